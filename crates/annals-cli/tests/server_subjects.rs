//! Goal: data subjects end to end through `annals serve`: events carrying a subject's tag are
//! stored encrypted (a marker in their data is never in the data directory's bytes), read
//! back whole until `POST /v1/admin/erase` or `annals erase` deletes the subject's key, and
//! then read back without data (`"erased": true`); appends naming an erased subject are
//! refused (409 subject_erased); a start with another master key is refused and changes
//! nothing.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use annals_testkit::eventually;
use common::{append_body, ServerProcess};

const MARKER: &str = "MARKER-subject-data-91c2";

fn annals() -> Command {
    Command::new(env!("CARGO_BIN_EXE_annals"))
}

/// Runs `command`, which must succeed (else its error output fails the test); its stdout.
fn succeeds(command: &mut Command) -> Vec<u8> {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn new_master_key(dir: &Path, name: &str) -> String {
    let out = annals().args(["master-key", "new"]).output().unwrap();
    assert!(out.status.success());
    let key = String::from_utf8(out.stdout).unwrap();
    assert_eq!(key.trim().len(), 64, "{key}");
    assert!(key.trim().chars().all(|c| c.is_ascii_hexdigit()));
    let path = dir.join(name);
    std::fs::write(&path, key).unwrap();
    path.display().to_string()
}

/// Goal: an operator of `annals serve` with data subjects finds their data sealed on disk, read
/// back until an erasure and without data after it, erased alike over HTTP and with `annals erase`,
/// a start with a wrong master key or a missing prefix refused without writing, and a rotated
/// master key replacing the old one. Method: one store taken through each step, its data directory
/// searched for the marker after each.
#[test]
fn subjects_are_encrypted_read_back_and_erased_over_http_and_the_command_line() {
    let keys = tempfile::tempdir().unwrap();
    let master = new_master_key(keys.path(), "master.key");
    let other = new_master_key(keys.path(), "other.key");
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("store");
    let config = keys.path().join("annals.toml");
    std::fs::write(
        &config,
        "[[read_models]]\nname = \"all\"\n[[read_models]]\nname = \"orders\"\ntypes = [\"OrderPlaced\"]\n",
    )
    .unwrap();
    let config = config.display().to_string();
    let flags = [
        "--subject-tags",
        "customer:,employee:",
        "--master-key-file",
        &master,
        "--config",
        &config,
    ];
    let mut server = ServerProcess::start(&dir, &flags);
    let lines = server.startup.join("\n");
    assert!(
        lines.contains("data subjects on: tags beginning customer:, employee: are sealed"),
        "{lines}"
    );
    let body = append_body(
        &[
            (
                "AddressChanged",
                &["customer:42"],
                &format!("{MARKER} 1 Main St"),
            ),
            ("OrderPlaced", &["order:1"], "no personal data"),
            (
                "Married",
                &["customer:42", "customer:43"],
                &format!("{MARKER} both"),
            ),
        ],
        None,
    );
    let appended = server.post("/v1/append", &body);
    assert_eq!(appended.status, 200, "{}", appended.text());
    let events = server.read("{}", "{}");
    assert_eq!(events[0]["data"], format!("{MARKER} 1 Main St"));
    assert_eq!(events[2]["data"], format!("{MARKER} both"));
    assert!(events.iter().all(|e| e.get("erased").is_none()));

    let erased = server.post("/v1/admin/erase", r#"{"tag":"customer:43"}"#);
    assert_eq!(erased.status, 200, "{}", erased.text());
    let answer = erased.json();
    assert_eq!(answer["events"], 1);
    assert_eq!(answer["already"], false);
    // The read model that folded the subject's event is rebuilt; the other is left alone.
    assert_eq!(answer["readModelsRebuilt"], serde_json::json!(["all"]));
    let again = server
        .post("/v1/admin/erase", r#"{"tag":"customer:43"}"#)
        .json();
    assert_eq!(again["already"], true);
    assert_eq!(again["receipt"], answer["receipt"]);

    let events = server.read("{}", "{}");
    assert_eq!(events[0]["data"], format!("{MARKER} 1 Main St"));
    assert_eq!(events[2]["erased"], true);
    assert_eq!(events[2]["data"], "");
    assert_eq!(events[2]["type"], "Married");
    assert_eq!(events[3]["type"], "annals.SubjectErased");

    let head = server.head();
    let refused = server.post(
        "/v1/append",
        &append_body(&[("Moved", &["customer:43"], "x")], None),
    );
    assert_eq!(refused.status, 409, "{}", refused.text());
    assert_eq!(refused.kind(), "subject_erased");
    for (bad, kind) in [
        (r#"{"tag":"order:1"}"#, "not_a_subject"),
        (r#"{"tag":""}"#, "not_a_subject"),
        (r#"{"tags":"customer:1"}"#, "invalid_body"),
        ("not json", "invalid_body"),
    ] {
        let r = server.post("/v1/admin/erase", bad);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert_eq!(r.kind(), kind, "{bad}");
    }
    assert_eq!(server.head(), head);
    assert!(server.terminate().success());
    assert_eq!(
        annals_testkit::files_holding(&dir, MARKER.as_bytes()),
        Vec::<std::path::PathBuf>::new()
    );

    // Another master key: refused at start, nothing written.
    let before = annals_testkit::files_holding(&dir, b"ANNKEYS1");
    let out = annals()
        .arg("serve")
        .arg("--data-dir")
        .arg(&dir)
        .args(["--http", "127.0.0.1:0", "--grpc", "off"])
        .args(["--subject-tags", "customer:", "--master-key-file", &other])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("master key"), "{err}");
    assert_eq!(annals_testkit::files_holding(&dir, b"ANNKEYS1"), before);
    // Subject tags without a master key: refused too.
    let out = annals()
        .arg("serve")
        .arg("--data-dir")
        .arg(&dir)
        .args([
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "off",
            "--subject-tags",
            "customer:",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--master-key-file"));
    // The right master key with a prefix left out (the store sealed customer:42's events):
    // refused, naming the subject and the prefixes to give, nothing written.
    let out = annals()
        .arg("serve")
        .arg("--data-dir")
        .arg(&dir)
        .args(["--http", "127.0.0.1:0", "--grpc", "off"])
        .args(["--subject-tags", "employee:", "--master-key-file", &master])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("customer:42") && err.contains("--subject-tags employee:,customer:"),
        "{err}"
    );
    assert_eq!(annals_testkit::files_holding(&dir, b"ANNKEYS1"), before);

    // The command line on the closed store: erase, then read with the key from the
    // environment.
    let out = succeeds(
        annals()
            .args(["erase", "customer:42", "--store"])
            .arg(&dir)
            .args([
                "--subject-tags",
                "customer:",
                "--master-key-file",
                &master,
                "--json",
            ]),
    );
    let answer: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(answer["events"], 2);
    let out = succeeds(
        annals()
            .args(["read", "--format", "ndjson", "--store"])
            .arg(&dir)
            .env("ANNALS_SUBJECT_TAGS", "customer:")
            .env("ANNALS_MASTER_KEY_FILE", &master),
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["erased"], true);
    assert_eq!(lines[1]["data"], "no personal data");
    assert_eq!(lines.last().unwrap()["type"], "annals.SubjectErased");
    server = ServerProcess::start(&dir, &flags);
    assert_eq!(server.read("{}", "{}")[0]["erased"], true);
    assert!(server.terminate().success());
    assert_eq!(
        annals_testkit::files_holding(&dir, MARKER.as_bytes()),
        Vec::<std::path::PathBuf>::new()
    );

    // The master key rotated: the old one is refused from then on, the new one reads.
    succeeds(
        annals()
            .args(["master-key", "rotate", "--store"])
            .arg(&dir)
            .args([
                "--subject-tags",
                "customer:,employee:",
                "--master-key-file",
                &master,
            ])
            .args(["--new-master-key-file", &other]),
    );
    let old_key = annals()
        .args(["read", "--store"])
        .arg(&dir)
        .env("ANNALS_SUBJECT_TAGS", "customer:")
        .env("ANNALS_MASTER_KEY_FILE", &master)
        .output()
        .unwrap();
    assert!(!old_key.status.success());
    assert!(String::from_utf8_lossy(&old_key.stderr).contains("master key"));
    let master = other;
    let flags = [
        "--subject-tags",
        "customer:,employee:",
        "--master-key-file",
        &master,
        "--config",
        &config,
    ];
    let mut rotated = ServerProcess::start(&dir, &flags);
    assert_eq!(rotated.read("{}", "{}")[1]["data"], "no personal data");
    assert_eq!(rotated.read("{}", "{}")[0]["erased"], true);
    assert!(rotated.terminate().success());

    // A copy carries the sealed events and the keys: the same reads, the same erasures.
    let copy = data.path().join("copy");
    succeeds(
        annals()
            .args(["copy", "--from"])
            .arg(&dir)
            .arg("--to")
            .arg(&copy)
            .env("ANNALS_SUBJECT_TAGS", "customer:,employee:")
            .env("ANNALS_MASTER_KEY_FILE", &master),
    );
    let mut copied = ServerProcess::start(&copy, &flags);
    let events = copied.read("{}", "{}");
    assert_eq!(events.len(), lines.len());
    assert_eq!(events[0]["erased"], true);
    assert_eq!(events[2]["erased"], true);
    assert_eq!(events[1]["data"], "no personal data");
    let refused = copied.post(
        "/v1/append",
        &append_body(&[("Moved", &["customer:42"], "x")], None),
    );
    assert_eq!(refused.kind(), "subject_erased");
    assert!(copied.terminate().success());
    assert_eq!(
        annals_testkit::files_holding(&copy, MARKER.as_bytes()),
        Vec::<std::path::PathBuf>::new()
    );

    // Into PostgreSQL, into another database, and back out into a directory: the keys go
    // into each database's table and come back out as a key file; the same reads and
    // erasures at each end.
    let Some(cluster) = annals_testkit::Cluster::start() else {
        return;
    };
    cluster.sql("CREATE DATABASE again");
    let database = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    let again = format!("postgres://postgres@127.0.0.1:{}/again", cluster.port());
    let back = data.path().join("back");
    for (from, to) in [
        (copy.display().to_string(), database.clone()),
        (database.clone(), again.clone()),
        (again.clone(), back.display().to_string()),
    ] {
        succeeds(
            annals()
                .args(["copy", "--from", &from, "--to", &to])
                .env("ANNALS_SUBJECT_TAGS", "customer:,employee:")
                .env("ANNALS_MASTER_KEY_FILE", &master),
        );
    }
    let on_postgres = [
        "--subject-tags",
        "customer:,employee:",
        "--master-key-file",
        &master,
    ];
    let mut served = ServerProcess::launch_with(
        &[&["--store", again.as_str()][..], &on_postgres[..]].concat(),
        &[],
    );
    assert_eq!(served.read("{}", "{}"), events);
    assert!(served.terminate().success());
    let mut back_served = ServerProcess::start(&back, &flags);
    assert_eq!(back_served.read("{}", "{}"), events);
    let refused = back_served.post(
        "/v1/append",
        &append_body(&[("Moved", &["customer:42"], "x")], None),
    );
    assert_eq!(refused.kind(), "subject_erased");
    assert!(back_served.terminate().success());
}

/// Goal: kill -9 while an erasure runs: after the restart the subject is either fully
/// readable (no receipt) or fully erased (with exactly one receipt), never half.
#[test]
fn kill9_during_erasure_leaves_the_subject_whole_or_erased() {
    let keys = tempfile::tempdir().unwrap();
    let master = new_master_key(keys.path(), "master.key");
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("store");
    let flags = ["--subject-tags", "customer:", "--master-key-file", &master];
    let mut server = ServerProcess::start(&dir, &flags);
    for i in 0..120 {
        let tag = format!("customer:{}", i % 12);
        let body = append_body(
            &[("Moved", &[tag.as_str()], &format!("{MARKER} {i}"))],
            None,
        );
        assert_eq!(server.post("/v1/append", &body).status, 200);
    }
    // How long an erasure takes here (the slowest of three), so that the kills spread over
    // before, during and after one however loaded the machine is: the later rounds, on a
    // server just started and with a request sent from a new thread, wait up to three times
    // that.
    let slowest = (0..3)
        .map(|i| {
            let tag = format!("customer:timing{i}");
            let body = append_body(&[("Moved", &[tag.as_str()], "x")], None);
            assert_eq!(server.post("/v1/append", &body).status, 200);
            let started = std::time::Instant::now();
            let answer = server.post("/v1/admin/erase", &format!(r#"{{"tag":"{tag}"}}"#));
            assert_eq!(answer.status, 200);
            started.elapsed()
        })
        .max()
        .unwrap();
    let step = (slowest * 3 / 11).max(Duration::from_micros(400));
    let (mut whole, mut erased) = (0, 0);
    for round in 0..12u32 {
        let tag = format!("customer:{round}");
        let addr = server.http;
        let body = format!(r#"{{"tag":"{tag}"}}"#);
        // The request is sent, and its answer read, by hand: the kill may cut either.
        let eraser = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut stream = std::net::TcpStream::connect(addr)?;
            write!(
                stream,
                "POST /v1/admin/erase HTTP/1.1\r\nHost: {addr}\r\nContent-Type: \
                 application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )?;
            let mut answer = Vec::new();
            stream.read_to_end(&mut answer).map(|_| answer)
        });
        // Somewhere between before the request lands and after it is answered.
        std::thread::sleep(step * round);
        server.kill9();
        let _ = eraser.join();
        server = ServerProcess::start(&dir, &flags);
        let query = format!(r#"{{"items":[{{"tags":["{tag}"]}}]}}"#);
        let events = server.read(&query, "{}");
        let receipts = events
            .iter()
            .filter(|e| e["type"] == "annals.SubjectErased")
            .count();
        let moved: Vec<&serde_json::Value> =
            events.iter().filter(|e| e["type"] == "Moved").collect();
        assert_eq!(moved.len(), 10, "round {round}");
        if receipts == 0 {
            assert!(
                moved.iter().all(|e| e.get("erased").is_none()),
                "round {round}: half"
            );
            whole += 1;
        } else {
            assert_eq!(receipts, 1, "round {round}");
            assert!(
                moved.iter().all(|e| e["erased"] == true),
                "round {round}: half"
            );
            erased += 1;
        }
    }
    eprintln!("{whole} rounds left the subject whole, {erased} erased");
    assert!(erased > 0, "no round erased: the kills came too early");
    assert!(server.terminate().success());
    assert_eq!(
        annals_testkit::files_holding(&dir, MARKER.as_bytes()),
        Vec::<std::path::PathBuf>::new()
    );
}

/// Goal: data subjects on PostgreSQL through two `annals serve` on one database. An event
/// appended on one server reads back whole on the other; an erasure on one holds on the other
/// at once (its append naming the subject is refused, its reads show no data), and the other
/// server's hosted read model that saw the subject is rebuilt; the subject's data is in no
/// `pg_dump`.
#[test]
fn an_erasure_on_one_postgres_server_holds_on_the_other() {
    let Some(cluster) = annals_testkit::Cluster::start() else {
        return;
    };
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    let keys = tempfile::tempdir().unwrap();
    let master = new_master_key(keys.path(), "master.key");
    let config = keys.path().join("annals.toml");
    std::fs::write(&config, "[[read_models]]\nname = \"all\"\n").unwrap();
    let config = config.display().to_string();
    let flags = [
        "--subject-tags",
        "customer:",
        "--master-key-file",
        &master,
        "--config",
        &config,
    ];
    let a = ServerProcess::start_postgres(&url, &flags);
    let b = ServerProcess::start_postgres(&url, &flags);
    let body = append_body(
        &[("AddressChanged", &["customer:7"], &format!("{MARKER} 7"))],
        None,
    );
    assert_eq!(a.post("/v1/append", &body).status, 200);
    let model_position = |server: &ServerProcess| -> u64 {
        server.get("/v1/readmodels/all").json()["position"]
            .as_u64()
            .unwrap_or(0)
    };
    eventually("b to follow a", Duration::from_secs(10), || {
        b.head() >= a.head() && model_position(&b) >= a.head()
    });
    assert_eq!(b.read("{}", "{}")[0]["data"], format!("{MARKER} 7"));

    let erased = a.post("/v1/admin/erase", r#"{"tag":"customer:7"}"#);
    assert_eq!(erased.status, 200, "{}", erased.text());
    assert_eq!(erased.json()["events"], 1);
    let refused = b.post(
        "/v1/append",
        &append_body(&[("Moved", &["customer:7"], "x")], None),
    );
    assert_eq!(refused.status, 409, "{}", refused.text());
    assert_eq!(refused.kind(), "subject_erased");
    let events = b.read("{}", "{}");
    assert_eq!(events[0]["erased"], true);
    assert_eq!(events[0]["data"], "");
    // b's read model saw the subject: rebuilt from the first event, it reaches the head
    // again.
    let rebuilds = |server: &ServerProcess| -> u64 {
        server.get("/v1/readmodels/all").json()["rebuilds"]
            .as_u64()
            .unwrap_or(0)
    };
    eventually(
        "b's read model to be rebuilt",
        Duration::from_secs(10),
        || {
            if rebuilds(&b) > 0 {
                Ok(())
            } else {
                Err(b.get("/v1/readmodels/all").text())
            }
        },
    );
    // Once each: the erasing server's model is rebuilt by its runner alone (not again by the
    // erase request and by a second watcher of receipts), and a model built again does not
    // take the receipt it already answered for a new one.
    eventually(
        "a's read model to be rebuilt",
        Duration::from_secs(10),
        || rebuilds(&a) > 0 && model_position(&a) >= a.head(),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!((rebuilds(&a), rebuilds(&b)), (1, 1));
    let hex: String = MARKER.bytes().map(|b| format!("{b:02x}")).collect();
    let text = cluster.dump();
    assert!(!text.contains(MARKER) && !text.contains(&hex));
}

/// Goal: every command that opens a store takes the data subjects' flags, and each
/// closed-store command works on a store with data subjects given them (no environment).
/// Regression: `read`, `export`, `import`, `append`, `stats` and `verify` refused
/// `--subject-tags` and `--master-key-file` as unknown arguments while the error on such a
/// store asked for its master key; only ANNALS_SUBJECT_TAGS and ANNALS_MASTER_KEY_FILE
/// worked. Method: with those variables removed, append makes a store with data subjects
/// from the flags; read without them is refused; read, export, import (into a second store),
/// append, stats and verify succeed with them; the subject's data is in no file of either
/// store; every store-opening command's help names both flags.
#[test]
fn closed_store_commands_take_the_subject_flags() {
    let keys = tempfile::tempdir().unwrap();
    let master = new_master_key(keys.path(), "master.key");
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("store");
    let copy = data.path().join("imported");
    let export = data.path().join("export.ndjson");
    let subjects = ["--subject-tags", "customer:", "--master-key-file", &master];
    // The command, without the variables that would stand in for the flags.
    let command = |args: &[&str]| {
        let mut command = annals();
        command
            .args(args)
            .env_remove("ANNALS_SUBJECT_TAGS")
            .env_remove("ANNALS_MASTER_KEY_FILE")
            .env_remove("ANNALS_URL");
        command
    };
    // The command given the subjects' flags.
    let with_subjects = |args: &[&str]| {
        let mut command = command(args);
        command.args(subjects);
        command
    };
    let store = dir.to_str().unwrap();

    let data_arg = format!("{MARKER} 1 Main St");
    succeeds(&mut with_subjects(&[
        "append",
        "--store",
        store,
        "--type",
        "AddressChanged",
        "--tag",
        "customer:42",
        "--data",
        &data_arg,
    ]));
    let refused = command(&["read", "--store", store]).output().unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("master key"), "{err}");

    let read = |store: &str| -> Vec<serde_json::Value> {
        let out = succeeds(&mut with_subjects(&[
            "read", "--format", "ndjson", "--store", store,
        ]));
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    assert_eq!(read(store)[0]["data"], data_arg);

    succeeds(&mut with_subjects(&[
        "export",
        "--store",
        store,
        "-o",
        export.to_str().unwrap(),
    ]));
    succeeds(&mut with_subjects(&[
        "import",
        "--store",
        copy.to_str().unwrap(),
        export.to_str().unwrap(),
    ]));
    let imported = read(copy.to_str().unwrap());
    assert_eq!(imported.len(), 1);
    assert_eq!(imported[0]["data"], data_arg);

    let out = succeeds(&mut with_subjects(&[
        "append",
        "--store",
        store,
        "--type",
        "Moved",
        "--tag",
        "customer:42",
        "--data",
        MARKER,
    ]));
    assert!(String::from_utf8_lossy(&out).contains("\"position\":2"));
    assert_eq!(read(store)[1]["data"], MARKER);

    let out = succeeds(&mut with_subjects(&["stats", "--store", store, "--json"]));
    let stats: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(stats["head"], 2);
    // On a directory, verify reads the records and the key file's tags without opening any
    // key (the flags are taken, and used for a database): it counts the sealed events.
    let out = succeeds(&mut with_subjects(&["verify", "--store", store, "--json"]));
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(report["events"], 2);
    assert_eq!(report["sealed_events"], 2);

    for sealed in [&dir, &copy] {
        assert_eq!(
            annals_testkit::files_holding(sealed, MARKER.as_bytes()),
            Vec::<std::path::PathBuf>::new(),
            "{}",
            sealed.display()
        );
    }

    for path in [
        &["append"][..],
        &["read"],
        &["tail"],
        &["export"],
        &["import"],
        &["verify"],
        &["stats"],
        &["copy"],
        &["restore"],
        &["erase"],
        &["master-key", "rotate"],
    ] {
        let out = succeeds(&mut command(&[path, &["--help"][..]].concat()));
        let help = String::from_utf8_lossy(&out);
        for flag in ["--subject-tags", "--master-key-file"] {
            assert!(help.contains(flag), "annals {path:?} --help lacks {flag}");
        }
    }
}

/// Goal: a restore to a position keeps the erasures made after it, and says so: positions
/// 1..=5 of the restored store are the source's (type, tags, data, erased or not), the
/// erasures' receipts follow at 6..=8 with the restore's time, and the command's output (and
/// its JSON) names them. Regression (issue 60): the receipts were appended after the
/// position asked for without a word, so a restore to position 5 gave 8 events. Method: a
/// store with data subjects shipping to a `file://` backup, three subjects erased after
/// position 10; `annals restore --position 5`; the two stores read side by side.
#[test]
fn a_restore_to_a_position_carries_the_later_erasures_and_says_so() {
    use annals::{BackupOptions, MasterKey, NewEvent, Options, Query, ReadOptions, Store};
    let work = tempfile::tempdir().unwrap();
    let master = new_master_key(work.path(), "master.key");
    let subjects = || {
        let key = MasterKey::from_hex(&std::fs::read_to_string(&master).unwrap()).unwrap();
        Some(annals::SubjectOptions::new(["customer:"], key))
    };
    let url = format!("file://{}", work.path().join("backup").display());
    let source_dir = work.path().join("source");
    let source = Store::open(
        &source_dir,
        Options {
            backup: Some(BackupOptions::new(&url)),
            subjects: subjects(),
            ..Options::default()
        },
    )
    .unwrap();
    for i in 1..=10u64 {
        let event =
            NewEvent::new("Moved", format!("{MARKER} {i}")).tag(format!("customer:{}", i % 4));
        source.append(&[event], None).unwrap();
    }
    for tag in ["customer:1", "customer:2", "customer:3"] {
        assert_eq!(source.erase_subject(tag).unwrap().in_backup, Some(true));
    }
    eventually("the backup to catch up", Duration::from_secs(30), || {
        source.stats().backup.unwrap().lag_positions == 0
    });
    source.close().unwrap();

    let restore = |to: &str, extra: &[&str]| -> String {
        let out = succeeds(
            annals()
                .args(["restore", "--from", &url, "--to", to, "--position", "5"])
                .args(["--subject-tags", "customer:", "--master-key-file", &master])
                .args(extra),
        );
        String::from_utf8(out).unwrap()
    };
    let restored_dir = work.path().join("restored");
    let started_us = now_us();
    let out = restore(restored_dir.to_str().unwrap(), &[]);
    assert!(out.contains("positions 1..=5)"), "{out}");
    assert!(
        out.contains("3 erasures made after position 5 carried over")
            && out.contains("appended at positions 6..=8")
            && out.contains("positions 1..=5 are the backup's, unchanged"),
        "{out}"
    );
    let json: serde_json::Value = serde_json::from_str(
        restore(work.path().join("as-json").to_str().unwrap(), &["--json"]).trim(),
    )
    .unwrap();
    assert_eq!(json["head"], 5);
    assert_eq!(json["erasures_carried_over"], 3);
    assert_eq!(json["head_with_receipts"], 8);

    let open = |dir: &Path| {
        Store::open(
            dir,
            Options {
                subjects: subjects(),
                ..Options::default()
            },
        )
        .unwrap()
    };
    let all = |store: &Store| -> Vec<annals::Event> {
        store
            .read(&Query::all(), ReadOptions::forwards())
            .unwrap()
            .map(|e| e.unwrap())
            .collect()
    };
    let (source, restored) = (open(&source_dir), open(&restored_dir));
    let (before, after) = (all(&source), all(&restored));
    assert_eq!(after.len(), 8);
    for (s, r) in before.iter().zip(&after).take(5) {
        assert_eq!(r.position(), s.position());
        assert_eq!(r.event_type(), s.event_type());
        assert_eq!(r.tags().collect::<Vec<_>>(), s.tags().collect::<Vec<_>>());
        assert_eq!(r.data(), s.data());
        assert_eq!(r.is_erased(), s.is_erased(), "{}", r.position());
        assert_eq!(r.appended_at_us(), s.appended_at_us());
    }
    assert!(after[0].is_erased() && !after[3].is_erased());
    for (r, tag) in after[5..]
        .iter()
        .zip(["customer:1", "customer:2", "customer:3"])
    {
        assert_eq!(r.event_type(), annals::SUBJECT_ERASED_TYPE);
        assert_eq!(r.tags().collect::<Vec<_>>(), [tag]);
        assert!(r.appended_at_us() >= started_us, "the restore's time");
    }
    let refused = restored.append(&[NewEvent::new("Moved", "x").tag("customer:2")], None);
    assert!(refused.is_err(), "the erasure holds in the restored store");
    source.close().unwrap();
    restored.close().unwrap();

    // Into a database: the keys go into its table, and the receipts follow within the
    // restore too.
    let Some(cluster) = annals_testkit::Cluster::start() else {
        return;
    };
    let database = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    let out = restore(&database, &[]);
    assert!(
        out.contains("3 erasures made after position 5 carried over")
            && out.contains("appended at positions 6..=8"),
        "{out}"
    );
    let on_postgres = Store::open_location(
        &database,
        Options {
            subjects: subjects(),
            ..Options::default()
        },
    )
    .unwrap();
    let events = all(&on_postgres);
    assert_eq!(events.len(), 8);
    for (r, a) in events.iter().zip(&after) {
        assert_eq!(r.event_type(), a.event_type());
        assert_eq!(r.tags().collect::<Vec<_>>(), a.tags().collect::<Vec<_>>());
        assert_eq!(r.data(), a.data());
    }
    on_postgres.close().unwrap();
}

/// Microseconds since the Unix epoch, as the store stamps appends.
fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Goal: erasing a tag no event carries is not done silently. Regression: `annals erase` of
/// a mistyped tag erased it for ever (every later append naming it refused) and said nothing
/// of it. Method: a closed store with one event of customer:1; `--dry-run` counts 1 event
/// for it and 0 for customer:9 and erases neither; erasing customer:9 is refused without
/// `--force` and done with it ("0 events"); customer:1's erasure says "1 event"; the read
/// table then marks its event erased.
#[test]
fn erasing_a_subject_no_event_carries_needs_force_and_a_dry_run_counts() {
    let keys = tempfile::tempdir().unwrap();
    let master = new_master_key(keys.path(), "master.key");
    let data = tempfile::tempdir().unwrap();
    let store = data.path().join("store");
    let run = |args: &[&str]| {
        annals()
            .args(args)
            .arg("--store")
            .arg(&store)
            .env("ANNALS_SUBJECT_TAGS", "customer:")
            .env("ANNALS_MASTER_KEY_FILE", &master)
            .output()
            .unwrap()
    };
    let stdout = |out: &std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    stdout(&run(&[
        "append",
        "--type",
        "Moved",
        "--tag",
        "customer:1",
        "--data",
        MARKER,
    ]));
    let counted = stdout(&run(&["erase", "customer:1", "--dry-run", "--json"]));
    let counted: serde_json::Value = serde_json::from_str(counted.trim()).unwrap();
    assert_eq!(counted["events"], 1);
    assert_eq!(counted["dryRun"], true);
    let unknown = stdout(&run(&["erase", "customer:9", "--dry-run"]));
    assert!(
        unknown.contains("0 events") && unknown.contains("--force"),
        "{unknown}"
    );
    let refused = run(&["erase", "customer:9"]);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("0 events") && why.contains("--force"), "{why}");
    // Nothing was erased by the dry runs or the refusal: the head is still the one event.
    let table = stdout(&run(&["read"]));
    assert_eq!(table.lines().count(), 2, "{table}");
    assert!(table.contains(MARKER), "{table}");

    let forced = stdout(&run(&["erase", "customer:9", "--force"]));
    assert!(forced.contains("0 events unreadable"), "{forced}");
    let erased = stdout(&run(&["erase", "customer:1"]));
    assert!(erased.contains("1 event unreadable"), "{erased}");
    let table = stdout(&run(&["read", "--type", "Moved"]));
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(
        row.contains("customer:1") && row.contains("erased") && !row.contains(MARKER),
        "{table}"
    );
}
