//! The web console in a real headless browser: Debian's Chromium driven by Playwright
//! (tests/console/console.test.mjs, installed by scripts/setup), against servers started on
//! temporary stores: one open, one with API keys, one hosting the exchange. The script builds
//! queries and checks the rows against the API's own answer, opens events, follows a query
//! while it appends, shows a bad query's error, shows the store's state and its backup (and a
//! replica's of that backup: following, lag, last poll) with charts that draw a rate soon
//! after the page opens, asks for a key before showing any error and refuses a wrong one,
//! offers the Exchange tab only on the server hosting one, and shows an order book. `ANNALS_CONSOLE_SCREENSHOTS=DIR` keeps a screenshot of each page.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::ServerProcess;
use serde_json::json;

/// The browser and the script's packages, or None (a skip, unless the test command requires
/// them with ANNALS_REQUIRE_BROWSER=1).
fn browser() -> Option<(PathBuf, PathBuf)> {
    let script_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/console");
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    let ready = script_dir.join("node_modules/playwright-core").exists();
    match chromium {
        Some(chromium) if ready => Some((chromium, script_dir)),
        _ => {
            let why = "Chromium or the console test's packages are missing (run scripts/setup)";
            if std::env::var_os("ANNALS_REQUIRE_BROWSER").is_some_and(|v| v == "1") {
                panic!("{why}");
            }
            eprintln!("skipped: {why}");
            None
        }
    }
}

fn post_ok(server: &ServerProcess, path: &str, body: serde_json::Value) {
    let r = server.post(path, &body.to_string());
    assert_eq!(r.status, 200, "{path}: {}", r.text());
}

fn append(server: &ServerProcess, events: serde_json::Value) {
    post_ok(server, "/v1/append", json!({ "events": events }));
}

/// Goal: the console shows a store as the API does and works with a keyboard-free browser
/// session end to end. Method: see the module's comment; the script fails on the first check
/// that does not hold and says which.
#[test]
fn the_console_in_a_browser() {
    let Some((chromium, script_dir)) = browser() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models.toml");
    std::fs::write(
        &models,
        "[[read_models]]\nname = \"subscriptions-by-course\"\ntypes = [\"StudentSubscribed\"]\ngroup_by = \"course:\"\n",
    )
    .unwrap();
    // The open server ships a backup (object_store's local directory), for the store page's
    // backup cards.
    let backup = format!("file://{}", dir.path().join("backup").display());
    let open = ServerProcess::start(
        &dir.path().join("open"),
        &["--config", models.to_str().unwrap(), "--backup", &backup],
    );
    for i in 0..30 {
        let course = format!("course:c{}", i % 3);
        let student = format!("student:s{i}");
        append(
            &open,
            json!([{ "type": if i % 4 == 0 { "CourseDefined" } else { "StudentSubscribed" },
                      "tags": [course, student],
                      "data": json!({ "n": i, "name": format!("student {i}") }).to_string() }]),
        );
    }
    // Data that is not JSON, and would be markup if the page let it be.
    append(
        &open,
        json!([{ "type": "Note", "tags": ["note"], "data": "<img src=x onerror=alert(1)> not JSON" }]),
    );
    let key = "console-test-key-0001";
    let admin = "console-admin-key-0002";
    // The keyed server keeps data subjects: one of them erased, for the console to show.
    let master = dir.path().join("master.key");
    std::fs::write(&master, "7e".repeat(32)).unwrap();
    let keyed = ServerProcess::start_with_env(
        &dir.path().join("keyed"),
        &[
            "--subject-tags",
            "customer:",
            "--master-key-file",
            master.to_str().unwrap(),
        ],
        &[("ANNALS_API_KEYS", &format!("{key}=read;{admin}=admin"))],
    );
    let as_admin = format!("Bearer {admin}");
    for (path, body) in [
        (
            "/v1/append",
            json!({ "events": [
                { "type": "AddressChanged", "tags": ["customer:1"], "data": "{\"street\":\"secret\"}" },
                { "type": "AddressChanged", "tags": ["customer:2"], "data": "{\"street\":\"kept\"}" }
            ] }),
        ),
        ("/v1/admin/erase", json!({ "tag": "customer:1" })),
    ] {
        let r = common::request(
            keyed.http,
            "POST",
            path,
            &[("authorization", &as_admin)],
            body.to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    let config = dir.path().join("exchange.toml");
    std::fs::write(
        &config,
        "[exchange]\nmode = \"d3-pipelined\"\nsymbols = [{ tick = 1, lot = 1 }]\n",
    )
    .unwrap();
    let exchange = ServerProcess::start(
        &dir.path().join("exchange"),
        &["--config", config.to_str().unwrap()],
    );
    for (account, side, price, qty) in [
        (1, "buy", 99, 5),
        (2, "buy", 98, 7),
        (3, "sell", 101, 4),
        (4, "sell", 103, 2),
        (5, "buy", 101, 1),
    ] {
        post_ok(
            &exchange,
            "/v1/exchange/orders",
            json!({ "account": account, "symbol": 0, "side": side, "price": price, "qty": qty }),
        );
    }
    // A read replica of the open server's backup, once that holds what was appended.
    open.await_backup_shipped(std::time::Duration::from_secs(30));
    let mut replica = ServerProcess::launch_with(&["--replica-of", &backup], &[]);
    let output = Command::new("node")
        .arg(script_dir.join("console.test.mjs"))
        .env("CHROMIUM", &chromium)
        .env("OPEN_URL", format!("http://{}", open.http))
        .env("KEYED_URL", format!("http://{}", keyed.http))
        .env("API_KEY", key)
        .env("EXCHANGE_URL", format!("http://{}", exchange.http))
        .env("REPLICA_URL", format!("http://{}", replica.http))
        .current_dir(&script_dir)
        .output()
        .expect("run node");
    // Stopped cleanly, so that its copy of the log in the temporary directory goes too.
    assert!(replica.terminate().success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}");
    assert!(
        output.status.success(),
        "the console's browser test failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all console checks passed"), "{stdout}");
}
