//! The commands for people at a terminal, on a directory and against a running server:
//! append, read, tail, export, import, and `--help` with an example on every command.

mod common;

use std::process::Stdio;

use common::cli::{annals, lines, ok, run, run_with_stdin, with_stdin, without_append_times};
use common::ServerProcess;

/// The same scenario on a directory and against a server: append from arguments (with a
/// condition that holds, then one that fails with exit 1), append NDJSON from stdin, read as a
/// table and as NDJSON with query flags, export, and import into a second store.
fn scenario(at: &[&str], import_at: &[&str]) {
    let arg = |extra: &[&str]| -> Vec<String> {
        extra
            .iter()
            .chain(at.iter())
            .map(|s| s.to_string())
            .collect()
    };
    let call = |extra: &[&str]| ok(&arg(extra).iter().map(String::as_str).collect::<Vec<_>>());
    let claim = r#"{"failIfEventsMatch":{"items":[{"tags":["user:ada"]}]}}"#;
    let out = call(&[
        "append",
        "--type",
        "UserRegistered",
        "--tag",
        "user:ada",
        "--data",
        "{\"n\":1}",
        "--condition",
        claim,
    ]);
    assert_eq!(out.trim(), r#"{"position":1}"#);
    let args = arg(&[
        "append",
        "--type",
        "UserRegistered",
        "--tag",
        "user:ada",
        "--data",
        "again",
        "--condition",
        claim,
    ]);
    let (success, _, stderr) = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!success);
    assert!(stderr.contains("position 1"), "{stderr}");
    let input: String = (0..25)
        .map(|i| {
            format!(
                "{{\"type\":\"Deposited\",\"tags\":[\"account:{}\"],\"data\":\"{i}\"}}\n",
                i % 5
            )
        })
        .collect();
    let args = arg(&["append", "--batch", "10"]);
    let out = with_stdin(&args.iter().map(String::as_str).collect::<Vec<_>>(), &input);
    assert_eq!(out.trim(), r#"{"position":26}"#);
    let table = call(&["read", "--tag", "account:2"]);
    assert!(table.lines().next().unwrap().contains("position"));
    assert_eq!(table.lines().count(), 1 + 5);
    let ndjson = call(&[
        "read",
        "--type",
        "Deposited",
        "--backwards",
        "--limit",
        "3",
        "--format",
        "ndjson",
    ]);
    let read = lines(&ndjson);
    assert_eq!(
        read.iter()
            .map(|e| e["position"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [26, 25, 24]
    );
    let from = lines(&call(&["read", "--from", "25", "--format", "ndjson"]));
    assert_eq!(from.len(), 2);
    let query = lines(&call(&[
        "read",
        "--query",
        r#"{"items":[{"types":["UserRegistered"]}]}"#,
        "--format",
        "ndjson",
    ]));
    assert_eq!(query.len(), 1);
    assert_eq!(query[0]["data"], "{\"n\":1}");
    // Export everything, import into another store: the same events in the same order.
    let exported = call(&["export"]);
    assert_eq!(exported.lines().count(), 26);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.ndjson");
    std::fs::write(&file, &exported).unwrap();
    let mut import: Vec<&str> = vec!["import", file.to_str().unwrap()];
    import.extend_from_slice(import_at);
    let (success, _, stderr) = run(&import);
    assert!(success, "{stderr}");
    assert!(stderr.contains("imported 26 events"), "{stderr}");
    let mut reread: Vec<&str> = vec!["export"];
    reread.extend_from_slice(import_at);
    let again = ok(&reread);
    let strip = |text: &str| -> Vec<serde_json::Value> {
        lines(text)
            .into_iter()
            .map(|mut e| {
                e.as_object_mut().unwrap().remove("appendedAt");
                e
            })
            .collect()
    };
    assert_eq!(strip(&again), strip(&exported));
}

/// Goal: the commands work on a data directory.
#[test]
fn commands_on_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    scenario(
        &["--dir", a.to_str().unwrap()],
        &["--dir", b.to_str().unwrap()],
    );
}

/// A throwaway cluster with two databases, `a` and `b`, and their URLs; None without
/// PostgreSQL (the test command requires it).
fn two_databases() -> Option<(annals_testkit::Cluster, String, String)> {
    let cluster = annals_testkit::Cluster::start()?;
    cluster.sql("CREATE DATABASE a");
    cluster.sql("CREATE DATABASE b");
    let url = |db: &str| format!("postgres://postgres@127.0.0.1:{}/{db}", cluster.port());
    let (a, b) = (url("a"), url("b"));
    Some((cluster, a, b))
}

/// Goal: the commands work on a store in PostgreSQL as on a directory (`--store URL`).
#[test]
fn commands_on_postgres() {
    let Some((_cluster, a, b)) = two_databases() else {
        return;
    };
    scenario(&["--store", &a], &["--store", &b]);
    let stats: serde_json::Value =
        serde_json::from_str(ok(&["stats", &a, "--json"]).trim()).unwrap();
    assert_eq!(
        (stats["head"].as_u64(), stats["backend"].as_str()),
        (Some(26), Some("postgres"))
    );
    let verified = ok(&["verify", &b]);
    assert!(
        verified.contains("events:      26 (of head 26)"),
        "{verified}"
    );
    assert!(verified.contains("problem:     none"), "{verified}");
}

/// Goal: `annals copy` moves a store from a directory to PostgreSQL and back, positions,
/// append times and boundaries kept, verified at the end; run again it resumes after what the
/// target holds; it refuses a target that holds other events, and says why.
#[test]
fn copy_between_a_directory_and_postgres() {
    let Some((_cluster, a, b)) = two_databases() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    let source = source.to_str().unwrap();
    let input: String = (0..300)
        .map(|i| {
            format!(
                "{{\"type\":\"T{}\",\"tags\":[\"k:{}\"],\"data\":\"{i}\"}}\n",
                i % 3,
                i % 7
            )
        })
        .collect();
    with_stdin(&["append", "--store", source, "--batch", "7"], &input);
    let out = ok(&["copy", "--from", source, "--to", &a]);
    assert!(out.contains("copied 43 appends (300 events)"), "{out}");
    assert!(
        out.contains("verified 43 appends, positions 1..=300"),
        "{out}"
    );
    assert_eq!(
        ok(&["export", "--store", &a]),
        ok(&["export", "--store", source])
    );
    // More events at the source: the copy goes on after the 300 the target holds.
    with_stdin(
        &["append", "--store", source],
        "{\"type\":\"Late\",\"data\":\"x\"}\n",
    );
    let out = ok(&["copy", "--from", source, "--to", &a, "--json"]);
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["resumed_after"], 300);
    assert_eq!(report["copied_appends"], 1);
    assert_eq!(report["verified_appends"], 44);
    // And back to a directory.
    let back = dir.path().join("back");
    let back = back.to_str().unwrap();
    ok(&["copy", "--from", &a, "--to", back]);
    assert_eq!(
        ok(&["export", "--store", back]),
        ok(&["export", "--store", source])
    );
    ok(&["verify", back]);
    // A target with other events: refused, nothing written.
    with_stdin(
        &["append", "--store", &b],
        "{\"type\":\"Other\",\"data\":\"y\"}\n",
    );
    let (success, _, stderr) = run(&["copy", "--from", source, "--to", &b]);
    assert!(!success);
    assert!(stderr.contains("differ"), "{stderr}");
    assert_eq!(lines(&ok(&["export", "--store", &b])).len(), 1);
}

/// Goal: the same commands work against a running server, with an API key; tail follows live.
#[test]
fn commands_against_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let keys = "cli-key-000000000001=read,append";
    let a = ServerProcess::start_with_env(&dir.path().join("a"), &[], &[("ANNALS_API_KEYS", keys)]);
    let b = ServerProcess::start_with_env(&dir.path().join("b"), &[], &[("ANNALS_API_KEYS", keys)]);
    let url_a = format!("http://{}", a.http);
    let url_b = format!("http://{}", b.http);
    let key = "cli-key-000000000001";
    scenario(
        &["--url", &url_a, "--api-key", key],
        &["--url", &url_b, "--api-key", key],
    );
    // Without the key the server refuses, and the command says why.
    let (success, _, stderr) = run(&["read", "--url", &url_a]);
    assert!(!success);
    assert!(stderr.contains("401"), "{stderr}");
    // tail: from position 20 it shows 21..26, then follows a new append.
    let tail = annals()
        .args([
            "tail",
            "--url",
            &url_a,
            "--api-key",
            key,
            "--after",
            "20",
            "--count",
            "7",
            "--format",
            "ndjson",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    ok(&[
        "append",
        "--url",
        &url_a,
        "--api-key",
        key,
        "--type",
        "Live",
        "--data",
        "now",
    ]);
    let out = tail.wait_with_output().unwrap();
    assert!(out.status.success());
    let seen = lines(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        seen.iter()
            .map(|e| e["position"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        (21..=27).collect::<Vec<_>>()
    );
    assert_eq!(seen[6]["type"], "Live");
}

/// Goal: every command explains itself with an example, and every subcommand's arguments are
/// well formed (clap checks them when a command is built: its --help builds it).
#[test]
fn every_command_has_help_with_an_example() {
    for command in [
        &["readmodel", "status", "--help"][..],
        &["readmodel", "get", "--help"],
        &["readmodel", "rebuild", "--help"],
    ] {
        ok(command);
    }
    for command in [
        "serve", "append", "read", "tail", "export", "import", "copy", "verify", "stats",
    ] {
        let out = ok(&[command, "--help"]);
        assert!(
            out.contains("Example"),
            "{command} --help lacks an example:\n{out}"
        );
    }
}

/// Goal: `stats --url` reports a running server's head, class and counters (metrics scope,
/// which admin implies), and says why when the key lacks the scope; a key of the metrics scope
/// alone reads no events, checks nothing and erases nothing; a running server's statistics and a closed store's
/// (`stats --store --json`) have one shape. Method: three appends, `stats --url --json`, the
/// server stopped, then `stats --store --json`: every field of the closed store's is in the
/// server's, and the server adds only its own (class, readiness, clients, the URL).
#[test]
fn stats_of_a_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let keys = "admin-key-0000000001=admin;reader-key-000000001=read;scrape-key-000000001=metrics";
    let mut server = ServerProcess::start_with_env(dir.path(), &[], &[("ANNALS_API_KEYS", keys)]);
    let url = format!("http://{}", server.http);
    for i in 0..3 {
        ok(&[
            "append",
            "--url",
            &url,
            "--api-key",
            "admin-key-0000000001",
            "--type",
            "E",
            "--data",
            &i.to_string(),
        ]);
    }
    let out = ok(&[
        "stats",
        "--url",
        &url,
        "--api-key",
        "admin-key-0000000001",
        "--json",
    ]);
    let stats: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(stats["head"], 3);
    assert_eq!(stats["durability"], "d3");
    assert_eq!(stats["appends"], 3);
    assert!(stats["fsyncs"].as_u64().unwrap() >= 1);
    // verify --url: the server checks its live log while it serves.
    let out = ok(&[
        "verify",
        "--url",
        &url,
        "--api-key",
        "admin-key-0000000001",
        "--json",
    ]);
    let check: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(check["ok"], true, "{check}");
    assert_eq!(check["events"], 3);
    let (success, _, stderr) = run(&["stats", "--url", &url, "--api-key", "reader-key-000000001"]);
    assert!(!success);
    assert!(
        stderr.contains("403") && stderr.contains("metrics"),
        "{stderr}"
    );
    // A scraper's key reads the statistics and nothing else.
    let scrape = ["--url", &url, "--api-key", "scrape-key-000000001"];
    let out = ok(&[&["stats", "--json"][..], &scrape].concat());
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["head"],
        3
    );
    for refused in [
        &["read"][..],
        &["verify"],
        &["erase", "customer:1", "--force"],
    ] {
        let (success, _, stderr) = run(&[refused, &scrape].concat());
        assert!(!success && stderr.contains("403"), "{refused:?}: {stderr}");
    }
    assert!(server.terminate().success());
    let store = dir.path().to_str().unwrap();
    let closed: serde_json::Value =
        serde_json::from_str(ok(&["stats", "--store", store, "--json"]).trim()).unwrap();
    assert_eq!(closed["head"], 3);
    let fields = |v: &serde_json::Value| -> std::collections::BTreeSet<String> {
        v.as_object().unwrap().keys().cloned().collect()
    };
    let (served, closed) = (fields(&stats), fields(&closed));
    assert!(
        closed.is_subset(&served),
        "{:?}",
        closed.difference(&served)
    );
    let own: Vec<&String> = served.difference(&closed).collect();
    assert_eq!(
        own,
        [
            "connections",
            "durability",
            "durability_description",
            "ready",
            "subscribers",
            "unready_reasons",
            "url"
        ]
    );
}

/// Goal: NDJSON data may be any JSON value (a string stored as it is, anything else as its
/// compact JSON text); the table shows data as written, escaping what could move the cursor or
/// is not UTF-8, cut to the terminal's width; an export imported into an empty store exports
/// the same bytes; every command names a store with `--store` (alias `--dir`), and `stats` and
/// `verify` still take it on its own. Method: the commands on a directory, and `read` against
/// a server holding the same events.
#[test]
fn data_as_written_and_one_way_to_name_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let a = a.to_str().unwrap();
    let input = concat!(
        r#"{"type":"CourseDefined","tags":["course:c1"],"data":{ "capacity": 10, "name": "Intro" }}"#,
        "\n",
        r#"{"type":"Listed","tags":[],"data":[1, 2,3]}"#,
        "\n",
        r#"{"type":"Counted","data":42}"#,
        "\n",
        r#"{"type":"Texted","data":"{\"capacity\":10}"}"#,
        "\n",
        r#"{"type":"Coloured","data":"a\u001b[31mred\nline \\ end"}"#,
        "\n",
        r#"{"type":"Binary","data":"/wBh","dataEncoding":"base64"}"#,
        "\n",
    );
    let out = with_stdin(&["append", "--store", a], input);
    assert_eq!(out.trim(), r#"{"position":6}"#);
    // Stored: compact JSON text for values, strings as they are, bytes as given.
    let stored = lines(&ok(&["read", "--dir", a, "--format", "ndjson"]));
    assert_eq!(stored[0]["data"], r#"{"capacity":10,"name":"Intro"}"#);
    assert_eq!(stored[1]["data"], "[1,2,3]");
    assert_eq!(stored[2]["data"], "42");
    assert_eq!(stored[3]["data"], r#"{"capacity":10}"#);
    assert_eq!(stored[4]["data"], "a\u{1b}[31mred\nline \\ end");
    assert_eq!(stored[5]["dataEncoding"], "base64");
    // A value that is not a string with a base64 encoding is refused, and nothing appended.
    let (success, _, stderr) = run_with_stdin(
        &["append", "--store", a],
        r#"{"type":"X","data":{"a":1},"dataEncoding":"base64"}"#,
    );
    assert!(!success);
    assert!(stderr.contains("must be a string"), "{stderr}");

    // The table: as written, nothing that moves the cursor, one line per event.
    let table = |args: &[&str]| -> String {
        let out = annals().args(args).env("COLUMNS", "200").output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let shown = table(&["read", "--store", a]);
    assert_eq!(shown.lines().count(), 1 + 6, "{shown}");
    assert!(
        shown.contains(r#"{"capacity":10,"name":"Intro"}"#),
        "{shown}"
    );
    assert!(shown.contains("[1,2,3]"), "{shown}");
    assert!(!shown.contains("\\\""), "no JSON escapes: {shown}");
    assert!(
        !shown.contains('\u{1b}'),
        "no escape character reaches the terminal"
    );
    assert!(
        shown.contains(r"a\u{1b}[31mred\nline \\ end"),
        "control characters and backslashes escaped: {shown}"
    );
    assert!(
        shown.contains(r"\xff\u{0}a"),
        "bytes that are not UTF-8 escaped: {shown}"
    );
    // A long value is cut to the terminal's width with an ellipsis.
    let long = "x".repeat(500);
    ok(&["append", "--store", a, "--type", "Long", "--data", &long]);
    let out = annals()
        .args(["read", "--store", a, "--type", "Long"])
        .env("COLUMNS", "100")
        .output()
        .unwrap();
    let row = String::from_utf8(out.stdout).unwrap();
    let row = row.lines().nth(1).unwrap();
    assert!(row.ends_with('…'), "{row}");
    assert_eq!(row.chars().count(), 100, "{row}");

    // The round trip: export, import into an empty store, export: the same bytes.
    let exported = ok(&["export", "--store", a]);
    let file = dir.path().join("events.ndjson");
    std::fs::write(&file, &exported).unwrap();
    let b = dir.path().join("b");
    let b = b.to_str().unwrap();
    ok(&["import", "--dir", b, file.to_str().unwrap()]);
    let again = ok(&["export", "--dir", b]);
    assert_eq!(
        without_append_times(&again),
        without_append_times(&exported)
    );

    // One way to name a store: --store, --dir, or (stats and verify) on its own.
    for args in [
        &["stats", "--store", a, "--json"][..],
        &["stats", "--dir", a, "--json"],
        &["stats", a, "--json"],
        &["verify", "--store", a, "--json"],
        &["verify", "--dir", a, "--json"],
        &["verify", a, "--json"],
    ] {
        let v: serde_json::Value = serde_json::from_str(&ok(args)).unwrap();
        assert!(v.is_object(), "{args:?}: {v}");
    }
    let (success, _, stderr) = run(&["stats", "--store", a, b]);
    assert!(!success, "two stores are refused");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    ok(&["readmodel", "status", "--store", a]);
    ok(&["readmodel", "status", "--dir", a]);

    // Against a server holding the same events, the table is the same.
    let server = ServerProcess::start(std::path::Path::new(b), &[]);
    let url = format!("http://{}", server.http);
    let remote = table(&["read", "--url", &url]);
    let local = table(&["read", "--store", a]);
    assert_eq!(remote, local);
}

/// Goal: `backup verify` and `restore` refuse a location that holds no backup and create
/// nothing at it. Regression: `backup verify file:///nonexistent/path` printed "every object
/// checked", exited 0 and made the directory; `restore --from` a mistyped location exited 0,
/// left an empty store behind and made the location. Method: a missing directory, an empty
/// one, one holding other files, and one whose backup lies a folder below (the location of
/// a bucket rather than its prefix), each verified and restored from; each refused, naming
/// what the location holds, with no directory or file made on either side. A real backup
/// next to them still verifies and restores.
#[test]
fn a_location_without_a_backup_is_refused_and_nothing_is_made() {
    let work = tempfile::tempdir().unwrap();
    let path = |name: &str| work.path().join(name);
    let url = |name: &str| format!("file://{}", path(name).display());
    let names_in = |name: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(path(name))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    std::fs::create_dir(path("empty")).unwrap();
    std::fs::create_dir(path("other")).unwrap();
    std::fs::write(path("other/notes.txt"), b"not a backup").unwrap();
    // A backup at bucket/store1, shipped by a store of the library.
    let options = annals::Options {
        backup: Some(annals::BackupOptions::new(url("bucket/store1"))),
        ..annals::Options::default()
    };
    let store = annals::Store::open(path("data"), options).unwrap();
    store
        .append(&[annals::NewEvent::new("Opened", "{}").tag("k:1")], None)
        .unwrap();
    store.close().unwrap();
    let bucket = names_in("bucket");

    for (location, says) in [
        ("missing/path", "does not exist"),
        ("empty", "holds nothing"),
        ("other", "holds other objects (notes.txt)"),
        ("bucket", "backups are below it"),
    ] {
        let (success, stdout, stderr) = run(&["backup", "verify", &url(location)]);
        assert!(!success, "verify {location}: {stdout}");
        assert!(
            stderr.contains(&format!("no backup at {}", url(location))) && stderr.contains(says),
            "verify {location}: {stderr}"
        );
        let to = path(&format!("restored-{}", location.replace('/', "-")));
        let to = to.display().to_string();
        let (success, stdout, stderr) = run(&["restore", "--from", &url(location), "--to", &to]);
        assert!(!success, "restore {location}: {stdout}");
        assert!(
            stderr.contains("no backup at"),
            "restore {location}: {stderr}"
        );
        assert!(!std::path::Path::new(&to).exists(), "restore made {to}");
    }
    assert!(
        !path("missing").exists(),
        "verify or restore made the location"
    );
    assert!(names_in("empty").is_empty());
    assert_eq!(names_in("other"), ["notes.txt"]);
    assert_eq!(names_in("bucket"), bucket);
    assert!(
        stderr_of(&["backup", "verify", &url("bucket")]).contains(&url("bucket/store1")),
        "the backup below is named"
    );

    let out = ok(&["backup", "verify", &url("bucket/store1")]);
    assert!(out.contains("every object checked"), "{out}");
    let to = path("restored").display().to_string();
    ok(&["restore", "--from", &url("bucket/store1"), "--to", &to]);
}

fn stderr_of(args: &[&str]) -> String {
    run(args).2
}
