//! `annals serve` end to end over gRPC with UmaDB's own clients, unchanged: the Rust
//! `umadb-client` crate here, the Python `umadb` package through tests/python.

mod common;

use std::time::Duration;

use common::umadb_event as event;
use common::ServerProcess;
use umadb_client::UmaDbClient;
use umadb_dcb::{
    DcbAppendCondition, DcbError, DcbEventStoreSync, DcbQuery, DcbQueryItem, TrackingInfo,
};

fn tags(tags: &[&str]) -> DcbQuery {
    DcbQuery {
        items: vec![DcbQueryItem {
            types: Vec::new(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
        }],
    }
}

fn condition(query: DcbQuery, after: Option<u64>) -> Option<DcbAppendCondition> {
    Some(DcbAppendCondition {
        fail_if_events_match: query,
        after,
    })
}

/// Goal: the Rust umadb-client works against Annals unchanged for read (start, backwards,
/// limit, queries), append with and without conditions, conflicts, subscribe, head, tracking
/// and health.
#[test]
fn umadb_rust_client_covers_the_dcb_api() {
    let dir = tempfile::tempdir().unwrap();
    rust_client_covers_the_dcb_api(&ServerProcess::start(dir.path(), &[]));
}

fn rust_client_covers_the_dcb_api(server: &ServerProcess) {
    let client = UmaDbClient::new(server.grpc_url()).connect().unwrap();
    assert_eq!(
        client.check_health("umadb.v1.DCB").unwrap(),
        umadb_client::ServingStatus::Serving
    );
    // Empty store.
    assert_eq!(client.head().unwrap(), None);
    let (events, head) = client.read_with_head(None, None, false, None).unwrap();
    assert!(events.is_empty());
    assert_eq!(head, None);
    // Appends without and with a condition; `after` beyond the head is accepted.
    assert_eq!(
        client
            .append(
                vec![event("CourseDefined", &["course:c1"], "10")],
                None,
                None
            )
            .unwrap(),
        1
    );
    let last = client
        .append(
            vec![
                event("StudentSubscribed", &["course:c1", "student:s1"], ""),
                event("StudentSubscribed", &["course:c1", "student:s2"], ""),
                event("CourseDefined", &["course:c2"], "5"),
            ],
            condition(tags(&["course:c9"]), Some(100)),
            None,
        )
        .unwrap();
    assert_eq!(last, 4);
    assert_eq!(client.head().unwrap(), Some(4));
    // Reads: all, start (inclusive), backwards from start, limit, queries.
    let positions = |events: Vec<umadb_dcb::DcbSequencedEvent>| -> Vec<u64> {
        events.iter().map(|e| e.position).collect()
    };
    let (all, head) = client.read_with_head(None, None, false, None).unwrap();
    assert_eq!(positions(all.clone()), [1, 2, 3, 4]);
    assert_eq!(head, Some(4));
    assert_eq!(all[1].event.event_type, "StudentSubscribed");
    assert_eq!(all[1].event.tags, ["course:c1", "student:s1"]);
    assert_eq!(all[0].event.data, b"10");
    let read = |query: Option<DcbQuery>, start, backwards, limit| {
        positions(
            client
                .read_with_head(query, start, backwards, limit)
                .unwrap()
                .0,
        )
    };
    assert_eq!(read(None, Some(2), false, None), [2, 3, 4]);
    assert_eq!(read(None, Some(3), true, None), [3, 2, 1]);
    assert_eq!(read(None, Some(3), true, Some(2)), [3, 2]);
    assert_eq!(read(None, None, true, Some(1)), [4]);
    assert_eq!(read(None, None, false, Some(2)), [1, 2]);
    assert_eq!(read(None, Some(10), false, None), Vec::<u64>::new());
    assert_eq!(
        read(Some(tags(&["course:c1"])), None, false, None),
        [1, 2, 3]
    );
    assert_eq!(
        read(Some(tags(&["course:c1", "student:s2"])), None, false, None),
        [3]
    );
    let types = DcbQuery {
        items: vec![DcbQueryItem {
            types: vec!["CourseDefined".into()],
            tags: Vec::new(),
        }],
    };
    assert_eq!(read(Some(types), None, false, None), [1, 4]);
    // With a limit, the head a read reports is its last event (as UmaDB's server does).
    let (_, head) = client.read_with_head(None, None, false, Some(2)).unwrap();
    assert_eq!(head, Some(2));
    // A conflict is an IntegrityError naming the position; nothing is appended.
    let err = client
        .append(
            vec![event("StudentSubscribed", &["course:c1", "student:s3"], "")],
            condition(tags(&["course:c1"]), Some(1)),
            None,
        )
        .unwrap_err();
    match err {
        DcbError::IntegrityError(message) => assert!(message.contains("position 2"), "{message}"),
        other => panic!("expected an integrity error, got {other:?}"),
    }
    assert_eq!(client.head().unwrap(), Some(4));
    assert_eq!(
        client
            .append(
                vec![event("StudentSubscribed", &["course:c1", "student:s3"], "")],
                condition(tags(&["course:c1"]), Some(3)),
                None,
            )
            .unwrap(),
        5
    );
    // A conditional append retried with the same ids answers where it is stored; metadata
    // travels both ways.
    let mut paid = event("Paid", &["invoice:1"], "100");
    paid.uuid = Some(uuid::Uuid::from_u128(0x1234));
    paid.metadata = vec![
        ("correlation".into(), "abc".into()),
        ("user".into(), "ada".into()),
    ];
    let once = || condition(tags(&["invoice:1"]), None);
    let first = client.append(vec![paid.clone()], once(), None).unwrap();
    assert_eq!(
        client.append(vec![paid.clone()], once(), None).unwrap(),
        first
    );
    let (stored, _) = client
        .read_with_head(Some(tags(&["invoice:1"])), None, false, None)
        .unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].event.uuid, paid.uuid);
    assert_eq!(stored[0].event.metadata, paid.metadata);
    // Tracking positions only increase, and are recorded with the append.
    assert_eq!(client.get_tracking_info("projector").unwrap(), None);
    client
        .append(
            vec![event("Projected", &[], "")],
            None,
            Some(TrackingInfo {
                source: "projector".into(),
                position: 5,
            }),
        )
        .unwrap();
    assert_eq!(client.get_tracking_info("projector").unwrap(), Some(5));
    let err = client
        .append(
            vec![event("Projected", &[], "")],
            None,
            Some(TrackingInfo {
                source: "projector".into(),
                position: 5,
            }),
        )
        .unwrap_err();
    assert!(
        matches!(&err, DcbError::IntegrityError(m) if m.contains("non-increasing tracking position")),
        "{err:?}"
    );
    let head = client.head().unwrap().unwrap();
    // Subscribe: catch up from `after`, then follow appends made meanwhile, with no gap.
    let mut subscription = client.subscribe(None, Some(head - 2)).unwrap();
    let url = server.grpc_url();
    let appender = std::thread::spawn(move || {
        let client = UmaDbClient::new(url).connect().unwrap();
        for i in 0..50 {
            client
                .append(vec![event("Live", &["live:1"], &i.to_string())], None, None)
                .unwrap();
        }
    });
    let mut seen = Vec::new();
    while seen.len() < 52 {
        let e = subscription
            .next_timeout(Duration::from_secs(20))
            .expect("the subscription delivers")
            .unwrap();
        seen.push(e.position);
    }
    assert_eq!(seen, ((head - 1)..=(head + 50)).collect::<Vec<_>>());
    appender.join().unwrap();
    // A subscription with a query sees only its events.
    let mut live = client.subscribe(Some(tags(&["live:1"])), None).unwrap();
    let first_live = live.next_timeout(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(first_live.event.event_type, "Live");
    assert_eq!(first_live.position, head + 1);
}

/// An append of one event of type E tagged k:1, without a condition.
fn one_event_append() -> umadb_proto::v1::AppendRequest {
    umadb_proto::v1::AppendRequest {
        events: vec![umadb_proto::v1::Event {
            event_type: "E".into(),
            tags: vec!["k:1".into()],
            data: b"x".to_vec(),
            uuid: String::new(),
            metadata: Vec::new(),
        }],
        condition: None,
        tracking_info: None,
    }
}

/// The tonic channel and a generic gRPC client for raw calls.
async fn raw_client(url: String) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    tonic::client::Grpc::new(channel)
}

async fn raw_head(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    path: &'static str,
    key: Option<&str>,
) -> Result<umadb_proto::v1::HeadResponse, tonic::Status> {
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(umadb_proto::v1::HeadRequest {});
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    let codec = tonic_prost::ProstCodec::<
        umadb_proto::v1::HeadRequest,
        umadb_proto::v1::HeadResponse,
    >::default();
    grpc.unary(request, http::uri::PathAndQuery::from_static(path), codec)
        .await
        .map(|r| r.into_inner())
}

/// Goal: the legacy service name answers like `umadb.v1.DCB`; with keys configured, calls
/// without a key or with a wrong one are UNAUTHENTICATED and without the scope
/// PERMISSION_DENIED, each with UmaDB's structured error details.
#[test]
fn legacy_service_name_and_auth_codes() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with_env(
        &dir.path().join("data"),
        &[],
        &[(
            "ANNALS_API_KEYS",
            "reader-key-0000000001=read;writer-key-0000000002=append,read",
        )],
    );
    let url = server.grpc_url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut grpc = raw_client(url.clone()).await;
        for path in ["/umadb.v1.DCB/Head", "/umadb.UmaDBService/Head"] {
            let head = raw_head(&mut grpc, path, Some("reader-key-0000000001"))
                .await
                .unwrap();
            assert_eq!(head.position, None, "{path}");
            let err = raw_head(&mut grpc, path, None).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{path}");
            let err = raw_head(&mut grpc, path, Some("wrong-key-00000000000"))
                .await
                .unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{path}");
            let details =
                <umadb_proto::v1::ErrorResponse as prost::Message>::decode(err.details()).unwrap();
            assert_eq!(
                details.error_type,
                umadb_proto::v1::error_response::ErrorType::Authentication as i32
            );
        }
        let channel = tonic::transport::Endpoint::from_shared(url)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut dcb = umadb_proto::v1::dcb_client::DcbClient::new(channel);
        let append = |key: Option<&str>| {
            let mut request = tonic::Request::new(one_event_append());
            if let Some(key) = key {
                request
                    .metadata_mut()
                    .insert("authorization", format!("Bearer {key}").parse().unwrap());
            }
            request
        };
        assert_eq!(
            dcb.append(append(None)).await.unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            dcb.append(append(Some("reader-key-0000000001")))
                .await
                .unwrap_err()
                .code(),
            tonic::Code::PermissionDenied
        );
        let position = dcb
            .append(append(Some("writer-key-0000000002")))
            .await
            .unwrap()
            .into_inner()
            .position;
        assert_eq!(position, 1);
        // Legacy Append through the generic client works too.
        let mut read = tonic::Request::new(umadb_proto::v1::ReadRequest::default());
        read.metadata_mut().insert(
            "authorization",
            "Bearer reader-key-0000000001".parse().unwrap(),
        );
        let mut stream = dcb.read(read).await.unwrap().into_inner();
        let batch = stream.message().await.unwrap().unwrap();
        assert_eq!(batch.events.len(), 1);
        assert_eq!(batch.head, Some(1));
        // Bad input over gRPC: INVALID_ARGUMENT with a message, nothing appended.
        let mut bad = append(Some("writer-key-0000000002"));
        bad.get_mut().events[0].tags = vec!["k:1".into(), "k:1".into()];
        let err = dcb.append(bad).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("twice"), "{}", err.message());
        // An unreadable UUID is a deserialization error, as UmaDB answers it.
        let mut bad = append(Some("writer-key-0000000002"));
        bad.get_mut().events[0].uuid = "not-a-uuid".into();
        assert_eq!(
            dcb.append(bad).await.unwrap_err().code(),
            tonic::Code::DataLoss
        );
        // No events: nothing appended, position 0.
        let mut empty = append(Some("writer-key-0000000002"));
        empty.get_mut().events.clear();
        assert_eq!(dcb.append(empty).await.unwrap().into_inner().position, 0);
        let mut head = tonic::Request::new(umadb_proto::v1::HeadRequest {});
        head.metadata_mut().insert(
            "authorization",
            "Bearer reader-key-0000000001".parse().unwrap(),
        );
        assert_eq!(dcb.head(head).await.unwrap().into_inner().position, Some(1));
    });
}

/// Goal: with a certificate, gRPC and HTTP run over TLS, and the umadb client connects with
/// the CA and an API key (which it refuses to send without TLS).
#[test]
fn tls_with_api_key_through_umadb_client() {
    let dir = tempfile::tempdir().unwrap();
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert_path = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();
    let server = ServerProcess::start_with_env(
        &dir.path().join("data"),
        &[
            "--tls-cert",
            cert_path.to_str().unwrap(),
            "--tls-key",
            key_path.to_str().unwrap(),
        ],
        &[("ANNALS_API_KEYS", "app-key-000000000001=read,append")],
    );
    let url = format!("https://{}", server.grpc.unwrap());
    let client = UmaDbClient::new(url.clone())
        .ca_path(cert_path.to_str().unwrap().to_string())
        .api_key("app-key-000000000001".into())
        .connect()
        .unwrap();
    assert_eq!(
        client
            .append(vec![event("Secure", &["t:1"], "s")], None, None)
            .unwrap(),
        1
    );
    assert_eq!(client.head().unwrap(), Some(1));
    let wrong = UmaDbClient::new(url)
        .ca_path(cert_path.to_str().unwrap().to_string())
        .api_key("app-key-000000000002".into())
        .connect()
        .unwrap();
    assert!(matches!(
        wrong.head(),
        Err(DcbError::AuthenticationError(_))
    ));
    // HTTPS on the HTTP port, checked with curl against the same CA.
    let out = std::process::Command::new("curl")
        .args(["-s", "--cacert", cert_path.to_str().unwrap()])
        .args(["-H", "authorization: Bearer app-key-000000000001"])
        .arg(format!("https://127.0.0.1:{}/v1/head", server.http.port()))
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&out.stdout), r#"{"head":1}"#);
    // The command line client over HTTPS, trusting the same CA.
    let https = format!("https://127.0.0.1:{}", server.http.port());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_annals"))
        .args(["read", "--url", &https, "--api-key", "app-key-000000000001"])
        .args([
            "--ca-cert",
            cert_path.to_str().unwrap(),
            "--format",
            "ndjson",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["type"], "Secure");
    // Without the CA, the server's self-signed certificate is refused.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_annals"))
        .args(["read", "--url", &https, "--api-key", "app-key-000000000001"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("TLS"));
    // Plain HTTP to the TLS port is refused.
    let plain = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("http://127.0.0.1:{}/v1/head", server.http.port()))
        .output()
        .unwrap();
    assert_ne!(String::from_utf8_lossy(&plain.stdout), "200");
}

/// Goal: UmaDB's Python client (the `umadb` package), and the Python eventsourcing library's
/// UmaDB persistence module built on it (recorders, applications, projections), work against
/// Annals unchanged. The test
/// command installs them (scripts/setup); elsewhere the test says how to.
#[test]
fn umadb_python_client() {
    let dir = tempfile::tempdir().unwrap();
    // Data subjects under customer:, for the erasure test.
    let master = dir.path().join("master.key");
    std::fs::write(&master, "5a".repeat(32)).unwrap();
    let master = master.display().to_string();
    let flags = ["--subject-tags", "customer:", "--master-key-file", &master];
    let server = ServerProcess::start(&dir.path().join("data"), &flags);
    let mut env = vec![
        ("ANNALS_GRPC_URL", server.grpc_url()),
        ("ANNALS_HTTP_URL", format!("http://{}", server.http)),
    ];
    // UmaDB's own server, when scripts/setup built it: the eventsourcing tests run on it too.
    if let Some(umadb) = annals_testkit::umadb_bin() {
        env.push(("ANNALS_UMADB_BIN", umadb.display().to_string()));
    }
    common::python_suite(&env);
}

/// One gRPC call written by hand on HTTP/2: `body` as sent, the answer's status code and
/// message (from a trailers-only answer or from the trailers) and its message bytes.
async fn raw_call(
    sender: &h2::client::SendRequest<bytes::Bytes>,
    authority: &str,
    path: &str,
    headers: &[(&'static str, &'static str)],
    body: Vec<u8>,
) -> (i32, String, Vec<u8>) {
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{authority}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut ready = sender.clone().ready().await.unwrap();
    let (response, mut outgoing) = ready
        .send_request(request.body(()).unwrap(), false)
        .unwrap();
    outgoing.send_data(bytes::Bytes::from(body), true).unwrap();
    let response = response.await.unwrap();
    let (parts, mut incoming) = response.into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = incoming.data().await {
        let chunk = chunk.unwrap();
        let _ = incoming.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = incoming.trailers().await.unwrap();
    let source = trailers
        .as_ref()
        .filter(|t| t.contains_key("grpc-status"))
        .unwrap_or(&parts.headers);
    let code = source["grpc-status"].to_str().unwrap().parse().unwrap();
    let message = source
        .get("grpc-message")
        .map(|m| percent_decoded(m.as_bytes()))
        .unwrap_or_default();
    (code, message, data)
}

/// `grpc-message` is percent-encoded.
fn percent_decoded(bytes: &[u8]) -> String {
    percent_encoding::percent_decode(bytes)
        .decode_utf8_lossy()
        .into_owned()
}

type Headers = Vec<(&'static str, &'static str)>;

/// gRPC framing: a compressed flag, the length (big-endian), the payload.
fn framed(flag: u8, length: u32, payload: &[u8]) -> Vec<u8> {
    let mut body = vec![flag];
    body.extend_from_slice(&length.to_be_bytes());
    body.extend_from_slice(payload);
    body
}

/// Goal: the unary calls, which the server decodes without tonic's codec, answer malformed
/// framing as tonic does (code and message), change nothing, hand compressed requests to tonic,
/// and answer well-formed calls under both service names.
#[test]
fn unary_calls_answer_bad_framing_and_change_nothing() {
    use prost::Message;
    use umadb_proto::v1;
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let authority = server.grpc_url().trim_start_matches("http://").to_string();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(&authority).await.unwrap();
        let (sender, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        let append = one_event_append().encode_to_vec();
        let len = append.len() as u32;
        // (what, extra headers, body, expected code, expected words in the message)
        let cases: Vec<(&str, Headers, Vec<u8>, i32, &str)> = vec![
            (
                "empty body",
                vec![],
                Vec::new(),
                13,
                "Missing request message.",
            ),
            (
                "compressed flag",
                vec![],
                framed(1, len, &append),
                13,
                "compressed-flag",
            ),
            (
                "unknown flag",
                vec![],
                framed(7, len, &append),
                13,
                "invalid compression flag: 7",
            ),
            (
                "over the limit",
                vec![],
                framed(0, 64 << 20, &append),
                11,
                "too large",
            ),
            (
                "cut short",
                vec![],
                framed(0, len + 10, &append),
                13,
                "Unexpected EOF",
            ),
            ("half a header", vec![], vec![0, 0, 0], 13, "Unexpected EOF"),
            (
                "not protobuf",
                vec![],
                framed(0, 3, &[0xff, 0xff, 0xff]),
                13,
                "",
            ),
            (
                "gzip",
                vec![("grpc-encoding", "gzip")],
                framed(1, len, &append),
                12,
                "gzip",
            ),
        ];
        for path in ["/umadb.v1.DCB/Append", "/umadb.UmaDBService/Append"] {
            for (what, headers, body, code, message) in &cases {
                let (got, text, _) =
                    raw_call(&sender, &authority, path, headers, body.clone()).await;
                assert_eq!(got, *code, "{path} {what}: {text}");
                assert!(text.contains(message), "{path} {what}: {text}");
            }
        }
        let head = |path: &'static str| {
            let sender = sender.clone();
            let authority = authority.clone();
            async move {
                let (code, _, data) =
                    raw_call(&sender, &authority, path, &[], framed(0, 0, &[])).await;
                assert_eq!(code, 0, "{path}");
                v1::HeadResponse::decode(&data[5..]).unwrap().position
            }
        };
        assert_eq!(
            head("/umadb.v1.DCB/Head").await,
            None,
            "nothing was appended"
        );
        for (path, expected) in [
            ("/umadb.v1.DCB/Append", 1),
            ("/umadb.UmaDBService/Append", 2),
        ] {
            let (code, text, data) =
                raw_call(&sender, &authority, path, &[], framed(0, len, &append)).await;
            assert_eq!(code, 0, "{path}: {text}");
            assert_eq!(
                u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize,
                data.len() - 5
            );
            let answer = v1::AppendResponse::decode(&data[5..]).unwrap();
            assert_eq!(answer.position, expected, "{path}");
        }
        assert_eq!(head("/umadb.UmaDBService/Head").await, Some(2));
        let tracking = v1::TrackingRequest {
            source: "nobody".into(),
        }
        .encode_to_vec();
        let (code, _, data) = raw_call(
            &sender,
            &authority,
            "/umadb.v1.DCB/GetTrackingInfo",
            &[],
            framed(0, tracking.len() as u32, &tracking),
        )
        .await;
        assert_eq!(code, 0);
        assert_eq!(
            v1::TrackingResponse::decode(&data[5..]).unwrap().position,
            None
        );
    });
}

/// Goal: one behaviour for ids through both APIs. An append with ids and a condition, sent over
/// HTTP, then retried over gRPC and over HTTP again, answers the original position each time;
/// the same events without a condition are appended again through either; an append of no
/// events answers position 0 through both. Method: one server, the same appends through
/// UmaDB's Rust client and the HTTP API, positions and the stored events compared.
#[test]
fn ids_and_empty_appends_behave_alike_over_http_and_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let client = UmaDbClient::new(server.grpc_url()).connect().unwrap();
    let id = "0b8e3c1a-7d5f-4a9e-8c2b-3f4e5d6c7b8a";
    let over_http = format!(
        r#"{{"events":[{{"type":"Paid","tags":["invoice:7"],"data":"1","id":"{id}"}}],
            "condition":{{"failIfEventsMatch":{{"items":[{{"tags":["invoice:7"]}}]}}}}}}"#
    );
    let first = server.append(&over_http);
    assert_eq!(first["appendConditionFailed"], false);
    let position = first["position"].as_u64().unwrap();
    // The same append retried over HTTP: the condition fails on exactly its own event.
    let again = server.append(&over_http);
    assert_eq!(again["appendConditionFailed"], false, "{again}");
    assert_eq!(again["position"].as_u64(), Some(position));
    // And over gRPC.
    let mut paid = event("Paid", &["invoice:7"], "1");
    paid.uuid = Some(id.parse().unwrap());
    let guarded = condition(tags(&["invoice:7"]), None);
    assert_eq!(
        client
            .append(vec![paid.clone()], guarded.clone(), None)
            .unwrap(),
        position
    );
    // Another id under the same condition is a conflict, through both.
    let other = over_http.replace(id, "0b8e3c1a-7d5f-4a9e-8c2b-3f4e5d6c7b8b");
    let refused = server.append(&other);
    assert_eq!(refused["appendConditionFailed"], true);
    assert_eq!(refused["conflictPosition"].as_u64(), Some(position));
    let mut stranger = paid.clone();
    stranger.uuid = Some("0b8e3c1a-7d5f-4a9e-8c2b-3f4e5d6c7b8b".parse().unwrap());
    assert!(matches!(
        client.append(vec![stranger], guarded, None),
        Err(DcbError::IntegrityError(_))
    ));
    // Without a condition, an id is no obstacle through either API.
    let unguarded =
        format!(r#"{{"events":[{{"type":"Paid","tags":["invoice:7"],"data":"1","id":"{id}"}}]}}"#);
    assert_eq!(
        server.append(&unguarded)["position"].as_u64(),
        Some(position + 1)
    );
    assert_eq!(client.append(vec![paid], None, None).unwrap(), position + 2);
    assert_eq!(
        server
            .read(r#"{"items":[{"tags":["invoice:7"]}]}"#, "{}")
            .len(),
        3
    );
    // No events: position 0 through both, nothing stored.
    assert_eq!(
        server.append(r#"{"events":[]}"#)["position"].as_u64(),
        Some(0)
    );
    assert_eq!(client.append(vec![], None, None).unwrap(), 0);
    assert_eq!(server.head(), position + 2);
}
