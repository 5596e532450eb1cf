//! Running the `annals` command line of this build, for the command tests.

use std::io::Write;
use std::process::{Command, Stdio};

pub fn annals() -> Command {
    Command::new(env!("CARGO_BIN_EXE_annals"))
}

pub fn run(args: &[&str]) -> (bool, String, String) {
    let out = annals().args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn ok(args: &[&str]) -> String {
    let (success, stdout, stderr) = run(args);
    assert!(success, "annals {args:?} failed: {stderr}");
    stdout
}

pub fn with_stdin(args: &[&str], input: &str) -> String {
    let (success, stdout, stderr) = run_with_stdin(args, input);
    assert!(success, "{stderr}");
    stdout
}

/// Runs with `input` on standard input: success, stdout, stderr.
pub fn run_with_stdin(args: &[&str], input: &str) -> (bool, String, String) {
    let mut child = annals()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn lines(ndjson: &str) -> Vec<serde_json::Value> {
    ndjson
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Removes the `appendedAt` field from an export's lines, as text (the rest byte for byte).
pub fn without_append_times(ndjson: &str) -> String {
    ndjson
        .lines()
        .map(|line| {
            let Some(at) = line.find(",\"appendedAt\":") else {
                return line.to_string();
            };
            let rest = &line[at + ",\"appendedAt\":".len()..];
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            format!("{}{}\n", &line[..at], &rest[digits..])
        })
        .collect()
}
