//! The clients published from clients/, each run by its own ecosystem's test runner against a
//! server these tests start on free ports: on segment files, and once on PostgreSQL. Their
//! output is printed, so that it appears in the test command's summary. A runner that is not
//! installed skips its suite, saying why, unless the test command requires the clients
//! (ANNALS_REQUIRE_CLIENTS).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use annals_testkit::Cluster;
use common::ServerProcess;

fn clients() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients")
}

/// Writes a suite's output to standard error past the test harness's capture, in one write, so
/// that the test command's summary shows what each client's runner said.
fn show(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{text}\n").as_bytes());
}

fn required() -> bool {
    std::env::var_os("ANNALS_REQUIRE_CLIENTS").is_some_and(|v| v == "1")
}

/// Whether `program` runs (`--version` or `version`); else skips, saying why, unless the
/// clients are required.
fn runs(program: &str, arg: &str) -> bool {
    let found = annals_testkit::tools_allowed()
        && Command::new(program)
            .arg(arg)
            .output()
            .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            !required(),
            "{program} is required to test the clients: run scripts/setup"
        );
        eprintln!("skipped: {program} is not installed");
    }
    found
}

/// One run at a time of the suites that build into their client's directory (Maven's
/// `target/`, TypeScript's `dist/`): the tests of this file run in parallel.
static JAVA: std::sync::Mutex<()> = std::sync::Mutex::new(());
static TYPESCRIPT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `command` in `dir` with the server's URL; fails with its output.
fn suite(name: &str, mut command: Command, server: &ServerProcess) {
    let url = format!("http://{}", server.http);
    let out = command.env("ANNALS_URL", &url).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    show(&format!("--- {name} against {url}\n{text}"));
    assert!(out.status.success(), "{name} failed:\n{text}");
}

fn go_test(server: &ServerProcess) {
    let mut go = Command::new("go");
    go.args(["test", "-count=1", "-v", "./..."])
        .current_dir(clients().join("go"))
        // The module needs nothing from elsewhere, and the toolchain installed is new enough.
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off");
    suite("the Go client (go test)", go, server);
}

/// The TypeScript suite against `server`; its balancer's test sends reads to `second`, a
/// server of the same log that takes `server`'s appends in later.
fn npm_test(server: &ServerProcess, second: &ServerProcess) {
    let dir = clients().join("typescript");
    if !dir.join("node_modules/@dcb-es/event-store").exists() {
        assert!(
            !required(),
            "the TypeScript client's packages are missing: run scripts/setup"
        );
        eprintln!("skipped: the TypeScript client's packages are not installed");
        return;
    }
    let _one = TYPESCRIPT.lock().unwrap_or_else(|p| p.into_inner());
    let mut npm = Command::new("npm");
    npm.args(["test", "--silent"])
        .current_dir(dir)
        .env("ANNALS_SECOND_URL", format!("http://{}", second.http));
    suite("the TypeScript adapter (node --test)", npm, server);
}

/// The JDK for the Java client (ANNALS_JAVA_HOME, which scripts/setup finds: 21 or newer);
/// None, saying why, when there is none and the clients are not required.
fn java_home() -> Option<PathBuf> {
    let home = std::env::var_os("ANNALS_JAVA_HOME")
        .map(PathBuf::from)
        .filter(|h| h.join("bin/java").exists() && annals_testkit::tools_allowed());
    if home.is_none() {
        assert!(
            !required(),
            "ANNALS_JAVA_HOME names no JDK 21 or newer: run scripts/setup"
        );
        eprintln!("skipped: no JDK 21 or newer (ANNALS_JAVA_HOME)");
    }
    home
}

/// Runs the Java client's tests (JUnit through Maven): AF5's storage engine suite and the
/// course subscription application, each on a server of its own that the tests start from this
/// build's binary; `pg_base`, a `postgres://` URL ending in `/` whose databases
/// `storage_engine_suite` and `course_subscriptions` they use instead of directories.
fn maven_test(java_home: &Path, pg_base: Option<&str>) {
    let _one = JAVA.lock().unwrap_or_else(|p| p.into_inner());
    let mut mvn = Command::new("mvn");
    mvn.args(["-B", "--no-transfer-progress", "test"])
        .current_dir(clients().join("java"))
        .env("JAVA_HOME", java_home)
        .env("ANNALS_BIN", common::ANNALS);
    if let Some(base) = pg_base {
        mvn.env("ANNALS_PG_BASE", base);
    }
    let out = mvn.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // Maven's own lines about itself are left out; the tests' are kept.
    let summary: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Tests run") || l.contains("ERROR") || l.contains("FAIL"))
        .collect();
    show(&format!(
        "--- the Java client (mvn test)\n{}",
        summary.join("\n")
    ));
    assert!(
        out.status.success(),
        "mvn test failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Goal: the Axon Framework 5 storage engine passes AF5's own `StorageEngineTestSuite`
/// unchanged, and the course subscription application on it gives the last seat to exactly one
/// of eight racing students; on segment files.
#[test]
fn the_java_client_on_segment_files() {
    let Some(java) = java_home() else {
        return;
    };
    if !runs("mvn", "--version") {
        return;
    }
    maven_test(&java, None);
}

/// Goal: the same, on PostgreSQL.
#[test]
fn the_java_client_on_postgres() {
    let Some(java) = java_home() else {
        return;
    };
    if !runs("mvn", "--version") {
        return;
    }
    let Some(cluster) = Cluster::start() else {
        return;
    };
    cluster.sql("CREATE DATABASE storage_engine_suite");
    cluster.sql("CREATE DATABASE course_subscriptions");
    let base = format!("postgres://postgres@127.0.0.1:{}/", cluster.port());
    maven_test(&java, Some(&base));
}

/// Goal: the Go client passes its own tests (`go test`: append, read, conditions, typed
/// errors, a subscription that resumes, the course subscription race) against a server on
/// segment files.
#[test]
fn the_go_client_on_segment_files() {
    if !runs("go", "version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    go_test(&server);
}

/// Goal: the TypeScript adapter of `@dcb-es/event-store` passes its tests (node's runner:
/// appends with and without conditions, several commands at once, reads in every direction,
/// subscriptions that resume, the library's decision model in a race for the last seat, typed
/// errors) against a server on segment files; and behind a balancer that sends its reads to a
/// read replica of the server's backup, racing appends still have one winner.
#[test]
fn the_typescript_adapter_on_segment_files() {
    if !runs("npm", "--version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let backup_dir = tempfile::tempdir().unwrap();
    let backup = format!("file://{}", backup_dir.path().display());
    let server = ServerProcess::start(dir.path(), &["--backup", &backup]);
    // A replica starts from a backup that holds something.
    server.append(&common::append_body(&[("Started", &[], "{}")], None));
    server.await_backup_shipped(std::time::Duration::from_secs(30));
    let replica = ServerProcess::launch_with(&["--replica-of", &backup], &[]);
    npm_test(&server, &replica);
}

/// Goal: the Go client passes the same tests against a server on PostgreSQL.
#[test]
fn the_go_client_on_postgres() {
    if !runs("go", "version") {
        return;
    }
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    let server = ServerProcess::start_postgres(&url, &[]);
    go_test(&server);
}

/// Goal: the TypeScript adapter passes the same tests against a server on PostgreSQL, the
/// balancer's in front of two servers of the database.
#[test]
fn the_typescript_adapter_on_postgres() {
    if !runs("npm", "--version") {
        return;
    }
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    let server = ServerProcess::start_postgres(&url, &[]);
    let second = ServerProcess::start_postgres(&url, &[]);
    npm_test(&server, &second);
}
