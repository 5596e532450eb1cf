//! The benchmarks' JSON contract: each prints, as its last line, one JSON object with the
//! fields its users read.

use std::process::Command;

fn bench() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_annals-bench"));
    // The server the HTTP benchmark starts: the workspace's `annals`, built beside this one.
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_annals-bench"));
    command.env("ANNALS_BIN", exe.with_file_name("annals"));
    command
}

/// Runs a command, requires success (showing its stderr otherwise), and returns its stdout.
fn stdout_of(command: &mut Command) -> Vec<u8> {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Goal: every benchmark's help says what it measures and gives an example.
#[test]
fn every_benchmark_has_help_with_an_example() {
    for name in [
        "append", "read", "recover", "fsync", "http", "decide", "exchange", "umadb", "schema",
        "image", "traces",
    ] {
        let out = stdout_of(bench().args([name, "--help"]));
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.contains("Example"),
            "{name} --help lacks an example:\n{out}"
        );
    }
}

/// Goal: `annals-bench append` prints, as its last line, one JSON object with the fields the issue
/// names. Method: a tiny D3 run on a temporary directory.
#[test]
fn bench_append_json_contract() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = stdout_of(
        bench()
            .args([
                "append",
                "--writers",
                "4",
                "--batch",
                "2",
                "--events",
                "400",
                "--conditional",
            ])
            .arg("--dir")
            .arg(dir.path()),
    );
    let stdout = String::from_utf8(stdout).unwrap();
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for field in [
        "workload",
        "writers",
        "batch",
        "events",
        "event_bytes",
        "durability",
        "events_per_sec",
        "appends_per_sec",
        "latency_us",
        "fsyncs",
        "events_per_fsync",
        "fsync_floor_per_sec",
    ] {
        assert!(!last[field].is_null(), "missing {field} in {last}");
    }
    for p in ["p50", "p90", "p99", "p999", "max"] {
        assert!(last["latency_us"][p].is_u64(), "latency_us.{p}");
    }
    assert_eq!(last["durability"], "d3");
    assert_eq!(last["events"], 400);
    assert!(last["fsyncs"].as_u64().unwrap() > 0);
}

/// Goal: `annals-bench http` starts its own server, drives every workload over HTTP and gRPC,
/// and prints the JSON contract as its last line: requests_per_sec, errors and latency_ms
/// {p50, p90, p99, max} per operation, with the fsync floor of the same directory.
#[test]
fn bench_http_json_contract() {
    let dir = tempfile::tempdir().unwrap();
    // gRPC with several calls in flight on each connection (HTTP/2 streams).
    for (protocol, workload, streams) in [("http", "mixed", "1"), ("grpc", "mixed", "4")] {
        let stdout = stdout_of(
            bench()
                .args(["http", "--connections", "4", "--seconds", "0.5"])
                .args(["--streams", streams])
                .args([
                    "--preload",
                    "2000",
                    "--protocol",
                    protocol,
                    "--workload",
                    workload,
                ])
                .arg("--dir")
                .arg(dir.path().join(protocol)),
        );
        let stdout = String::from_utf8(stdout).unwrap();
        let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(last["protocol"], protocol);
        assert_eq!(last["errors"], 0, "{last}");
        assert_eq!(last["conflicts"], 0, "condition keys are unique: {last}");
        assert_eq!(last["durability"], "d3");
        assert!(last["requests_per_sec"].as_f64().unwrap() > 0.0);
        assert!(last["fsync_floor_per_sec"].as_f64().unwrap() > 0.0);
        for op in ["append", "conditional_append", "read"] {
            let o = &last["operations"][op];
            assert!(o["requests"].as_u64().unwrap() > 0, "{op}: {last}");
            for p in ["p50", "p90", "p99", "max"] {
                assert!(o["latency_ms"][p].is_f64(), "{op}.latency_ms.{p}");
            }
        }
        assert!(last["server_fsyncs"].as_f64().unwrap() > 0.0);
        // Both sides' CPU during the measured time, per request.
        assert!(
            last["client_cpu_us_per_request"].as_f64().unwrap() > 0.0,
            "{last}"
        );
        assert!(
            last["server_cpu_us_per_request"].as_f64().unwrap() > 0.0,
            "{last}"
        );
    }
}

/// Goal: `annals-bench decide` runs the course-subscription decision and prints the JSON
/// contract as its last line: decisions_per_sec, retries, latency_us {p50, p99} and
/// fsync_floor_per_sec.
#[test]
fn bench_decide_json_contract() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = stdout_of(
        bench()
            .args(["decide", "--clients", "4", "--seconds", "0.5"])
            .args(["--courses", "20", "--students", "200"])
            .arg("--dir")
            .arg(dir.path()),
    );
    let stdout = String::from_utf8(stdout).unwrap();
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for field in [
        "decisions_per_sec",
        "retries",
        "fsync_floor_per_sec",
        "accepted",
        "rejected",
    ] {
        assert!(last[field].is_number(), "missing {field} in {last}");
    }
    assert!(last["latency_us"]["p50"].is_u64() && last["latency_us"]["p99"].is_u64());
    assert!(last["accepted"].as_u64().unwrap() > 0);
    assert_eq!(last["durability"], "d3");
}

/// Goal: `annals-bench exchange` ends with one JSON line holding the fields the issue names,
/// its runs agree on the state hash (the same seed gives the same books), and a journaled mode
/// that is not built yet is refused rather than faked.
#[test]
fn exchange_bench_json_contract() {
    let dir = tempfile::tempdir().unwrap();
    let run = |seed: &str| {
        let stdout = stdout_of(
            bench()
                .args(["exchange", "--scenario", "normal"])
                .args(["--messages", "20000", "--runs", "2", "--seed", seed])
                .arg("--dir")
                .arg(dir.path()),
        );
        let stdout = String::from_utf8(stdout).unwrap();
        serde_json::from_str::<serde_json::Value>(stdout.lines().last().unwrap()).unwrap()
    };
    let last = run("1");
    for field in [
        "messages_per_sec",
        "orders_per_sec",
        "trades",
        "trade_ratio",
        "resting_orders",
        "fsyncs",
        "fsync_floor_per_sec",
    ] {
        assert!(last[field].is_number(), "missing {field} in {last}");
    }
    for field in ["p50", "p90", "p99", "p999", "max"] {
        assert!(last["latency_ns"][field].is_u64(), "latency_ns.{field}");
    }
    assert_eq!(last["scenario"], "normal");
    assert_eq!(last["messages"], 20000);
    assert_eq!(last["durability"], "d0");
    assert!(last["trades"].as_u64().unwrap() > 0);
    assert!(last["resting_orders"].as_u64().unwrap() >= 1000);
    let ratio = last["trade_ratio"].as_f64().unwrap();
    assert!((0.02..=0.06).contains(&ratio), "trade ratio {ratio}");
    // Deterministic: the same seed, the same state; another seed, another.
    assert_eq!(run("1")["state_hash"], last["state_hash"]);
    assert_ne!(run("2")["state_hash"], last["state_hash"]);
    // The journaled modes end in the same books; their acknowledgements are timed, their
    // fsyncs counted, and the journal replays to the live state.
    let journaled = |mode: &str, messages: &str| {
        let stdout = stdout_of(
            bench()
                .args(["exchange", "--scenario", "normal", "--seed", "1"])
                .args(["--messages", messages, "--runs", "1", "--durability", mode])
                .arg("--dir")
                .arg(dir.path()),
        );
        let stdout = String::from_utf8(stdout).unwrap();
        serde_json::from_str::<serde_json::Value>(stdout.lines().last().unwrap()).unwrap()
    };
    for mode in ["d3-pipelined", "d2-critical"] {
        let result = journaled(mode, "20000");
        assert_eq!(result["durability"], mode);
        assert_eq!(result["state_hash"], last["state_hash"], "{mode}");
        assert_eq!(result["replay"]["state_hash_matches"], true, "{result}");
        assert!(result["fsyncs"].as_u64().unwrap() > 0, "{result}");
        // Every event is a record's entry: more than its fixed header, far less than a page.
        let per_event = result["journal_bytes_per_event"].as_f64().unwrap();
        assert!((24.0..1000.0).contains(&per_event), "{result}");
        assert!(
            result["journal_mb_per_sec"].as_f64().unwrap() > 0.0,
            "{result}"
        );
        for field in ["p50", "p99", "max"] {
            assert!(result["ack_latency_us"][field].is_number(), "{result}");
        }
    }
    let per_order = journaled("d3-per-order", "300");
    // One fsync per command (the warm-up is synced before the measured run).
    assert!(per_order["fsyncs"].as_u64().unwrap() >= 300, "{per_order}");
    assert!(per_order["commands_per_fsync"].as_f64().unwrap() <= 1.0);
    let refused = bench()
        .args(["exchange", "--durability", "d9", "--messages", "10"])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("unknown exchange durability"));
    // The four modes side by side with the seed engine's published figures.
    let stdout = stdout_of(
        bench()
            .args(["exchange", "--compare-seed", "--messages", "2000"])
            .args(["--runs", "1"])
            .arg("--dir")
            .arg(dir.path()),
    );
    let stdout = String::from_utf8(stdout).unwrap();
    let table: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(table["scenario"], "seed50k");
    let rows = table["rows"].as_array().unwrap();
    let modes: Vec<_> = rows
        .iter()
        .map(|r| r["ours"]["durability"].clone())
        .collect();
    assert_eq!(modes, ["d0", "d3-per-order", "d2-critical", "d3-pipelined"]);
    assert!(stdout.contains("production_safe"), "{stdout}");
}

/// Goal: `annals-bench umadb` drives UmaDB's Rust client against Annals and against a server
/// that does nothing, and with one writer gives the bound that the client's round trip and
/// the fsync floor set; with `--postgres`, Annals serves a throwaway cluster and the figures
/// stand beside the database's commit floor (and no fsync count is claimed).
#[test]
fn bench_umadb_json_contract() {
    let dir = tempfile::tempdir().unwrap();
    let mut backends = vec![false];
    if annals_testkit::bin_dir().is_some() || annals_testkit::required() {
        backends.push(true);
    }
    for postgres in backends {
        let mut command = bench();
        command
            .args(["umadb", "--writers", "1", "--seconds", "0.3", "--runs", "1"])
            .env_remove("ANNALS_UMADB_BIN")
            .arg("--dir")
            .arg(dir.path());
        if postgres {
            command.arg("--postgres");
        }
        let stdout = String::from_utf8(stdout_of(&mut command)).unwrap();
        let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        for server in ["annals", "null_server"] {
            let s = &last[server];
            assert!(s["appends_per_sec"].as_f64().unwrap() > 0.0, "{last}");
            assert_eq!(s["failed_calls"], 0, "{last}");
            assert!(s["latency_us"]["p99"].as_u64().unwrap() > 0, "{last}");
        }
        let floor = last["fsync_floor_per_sec"].as_f64().unwrap();
        let bound = last["round_trip_and_fsync_bound_per_sec"].as_f64().unwrap();
        assert!(bound > 0.0 && bound <= floor, "{last}");
        assert!(
            last["annals_to_round_trip_and_fsync_bound"].is_f64(),
            "{last}"
        );
        if postgres {
            assert!(
                last["commit_floor_per_sec"].as_f64().unwrap() > 0.0,
                "{last}"
            );
            assert!(last["annals_to_commit_floor"].is_f64(), "{last}");
            assert!(
                last["round_trip_and_commit_bound_per_sec"].is_f64(),
                "{last}"
            );
            assert!(last["annals"]["appends_per_fsync"].is_null(), "{last}");
        } else {
            assert!(last["commit_floor_per_sec"].is_null(), "{last}");
            assert!(
                last["annals"]["appends_per_fsync"].as_f64().unwrap() > 0.0,
                "{last}"
            );
        }
    }
}

/// Goal: `annals-bench postgres` measures one client beside both floors of the same run: the
/// database's plain commit floor and its row floor (the statement and row of a lone append,
/// without the server), and reports the ratio to the row floor from the figures it gives; and
/// the open of a store on that log, filled from the database and from a kept mirror.
#[test]
fn bench_postgres_floors_json_contract() {
    if annals_testkit::bin_dir().is_none() && !annals_testkit::required() {
        eprintln!("skipped: PostgreSQL is not installed (run scripts/setup)");
        return;
    }
    let stdout = stdout_of(bench().args([
        "postgres",
        "--only",
        "one,open",
        "--seconds",
        "0.3",
        "--runs",
        "1",
    ]));
    let stdout = String::from_utf8(stdout).unwrap();
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["bench"], "postgres-partial", "{last}");
    for figure in [
        "commit_floor_per_sec",
        "row_floor_per_sec",
        "one_client_conditional_per_sec",
    ] {
        assert!(last[figure].as_f64().unwrap() > 0.0, "{figure}: {last}");
    }
    let ratio = |a: &str, b: &str| last[a].as_f64().unwrap() / last[b].as_f64().unwrap();
    let reported = last["one_client_ratio_to_row_floor"].as_f64().unwrap();
    let computed = ratio("one_client_conditional_per_sec", "row_floor_per_sec");
    assert!((reported - computed).abs() < 0.01, "{last}");
    // The open of a store on what the one client appended (one event each), filled from the
    // database and then from its kept mirror.
    let open = &last["open"];
    let events = open["events"].as_u64().unwrap();
    assert!(events > 0, "{last}");
    assert_eq!(open["appends"].as_u64(), Some(events), "{last}");
    for figure in ["filled_ms", "close_kept_ms", "kept_ms"] {
        assert!(open[figure].as_f64().unwrap() >= 0.0, "{figure}: {last}");
    }
    // Figures not asked for are not made up.
    assert!(last["two_servers_http64_per_sec"].is_null(), "{last}");
}

/// Goal: `annals-bench schema` ends with one JSON line holding the HTTP and library ratios of
/// checked to unchecked appends and the history check's rate, each measured (none refused).
/// Method: a tiny run of every part on a temporary directory.
#[test]
fn bench_schema_json_contract() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = stdout_of(
        bench()
            .args(["schema", "--runs", "1", "--seconds", "0.5"])
            .args(["--events", "2000", "--history-events", "3000"])
            .arg("--dir")
            .arg(dir.path()),
    );
    let stdout = String::from_utf8(stdout).unwrap();
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for (part, field) in [
        ("http_64", "ratio_reject_to_off"),
        ("http_64", "reject_appends_per_sec"),
        ("library_64", "ratio_schema_to_no_registry"),
        ("history", "check_events_per_sec"),
        ("history", "read_and_parse_events_per_sec"),
    ] {
        assert!(
            last[part][field].as_f64().is_some_and(|v| v > 0.0),
            "missing {part}.{field} in {last}"
        );
    }
    assert_eq!(
        last["http_64"]["events_refused"], 0.0,
        "every event fits: {last}"
    );
    assert!(last["fsync_floor_per_sec"].is_number());
}

/// Goal: `annals-bench image` ends with one JSON line holding the image's sizes and the two
/// timings. Method: one run with the binary this build made, when podman and buildah are
/// installed (required by the test command).
#[test]
fn bench_image_json_contract() {
    let present = |tool: &str| Command::new(tool).arg("--version").output().is_ok();
    if !present("podman") || !present("buildah") {
        assert!(
            std::env::var_os("ANNALS_REQUIRE_CONTAINERS").is_none_or(|v| v != "1"),
            "podman and buildah are required (ANNALS_REQUIRE_CONTAINERS=1): run scripts/setup"
        );
        eprintln!("skipped: podman and buildah are not installed");
        return;
    }
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_annals-bench")).with_file_name("annals");
    let tag = format!("localhost/annals-bench-contract:{}", std::process::id());
    let stdout = stdout_of(
        bench()
            .args(["image", "--runs", "1", "--tag", &tag, "--binary"])
            .arg(&exe)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")),
    );
    let _ = Command::new("podman")
        .args(["rmi", "-f", &tag])
        .env(
            "CONTAINERS_CONF",
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../packaging/containers.conf"
            ),
        )
        .output();
    let stdout = String::from_utf8(stdout).unwrap();
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for field in ["image_bytes", "image_gzip_bytes"] {
        assert!(json[field].as_u64().unwrap() > 1_000_000, "{field}: {json}");
    }
    for field in ["scripts_image_seconds", "run_to_first_append_seconds"] {
        let seconds = json[field].as_f64().unwrap();
        assert!(seconds > 0.0 && seconds < 120.0, "{field}: {json}");
    }
}

/// Goal: `annals-bench traces` ends with one JSON line holding, for every request traced and
/// for 1% sampled, the rate beside the rate with nothing exported and their ratio, and the
/// traced server's span counts, which show spans reaching Jaeger. Method: one short run, when
/// Jaeger is installed (required by the test command).
#[test]
fn bench_traces_json_contract() {
    if annals_testkit::jaeger::jaeger_bin().is_none() {
        assert!(
            !annals_testkit::jaeger::jaeger_required(),
            "Jaeger is required (ANNALS_REQUIRE_JAEGER=1): run scripts/setup"
        );
        eprintln!("skipped: Jaeger is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let stdout = stdout_of(
        bench()
            .args(["traces", "--runs", "1", "--seconds", "0.5", "--dir"])
            .arg(dir.path()),
    );
    let stdout = String::from_utf8(stdout).unwrap();
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for part in ["all", "sampled_1pct"] {
        for field in [
            "traced_appends_per_sec",
            "off_appends_per_sec",
            "ratio_traced_to_off",
        ] {
            assert!(
                last[part][field].as_f64().is_some_and(|v| v > 0.0),
                "missing {part}.{field} in {last}"
            );
        }
    }
    // Spans are exported at most 5 s after they end: the short run's may still be queued.
    assert!(last["all"]["spans"]["exported"].is_number(), "{last}");
    assert!(last["fsync_floor_per_sec"].is_number());
}
