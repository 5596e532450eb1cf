//! The network edge under attack, on loopback: every finding of the edge's review reproduced
//! and shown closed (HTTP/2 conformance is tests/h2spec.rs). Silent connections, one peer holding every slot, browsers' cross-origin requests and non-JSON
//! bodies, listening beyond loopback without keys, deeply nested metadata, refusals without a
//! JSON body, floods of HTTP/2 frames, and the memory a stalled live stream holds.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{request, request_exactly, ServerProcess};

/// A server with `limits` (TOML lines of the `[limits]` section) from a config file.
fn server_with(dir: &Path, limits: &str, extra: &[&str]) -> ServerProcess {
    let config = dir.join("annals.toml");
    std::fs::write(&config, format!("[limits]\n{limits}\n")).unwrap();
    let data = dir.join("data");
    let mut args = vec!["--config", config.to_str().unwrap()];
    args.extend_from_slice(extra);
    ServerProcess::start(&data, &args)
}

/// Whether the peer closed `stream` (EOF or reset) within `within`.
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

/// The server process's resident memory, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// What another client's median latency may add beside an attack, over ten times its latency
/// before: a loaded two-core machine's scheduling can cost that much, while a server an
/// attack held would take seconds or never answer.
const LATENCY_SLACK: Duration = Duration::from_millis(50);

/// The median time of `n` HEAD requests on fresh connections.
fn head_latency(addr: SocketAddr, n: usize) -> Duration {
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            let started = Instant::now();
            let r = request(addr, "GET", "/v1/head", &[], b"");
            assert_eq!(r.status, 200);
            started.elapsed()
        })
        .collect();
    times.sort();
    times[n / 2]
}

/// Goal: a connection that sends nothing is closed within the header timeout on both ports,
/// and one peer address cannot hold more than its share of the connection slots. Method: a
/// 300 ms header timeout; silent connections on both ports must be closed by then. Then a
/// server with a share of 8 and a 3 s header timeout: 8 silent connections from one address,
/// and a ninth refused at once (well before the timeout would close it); once the timeout has
/// closed the 8, the slots are free again.
#[test]
fn silent_connections_are_closed_and_a_peer_gets_its_share() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with(dir.path(), "header_timeout_ms = 300", &[]);
    for addr in [server.http, server.grpc.unwrap()] {
        let mut silent = TcpStream::connect(addr).unwrap();
        let started = Instant::now();
        assert!(closed_within(&mut silent, Duration::from_secs(5)), "{addr}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }
    drop(server);
    let server = server_with(
        dir.path(),
        "header_timeout_ms = 3000\nconnections_per_peer_max = 8",
        &[],
    );
    let mut held: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(server.http).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let mut ninth = TcpStream::connect(server.http).unwrap();
    assert!(
        closed_within(&mut ninth, Duration::from_millis(1500)),
        "a ninth connection from the same address is refused"
    );
    // Once the silent ones are closed by the timeout, the slots are free again.
    for c in &mut held {
        assert!(closed_within(c, Duration::from_secs(10)));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(server.get("/v1/head").status, 200);
}

/// Goal: a browser page of another origin can neither append nor read, and a body not sent as
/// JSON is refused (415), so that no page open in a local browser can write to a store
/// without keys; the server's own origin and configured origins are served. Method: appends
/// with text/plain, form and no Content-Type, and requests carrying foreign, own and
/// configured `Origin` headers; the head must not move on a refusal.
#[test]
fn browsers_of_other_origins_and_non_json_bodies_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &["--allow-origin", "https://console.example"]);
    let body = br#"{"events":[{"type":"T","tags":[],"data":"x"}]}"#;
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let headers: Vec<(&str, &str)> = content_type
            .map(|c| ("content-type", c))
            .into_iter()
            .collect();
        let r = request_exactly(server.http, "POST", "/v1/append", &headers, body);
        assert_eq!(r.status, 415, "{content_type:?}: {}", r.text());
        assert_eq!(r.kind(), "unsupported_media_type");
    }
    let json = ("content-type", "application/json");
    let foreign = request(
        server.http,
        "POST",
        "/v1/append",
        &[json, ("origin", "http://evil.example")],
        body,
    );
    assert_eq!(foreign.status, 403, "{}", foreign.text());
    assert_eq!(foreign.kind(), "origin_not_allowed");
    let read = request(
        server.http,
        "GET",
        "/v1/read",
        &[("origin", "http://evil.example")],
        b"",
    );
    assert_eq!(read.status, 403);
    assert_eq!(server.head(), 0, "nothing refused was appended");
    // The server's own origin (as the request addressed it) and a configured one.
    for origin in ["http://test", "https://console.example"] {
        let r = request(
            server.http,
            "POST",
            "/v1/append",
            &[json, ("origin", origin)],
            body,
        );
        assert_eq!(r.status, 200, "{origin}: {}", r.text());
    }
    // application/json with a charset is JSON too.
    let r = request(
        server.http,
        "POST",
        "/v1/append",
        &[("content-type", "application/json; charset=utf-8")],
        body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(server.head(), 3);
}

/// Goal: listening beyond loopback without API keys is refused, with a message saying how to
/// configure keys, unless the flag that says so is given. Method: `annals serve --http
/// 0.0.0.0:0` without keys (refused, exit 1), then with --allow-unauthenticated-network
/// (serves), then with a key (serves).
#[test]
fn listening_beyond_loopback_needs_keys_or_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_annals"))
        .args([
            "serve",
            "--http",
            "0.0.0.0:0",
            "--grpc",
            "off",
            "--data-dir",
        ])
        .arg(dir.path().join("a"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("without API keys"), "{stderr}");
    assert!(stderr.contains("--api-keys-file"), "{stderr}");
    assert!(
        stderr.contains("--allow-unauthenticated-network"),
        "{stderr}"
    );
    // With the flag, and with a key, it serves.
    let starts = |name: &str, extra: &[&str], env: &[(&str, &str)]| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_annals"))
            .args([
                "serve",
                "--http",
                "0.0.0.0:0",
                "--grpc",
                "off",
                "--data-dir",
            ])
            .arg(dir.path().join(name))
            .args(extra)
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let listening = std::io::BufRead::lines(stdout)
            .map_while(Result::ok)
            .any(|l| l.starts_with("annals: listening "));
        let _ = child.kill();
        let _ = child.wait();
        listening
    };
    assert!(starts("b", &["--allow-unauthenticated-network"], &[]));
    assert!(starts(
        "c",
        &[],
        &[("ANNALS_API_KEYS", "a-key-00000000001=read,append")]
    ));
}

/// Goal: a start that fails leaves no store behind that it made. Regression: a start refused
/// for a port in use, or for a backup prefix that backs up another store, left a new store
/// (its first segment preallocated) in the data directory it made. Method: with the HTTP
/// port, then the gRPC port, held by another socket, `annals serve` on a data directory that
/// does not exist (nor its parent) exits non-zero naming the port, and neither directory
/// exists afterwards; on an empty directory, it stays empty; on a directory holding a store,
/// its files are kept. A fresh start whose backup prefix holds another store's backup is
/// refused once the store is open, and the directory it made is removed again.
#[test]
fn a_failed_start_leaves_no_store_behind() {
    let work = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let serve = |dir: &Path, args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_annals"))
            .arg("serve")
            .arg("--data-dir")
            .arg(dir)
            .args(args)
            .env_remove("ANNALS_BACKUP")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{dir:?} {args:?} started");
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let names = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let parent = work.path().join("parent");
    let fresh = parent.join("data");
    let empty = work.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for (listener, args) in [
        ("http", ["--http", port.as_str(), "--grpc", "off"]),
        ("grpc", ["--http", "127.0.0.1:0", "--grpc", port.as_str()]),
    ] {
        let (status, err) = serve(&fresh, &args);
        assert!(
            err.contains(&format!("cannot listen on {port} ({listener})")),
            "{err}"
        );
        assert_eq!(status, 75, "a port in use may be free later: {err}");
        assert!(
            !parent.exists(),
            "{listener}: {} was made",
            parent.display()
        );
        serve(&empty, &args);
        assert!(names(&empty).is_empty(), "{:?}", names(&empty));
    }

    // A store of its own, backed up: a port in use leaves its files as they were.
    let backup = format!("file://{}", work.path().join("backup").display());
    let held = work.path().join("held");
    let options = annals::Options {
        backup: Some(annals::BackupOptions::new(&backup)),
        ..annals::Options::default()
    };
    let store = annals::Store::open(&held, options).unwrap();
    store
        .append(&[annals::NewEvent::new("Opened", "{}").tag("k:1")], None)
        .unwrap();
    store.close().unwrap();
    let before = names(&held);
    serve(&held, &["--http", &port, "--grpc", "off"]);
    assert_eq!(names(&held), before);

    // A new store on that backup's prefix is refused once it is open; the directory this
    // start made is removed again, and an empty one given is left empty.
    for dir in [&fresh, &empty] {
        let (_, err) = serve(
            dir,
            &[
                "--http",
                "127.0.0.1:0",
                "--grpc",
                "off",
                "--backup",
                &backup,
            ],
        );
        assert!(err.contains("prefix"), "{err}");
    }
    assert!(!parent.exists(), "{} was made", parent.display());
    assert!(names(&empty).is_empty(), "{:?}", names(&empty));

    // A replica whose location holds no backup: its kept copy's directory goes too.
    let nothing = work.path().join("nothing-here");
    std::fs::create_dir(&nothing).unwrap();
    let mirror = work.path().join("replica").join("copy");
    let (_, err) = serve(
        &fresh,
        &[
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "off",
            "--replica-of",
            &format!("file://{}", nothing.display()),
            "--mirror",
            mirror.to_str().unwrap(),
        ],
    );
    assert!(
        err.contains("no backup") || err.contains("holds no backup"),
        "{err}"
    );
    assert!(
        !work.path().join("replica").exists(),
        "the replica's copy was left"
    );
    drop(taken);
}

/// Goal: a start that fails exits with a status a supervisor can act on: 78 (`EX_CONFIG`)
/// when the configuration must change, 75 (`EX_TEMPFAIL`) when the same start may succeed
/// later. Method: `annals serve` given an address with a typo, then listening beyond
/// loopback without API keys (both refused by the configuration), then on a data directory
/// another process holds open; each exit status, and the message naming why.
#[test]
fn a_failed_start_exits_with_a_status_a_supervisor_can_act_on() {
    let work = tempfile::tempdir().unwrap();
    let serve = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_annals"))
            .arg("serve")
            .args(args)
            .env_remove("ANNALS_BACKUP")
            .env_remove("ANNALS_API_KEYS")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let dir = work.path().join("data");
    let dir = dir.to_str().unwrap();
    // A typo in the address, and a configuration refused once read, exit alike.
    let (status, err) = serve(&[
        "--data-dir",
        dir,
        "--http",
        "127.0.0.1:port",
        "--grpc",
        "off",
    ]);
    assert_eq!(status, Some(78), "{err}");
    let (status, err) = serve(&["--data-dir", dir, "--http", "0.0.0.0:0", "--grpc", "off"]);
    assert_eq!(status, Some(78), "{err}");
    assert!(err.contains("without API keys"), "{err}");

    let held = annals::Store::open(dir, annals::Options::default()).unwrap();
    let (status, err) = serve(&["--data-dir", dir, "--http", "127.0.0.1:0", "--grpc", "off"]);
    assert_eq!(status, Some(75), "{err}");
    assert!(err.contains("in use by another process"), "{err}");
    held.close().unwrap();
}

/// Goal: metadata nested deeper than the limit is refused (a client's JSON parser would fail
/// on every read that served it); every refusal carries the JSON error body, 414 and 431
/// included; a 401 names its scheme. Method: metadata 100,000 and 33 levels deep (refused)
/// and 32 (stored); a head larger than the limit; a URI beyond hyper's limit; a request
/// without a key on a keyed server.
#[test]
fn deep_metadata_and_bodyless_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with(dir.path(), "header_list_bytes_max = 16384", &[]);
    let deep = |levels: usize| {
        format!(
            r#"{{"events":[{{"type":"T","data":"x","metadata":{}1{}}}]}}"#,
            "[".repeat(levels),
            "]".repeat(levels)
        )
    };
    for levels in [100_000, 33] {
        let r = server.post("/v1/append", &deep(levels));
        assert_eq!(r.status, 400, "{levels}: {}", r.text());
        assert_eq!(r.kind(), "metadata_too_deep");
    }
    assert_eq!(server.post("/v1/append", &deep(32)).status, 200);
    assert_eq!(server.head(), 1);
    // A head beyond the limit: hyper refuses it before any handler; the answer still says why.
    let big = "x".repeat(20_000);
    let r = request(server.http, "GET", "/v1/head", &[("x-filler", &big)], b"");
    assert_eq!(r.status, 431);
    assert_eq!(r.kind(), "headers_too_large");
    let long_path = format!("/v1/head?{}", "a".repeat(70_000));
    let r = request(server.http, "GET", &long_path, &[], b"");
    assert!(r.status == 414 || r.status == 431, "{}", r.status);
    assert!(!r.kind().is_empty(), "a JSON error body: {:?}", r.text());
    let keyed_dir = tempfile::tempdir().unwrap();
    let keyed = ServerProcess::start_with_env(
        keyed_dir.path(),
        &[],
        &[("ANNALS_API_KEYS", "a-key-00000000001=read")],
    );
    let r = keyed.get("/v1/head");
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer realm=\"annals\"")
    );
}

/// HTTP/2 frames written by hand.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// A header block for a gRPC call to `path`, as HPACK literals without indexing.
fn call_headers(path: &str) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in [
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", path.as_bytes()),
        (b":authority", b"test"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ] {
        block.push(0x00);
        block.push(name.len() as u8);
        block.extend_from_slice(name);
        block.push(value.len() as u8);
        block.extend_from_slice(value);
    }
    block
}

/// Opens an HTTP/2 connection (preface and empty SETTINGS written).
fn h2_connect(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(PREFACE).unwrap();
    stream.write_all(&frame(SETTINGS, 0, 0, &[])).unwrap();
    stream
}

/// Keeps writing `next` frames, 64 at a time, until the server closes the connection (true)
/// or `within` passes (false); reads what the server answers only when `read`. A write the
/// socket takes in part is finished before new frames are made, so the flood stays well
/// framed: the server must close it for what it is, not for bytes out of step.
fn flood_until_closed(
    stream: &mut TcpStream,
    within: Duration,
    read: bool,
    mut next: impl FnMut(u32) -> Vec<u8>,
) -> bool {
    stream.set_nonblocking(true).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 65536];
    let mut i = 0u32;
    let mut pending: Vec<u8> = Vec::new();
    while started.elapsed() < within {
        if pending.is_empty() {
            pending = (0..64)
                .flat_map(|_| {
                    i += 1;
                    next(i)
                })
                .collect();
        }
        match stream.write(&pending) {
            Ok(n) => {
                pending.drain(..n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if !read {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            Err(_) => return true,
        }
        if !read {
            continue;
        }
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return true,
        }
    }
    false
}

/// Goal: the HTTP/2 floods the edge review found unbounded close the abusive connection while
/// another client keeps its latency: rapid reset (a stream opened and reset, again and
/// again), an endless CONTINUATION flood, and a header block never finished. Method: each
/// flood on the gRPC port for at most 10 s; the server must close the connection; then HTTP
/// requests of another client must be answered about as fast as before.
#[test]
fn http2_floods_close_the_abusive_connection() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with(dir.path(), "header_timeout_ms = 2000", &[]);
    let grpc = server.grpc.unwrap();
    let before = head_latency(server.http, 21);
    let block = call_headers("/umadb.v1.DCB/Head");
    // Rapid reset.
    let mut rapid = h2_connect(grpc);
    let closed = flood_until_closed(&mut rapid, Duration::from_secs(10), true, |i| {
        let id = 2 * i - 1;
        let mut out = frame(HEADERS, END_HEADERS, id, &block);
        out.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
        out
    });
    assert!(closed, "a rapid-reset connection is closed");
    // CONTINUATION flood: a header block that never ends.
    let mut continuation = h2_connect(grpc);
    continuation
        .write_all(&frame(HEADERS, END_STREAM, 1, &block[..4]))
        .unwrap();
    let closed = flood_until_closed(&mut continuation, Duration::from_secs(10), true, |_| {
        frame(CONTINUATION, 0, 1, &[])
    });
    assert!(closed, "an endless CONTINUATION flood is closed");
    // A header block left unfinished, then silence: closed by the keep-alive or timeout.
    let mut unfinished = h2_connect(grpc);
    unfinished
        .write_all(&frame(HEADERS, END_STREAM, 1, &block[..4]))
        .unwrap();
    assert!(
        closed_within(&mut unfinished, Duration::from_secs(30)),
        "an unfinished header block does not hold the connection"
    );
    let after = head_latency(server.http, 21);
    assert!(
        after < before * 10 + LATENCY_SLACK,
        "another client's latency held: {before:?} before, {after:?} after"
    );
}

/// Goal: PING and SETTINGS floods, each of which makes the server answer every frame, cannot
/// grow the server's memory or take another client's latency, whether the flooder reads the
/// answers or not. Method: on both ports (gRPC, and HTTP/2 on the HTTP port), each flood for 2 s
/// from a client that reads and from one that never does; after all of them the server's
/// resident memory may have grown by at most 64 MiB and another client's requests must be
/// answered about as fast as before. (A flood may also be ended by the server closing the
/// connection; it need not be, as long as it costs nothing but its own connection's share.)
#[test]
fn ping_and_settings_floods_cost_only_their_connection() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with(dir.path(), "", &[]);
    let before = head_latency(server.http, 21);
    let rss_before = rss_bytes(server.child.id());
    let ping = frame(PING, 0, 0, &[7u8; 8]);
    let settings = frame(SETTINGS, 0, 0, &[0, 4, 0, 1, 0, 0]);
    for port in [server.grpc.unwrap(), server.http] {
        for one in [&ping, &settings] {
            let mut reading = h2_connect(port);
            flood_until_closed(&mut reading, Duration::from_secs(2), true, |_| one.clone());
            let mut deaf = h2_connect(port);
            flood_until_closed(&mut deaf, Duration::from_secs(2), false, |_| one.clone());
            let during = head_latency(server.http, 21);
            assert!(
                during < before * 10 + LATENCY_SLACK,
                "another client waited {during:?} (before: {before:?}) beside a flood held open"
            );
        }
    }
    let grown = rss_bytes(server.child.id()).saturating_sub(rss_before);
    assert!(
        grown < 64 << 20,
        "the floods grew the server by {grown} bytes"
    );
    let after = head_latency(server.http, 21);
    assert!(
        after < before * 10 + LATENCY_SLACK,
        "another client's latency held: {before:?} before, {after:?} after"
    );
}

/// An SSE subscriber from the first event that never reads what it is sent.
fn stalled_subscriber(http: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(http).unwrap();
    s.write_all(
        b"GET /v1/subscribe?after=0 HTTP/1.1\r\nhost: test\r\naccept: text/event-stream\r\n\r\n",
    )
    .unwrap();
    s
}

/// Starts on `stream` of `c` a gRPC Read with the largest batch size, whose answer the client
/// never reads (its window is left untouched).
fn start_stalled_read(c: &mut TcpStream, stream: u32) {
    // ReadRequest { batch_size: 5000 } (field 6, varint), in a gRPC message frame.
    let message = [0x30, 0x88, 0x27];
    let mut body = vec![0u8];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(&message);
    let block = call_headers("/umadb.v1.DCB/Read");
    c.write_all(&frame(HEADERS, END_HEADERS, stream, &block))
        .unwrap();
    c.write_all(&frame(0x0, END_STREAM, stream, &body)).unwrap();
}

/// Goal: a live stream whose client does not read holds a bounded number of bytes, whatever
/// the events' size. Method: 300 events of 1 MiB appended while two SSE subscribers that never
/// read and two gRPC Read calls that never read are open; the server's resident memory may
/// not grow by more than a bounded amount (the events are in the page cache, not the heap).
#[test]
fn stalled_streams_hold_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with(
        dir.path(),
        "event_bytes_max = 1100000\nbody_bytes_max = 2000000",
        &[],
    );
    let pid = server.child.id();
    let data = "x".repeat(1 << 20);
    let body = format!(r#"{{"events":[{{"type":"Big","tags":["big"],"data":"{data}"}}]}}"#);
    for _ in 0..20 {
        assert_eq!(server.post("/v1/append", &body).status, 200);
    }
    let baseline = rss_bytes(pid);
    // Two SSE subscribers that never read.
    let mut stalled = Vec::new();
    for _ in 0..2 {
        stalled.push(stalled_subscriber(server.http));
    }
    // Two gRPC reads with the largest batch size that never read (HTTP/2, window untouched).
    for _ in 0..2 {
        let mut c = h2_connect(server.grpc.unwrap());
        start_stalled_read(&mut c, 1);
        stalled.push(c);
    }
    for _ in 0..280 {
        assert_eq!(server.post("/v1/append", &body).status, 200);
    }
    std::thread::sleep(Duration::from_millis(500));
    let grown = rss_bytes(pid).saturating_sub(baseline);
    assert!(
        grown < 120 << 20,
        "four stalled streams over 300 MiB of events grew the server by {} MiB",
        grown >> 20
    );
    drop(stalled);
}

/// The value of an unlabelled gauge in the server's /metrics.
fn metric(server: &ServerProcess, name: &str) -> f64 {
    let text = server.get("/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
        .trim()
        .parse()
        .unwrap()
}

/// Goal: what all stalled streams together hold is bounded by the server's budget, and what
/// one connection's streams hold by the connection's, whatever the number of connections and
/// streams. Method: an 8 MiB server budget; 48 SSE subscribers on connections of their own and
/// one HTTP/2 connection with 24 gRPC Read calls that never read, over 120 events of 1 MiB;
/// the server's resident memory and its own gauge of bytes held must stay near the budget
/// (each stream alone is bounded to 1-2 MiB, so without the budget they hold ~100 MiB).
/// Meanwhile a reading client's head requests are answered.
#[test]
fn stalled_streams_together_hold_the_servers_budget() {
    const BUDGET: usize = 8 << 20;
    let dir = tempfile::tempdir().unwrap();
    let server = server_with(
        dir.path(),
        &format!(
            "event_bytes_max = 1100000\nbody_bytes_max = 2000000\nstream_bytes_max = {BUDGET}\n\
             stream_bytes_per_connection_max = {}",
            BUDGET / 2
        ),
        &[],
    );
    let pid = server.child.id();
    let data = "x".repeat(1 << 20);
    let body = format!(r#"{{"events":[{{"type":"Big","tags":["big"],"data":"{data}"}}]}}"#);
    for _ in 0..8 {
        assert_eq!(server.post("/v1/append", &body).status, 200);
    }
    let baseline = rss_bytes(pid);
    let mut stalled = Vec::new();
    for _ in 0..48 {
        stalled.push(stalled_subscriber(server.http));
    }
    let mut c = h2_connect(server.grpc.unwrap());
    for i in 0..24u32 {
        start_stalled_read(&mut c, 1 + 2 * i);
    }
    stalled.push(c);
    for _ in 0..112 {
        assert_eq!(server.post("/v1/append", &body).status, 200);
    }
    annals_testkit::eventually(
        "the stalled streams filling half the budget",
        Duration::from_secs(10),
        || metric(&server, "annals_stream_buffered_bytes") >= (BUDGET / 2) as f64,
    );
    let held = metric(&server, "annals_stream_buffered_bytes");
    assert!(
        held <= BUDGET as f64,
        "streams hold {held} bytes, over the budget of {BUDGET}"
    );
    let grown = rss_bytes(pid).saturating_sub(baseline);
    assert!(
        grown < 48 << 20,
        "72 stalled streams over 120 MiB of events grew the server by {} MiB (budget 8 MiB)",
        grown >> 20
    );
    assert!(head_latency(server.http, 5) < Duration::from_millis(500));
    drop(stalled);
    // Once the clients are gone, their reservations come back.
    annals_testkit::eventually(
        "the reservations to be returned",
        Duration::from_secs(10),
        || {
            let buffered = metric(&server, "annals_stream_buffered_bytes");
            if buffered > 0.0 {
                Err(buffered)
            } else {
                Ok(())
            }
        },
    );
}

/// Goal: every refusal is a 4xx with the JSON error body, including those made before any
/// handler runs. Regression: the unencoded read URL docs/SERVER.md showed got hyper's bare 400,
/// and a path segment that is not UTF-8 got axum's plain-text rejection. Method: one request
/// for each way in (a query value with bad percent-encoding; JSON unencoded in the URI; a path
/// segment that decodes to no UTF-8; an unknown route; a method a route does not take; a body
/// that is not JSON; a body over `body_bytes_max`), each required to be a 4xx whose body
/// parses as `{"error": text, "kind": text}`; the head stays 0 throughout. A browser's icon
/// request is answered with no content rather than refused.
#[test]
fn every_refusal_is_json_before_any_handler_too() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with(dir.path(), "body_bytes_max = 1024", &[]);
    let big = format!(
        r#"{{"events":[{{"type":"T","data":"{}"}}]}}"#,
        "x".repeat(2048)
    );
    /// A request (method, path, headers, body) and the status that must refuse it.
    type Refusal<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], &'a [u8], u16);
    let refusals: [Refusal; 7] = [
        ("GET", "/v1/read?query=%ZZ%7B", &[], b"", 400),
        (
            "GET",
            r#"/v1/read?query={"items":[{"tags":["order:1"]}]}"#,
            &[],
            b"",
            400,
        ),
        ("GET", "/v1/readmodels/%FF%FE", &[], b"", 400),
        ("GET", "/v1/no-such-endpoint", &[], b"", 404),
        ("DELETE", "/v1/append", &[], b"", 405),
        (
            "POST",
            "/v1/append",
            &[("content-type", "text/plain")],
            br#"{"events":[]}"#,
            415,
        ),
        ("POST", "/v1/append", &[], big.as_bytes(), 413),
    ];
    for (method, path, headers, body, status) in refusals {
        let r = request(server.http, method, path, headers, body);
        assert_eq!(r.status, status, "{method} {path}: {}", r.text());
        assert!(
            r.header("content-type")
                .is_some_and(|t| t.starts_with("application/json")),
            "{method} {path}: {:?}",
            r.headers
        );
        let answer = r.json();
        assert!(
            answer["error"].as_str().is_some_and(|e| !e.is_empty())
                && answer["kind"].as_str().is_some_and(|k| !k.is_empty()),
            "{method} {path}: {answer}"
        );
    }
    assert_eq!(server.head(), 0);
    let icon = request(server.http, "GET", "/favicon.ico", &[], b"");
    assert_eq!(icon.status, 204);
}
