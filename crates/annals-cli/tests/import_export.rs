//! `export` and `import` between stores and servers: the same log at the same positions,
//! erased events kept erased, an interrupted import resumed, a failed one leaving nothing.

mod common;

use common::cli::{lines, ok, run, with_stdin, without_append_times};
use common::ServerProcess;

/// An export's lines compared as values: the times of appends left out, and in the receipts
/// of erasures the time of the erasure too (an import's erasures are made anew).
fn comparable(ndjson: &str) -> Vec<serde_json::Value> {
    lines(ndjson)
        .into_iter()
        .map(|mut e| {
            e.as_object_mut().unwrap().remove("appendedAt");
            if e["type"] == "annals.SubjectErased" {
                let mut body: serde_json::Value =
                    serde_json::from_str(e["data"].as_str().unwrap()).unwrap();
                body.as_object_mut().unwrap().remove("erasedAtUs");
                e["data"] = body;
            }
            e
        })
        .collect()
}

/// Goal: what `export` writes imports into an empty store as the same log, for every store:
/// erased events, data that is not UTF-8, metadata and ids, at the same positions, and the
/// erasures hold in the new store. Regression (issue 60): the export of a store with an
/// erased event held `"erased":true`, which `import` refused as an unknown field, after it
/// had made the target store, saying "(events before line 1 were imported)". Method: a
/// store with data subjects filled and erased through the command line, exported, imported
/// into a store under another master key, exported again and compared line by line (times
/// aside), and into a server the same way; then into a store without data subjects:
/// refused with the reason, leaving nothing, and with --erased-as-empty imported with the
/// erased events as ordinary ones.
#[test]
fn export_imports_back_with_erased_events_binary_data_metadata_and_ids() {
    let dir = tempfile::tempdir().unwrap();
    let key = |name: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, ok(&["master-key", "new"])).unwrap();
        path.display().to_string()
    };
    let (key_a, key_b) = (key("a.key"), key("b.key"));
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (a, b, c) = (path("a"), path("b"), path("c"));
    let with = |args: &[&str], store: &str, key: &str| -> Vec<String> {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend(
            [
                "--store",
                store,
                "--subject-tags",
                "customer:",
                "--master-key-file",
                key,
            ]
            .map(String::from),
        );
        all
    };
    let run_owned = |args: Vec<String>| -> (bool, String, String) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args)
    };
    let input = concat!(
        r#"{"type":"Registered","tags":["customer:1"],"data":{"name":"Ada"},"metadata":{"by":"web","n":[1,2]},"id":"6f1c2a1e-5d3b-4c4e-9a51-0c2d7f3b9e01"}"#,
        "\n",
        r#"{"type":"Moved","tags":["customer:1","city:paris"],"data":"rue 1"}"#,
        "\n",
        r#"{"type":"Registered","tags":["customer:2"],"data":"Bob","id":"6f1c2a1e-5d3b-4c4e-9a51-0c2d7f3b9e02"}"#,
        "\n",
        r#"{"type":"Blob","tags":["customer:2"],"data":"/wBhgA==","dataEncoding":"base64","metadata":{"k":"v"}}"#,
        "\n",
        r#"{"type":"Blob","data":"AP8=","dataEncoding":"base64","metadata":"AAH/","metadataEncoding":"base64"}"#,
        "\n",
        r#"{"type":"Noted","data":"plain","metadata":"just text"}"#,
        "\n",
    );
    let append = with(&["append"], &a, &key_a);
    let append: Vec<&str> = append.iter().map(String::as_str).collect();
    assert_eq!(with_stdin(&append, input).trim(), r#"{"position":6}"#);
    let erase = |tag: &str| {
        let (success, _, stderr) = run_owned(with(&["erase", tag, "--force"], &a, &key_a));
        assert!(success, "{stderr}");
    };
    erase("customer:1");
    assert_eq!(
        with_stdin(
            &append,
            r#"{"type":"Moved","tags":["customer:2"],"data":"rue 2"}"#
        )
        .trim(),
        r#"{"position":8}"#
    );
    // A subject without events erased: a receipt that follows no erased event.
    erase("customer:3");
    let (success, exported, stderr) = run_owned(with(&["export"], &a, &key_a));
    assert!(success, "{stderr}");
    let source = lines(&exported);
    assert_eq!(source.len(), 9);
    assert_eq!(source[0]["erased"], true);
    assert_eq!(source[1]["erased"], true);
    assert_eq!(source[3]["dataEncoding"], "base64");
    assert_eq!(source[4]["data"], "AP8=");
    // Metadata that is not JSON (bytes 00 01 ff) travels as base64 too.
    assert_eq!(source[4]["metadata"], "AAH/");
    assert_eq!(source[4]["metadataEncoding"], "base64");
    let file = dir.path().join("events.ndjson");
    std::fs::write(&file, &exported).unwrap();
    let file = file.to_str().unwrap();

    // Into a store with data subjects: the same log, the erasures made anew at their
    // receipts' positions.
    let (success, _, stderr) = run_owned(with(&["import", file], &b, &key_b));
    assert!(success, "{stderr}");
    assert!(stderr.contains("imported 7 events"), "{stderr}");
    assert!(
        stderr.contains("2 subjects erased, their receipts at positions 7, 9"),
        "{stderr}"
    );
    let (success, again, stderr) = run_owned(with(&["export"], &b, &key_b));
    assert!(success, "{stderr}");
    assert_eq!(comparable(&again), comparable(&exported));
    for (line, source_line) in again.lines().zip(exported.lines()) {
        if !line.contains("annals.SubjectErased") {
            assert_eq!(
                without_append_times(line),
                without_append_times(source_line),
                "byte for byte"
            );
        }
    }
    let (success, _, stderr) = run_owned(with(
        &[
            "append",
            "--type",
            "Moved",
            "--tag",
            "customer:1",
            "--data",
            "x",
        ],
        &b,
        &key_b,
    ));
    assert!(!success, "the erasure holds in the imported store");
    assert!(stderr.contains("erased"), "{stderr}");

    // Into a running server with data subjects: the same, data that is not UTF-8 sent as
    // base64 and the erasures made through its admin route.
    let served = dir.path().join("served");
    let server = ServerProcess::start(
        &served,
        &["--subject-tags", "customer:", "--master-key-file", &key_b],
    );
    let url = format!("http://{}", server.http);
    let (success, _, stderr) = run(&["import", file, "--url", &url]);
    assert!(success, "{stderr}");
    assert_eq!(
        comparable(&ok(&["export", "--url", &url])),
        comparable(&exported)
    );
    drop(server);

    // Into a store without data subjects: refused at the first erased event, nothing left.
    let (success, _, stderr) = run(&["import", file, "--store", &c]);
    assert!(!success);
    assert!(
        stderr.contains("line 1 is an erased event")
            && stderr.contains("--erased-as-empty")
            && stderr.contains("nothing was imported"),
        "{stderr}"
    );
    assert!(
        !std::path::Path::new(&c).exists(),
        "no store is left behind"
    );
    // With --erased-as-empty: the same positions, erased events with no data, receipts as
    // ordinary events.
    let (success, _, stderr) = run(&["import", file, "--store", &c, "--erased-as-empty"]);
    assert!(success, "{stderr}");
    let plain = lines(&ok(&["export", "--store", &c]));
    assert_eq!(plain.len(), source.len());
    for (i, (p, s)) in plain.iter().zip(&source).enumerate() {
        assert_eq!(p["position"], s["position"], "{i}");
        assert_eq!(p["type"], s["type"], "{i}");
        assert_eq!(p["tags"], s["tags"], "{i}");
        assert_eq!(p["id"], s["id"], "{i}");
        assert!(p.get("erased").is_none(), "{i}");
        assert_eq!(p["data"], s["data"], "{i}");
    }
}

/// Goal: an import stopped part way resumes when run again: the lines the store holds at
/// their positions are found there and skipped, the rest appended, no event twice, and the
/// failed run's message says truly what the store holds. A store holding other events, and a
/// file that skips a position, are refused with a word on --new-positions, which appends
/// after the store's events. Method: an export of 10 events whose line 7 is damaged,
/// imported in batches of 2 (lines 1..=6 go in, line 7 stops it), then the whole file
/// imported again, and once more.
#[test]
fn an_interrupted_import_resumes_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (a, b, c, d) = (path("a"), path("b"), path("c"), path("d"));
    let input: String = (1..=10)
        .map(|i| {
            format!(
                "{{\"type\":\"Counted\",\"tags\":[\"n:{}\"],\"data\":{{\"n\":{i}}}}}\n",
                i % 3
            )
        })
        .collect();
    with_stdin(&["append", "--store", &a], &input);
    let exported = ok(&["export", "--store", &a]);
    let file = |name: &str, lines: Vec<&str>| -> String {
        let path = dir.path().join(name);
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        path.display().to_string()
    };
    let whole = file("whole.ndjson", exported.lines().collect());
    let mut damaged: Vec<&str> = exported.lines().collect();
    damaged[6] = r#"{"type":"#;
    let damaged = file("damaged.ndjson", damaged);

    let (success, _, stderr) = run(&["import", &damaged, "--store", &b, "--batch", "2"]);
    assert!(!success);
    assert!(
        stderr.contains("line 7:")
            && stderr.contains("the store holds the file's lines through line 6")
            && stderr.contains("6 appended at positions 1..=6")
            && stderr.contains("run the same import again"),
        "{stderr}"
    );
    assert_eq!(lines(&ok(&["export", "--store", &b])).len(), 6);
    let (success, _, stderr) = run(&["import", &whole, "--store", &b, "--batch", "2"]);
    assert!(success, "{stderr}");
    assert!(
        stderr.contains("imported 4 events")
            && stderr.contains("positions 7..=10")
            && stderr.contains("6 lines found in the store already"),
        "{stderr}"
    );
    let imported = ok(&["export", "--store", &b]);
    assert_eq!(
        without_append_times(&imported),
        without_append_times(&exported)
    );
    let (success, _, stderr) = run(&["import", &whole, "--store", &b]);
    assert!(success, "{stderr}");
    assert!(
        stderr.contains("imported 0 events") && stderr.contains("10 lines found"),
        "{stderr}"
    );
    assert_eq!(ok(&["export", "--store", &b]), imported, "nothing twice");

    // A store holding other events: refused, unchanged; --new-positions appends after them.
    ok(&["append", "--store", &c, "--type", "Other", "--data", "x"]);
    let (success, _, stderr) = run(&["import", &whole, "--store", &c]);
    assert!(!success);
    assert!(
        stderr.contains("line 1 is not the store's event at position 1")
            && stderr.contains("--new-positions"),
        "{stderr}"
    );
    assert_eq!(lines(&ok(&["export", "--store", &c])).len(), 1);
    let (success, _, stderr) = run(&["import", &whole, "--store", &c, "--new-positions"]);
    assert!(success, "{stderr}");
    assert!(stderr.contains("positions 2..=11"), "{stderr}");

    // A file that skips a position (as an export of a query does).
    let mut gap: Vec<&str> = exported.lines().collect();
    gap.remove(3);
    let gap = file("gap.ndjson", gap);
    let (success, _, stderr) = run(&["import", &gap, "--store", &d]);
    assert!(!success);
    assert!(
        stderr.contains("line 4: position 5 follows position 3")
            && stderr.contains("--new-positions")
            && stderr.contains("nothing was imported"),
        "{stderr}"
    );
    let (success, _, stderr) = run(&["import", &gap, "--store", &d, "--new-positions"]);
    assert!(success, "{stderr}");
    assert_eq!(lines(&ok(&["export", "--store", &d])).len(), 9);
}

/// Goal: a failed import leaves no new store behind, and its message is true about what was
/// imported. Regression (issue 60): the store was made before the first line was read, so a
/// file that was not events left an empty store (a directory with its files), and the
/// message said "(events before line 1 were imported)". Method: a file whose first line is
/// not an event, and one whose third is not, imported into a directory that does not exist,
/// into an empty one, and (its lines without positions, appended after the store's events)
/// into a store that holds events.
#[test]
fn a_failed_import_leaves_no_store_and_says_what_it_imported() {
    let dir = tempfile::tempdir().unwrap();
    let bad_first = dir.path().join("bad-first.ndjson");
    std::fs::write(&bad_first, "not an event\n").unwrap();
    let bad_third = dir.path().join("bad-third.ndjson");
    std::fs::write(
        &bad_third,
        "{\"type\":\"A\",\"data\":\"1\"}\n{\"type\":\"A\",\"data\":\"2\"}\n{\"type\":\n",
    )
    .unwrap();
    let absent = dir.path().join("absent");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for file in [&bad_first, &bad_third] {
        for target in [&absent, &empty] {
            let (success, _, stderr) = run(&[
                "import",
                file.to_str().unwrap(),
                "--store",
                target.to_str().unwrap(),
            ]);
            assert!(!success);
            assert!(stderr.contains("nothing was imported"), "{stderr}");
            assert!(!stderr.contains("were imported"), "{stderr}");
        }
        assert!(!absent.exists(), "{}", file.display());
        assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
    }
    // A store that held events before stays, with them.
    let held = dir.path().join("held");
    let held = held.to_str().unwrap();
    ok(&["append", "--store", held, "--type", "A", "--data", "1"]);
    let (success, _, stderr) = run(&[
        "import",
        bad_third.to_str().unwrap(),
        "--store",
        held,
        "--batch",
        "1",
    ]);
    assert!(!success);
    assert!(
        stderr.contains("line 3:")
            && stderr.contains("through line 2 (2 appended at positions 2..=3)"),
        "{stderr}"
    );
    assert_eq!(lines(&ok(&["export", "--store", held])).len(), 3);
}
