//! What the tidy tests (tidy.rs, tidy_imports.rs) share: the repository's root, the tracked
//! files whose text is prose or code, and a line of Rust without its comment.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The tracked files whose text is prose or code: not the history (the changelog, the results
/// log), not the fuzz corpora and lock files.
pub fn tracked_text() -> Vec<(String, String)> {
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root())
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    let text_kinds = [
        ".md", ".rs", ".toml", ".py", ".mjs", ".sh", ".proto", ".yaml",
    ];
    String::from_utf8(out.stdout)
        .unwrap()
        .split('\0')
        .filter(|path| !path.is_empty())
        .filter(|path| {
            let scripts = path.starts_with("scripts/") || path.starts_with(".ci/");
            scripts || text_kinds.iter().any(|kind| path.ends_with(kind))
        })
        .filter(|path| {
            !(*path == "CHANGELOG.md"
                || path.starts_with("bench/results/")
                || path.starts_with("fuzz/corpus/")
                || path.ends_with("Cargo.lock"))
        })
        .filter_map(|path| {
            let text = std::fs::read_to_string(root().join(path)).ok()?;
            Some((path.to_string(), text))
        })
        .collect()
}

/// A line of Rust without its comment (pragmatic: a `//` inside a string ends it too).
pub fn code_of(line: &str) -> &str {
    line.split("//").next().unwrap()
}
