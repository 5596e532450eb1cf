//! Differential test of the UmaDB protocol: the same calls go to UmaDB 0.7.8's own server
//! (built from crates.io by scripts/setup) and to Annals, one after the other, and the answers
//! are compared field by field: positions, events with their ids and metadata, heads, how a
//! read is cut into messages (and whether one is sent when nothing matches), gRPC status codes
//! and the error type in the status details.
//!
//! Where Annals differs on purpose, docs/USING.md ("UmaDB compatibility") lists the difference
//! with its reason.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::ServerProcess;
use prost::Message;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;
use umadb_proto::v1;
use umadb_proto::v1::dcb_client::DcbClient;

/// UmaDB's server, as scripts/setup installs it.
fn umadb_binary() -> Option<PathBuf> {
    if let Some(path) = annals_testkit::umadb_bin() {
        return Some(path);
    }
    assert!(
        std::env::var_os("ANNALS_REQUIRE_PEERS").is_none(),
        "UmaDB's server is missing from {}: run scripts/setup",
        annals_testkit::tools_dir().display()
    );
    eprintln!("skipped: UmaDB's server is not installed (scripts/setup installs it)");
    None
}

/// A running UmaDB server on a fresh database.
struct Umadb {
    child: Child,
    addr: SocketAddr,
}

impl Umadb {
    fn start(binary: &Path, dir: &Path) -> Umadb {
        let port = annals_testkit::free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let child = Command::new(binary)
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--db-path")
            .arg(dir.join("uma.db"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn UmaDB's server");
        annals_testkit::eventually("UmaDB's server to listen", Duration::from_secs(30), || {
            TcpStream::connect(addr).is_ok()
        });
        Umadb { child, addr }
    }
}

impl Drop for Umadb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a call answered, in the terms compared.
#[derive(Debug, Clone, PartialEq)]
enum Answer<T> {
    Ok(T),
    Err {
        code: tonic::Code,
        /// The `ErrorResponse` type in the status details, if any.
        error_type: Option<i32>,
        /// The message carries the word "integrity" (in any case), as adapters look for.
        integrity_word: bool,
    },
}

fn error<T>(status: &tonic::Status) -> Answer<T> {
    let error_type = v1::ErrorResponse::decode(status.details())
        .ok()
        .filter(|_| !status.details().is_empty())
        .map(|e| e.error_type);
    Answer::Err {
        code: status.code(),
        error_type,
        integrity_word: status.message().to_lowercase().contains("integrity"),
    }
}

/// An event as read back.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    position: u64,
    event_type: String,
    tags: Vec<String>,
    data: Vec<u8>,
    uuid: String,
    metadata: Vec<(String, String)>,
}

fn seen(e: v1::SequencedEvent) -> Seen {
    let event = e.event.unwrap_or_default();
    Seen {
        position: e.position,
        event_type: event.event_type,
        tags: event.tags,
        data: event.data,
        uuid: event.uuid,
        metadata: event
            .metadata
            .into_iter()
            .map(|m| (m.key, m.value))
            .collect(),
    }
}

/// A read's messages: each one's events and head; an error ends the list.
type ReadAnswer = Answer<Vec<(Vec<Seen>, Option<u64>)>>;

struct Peer {
    name: &'static str,
    client: DcbClient<Channel>,
}

impl Peer {
    async fn connect(name: &'static str, addr: SocketAddr) -> Peer {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Peer {
            name,
            client: DcbClient::new(channel),
        }
    }

    async fn append(&mut self, request: v1::AppendRequest) -> Answer<u64> {
        match self.client.append(request).await {
            Ok(r) => Answer::Ok(r.into_inner().position),
            Err(s) => error(&s),
        }
    }

    async fn head(&mut self) -> Answer<Option<u64>> {
        match self.client.head(v1::HeadRequest {}).await {
            Ok(r) => Answer::Ok(r.into_inner().position),
            Err(s) => error(&s),
        }
    }

    async fn tracking(&mut self, source: &str) -> Answer<Option<u64>> {
        let request = v1::TrackingRequest {
            source: source.into(),
        };
        match self.client.get_tracking_info(request).await {
            Ok(r) => Answer::Ok(r.into_inner().position),
            Err(s) => error(&s),
        }
    }

    async fn read(&mut self, request: v1::ReadRequest) -> ReadAnswer {
        let mut stream = match self.client.read(request).await {
            Ok(r) => r.into_inner(),
            Err(s) => return error(&s),
        };
        let mut messages = Vec::new();
        loop {
            match stream.message().await {
                Ok(Some(m)) => messages.push((m.events.into_iter().map(seen).collect(), m.head)),
                Ok(None) => break,
                Err(s) => return error(&s),
            }
        }
        Answer::Ok(messages)
    }

    /// A subscription's events until `count` have arrived, or none more for 10 s (long beside
    /// a loaded machine's appends, and only ever waited out when a server sends too few).
    async fn subscribe(
        &mut self,
        request: v1::SubscribeRequest,
        count: usize,
    ) -> Answer<Vec<Seen>> {
        let mut stream = match self.client.subscribe(request).await {
            Ok(r) => r.into_inner(),
            Err(s) => return error(&s),
        };
        let mut events = Vec::new();
        while events.len() < count {
            match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
                Ok(Ok(Some(m))) => events.extend(m.events.into_iter().map(seen)),
                Ok(Err(s)) => return error(&s),
                Ok(Ok(None)) | Err(_) => break,
            }
        }
        Answer::Ok(events)
    }
}

/// The two servers side by side; every call goes to both and the answers must agree.
struct Pair {
    umadb: Peer,
    annals: Peer,
    calls: usize,
    /// The calls answered differently, described (the test fails at the end if any).
    differences: Vec<String>,
}

impl Pair {
    fn check<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, a: Answer<T>, b: Answer<T>) {
        self.calls += 1;
        if a != b {
            self.differences.push(format!(
                "call {} ({what}):\n  {}: {a:?}\n  {}: {b:?}",
                self.calls, self.umadb.name, self.annals.name
            ));
        }
    }

    async fn append(&mut self, what: &str, request: v1::AppendRequest) -> Answer<u64> {
        let a = self.umadb.append(request.clone()).await;
        let b = self.annals.append(request).await;
        self.check(what, a.clone(), b);
        a
    }

    async fn head(&mut self) {
        let a = self.umadb.head().await;
        let b = self.annals.head().await;
        self.check("head", a, b);
    }

    async fn tracking(&mut self, source: &str) {
        let a = self.umadb.tracking(source).await;
        let b = self.annals.tracking(source).await;
        self.check(&format!("tracking {source:?}"), a, b);
    }

    async fn read(&mut self, request: v1::ReadRequest) {
        let what = format!("read {request:?}");
        let a = self.umadb.read(request.clone()).await;
        let b = self.annals.read(request).await;
        self.check(&what, a, b);
    }

    async fn subscribe(&mut self, request: v1::SubscribeRequest, count: usize) {
        let what = format!("subscribe {request:?}");
        let a = self.umadb.subscribe(request.clone(), count).await;
        let b = self.annals.subscribe(request, count).await;
        self.check(&what, a, b);
    }
}

fn event(event_type: &str, tags: &[&str], data: &str) -> v1::Event {
    v1::Event {
        event_type: event_type.into(),
        tags: tags.iter().map(|t| t.to_string()).collect(),
        data: data.as_bytes().to_vec(),
        uuid: String::new(),
        metadata: Vec::new(),
    }
}

fn with_id(mut e: v1::Event, id: &str) -> v1::Event {
    e.uuid = id.into();
    e
}

fn item(types: &[&str], tags: &[&str]) -> v1::QueryItem {
    v1::QueryItem {
        types: types.iter().map(|t| t.to_string()).collect(),
        tags: tags.iter().map(|t| t.to_string()).collect(),
    }
}

fn query(items: Vec<v1::QueryItem>) -> Option<v1::Query> {
    Some(v1::Query { items })
}

fn append(events: Vec<v1::Event>) -> v1::AppendRequest {
    v1::AppendRequest {
        events,
        condition: None,
        tracking_info: None,
    }
}

fn conditional(
    events: Vec<v1::Event>,
    fail_if: Option<v1::Query>,
    after: Option<u64>,
) -> v1::AppendRequest {
    v1::AppendRequest {
        events,
        condition: Some(v1::AppendCondition {
            fail_if_events_match: fail_if,
            after,
        }),
        tracking_info: None,
    }
}

fn tracked(mut request: v1::AppendRequest, source: &str, position: u64) -> v1::AppendRequest {
    request.tracking_info = Some(v1::TrackingInfo {
        source: source.into(),
        position,
    });
    request
}

const ID_A: &str = "6f1c9a52-0d4e-4a4b-9a51-1b2c3d4e5f60";
const ID_B: &str = "6f1c9a52-0d4e-4a4b-9a51-1b2c3d4e5f61";
const ID_C: &str = "6f1c9a52-0d4e-4a4b-9a51-1b2c3d4e5f62";

/// Every read shape over the store as it stands: starts around both ends and the middle,
/// both directions, limits, batch sizes, queries matching nothing, one item, several.
async fn every_read(pair: &mut Pair, head: u64) {
    let queries = [
        None,
        query(vec![]),
        query(vec![item(&["Opened"], &[])]),
        query(vec![item(&[], &["account:1"])]),
        query(vec![
            item(&["Deposited"], &["account:1"]),
            item(&["Closed"], &[]),
        ]),
        query(vec![item(&[], &["account:1", "branch:x"])]),
        query(vec![item(&["Nothing"], &[])]),
        query(vec![item(&[], &["tag:none"])]),
    ];
    let starts = [
        None,
        Some(0),
        Some(1),
        Some(head / 2),
        Some(head),
        Some(head + 1),
        Some(1 << 40),
    ];
    for q in &queries {
        for &start in &starts {
            for backwards in [None, Some(false), Some(true)] {
                for limit in [None, Some(0), Some(1), Some(3)] {
                    for batch_size in [None, Some(0), Some(2)] {
                        pair.read(v1::ReadRequest {
                            query: q.clone(),
                            start,
                            backwards,
                            limit,
                            batch_size,
                            ..Default::default()
                        })
                        .await;
                    }
                }
            }
        }
    }
}

async fn scenario(pair: &mut Pair) {
    // An empty store.
    pair.head().await;
    pair.tracking("projector").await;
    every_read(pair, 0).await;

    // Appends without conditions, with and without ids (the nil UUID and "" mean none),
    // metadata, several events at once.
    pair.append(
        "one event",
        append(vec![event("Opened", &["account:1"], "a")]),
    )
    .await;
    let mut meta = event("Deposited", &["account:1", "branch:x"], "10");
    meta.metadata = vec![v1::MetadataEntry {
        key: "user".into(),
        value: "ada".into(),
    }];
    pair.append("metadata", append(vec![meta])).await;
    pair.append(
        "ids",
        append(vec![
            with_id(event("Deposited", &["account:1"], "5"), ID_A),
            with_id(event("Deposited", &["account:2"], "6"), ID_B),
        ]),
    )
    .await;
    pair.append(
        "the same ids again, no condition",
        append(vec![
            with_id(event("Deposited", &["account:1"], "5"), ID_A),
            with_id(event("Deposited", &["account:2"], "6"), ID_B),
        ]),
    )
    .await;
    pair.append(
        "one id twice in one append",
        append(vec![
            with_id(event("Noted", &["account:3"], ""), ID_C),
            with_id(event("Noted", &["account:3"], ""), ID_C),
        ]),
    )
    .await;
    pair.append(
        "an empty id",
        append(vec![with_id(event("Noted", &[], "x"), "")]),
    )
    .await;
    pair.append("no events", append(vec![])).await;
    pair.append(
        "an invalid uuid",
        append(vec![with_id(event("Noted", &[], ""), "not-a-uuid")]),
    )
    .await;

    // Conditions: passing, failing, `after` beyond the head, and retries recognised by ids.
    let acct = || query(vec![item(&[], &["account:9"])]);
    // One event opening account 9 under the condition that nothing about it exists yet.
    let open_nine = |data: &str, id: &str| {
        conditional(
            vec![with_id(event("Opened", &["account:9"], data), id)],
            acct(),
            None,
        )
    };
    let opened = pair.append("condition passes", open_nine("", ID_A)).await;
    pair.append("the same append again: a retry", open_nine("", ID_A))
        .await;
    pair.append("a retry with other content", open_nine("other", ID_A))
        .await;
    pair.append("another id: the condition fails", open_nine("", ID_B))
        .await;
    pair.append(
        "no id: the condition fails",
        conditional(vec![event("Opened", &["account:9"], "")], acct(), None),
    )
    .await;
    if let Answer::Ok(p) = opened {
        pair.append(
            "after the conflicting event",
            conditional(vec![event("Closed", &["account:9"], "")], acct(), Some(p)),
        )
        .await;
    }
    pair.append(
        "after beyond the head",
        conditional(
            vec![event("Noted", &["account:9"], "")],
            acct(),
            Some(1 << 40),
        ),
    )
    .await;
    pair.append(
        "a condition without a query",
        conditional(vec![event("Noted", &[], "")], None, None),
    )
    .await;
    pair.append(
        "a condition matching everything, after the head",
        conditional(vec![event("Noted", &[], "")], query(vec![]), Some(1 << 40)),
    )
    .await;
    pair.append(
        "two events retried, the second id different",
        conditional(
            vec![
                with_id(event("Deposited", &["account:1"], ""), ID_A),
                with_id(event("Deposited", &["account:2"], ""), ID_C),
            ],
            query(vec![item(&["Deposited"], &[])]),
            Some(2),
        ),
    )
    .await;
    pair.append(
        "two events retried, as stored",
        conditional(
            vec![
                with_id(event("Deposited", &["account:1"], ""), ID_A),
                with_id(event("Deposited", &["account:2"], ""), ID_B),
            ],
            query(vec![item(&["Deposited"], &[])]),
            Some(2),
        ),
    )
    .await;

    // Tracking positions.
    pair.append(
        "tracking",
        tracked(append(vec![event("Projected", &[], "")]), "projector", 5),
    )
    .await;
    pair.tracking("projector").await;
    pair.append(
        "tracking not increasing",
        tracked(append(vec![event("Projected", &[], "")]), "projector", 5),
    )
    .await;
    pair.append(
        "tracking increasing",
        tracked(append(vec![event("Projected", &[], "")]), "projector", 9),
    )
    .await;
    pair.tracking("projector").await;
    pair.tracking("unknown").await;

    let head = match pair.umadb.head().await {
        Answer::Ok(h) => h.unwrap_or(0),
        other => panic!("head: {other:?}"),
    };
    pair.head().await;
    every_read(pair, head).await;

    // Subscriptions: catching up from several positions, with several batch sizes.
    for after in [None, Some(0), Some(3), Some(head - 1), Some(head)] {
        for batch_size in [None, Some(1), Some(5)] {
            let count = (head - after.unwrap_or(0)) as usize;
            pair.subscribe(
                v1::SubscribeRequest {
                    query: None,
                    after,
                    batch_size,
                },
                count,
            )
            .await;
        }
    }
    pair.subscribe(
        v1::SubscribeRequest {
            query: query(vec![item(&[], &["account:1"])]),
            after: Some(0),
            batch_size: None,
        },
        4,
    )
    .await;

    // A live subscription: events appended after it began arrive.
    let live = v1::SubscribeRequest {
        query: query(vec![item(&[], &["live"])]),
        after: Some(head),
        batch_size: None,
    };
    let (mut to_umadb, mut to_annals) = (pair.umadb.client.clone(), pair.annals.client.clone());
    let (a, b, ()) = tokio::join!(
        pair.umadb.subscribe(live.clone(), 3),
        pair.annals.subscribe(live, 3),
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            for i in 0..3 {
                let request = append(vec![event("Tick", &["live"], &i.to_string())]);
                let _ = to_umadb.append(request.clone()).await;
                to_annals.append(request).await.unwrap();
            }
        }
    );
    pair.check("live subscription", a, b);

    // The deprecated `subscribe` flag of a read is refused.
    #[allow(deprecated)]
    pair.read(v1::ReadRequest {
        subscribe: Some(true),
        ..Default::default()
    })
    .await;
}

/// Calls on which Annals differs from UmaDB 0.7.8 on purpose (docs/USING.md lists them), asked
/// of Annals alone with the answers it must give. UmaDB's server answers the first two by
/// losing its writer thread (an append with no events and a condition panics in its retry
/// check), after which it refuses every append; its answers to the rest are compared in
/// [`scenario`] before that.
async fn deliberate_differences(annals: &mut Peer) {
    let invalid = |error_type| Answer::Err {
        code: tonic::Code::InvalidArgument,
        error_type: Some(error_type as i32),
        integrity_word: false,
    };
    // No events: nothing to append and nothing to check, as UmaDB's own library answers.
    let account = || query(vec![item(&[], &["account:1"])]);
    assert_eq!(
        annals.append(conditional(vec![], account(), None)).await,
        Answer::Ok(0)
    );
    // A tracking position needs an event to travel with.
    assert_eq!(
        annals.append(tracked(append(vec![]), "empty", 3)).await,
        invalid(v1::error_response::ErrorType::InvalidArgument)
    );
    assert_eq!(annals.tracking("empty").await, Answer::Ok(None));
    // Events are checked: a type, tags that are not empty, without control characters and
    // not repeated, a tracking source with a name. UmaDB stores all of these.
    let refused = [
        append(vec![event("", &[], "")]),
        append(vec![event("T", &["a", "a"], "")]),
        append(vec![event("T", &[""], "")]),
        append(vec![event("T", &["a\nb"], "")]),
        tracked(append(vec![event("T", &[], "")]), "", 1),
    ];
    let head = annals.head().await;
    for request in refused {
        assert_eq!(
            annals.append(request.clone()).await,
            invalid(v1::error_response::ErrorType::InvalidArgument),
            "{request:?}"
        );
    }
    assert_eq!(
        annals.head().await,
        head,
        "a refused append changes nothing"
    );
    // The nil UUID means "no id" (UmaDB stores it as an id): it is read back as none, and an
    // append carrying it is never taken for a retry.
    let nil = || {
        vec![with_id(
            event("Noted", &["nil"], ""),
            "00000000-0000-0000-0000-000000000000",
        )]
    };
    let nil_query = || query(vec![item(&[], &["nil"])]);
    let Answer::Ok(position) = annals.append(append(nil())).await else {
        panic!("the nil UUID is accepted");
    };
    let read = annals
        .read(v1::ReadRequest {
            query: nil_query(),
            ..Default::default()
        })
        .await;
    let Answer::Ok(messages) = read else {
        panic!("read: {read:?}")
    };
    assert_eq!(messages[0].0[0].position, position);
    assert_eq!(messages[0].0[0].uuid, "");
    assert!(matches!(
        annals.append(conditional(nil(), nil_query(), None)).await,
        Answer::Err {
            code: tonic::Code::FailedPrecondition,
            integrity_word: true,
            ..
        }
    ));
}

/// Random appends (some conditional, some retried) and reads, from a printed seed.
async fn random_rounds(pair: &mut Pair, seed: u64, rounds: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let types = ["Opened", "Deposited", "Closed"];
    let mut sent: Vec<v1::AppendRequest> = Vec::new();
    for _ in 0..rounds {
        let roll = rng.gen_range(0..10);
        if roll < 5 {
            let n = rng.gen_range(1..4);
            let events: Vec<v1::Event> = (0..n)
                .map(|_| {
                    let t = types[rng.gen_range(0..types.len())];
                    let account = format!("account:{}", rng.gen_range(0..4));
                    let mut e = event(t, &[&account], "x");
                    if rng.gen_bool(0.5) {
                        e.uuid = uuid::Uuid::from_u128(rng.gen()).to_string();
                    }
                    e
                })
                .collect();
            let account = format!("account:{}", rng.gen_range(0..4));
            let request = if rng.gen_bool(0.6) {
                let after = rng.gen_bool(0.5).then(|| rng.gen_range(0..40));
                conditional(events, query(vec![item(&[], &[&account])]), after)
            } else {
                append(events)
            };
            sent.push(request.clone());
            pair.append("random append", request).await;
        } else if roll < 7 && !sent.is_empty() {
            let request = sent[rng.gen_range(0..sent.len())].clone();
            pair.append("random retry", request).await;
        } else {
            let account = format!("account:{}", rng.gen_range(0..4));
            pair.read(v1::ReadRequest {
                query: query(vec![item(&[], &[&account])]),
                start: rng.gen_bool(0.5).then(|| rng.gen_range(0..40)),
                backwards: Some(rng.gen_bool(0.5)),
                limit: rng.gen_bool(0.5).then(|| rng.gen_range(0..5)),
                batch_size: rng.gen_bool(0.5).then(|| rng.gen_range(1..4)),
                ..Default::default()
            })
            .await;
        }
    }
    pair.head().await;
}

/// Goal: over the UmaDB protocol, Annals answers as UmaDB 0.7.8's own server does, call for
/// call: appends with and without ids and conditions, retries, conflicts, tracking, metadata,
/// invalid arguments, every read shape (including start 0 backwards and empty answers), head,
/// and subscriptions from several positions. Method: both servers on fresh stores, a fixed
/// scenario then seeded random rounds (the seed is printed), every answer compared.
#[test]
fn annals_answers_as_umadb_does() {
    let Some(binary) = umadb_binary() else {
        return;
    };
    let annals_dir = tempfile::tempdir().unwrap();
    differential(&binary, ServerProcess::start(annals_dir.path(), &[]));
}

/// Goal: the same, with Annals' store in PostgreSQL: the backend changes nothing a UmaDB
/// client sees. Method: as above, Annals served from a throwaway cluster.
#[test]
fn annals_on_postgres_answers_as_umadb_does() {
    let Some(binary) = umadb_binary() else {
        return;
    };
    let Some(cluster) = annals_testkit::Cluster::start() else {
        return;
    };
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    differential(&binary, ServerProcess::start_postgres(&url, &[]));
}

/// Sends the scenario, seeded random rounds and the deliberate differences to a fresh UmaDB
/// server and to `annals`; fails listing every answer that differs.
fn differential(binary: &Path, annals: ServerProcess) {
    let umadb_dir = tempfile::tempdir().unwrap();
    let umadb = Umadb::start(binary, umadb_dir.path());
    let seed: u64 = std::env::var("ANNALS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("differential seed: {seed} (replay with ANNALS_SEED={seed})");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut pair = Pair {
            umadb: Peer::connect("UmaDB 0.7.8", umadb.addr).await,
            annals: Peer::connect("Annals", annals.grpc.unwrap()).await,
            calls: 0,
            differences: Vec::new(),
        };
        scenario(&mut pair).await;
        random_rounds(&mut pair, seed, 300).await;
        deliberate_differences(&mut pair.annals).await;
        assert!(
            pair.differences.is_empty(),
            "{} of {} calls answered differently:\n{}",
            pair.differences.len(),
            pair.calls,
            pair.differences.join("\n")
        );
        eprintln!("{} calls answered alike", pair.calls);
    });
}
