//! The end-to-end tests' kit: a running `annals serve` of this build
//! ([`annals_testkit::server::ServerProcess`] started from this crate's binary) and the HTTP
//! client of annals-testkit, which can also misbehave on purpose (partial requests, stalls).
#![allow(dead_code)]

pub mod answers;
pub mod claims;
pub mod cli;

use std::path::Path;
use std::process::Command;

// Each test binary uses some of these.
#[allow(unused_imports)]
pub use annals_testkit::http::{
    append_body, encode, read_response, request, request_exactly, Response, Stream,
};

/// The `annals` binary this crate builds.
pub const ANNALS: &str = env!("CARGO_BIN_EXE_annals");

/// A running `annals serve` of this build (everything else is annals-testkit's
/// [`annals_testkit::server::ServerProcess`], which it dereferences to).
pub struct ServerProcess(annals_testkit::server::ServerProcess);

impl ServerProcess {
    /// Starts `annals serve` on `dir` with ephemeral ports and `extra` flags; waits for its
    /// listening line.
    pub fn start(dir: &Path, extra: &[&str]) -> ServerProcess {
        Self::start_with_env(dir, extra, &[])
    }

    pub fn start_with_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> ServerProcess {
        Self::launch(Some(dir), extra, env)
    }

    /// Starts `annals serve` with `args` instead of a data directory (a replica, say).
    pub fn launch_with(args: &[&str], env: &[(&str, &str)]) -> ServerProcess {
        Self::launch(None, args, env)
    }

    /// Starts `annals serve --store <url>` on a PostgreSQL database.
    pub fn start_postgres(url: &str, extra: &[&str]) -> ServerProcess {
        let mut args = vec!["--store", url];
        args.extend_from_slice(extra);
        Self::launch(None, &args, &[])
    }

    fn launch(dir: Option<&Path>, args: &[&str], env: &[(&str, &str)]) -> ServerProcess {
        ServerProcess(annals_testkit::server::ServerProcess::launch(
            Path::new(ANNALS),
            dir,
            args,
            env,
        ))
    }
}

impl std::ops::Deref for ServerProcess {
    type Target = annals_testkit::server::ServerProcess;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for ServerProcess {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

/// Runs tests/python (UmaDB's Python client, and the eventsourcing library's recorders,
/// applications and projections on its UmaDB persistence module) with
/// pytest and `env`; fails with pytest's output. Skipped, saying why, when the Python packages
/// are missing, unless the test command requires them (ANNALS_REQUIRE_PYTHON).
pub fn python_suite(env: &[(&str, String)]) {
    let python = annals_testkit::python().unwrap_or_else(|| "python3".into());
    let has_packages = annals_testkit::tools_allowed()
        && Command::new(&python)
            .args([
                "-c",
                "import umadb, pytest, eventsourcing, eventsourcing_umadb",
            ])
            .status()
            .is_ok_and(|s| s.success());
    if !has_packages {
        assert!(
            std::env::var_os("ANNALS_REQUIRE_PYTHON").is_none(),
            "{} lacks the umadb, eventsourcing and pytest packages: run scripts/setup",
            python.display()
        );
        eprintln!("skipped: no Python with umadb/pytest (scripts/test installs them)");
        return;
    }
    let tests = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python");
    let out = Command::new(&python)
        .args(["-m", "pytest", "-v", "-p", "no:cacheprovider", tests])
        .env("ANNALS_BIN", ANNALS)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "pytest failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An event as UmaDB's clients take it: a type, tags and data, no id or metadata.
pub fn umadb_event(event_type: &str, tags: &[&str], data: &str) -> umadb_dcb::DcbEvent {
    umadb_dcb::DcbEvent {
        event_type: event_type.to_string(),
        tags: tags.iter().map(|t| t.to_string()).collect(),
        data: data.as_bytes().to_vec(),
        uuid: None,
        metadata: Vec::new(),
    }
}

/// `annals serve` on a fresh directory with `env` set, run to its end: for starts that are
/// refused.
pub fn serve_refused(env: &[(&str, &str)]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    Command::new(ANNALS)
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "off",
            "--data-dir",
        ])
        .arg(dir.path())
        .envs(env.iter().copied())
        .output()
        .unwrap()
}
