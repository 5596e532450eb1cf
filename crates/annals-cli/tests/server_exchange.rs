//! The exchange hosted by `annals serve`, end to end over HTTP: orders, trades, the order's
//! state, depth, recent trades, both live streams, the audit trail as a DCB read, bad input
//! that changes nothing, a clean restart from the stop's snapshot, and kill -9 while clients
//! place orders (every acknowledged order survives).

mod common;

use std::time::{Duration, Instant};

use common::{append_body, request, ServerProcess, Stream};
use serde_json::{json, Value};

fn config(dir: &std::path::Path, mode: &str) -> String {
    let path = dir.join("annals.toml");
    std::fs::write(
        &path,
        format!(
            "[exchange]\nmode = \"{mode}\"\nsymbols = [{{ tick = 1, lot = 1 }}, {{ tick = 5, lot = 10 }}]\n"
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

fn start(dir: &std::path::Path, mode: &str) -> ServerProcess {
    let config = config(dir, mode);
    ServerProcess::start(&dir.join("data"), &["--config", &config])
}

fn ok(server: &ServerProcess, path: &str, body: Value) -> Value {
    let r = server.post(path, &body.to_string());
    assert_eq!(r.status, 200, "{path} {body}: {}", r.text());
    r.json()
}

fn place(server: &ServerProcess, account: u64, side: &str, price: u64, qty: u64) -> Value {
    ok(
        server,
        "/v1/exchange/orders",
        json!({ "account": account, "symbol": 0, "side": side, "price": price, "qty": qty }),
    )
}

fn next_json(stream: &mut Stream) -> Value {
    let line = stream.next_line().expect("the stream goes on");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

/// Goal: place, trade, amend and cancel over HTTP with answers sent once durable; the order's
/// state, depth, symbols, recent trades and both streams agree with what happened; the audit
/// trail of an order is a DCB read.
#[test]
fn trading_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "d3-pipelined");
    let status = server.get("/v1/exchange").json();
    assert_eq!(status["mode"], "d3-pipelined");
    let mut market = Stream::open(server.http, "/v1/exchange/symbols/0/stream", &[]);
    assert_eq!(market.status, 200);
    let book = next_json(&mut market);
    assert_eq!(book["event"], "book");
    assert_eq!(book["bids"], json!([]));
    let mut seller = Stream::open(server.http, "/v1/exchange/accounts/7/reports", &[]);
    let mut buyer = Stream::open(
        server.http,
        "/v1/exchange/accounts/8/reports",
        &[("accept", "text/event-stream")],
    );
    assert_eq!(buyer.next_line().unwrap(), ": reports of account 8");

    let sell = place(&server, 7, "sell", 101, 5);
    assert_eq!(sell["orderId"], 1);
    assert_eq!(sell["status"], "live");
    assert_eq!(sell["leaves"], 5);
    assert!(sell["position"].as_u64().unwrap() >= 3);
    assert!(sell["position"].as_u64().unwrap() <= server.head());
    let buy = place(&server, 8, "buy", 102, 3);
    assert_eq!(buy["orderId"], 2);
    assert_eq!(buy["status"], "filled");
    let kinds: Vec<&str> = buy["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["accepted", "trade", "fill", "fill"]);
    assert_eq!(
        buy["reports"][1]["price"], 101,
        "trades print at the maker's price"
    );

    // Market data: the best ask appears, the trade prints, the ask shrinks.
    let e = next_json(&mut market);
    assert_eq!(
        (e["event"].as_str(), &e["ask"]),
        (Some("bbo"), &json!({"price":101,"qty":5}))
    );
    let e = next_json(&mut market);
    assert_eq!(
        (e["event"].as_str(), &e["price"], &e["qty"]),
        (Some("trade"), &json!(101), &json!(3))
    );
    assert_eq!(e["takerSide"], "buy");
    let e = next_json(&mut market);
    assert_eq!(e["ask"], json!({"price":101,"qty":2}));
    // Execution reports go to their own account only.
    let e = next_json(&mut seller);
    assert_eq!(
        (e["event"].as_str(), e["type"].as_str()),
        (Some("report"), Some("accepted"))
    );
    let e = next_json(&mut seller);
    assert_eq!(
        (e["type"].as_str(), e["role"].as_str(), &e["leaves"]),
        (Some("fill"), Some("maker"), &json!(2))
    );
    let mut sse = Vec::new();
    while sse.len() < 2 {
        let line = buyer.next_line().unwrap();
        if let Some(data) = line.strip_prefix("data: ") {
            sse.push(serde_json::from_str::<Value>(data).unwrap());
        }
    }
    assert_eq!(sse[0]["type"], "accepted");
    assert_eq!(
        (sse[1]["type"].as_str(), &sse[1]["leaves"]),
        (Some("fill"), &json!(0))
    );

    let depth = server.get("/v1/exchange/symbols/0/depth").json();
    assert_eq!(depth["asks"], json!([{"price":101,"qty":2,"orders":1}]));
    assert_eq!(depth["bids"], json!([]));
    let order = server.get("/v1/exchange/orders/1").json();
    assert_eq!(
        (
            order["status"].as_str(),
            &order["leaves"],
            &order["account"]
        ),
        (Some("live"), &json!(2), &json!(7))
    );
    assert_eq!(
        server.get("/v1/exchange/orders/2").json()["status"],
        "filled"
    );
    let unknown = server.get("/v1/exchange/orders/99");
    assert_eq!(
        (unknown.status, unknown.kind()),
        (404, "unknown_order".to_string())
    );
    let symbols = server.get("/v1/exchange/symbols").json();
    assert_eq!(symbols["symbols"][1]["tick"], 5);
    assert_eq!(symbols["symbols"][0]["ask"]["price"], 101);

    // Amend, a cancel by another account, a cancel, a cancel of a cancelled order.
    let amended = ok(
        &server,
        "/v1/exchange/orders/1/amend",
        json!({"account":7,"price":103,"qty":1}),
    );
    assert_eq!(
        (amended["status"].as_str(), &amended["leaves"]),
        (Some("live"), &json!(1))
    );
    let foreign = ok(
        &server,
        "/v1/exchange/orders/1/cancel",
        json!({"account":8}),
    );
    assert_eq!(
        (foreign["status"].as_str(), foreign["reason"].as_str()),
        (Some("rejected"), Some("not_owner"))
    );
    let cancelled = ok(
        &server,
        "/v1/exchange/orders/1/cancel",
        json!({"account":7}),
    );
    assert_eq!(cancelled["status"], "cancelled");
    let again = ok(
        &server,
        "/v1/exchange/orders/1/cancel",
        json!({"account":7}),
    );
    assert_eq!(again["reason"], "already_cancelled");
    assert_eq!(
        server.get("/v1/exchange/orders/1").json()["status"],
        "cancelled"
    );
    // Orders the engine refuses are answered with a reason.
    let off_tick = ok(
        &server,
        "/v1/exchange/orders",
        json!({"account":1,"symbol":1,"side":"buy","price":7,"qty":10}),
    );
    assert_eq!(
        (off_tick["status"].as_str(), off_tick["reason"].as_str()),
        (Some("rejected"), Some("invalid_price"))
    );
    let post_only = place(&server, 9, "buy", 90, 1);
    assert_eq!(post_only["status"], "live");
    let taker = ok(
        &server,
        "/v1/exchange/orders",
        json!({"account":10,"symbol":0,"side":"sell","kind":"post_only","price":90,"qty":1}),
    );
    assert_eq!(taker["reason"], "would_take");
    let ioc = ok(
        &server,
        "/v1/exchange/orders",
        json!({"account":10,"symbol":0,"side":"sell","kind":"ioc","price":90,"qty":3}),
    );
    assert_eq!(ioc["status"], "cancelled", "{ioc}");
    let market_order = ok(
        &server,
        "/v1/exchange/orders",
        json!({"account":10,"symbol":0,"side":"buy","kind":"market","qty":1}),
    );
    assert_eq!(
        market_order["status"], "cancelled",
        "nothing to buy: {market_order}"
    );
    place(&server, 9, "buy", 80, 1);
    place(&server, 9, "buy", 81, 1);
    let all = ok(&server, "/v1/exchange/accounts/9/cancel-all", json!({}));
    assert_eq!(all["cancelled"], 2, "{all}");
    assert!(all.get("orderId").is_none());

    // Recent trades, newest first, from the journal.
    let trades = server.get("/v1/exchange/symbols/0/trades?limit=10").json();
    let prices: Vec<u64> = trades["trades"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["price"].as_u64().unwrap())
        .collect();
    assert_eq!(prices, [90, 101]);
    // The audit trail of order 1 is a plain DCB read.
    let events = server.read(r#"{"items":[{"tags":["order:1"]}]}"#, "{}");
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "PlaceOrder",
            "TradeExecuted",
            "AmendOrder",
            "CancelOrder",
            "CancelOrder",
            "CancelOrder"
        ]
    );
    let metrics = server.get("/metrics").text();
    assert!(
        metrics.contains("annals_exchange_commands_total 14"),
        "{metrics}"
    );
    assert!(metrics.contains("op=\"exchange_order\""));
    // Per symbol: the trades the journal holds for symbol 0, and their quantity; symbol 1's
    // series are there from its start.
    let volume: u64 = trades["trades"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["qty"].as_u64().unwrap())
        .sum();
    for needed in [
        format!(
            "annals_exchange_symbol_trades_total{{symbol=\"0\"}} {}",
            prices.len()
        ),
        format!("annals_exchange_symbol_volume_total{{symbol=\"0\"}} {volume}"),
        "annals_exchange_symbol_trades_total{symbol=\"1\"}".to_string(),
    ] {
        assert!(metrics.contains(&needed), "missing {needed} in\n{metrics}");
    }
}

/// Goal: bad input gets a clear error and changes nothing: malformed JSON, unknown fields,
/// missing or contradictory fields, bad path and query parameters, unknown symbols, and
/// events of the journal's types appended through the DCB API.
#[test]
fn bad_input_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "d3-pipelined");
    place(&server, 1, "sell", 100, 5);
    let head = server.head();
    let cases: &[(&str, &str, &str, u16, &str)] = &[
        (
            "POST",
            "/v1/exchange/orders",
            "{\"account\":1,",
            400,
            "malformed_json",
        ),
        (
            "POST",
            "/v1/exchange/orders",
            r#"{"account":1,"symbol":0,"side":"buy","price":1,"qty":1,"colour":"red"}"#,
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/exchange/orders",
            r#"{"account":1,"symbol":0,"side":"up","price":1,"qty":1}"#,
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/exchange/orders",
            r#"{"account":1,"symbol":0,"side":"buy","qty":1}"#,
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/exchange/orders",
            r#"{"account":1,"symbol":0,"side":"buy","kind":"market","price":5,"qty":1}"#,
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/exchange/orders",
            r#"{"account":-1,"symbol":0,"side":"buy","price":1,"qty":1}"#,
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/exchange/orders",
            r#"{"account":1,"symbol":0,"side":"buy","price":1,"qty":1,"clientOrderId":0}"#,
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/exchange/orders",
            r#"{"account":1,"symbol":0,"side":"buy","price":1.5,"qty":1}"#,
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/exchange/orders?x=1",
            r#"{"account":1,"symbol":0,"side":"buy","price":1,"qty":1}"#,
            400,
            "invalid_parameter",
        ),
        (
            "POST",
            "/v1/exchange/orders/abc/cancel",
            r#"{"account":1}"#,
            400,
            "invalid_parameter",
        ),
        (
            "POST",
            "/v1/exchange/orders/1/cancel",
            r#"{}"#,
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/exchange/orders/1/amend",
            r#"{"account":1,"price":100}"#,
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/exchange/accounts/1/cancel-all",
            r#"{"symbol":"x"}"#,
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/admin/exchange/symbols",
            r#"{"tick":0,"lot":1}"#,
            400,
            "invalid_body",
        ),
        (
            "GET",
            "/v1/exchange/symbols/0/depth?levels=0",
            "",
            400,
            "invalid_parameter",
        ),
        (
            "GET",
            "/v1/exchange/symbols/0/depth?levels=5000",
            "",
            400,
            "invalid_parameter",
        ),
        (
            "GET",
            "/v1/exchange/symbols/0/depth?depth=5",
            "",
            400,
            "invalid_parameter",
        ),
        (
            "GET",
            "/v1/exchange/symbols/9/depth",
            "",
            404,
            "unknown_symbol",
        ),
        (
            "GET",
            "/v1/exchange/symbols/-1/depth",
            "",
            400,
            "invalid_parameter",
        ),
        (
            "GET",
            "/v1/exchange/symbols/9/stream",
            "",
            404,
            "unknown_symbol",
        ),
        (
            "GET",
            "/v1/exchange/symbols/0/trades?limit=abc",
            "",
            400,
            "invalid_parameter",
        ),
        (
            "GET",
            "/v1/exchange/orders/18446744073709551616",
            "",
            400,
            "invalid_parameter",
        ),
        (
            "DELETE",
            "/v1/exchange/orders/1",
            "",
            405,
            "method_not_allowed",
        ),
    ];
    for (method, path, body, status, kind) in cases {
        let r = request(server.http, method, path, &[], body.as_bytes());
        assert_eq!(
            (r.status, r.kind().as_str()),
            (*status, *kind),
            "{method} {path} {body}: {}",
            r.text()
        );
        assert!(!r.json()["error"].as_str().unwrap().is_empty());
    }
    for reserved in ["PlaceOrder", "TradeExecuted", "SymbolAdded"] {
        let r = server.post(
            "/v1/append",
            &append_body(&[(reserved, &["order:1"], "x")], None),
        );
        assert_eq!(
            (r.status, r.kind().as_str()),
            (400, "reserved_type"),
            "{}",
            r.text()
        );
    }
    assert_eq!(server.head(), head, "nothing was journaled");
    let depth = server.get("/v1/exchange/symbols/0/depth").json();
    assert_eq!(depth["asks"], json!([{"price":100,"qty":5,"orders":1}]));
    // Still serving.
    assert_eq!(place(&server, 2, "buy", 100, 5)["status"], "filled");
}

/// Goal: a server without an exchange says so; an exchange mode that does not fit the
/// store's durability stops the server at start with a reason; with no exchange, the
/// journal's types are ordinary events.
#[test]
fn no_exchange_and_modes_that_do_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("plain"), &[]);
    let r = server.post("/v1/exchange/orders", "{}");
    assert_eq!((r.status, r.kind().as_str()), (404, "no_exchange"));
    assert_eq!(
        server.get("/v1/exchange/symbols/0/depth").kind(),
        "no_exchange"
    );
    server.append(&append_body(&[("PlaceOrder", &[], "anything")], None));
    drop(server);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_annals"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "off",
            "--exchange",
            "d2-critical",
            "--data-dir",
        ])
        .arg(dir.path().join("critical"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--durability d2"), "{stderr}");
    // d2-critical on a d2 store serves; d0 journals nothing.
    for (mode, durability) in [("d2-critical", "d2"), ("d0", "d3")] {
        let data = dir.path().join(mode);
        let server = ServerProcess::start(&data, &["--exchange", mode, "--durability", durability]);
        let added = server.post("/v1/admin/exchange/symbols", r#"{"tick":1,"lot":1}"#);
        assert_eq!(added.status, 201, "{}", added.text());
        assert_eq!(place(&server, 1, "sell", 10, 1)["status"], "live");
        assert_eq!(place(&server, 2, "buy", 10, 1)["status"], "filled");
        let trades = server.get("/v1/exchange/symbols/0/trades");
        if mode == "d0" {
            assert_eq!(server.head(), 0);
            assert_eq!(trades.kind(), "not_journaled");
        } else {
            assert_eq!(trades.json()["trades"].as_array().unwrap().len(), 1);
        }
    }
}

/// Goal: SIGTERM answers what is queued, saves a snapshot and stops; the restarted exchange
/// starts from that snapshot with nothing to replay, the same books, and the next order id.
#[test]
fn a_clean_restart_resumes_from_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), "d3-pipelined");
    for i in 0..20 {
        place(
            &server,
            i % 3,
            if i % 2 == 0 { "buy" } else { "sell" },
            100 + i % 4,
            2,
        );
    }
    let depth = server.get("/v1/exchange/symbols/0/depth?levels=100").json();
    assert!(server.terminate().success());
    let server = start(dir.path(), "d3-pipelined");
    let status = server.get("/v1/exchange").json();
    assert!(
        status["started"]["snapshotPosition"].as_u64().is_some(),
        "{status}"
    );
    assert_eq!(status["started"]["replayed"], 0);
    assert_eq!(status["started"]["commands"], 20);
    assert_eq!(
        server.get("/v1/exchange/symbols/0/depth?levels=100").json(),
        depth
    );
    assert_eq!(place(&server, 5, "buy", 1, 1)["orderId"], 21);
}

/// Goal: kill -9 while several clients place orders: after a restart every order the
/// server acknowledged is known, in the state its acknowledgement implied or later.
#[test]
fn kill9_keeps_every_acknowledged_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), "d3-pipelined");
    let addr = server.http;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4u64)
        .map(|c| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let side = if (c + i).is_multiple_of(2) { "buy" } else { "sell" };
                    let body = json!({"account":c,"symbol":0,"side":side,"price":100 + i % 5,"qty":1 + i % 3});
                    let r = std::panic::catch_unwind(|| {
                        request(addr, "POST", "/v1/exchange/orders", &[], body.to_string().as_bytes())
                    });
                    match r {
                        Ok(r) if r.status == 200 => {
                            let v = r.json();
                            acked.push((v["orderId"].as_u64().unwrap(), v["status"].as_str().unwrap().to_string()));
                        }
                        _ => break,
                    }
                    i += 1;
                }
                acked
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill9();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked: Vec<(u64, String)> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    assert!(acked.len() > 50, "only {} orders acknowledged", acked.len());
    let server = start(dir.path(), "d3-pipelined");
    let status = server.get("/v1/exchange").json();
    assert!(
        status["started"]["commands"].as_u64().unwrap() >= acked.len() as u64,
        "{status}"
    );
    for (id, was) in &acked {
        let now = server.get(&format!("/v1/exchange/orders/{id}"));
        assert_eq!(now.status, 200, "acknowledged order {id} ({was}) is gone");
        let now = now.json()["status"].as_str().unwrap().to_string();
        // An order acknowledged as done stays done; a live one may have traded since.
        if was != "live" {
            assert_eq!(&now, was, "order {id}");
        }
    }
    // The books equal a replay of the journal: the restarted exchange rebuilt them from it,
    // and a read of every command agrees with the count it reports.
    let commands = server.read(
        r#"{"items":[{"types":["PlaceOrder","CancelOrder","AmendOrder","CancelAllOrders"]}]}"#,
        "{}",
    );
    assert_eq!(
        commands.len() as u64,
        status["started"]["commands"].as_u64().unwrap()
    );
}

/// Goal: a key bound to accounts acts for and watches only those accounts; other live orders
/// are hidden from it; an unbound key may act for any account.
#[test]
fn keys_bound_to_accounts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("annals.toml");
    std::fs::write(
        &path,
        r#"
api_keys = [
  { key = "trader-seven-0123456789", scopes = ["read", "append"], accounts = [7] },
  { key = "desk-key-0123456789", scopes = ["admin"] },
]
[exchange]
symbols = [{ tick = 1, lot = 1 }]
"#,
    )
    .unwrap();
    let server = ServerProcess::start(
        &dir.path().join("data"),
        &["--config", path.to_str().unwrap()],
    );
    let send = |key: &str, method: &str, path: &str, body: Value| {
        let auth = format!("Bearer {key}");
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        request(
            server.http,
            method,
            path,
            &[("authorization", &auth)],
            body.as_bytes(),
        )
    };
    let trader = "trader-seven-0123456789";
    let desk = "desk-key-0123456789";
    let order =
        |account: u64| json!({"account":account,"symbol":0,"side":"sell","price":100,"qty":1});
    let own = send(trader, "POST", "/v1/exchange/orders", order(7));
    assert_eq!(own.status, 200, "{}", own.text());
    let other = send(trader, "POST", "/v1/exchange/orders", order(8));
    assert_eq!(
        (other.status, other.kind().as_str()),
        (403, "forbidden_account")
    );
    let desk_order = send(desk, "POST", "/v1/exchange/orders", order(8));
    assert_eq!(desk_order.status, 200);
    let id = desk_order.json()["orderId"].as_u64().unwrap();
    let cancel = send(
        trader,
        "POST",
        &format!("/v1/exchange/orders/{id}/cancel"),
        json!({"account":8}),
    );
    assert_eq!(cancel.kind(), "forbidden_account");
    let all = send(
        trader,
        "POST",
        "/v1/exchange/accounts/8/cancel-all",
        json!({}),
    );
    assert_eq!(all.kind(), "forbidden_account");
    let seen = send(
        trader,
        "GET",
        &format!("/v1/exchange/orders/{id}"),
        Value::Null,
    );
    assert_eq!((seen.status, seen.kind().as_str()), (404, "unknown_order"));
    assert_eq!(
        send(
            desk,
            "GET",
            &format!("/v1/exchange/orders/{id}"),
            Value::Null
        )
        .status,
        200
    );
    let mine = own.json()["orderId"].as_u64().unwrap();
    assert_eq!(
        send(
            trader,
            "GET",
            &format!("/v1/exchange/orders/{mine}"),
            Value::Null
        )
        .status,
        200
    );
    let watch = Stream::open(
        server.http,
        "/v1/exchange/accounts/8/reports",
        &[("authorization", &format!("Bearer {trader}"))],
    );
    assert_eq!(watch.status, 403);
    let watch = Stream::open(
        server.http,
        "/v1/exchange/accounts/7/reports",
        &[("authorization", &format!("Bearer {trader}"))],
    );
    assert_eq!(watch.status, 200);
    // Without a key: 401; the symbol list needs only read.
    assert_eq!(
        server
            .post("/v1/exchange/orders", &order(7).to_string())
            .status,
        401
    );
    assert_eq!(
        send(trader, "GET", "/v1/exchange/symbols", Value::Null).status,
        200
    );
    assert_eq!(
        send(
            trader,
            "POST",
            "/v1/admin/exchange/symbols",
            json!({"tick":1,"lot":1})
        )
        .status,
        403
    );
}
