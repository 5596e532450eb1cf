//! Goal: event schemas through `annals serve`: appends over HTTP and gRPC (UmaDB's Rust client)
//! judged against their type's newest version, refused whole with one error per fault; a new
//! version checked against the stored events; the registry carried across a restart, loaded
//! from the configuration, and carried by a copy, a restore and a replica; bad registrations
//! get clear errors and change nothing.

mod common;

use common::cli::{ok, run, run_with_stdin};
use common::{append_body, request, Response, ServerProcess, Stream};
use serde_json::{json, Value};

fn register(server: &ServerProcess, event_type: &str, body: Value) -> Response {
    server.post(
        &format!("/v1/admin/schemas/{event_type}"),
        &body.to_string(),
    )
}

fn put(server: &ServerProcess, path: &str, body: Value) -> Response {
    request(
        server.http,
        "PUT",
        path,
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
}

fn opened(id: &str) -> String {
    append_body(&[("Opened", &["account:1"], id)], None)
}

/// `{"id": <integer>}` required; `owner` a string when given.
fn loose() -> Value {
    json!({
        "type": "object",
        "required": ["id"],
        "properties": {"id": {"type": "integer"}, "owner": {"type": "string"}}
    })
}

/// Goal: over HTTP, a version that stored events break is refused (409) naming them; a dry
/// run registers nothing; a version they fit is registered (201, then 200 unchanged); an
/// append with a bad event is refused whole (422) naming its index, type, version and paths;
/// the list, a type and the version an event was checked against are shown, on reads and
/// subscriptions too; warn stores and counts, off checks nothing; types without a schema can
/// be refused. Method: one server,
/// each step's answer and the head checked.
#[test]
fn http_appends_are_judged_and_versions_checked_against_history() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"), &[]);
    for i in 0..20 {
        server.append(&opened(&format!(r#"{{"id":{i},"owner":"o{i}"}}"#)));
    }
    let lacking = server.append(&opened(r#"{"id":20}"#))["position"]
        .as_u64()
        .unwrap();
    let strict = json!({"type": "object", "required": ["id", "owner"]});
    let refused = register(&server, "Opened", json!({ "schema": strict }));
    assert_eq!(refused.status, 409, "{}", refused.text());
    let answer = refused.json();
    assert_eq!(answer["kind"], "history_violation");
    assert_eq!(answer["violations"][0]["position"], lacking);
    assert_eq!(answer["violations"][0]["schemaPath"], "/required");
    let head = server.head();
    let dry = register(
        &server,
        "Opened",
        json!({"schema": loose(), "dryRun": true}),
    );
    assert_eq!(dry.status, 200, "{}", dry.text());
    assert_eq!(dry.json()["checkedEvents"], 21);
    // The same as NDJSON: progress, then the outcome (here the refusal of the strict one).
    let streamed = request(
        server.http,
        "POST",
        "/v1/admin/schemas/Opened",
        &[
            ("content-type", "application/json"),
            ("accept", "application/x-ndjson"),
        ],
        json!({ "schema": strict }).to_string().as_bytes(),
    );
    assert_eq!(streamed.status, 200, "{}", streamed.text());
    let lines: Vec<Value> = streamed
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["progress"]["checked"], 21, "{lines:?}");
    let outcome = &lines[lines.len() - 1]["error"];
    assert_eq!(
        (outcome["status"].as_u64(), outcome["kind"].as_str()),
        (Some(409), Some("history_violation"))
    );
    assert_eq!(outcome["violations"][0]["position"], lacking);
    assert_eq!(server.head(), head, "a dry run appends nothing");
    let made = register(&server, "Opened", json!({ "schema": loose() }));
    assert_eq!(made.status, 201, "{}", made.text());
    assert_eq!(made.json()["version"], 1);
    let again = register(&server, "Opened", json!({ "schema": loose() }));
    assert_eq!(
        (again.status, again.json()["unchanged"].clone()),
        (200, json!(true))
    );

    // Appends judged: one bad event refuses the whole append.
    let fit = server.append(&opened(r#"{"id":21}"#))["position"]
        .as_u64()
        .unwrap();
    let head = server.head();
    let body = append_body(
        &[
            ("Opened", &[], r#"{"id":22}"#),
            ("Opened", &[], r#"{"id":"x","owner":5}"#),
            ("Other", &[], "anything"),
        ],
        None,
    );
    let refused = server.post("/v1/append", &body);
    assert_eq!(refused.status, 422, "{}", refused.text());
    let answer = refused.json();
    assert_eq!(answer["kind"], "schema_violation");
    let violations = answer["violations"].as_array().unwrap();
    assert_eq!(violations.len(), 2, "{answer}");
    for (v, path) in violations.iter().zip(["/id", "/owner"]) {
        assert_eq!(
            (v["index"].as_u64(), v["type"].as_str()),
            (Some(1), Some("Opened"))
        );
        assert_eq!(v["version"], 1);
        assert_eq!(v["instancePath"], path);
        assert_eq!(v["schemaPath"], format!("/properties{}/type", path));
    }
    assert!(answer["error"]
        .as_str()
        .unwrap()
        .contains("event 1 (Opened v1) at /id"));
    assert_eq!(server.head(), head, "nothing of a refused append is stored");

    // What is shown.
    let list = server.get("/v1/schemas").json();
    assert_eq!(list["unknownTypes"], "allow");
    assert_eq!(list["types"][0]["type"], "Opened");
    assert_eq!(list["types"][0]["enforcement"], "reject");
    assert!(list["types"][0]["versions"][0].get("schema").is_none());
    let shown = server
        .get(&format!("/v1/schemas/Opened?position={fit}"))
        .json();
    assert_eq!(shown["versions"][0]["schema"], loose());
    assert_eq!(
        shown["checkedAgainst"],
        json!({"version": 1, "enforcement": "reject"})
    );
    assert_eq!(
        server.get("/v1/schemas/Opened?position=1").json()["checkedAgainst"],
        Value::Null
    );
    assert_eq!(server.get("/v1/schemas/Nothing").status, 404);

    // Warn stores and counts; off checks nothing; reject again refuses.
    let set = |e: &str| {
        put(
            &server,
            "/v1/admin/schemas/Opened/enforcement",
            json!({"enforcement": e}),
        )
    };
    assert_eq!(set("warn").status, 200);
    let warned = server.append(&opened(r#"{"id":"warned"}"#))["position"]
        .as_u64()
        .unwrap();
    let metrics = server.get("/metrics").text();
    assert_eq!(
        annals_testkit::server::sample(&metrics, r#"annals_schema_checks_total{outcome="warned"}"#),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(set("off").status, 200);
    let unchecked = server.append(&opened("not json"))["position"]
        .as_u64()
        .unwrap();
    assert_eq!(set("reject").status, 200);
    assert_eq!(server.post("/v1/append", &opened("not json")).status, 422);
    let newest = server.append(&opened(r#"{"id":23}"#))["position"]
        .as_u64()
        .unwrap();

    // A reader tells what each event was checked against: on reads and on subscriptions.
    let expected = |p: u64| match p {
        p if p == fit || p == newest => json!({"version": 1, "enforcement": "reject"}),
        p if p == warned => json!({"version": 1, "enforcement": "warn"}),
        _ => Value::Null,
    };
    let read = server.read(r#"{"items":[{"types":["Opened"]}]}"#, "{}");
    assert_eq!(read.len(), 25, "{read:?}");
    for event in &read {
        let p = event["position"].as_u64().unwrap();
        assert_eq!(event["schema"], expected(p), "{event}");
    }
    assert!(read.iter().any(|e| e["position"] == unchecked));
    let mut live = Stream::open(server.http, "/v1/subscribe?after=0", &[]);
    let mut streamed = 0;
    while streamed < newest {
        let event: Value = serde_json::from_str(&live.next_line().unwrap()).unwrap();
        let p = event["position"].as_u64().unwrap();
        if event["type"] == "Opened" {
            assert_eq!(event["schema"], expected(p), "{event}");
        } else {
            assert_eq!(event["schema"], Value::Null, "{event}");
        }
        streamed = p;
    }
    // The event asked about must be of the type named, and stored.
    let other = server.append(&append_body(&[("Other", &[], "x")], None))["position"]
        .as_u64()
        .unwrap();
    let wrong = server.get(&format!("/v1/schemas/Opened?position={other}"));
    assert_eq!(
        (wrong.status, wrong.json()["kind"].clone()),
        (404, json!("other_type")),
        "{}",
        wrong.text()
    );
    let beyond = server.get(&format!("/v1/schemas/Opened?position={}", newest + 100));
    assert_eq!(
        (beyond.status, beyond.json()["kind"].clone()),
        (404, json!("no_event"))
    );

    // Types without a schema, refused and allowed again.
    let policy = |p: &str| {
        put(
            &server,
            "/v1/admin/schema-policy",
            json!({"unknownTypes": p}),
        )
    };
    assert_eq!(policy("refuse").status, 200);
    let unknown = server.post("/v1/append", &append_body(&[("Other", &[], "x")], None));
    assert_eq!(unknown.status, 422, "{}", unknown.text());
    assert_eq!(unknown.json()["violations"][0]["version"], 0);
    assert_eq!(policy("allow").status, 200);
    server.append(&append_body(&[("Other", &[], "x")], None));
}

/// Goal: bad registrations get a clear error and change nothing: a schema that is not a JSON
/// Schema, an unknown draft, a reference outside it, a huge schema, a reserved type, unknown
/// fields, an enforcement on a type without a schema, a client's event of the registry's
/// types; of two registrations of the same version at once exactly one wins. Method: each
/// request's status and kind, the head before and after.
#[test]
fn bad_registrations_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"), &[]);
    let head = server.head();
    let huge: serde_json::Map<String, Value> = (0..4000)
        .map(|i| (format!("property_{i}"), json!({"type": "string"})))
        .collect();
    let cases = [
        ("T", json!({"schema": {"type": 12}}), 400, "invalid_schema"),
        ("T", json!({"schema": [1, 2]}), 400, "invalid_schema"),
        (
            "T",
            json!({"schema": {"$schema": "http://json-schema.org/draft-04/schema#"}}),
            400,
            "unknown_draft",
        ),
        (
            "T",
            json!({"schema": {"$ref": "https://example.com/s.json"}}),
            400,
            "invalid_schema",
        ),
        (
            "T",
            json!({"schema": {"properties": huge}}),
            413,
            "schema_too_large",
        ),
        (
            "annals.SchemaVersion",
            json!({"schema": {}}),
            400,
            "invalid_type",
        ),
        ("T", json!({"schema": {}, "extra": 1}), 400, "invalid_body"),
        (
            "T",
            json!({"schema": {}, "check": "sometimes"}),
            400,
            "invalid_body",
        ),
    ];
    for (event_type, body, status, kind) in cases {
        let r = register(&server, event_type, body.clone());
        assert_eq!(r.status, status, "{body}: {}", r.text());
        assert_eq!(r.json()["kind"], kind, "{body}");
        assert!(!r.json()["error"].as_str().unwrap().is_empty());
    }
    let r = put(
        &server,
        "/v1/admin/schemas/T/enforcement",
        json!({"enforcement": "warn"}),
    );
    assert_eq!(
        (r.status, r.json()["kind"].clone()),
        (404, json!("schema_not_found"))
    );
    let r = server.post(
        "/v1/append",
        &append_body(&[("annals.SchemaVersion", &[], "{}")], None),
    );
    assert_eq!(
        (r.status, r.json()["kind"].clone()),
        (400, json!("reserved_type"))
    );
    assert_eq!(server.head(), head, "nothing appended");
    assert_eq!(server.get("/v1/schemas").json()["types"], json!([]));

    // Two registrations of version 1 at once: one wins, the other is told the newest.
    let addr = server.http;
    let outcomes: Vec<(u16, Value)> = ["a", "b"]
        .map(|title| {
            std::thread::spawn(move || {
                let schema = json!({"type": "object", "title": title});
                let body = json!({"schema": schema, "version": 1}).to_string();
                let headers = [("content-type", "application/json")];
                let r = request(
                    addr,
                    "POST",
                    "/v1/admin/schemas/Raced",
                    &headers,
                    body.as_bytes(),
                );
                (r.status, r.json())
            })
        })
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let statuses: Vec<u16> = outcomes.iter().map(|(s, _)| *s).collect();
    assert!(
        statuses.contains(&201) && statuses.contains(&409),
        "{outcomes:?}"
    );
    let lost = outcomes.iter().find(|(s, _)| *s == 409).unwrap();
    assert_eq!(lost.1["kind"], "version_taken");
    let shown = server.get("/v1/schemas/Raced").json();
    assert_eq!(shown["versions"].as_array().unwrap().len(), 1);
}

/// Goal: UmaDB's Rust client sees a schema violation as a clear error naming the event, the
/// version and the path, and the append stores nothing. Method: a schema registered over HTTP,
/// appends through the client.
#[test]
fn the_umadb_rust_client_gets_a_clear_error() {
    use umadb_client::UmaDbClient;
    use umadb_dcb::{DcbEvent, DcbEventStoreSync};
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"), &[]);
    assert_eq!(
        register(&server, "Opened", json!({ "schema": loose() })).status,
        201
    );
    let client = UmaDbClient::new(server.grpc_url()).connect().unwrap();
    let event = |data: &str| DcbEvent {
        event_type: "Opened".into(),
        tags: vec!["account:1".into()],
        data: data.as_bytes().to_vec(),
        uuid: None,
        metadata: Vec::new(),
    };
    let head = client.head().unwrap();
    let refused = client
        .append(
            vec![event(r#"{"id":1}"#), event(r#"{"id":"x"}"#)],
            None,
            None,
        )
        .unwrap_err();
    let message = refused.to_string();
    assert!(
        message.contains("event 1 (Opened v1) at /id"),
        "{message} ({refused:?})"
    );
    assert!(
        !matches!(refused, umadb_dcb::DcbError::IntegrityError(_)),
        "{refused:?}"
    );
    assert_eq!(client.head().unwrap(), head);
    assert!(client
        .append(vec![event(r#"{"id":2}"#)], None, None)
        .is_ok());
}

/// Goal: the registry is in the log: a restart keeps it; the configuration registers its
/// schemas at start once (the same file again registers nothing), and a start whose new schema
/// the stored events break fails saying why; `annals copy` and `annals restore` of a backup
/// carry it, and a replica of that backup shows it. Method: servers started and stopped over
/// one data directory, a backup in a local directory, each copy served and tried.
#[test]
fn the_registry_travels_with_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let schema_file = dir.path().join("opened.json");
    std::fs::write(&schema_file, loose().to_string()).unwrap();
    let config = dir.path().join("annals.toml");
    std::fs::write(
        &config,
        format!(
            "[[schemas]]\ntype = \"Opened\"\nfile = {:?}\n",
            schema_file.display().to_string()
        ),
    )
    .unwrap();
    let backup = format!("file://{}", dir.path().join("backup").display());
    let flags = ["--config", config.to_str().unwrap(), "--backup", &backup];
    let mut server = ServerProcess::start(&data, &flags);
    server.append(&opened(r#"{"id":1}"#));
    let registered = server.get("/v1/schemas/Opened").json();
    assert_eq!(registered["versions"].as_array().unwrap().len(), 1);
    assert_eq!(server.post("/v1/append", &opened("{}")).status, 422);
    assert!(server.terminate().success());

    // Restarted with the same file: nothing new registered.
    let mut server = ServerProcess::start(&data, &flags);
    assert_eq!(server.get("/v1/schemas/Opened").json(), registered);
    // A replica of its backup shows the same registry.
    let replica = ServerProcess::launch_with(&["--replica-of", &backup], &[]);
    let mut seen = Value::Null;
    for _ in 0..100 {
        seen = replica.get("/v1/schemas/Opened").json();
        if seen == registered {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(seen, registered, "the replica carries the registry");
    // It takes no registration, refused before it reads the history; a dry run it answers.
    let schema = json!({"required": ["id"]});
    let refused = replica.post(
        "/v1/admin/schemas/Opened",
        &json!({ "schema": schema }).to_string(),
    );
    assert_eq!(refused.kind(), "read_only_replica", "{}", refused.text());
    let dry = json!({ "schema": schema, "dryRun": true }).to_string();
    let answered = replica.post("/v1/admin/schemas/Opened", &dry);
    assert_eq!(answered.status, 200, "{}", answered.text());
    drop(replica);
    assert!(server.terminate().success());

    // A new file the stored events break: the start fails, naming why.
    std::fs::write(
        &schema_file,
        json!({"required": ["id", "owner"]}).to_string(),
    )
    .unwrap();
    let (started, _, stderr) = run(&[
        "serve",
        "--store",
        data.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--grpc",
        "off",
    ]);
    assert!(!started, "a start with a schema its events break fails");
    assert!(
        stderr.contains("Opened") && stderr.contains("position"),
        "{stderr}"
    );

    // Without the configuration the registry still holds; a copy and a restore carry it.
    let copied = dir.path().join("copied");
    ok(&[
        "copy",
        "--from",
        data.to_str().unwrap(),
        "--to",
        copied.to_str().unwrap(),
    ]);
    let restored = dir.path().join("restored");
    ok(&[
        "restore",
        "--from",
        &backup,
        "--to",
        restored.to_str().unwrap(),
    ]);
    for place in [&data, &copied, &restored] {
        let server = ServerProcess::start(place, &[]);
        assert_eq!(
            server.get("/v1/schemas/Opened").json(),
            registered,
            "{place:?}"
        );
        let refused = server.post("/v1/append", &opened(r#"{"id":"x"}"#));
        assert_eq!(refused.status, 422, "{place:?}: {}", refused.text());
    }
}

/// Goal: `annals schema` on a server and on a closed store: `check` registers nothing, `put`
/// registers (and names the stored events a version breaks), `list` and `show` print them,
/// `enforce` changes the enforcement; an append through the command line on a closed store is
/// judged as the server judges it; an import into a server of an export holding the registry's
/// events is refused, saying what to do, and one into a closed store carries them, with the
/// events a server's export says were checked. Method:
/// the binary run against both.
#[test]
fn the_command_line_manages_schemas_on_a_server_and_a_closed_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("opened.json");
    std::fs::write(&file, loose().to_string()).unwrap();
    let file = file.to_str().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"), &[]);
    server.append(&opened(r#"{"id":"odd"}"#));
    let url = format!("http://{}", server.http);
    let (done, _, stderr) = run(&["schema", "put", "Opened", file, "--url", &url]);
    assert!(!done && stderr.contains("position 1 at /id"), "{stderr}");
    assert!(
        stderr.contains("checked 1 events of Opened (1 fail)"),
        "progress: {stderr}"
    );
    let (done, _, _) = run(&["schema", "put", "Other", file, "--url", &url]);
    assert!(done);
    let out = ok(&["schema", "check", "Other", file, "--url", &url]);
    assert!(out.contains("nothing was registered"), "{out}");
    let out = ok(&["schema", "list", "--url", &url]);
    assert!(out.contains("Other  1 versions"), "{out}");
    let shown: Value =
        serde_json::from_str(&ok(&["schema", "show", "Other", "--url", &url])).unwrap();
    assert_eq!(shown["versions"][0]["schema"], loose());
    ok(&["schema", "enforce", "Other", "warn", "--url", &url]);
    assert_eq!(
        server.get("/v1/schemas/Other").json()["enforcement"],
        "warn"
    );
    server.append(&append_body(&[("Other", &[], r#"{"id":2}"#)], None));
    let export = dir.path().join("export.ndjson");
    ok(&["export", "--url", &url, "-o", export.to_str().unwrap()]);
    drop(server);
    let lines = std::fs::read_to_string(&export).unwrap();
    let checked = lines.lines().last().unwrap();
    assert!(
        checked.contains(r#""schema":{"version":1,"enforcement":"warn"}"#),
        "a server's export says what each event was checked against: {checked}"
    );

    // The same on a closed store.
    let store = dir.path().join("closed");
    let store = store.to_str().unwrap();
    {
        // A server takes no registry event from a client: a file's are found before anything
        // is imported; standard input, read once, stops at the first.
        let other = ServerProcess::start(&dir.path().join("other"), &[]);
        let other_url = format!("http://{}", other.http);
        let (imported, _, stderr) = run(&[
            "import",
            "--url",
            &other_url,
            "--batch",
            "1",
            export.to_str().unwrap(),
        ]);
        assert!(!imported, "{stderr}");
        assert!(
            stderr.contains("line 2 holds an event of the schema registry")
                && stderr.contains("nothing was imported"),
            "{stderr}"
        );
        assert_eq!(other.get("/v1/head").json()["head"], 0);
        let (imported, _, stderr) = run_with_stdin(
            &["import", "--url", &other_url, "--batch", "1", "-"],
            &lines,
        );
        assert!(!imported && stderr.contains("line 2 holds"), "{stderr}");
        assert!(
            stderr.contains("through line 1") && !stderr.contains("run the same import again"),
            "the same import run again meets the same line: {stderr}"
        );
        assert_eq!(other.get("/v1/head").json()["head"], 1);
        // At new positions a store opened here cannot carry them either: nothing is made.
        let fresh = dir.path().join("fresh");
        let (imported, _, stderr) = run(&[
            "import",
            "--store",
            fresh.to_str().unwrap(),
            "--new-positions",
            export.to_str().unwrap(),
        ]);
        assert!(
            !imported && stderr.contains("line 2 holds") && !fresh.exists(),
            "{stderr}"
        );
    }
    // An import takes the export as it is (what each event was checked against included).
    ok(&["import", "--store", store, export.to_str().unwrap()]);
    {
        // Into a server that holds them, a file's registry lines are compared, not refused.
        let holding = ServerProcess::start(std::path::Path::new(store), &[]);
        let url = format!("http://{}", holding.http);
        let (imported, _, stderr) = run(&["import", "--url", &url, export.to_str().unwrap()]);
        assert!(
            imported && stderr.contains("found in the store already"),
            "{stderr}"
        );
    }
    let imported = ok(&["export", "--store", store]);
    assert!(imported.contains(r#""data":"{\"id\":2}""#), "{imported}");
    let out = ok(&["schema", "list", "--store", store]);
    assert!(
        out.contains("Other  1 versions") && out.contains("enforcement warn"),
        "{out}"
    );
    ok(&["schema", "enforce", "Other", "reject", "--store", store]);
    let (appended, _, stderr) = run(&[
        "append", "--store", store, "--type", "Other", "--data", "{}",
    ]);
    assert!(!appended && stderr.contains("Other v1"), "{stderr}");
    ok(&[
        "append",
        "--store",
        store,
        "--type",
        "Other",
        "--data",
        r#"{"id":3}"#,
    ]);
}

/// Goal: the schema settings hold whatever a later start is told: `schema_unknown_types` set
/// at one start stays in the log when a later start leaves it out, and changes when one gives
/// another value; a misspelt value and a schema file that is not there stop the start, saying
/// which. Method: four starts of one data directory, an append of a type without a schema at
/// each; two starts that must fail.
#[test]
fn schema_settings_hold_across_starts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let unknown = || append_body(&[("Unregistered", &[], "{}")], None);
    let start = |value: Option<&str>| match value {
        Some(v) => ServerProcess::start_with_env(&data, &[], &[("ANNALS_SCHEMA_UNKNOWN_TYPES", v)]),
        None => ServerProcess::start(&data, &[]),
    };
    let server = start(Some("refuse"));
    assert_eq!(server.post("/v1/append", &unknown()).status, 422);
    drop(server);
    let server = start(None);
    assert_eq!(
        server.post("/v1/append", &unknown()).status,
        422,
        "kept in the log"
    );
    drop(server);
    let server = start(Some("allow"));
    assert_eq!(server.post("/v1/append", &unknown()).status, 200);
    drop(server);
    let args = [
        "serve",
        "--store",
        data.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--grpc",
        "off",
    ];
    let out = common::cli::annals()
        .args(args)
        .env("ANNALS_SCHEMA_UNKNOWN_TYPES", "refuze")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("refuze"),
        "{stderr}"
    );
    let config = dir.path().join("annals.toml");
    std::fs::write(
        &config,
        "[[schemas]]\ntype = \"Opened\"\nfile = \"no-such-schema.json\"\n",
    )
    .unwrap();
    let (started, _, stderr) = run(&[&args[..], &["--config", config.to_str().unwrap()]].concat());
    assert!(
        !started && stderr.contains("no-such-schema.json"),
        "{stderr}"
    );
    let server = start(None);
    assert_eq!(
        server.post("/v1/append", &unknown()).status,
        200,
        "nothing changed"
    );
}
