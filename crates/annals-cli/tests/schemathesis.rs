//! The OpenAPI document against the server, by schemathesis (a property-based API tester): it
//! generates requests from /v1/openapi.json, valid and invalid, and checks every answer
//! (schema-valid requests accepted, invalid ones refused, statuses, content types and bodies
//! as documented, no server error). The test command installs schemathesis (scripts/setup).

mod common;

use common::ServerProcess;

/// Goal: schemathesis finds no disagreement between the document and the server. Method: a
/// fixed seed and a bounded number of examples per operation, every phase (examples,
/// coverage, fuzzing, stateful), with the configuration in tests/schemathesis/. The live
/// streams (subscribe, market data, reports) never end, so they are left to their own tests.
#[test]
fn the_openapi_document_matches_the_server() {
    let schemathesis = annals_testkit::python()
        .map(|python| python.with_file_name("schemathesis"))
        .filter(|path| path.exists());
    let Some(schemathesis) = schemathesis else {
        assert!(
            std::env::var_os("ANNALS_REQUIRE_PYTHON").is_none(),
            "schemathesis is missing from {}: run scripts/setup",
            annals_testkit::tools_dir().display()
        );
        eprintln!("skipped: no schemathesis (scripts/test installs it)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A read model and an exchange hosted, so that their operations are reached too (the
    // exchange in D0: conformance does not depend on durability, and the run stays short).
    let config = dir.path().join("annals.toml");
    std::fs::write(
        &config,
        "[[read_models]]\nname = \"counts\"\ntypes = [\"Counted\"]\ngroup_by = \"k:\"\n\
         [exchange]\nmode = \"d0\"\nsymbols = [{ tick = 1, lot = 1 }, { tick = 5, lot = 100 }]\n",
    )
    .unwrap();
    let server = ServerProcess::start(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    for hosted in ["/v1/exchange", "/v1/readmodels/counts"] {
        assert_eq!(server.get(hosted).status, 200, "{hosted} is not served");
    }
    let base = format!("http://{}", server.http);
    let settings = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/schemathesis/schemathesis.toml"
    );
    let out = std::process::Command::new(&schemathesis)
        .args(["--config-file", settings, "run"])
        .arg(format!("{base}/v1/openapi.json"))
        .args(["--url", &base])
        .args(["--max-examples", "50", "--seed", "1"])
        .args(["--exclude-path", "/v1/subscribe"])
        .args(["--exclude-path-regex", "/(stream|reports)$"])
        .args(["--request-timeout", "15"])
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found disagreements:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Tested: "), "{stdout}");
}
