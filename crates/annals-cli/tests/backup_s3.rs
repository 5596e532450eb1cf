//! The continuous backup against a real S3 server (SeaweedFS, started the way a user would
//! run one, killed and started again): the server killed under load and its directory lost,
//! then restored; object storage gone for seconds mid-load; bad input refused clearly.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use annals::{BackupOptions, Options, Query, ReadOptions, Store};
use annals_testkit::eventually;
use annals_testkit::s3::S3Server;
use common::{request, ServerProcess};

/// The environment a server or command needs to reach `s3`.
fn env(s3: &S3Server) -> Vec<(&'static str, String)> {
    s3.env()
}

fn env_refs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// `annals <args>` with `env`; its status and its output (both streams). Killed, and the
/// test failed, when it runs for more than a minute (a server that should have refused to
/// start).
fn annals(args: &[&str], env: &[(&'static str, String)]) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_annals"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run annals");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "annals {args:?} still ran after a minute:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// One acknowledged append: its data (unique), its position, whether it asked for D4.
#[derive(Debug, Clone)]
struct Acked {
    data: String,
    position: u64,
    off_machine: bool,
}

/// Appends one event per request until `stop` or the server goes away; every fourth client
/// asks for D4. Answers what was acknowledged, and counts acknowledgements in `acks`.
fn appender(
    addr: SocketAddr,
    id: usize,
    stop: Arc<AtomicBool>,
    acks: Arc<AtomicU64>,
) -> Vec<Acked> {
    let off_machine = id.is_multiple_of(4);
    let mut acked = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let data = format!("c{id}-n{n}");
        n += 1;
        let mut body = serde_json::json!({
            "events": [{"type": "Put", "tags": [format!("client:{id}")], "data": data}]
        });
        if off_machine {
            body["durability"] = "d4".into();
        }
        let body = body.to_string();
        let answer =
            std::panic::catch_unwind(|| request(addr, "POST", "/v1/append", &[], body.as_bytes()));
        let Ok(answer) = answer else { break };
        if answer.status == 200 {
            let position = answer.json()["position"].as_u64().unwrap();
            acked.push(Acked {
                data,
                position,
                off_machine,
            });
            acks.fetch_add(1, Ordering::Relaxed);
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    acked
}

/// A sample of the server's /metrics (0 when it has none), or None when it does not answer.
fn metric(addr: SocketAddr, name: &str) -> Option<f64> {
    let answer = std::panic::catch_unwind(|| request(addr, "GET", "/metrics", &[], b"")).ok()?;
    (answer.status == 200)
        .then(|| annals_testkit::server::sample(&answer.text(), name).unwrap_or(0.0))
}

/// Every event of the store in `dir`, as (position, data).
fn log_of(dir: &Path) -> Vec<(u64, String)> {
    let store = Store::open(dir, Options::default()).unwrap();
    let events = store
        .read(&Query::all(), ReadOptions::forwards())
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.position(), String::from_utf8(e.data().to_vec()).unwrap())
        })
        .collect();
    store.close().unwrap();
    events
}

/// Goal: a kill -9 under load, then the loss of the data directory, loses nothing the backup
/// promised. Every D4 append acknowledged is in the restored store, so is every acknowledged
/// append at or below the shipped position /metrics last showed, positions are gapless and
/// nothing is there that no client sent.
#[test]
fn kill9_then_the_directory_lost_restores_every_promised_append() {
    let Some(s3) = S3Server::start() else { return };
    let env = env(&s3);
    let url = s3.url("kill9");
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    let mut server = ServerProcess::start_with_env(&data, &["--backup", &url], &env_refs(&env));
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..16)
        .map(|id| {
            let (stop, acks, addr) = (stop.clone(), acks.clone(), server.http);
            std::thread::spawn(move || appender(addr, id, stop, acks))
        })
        .collect();
    // The shipped position, sampled until the kill.
    let mut shipped = 0u64;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        if let Some(s) = metric(server.http, "annals_backup_shipped_position") {
            shipped = shipped.max(s as u64);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill9();
    stop.store(true, Ordering::Relaxed);
    let acked: Vec<Acked> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    assert!(shipped > 0, "the backup shipped during the load");
    let d4 = acked.iter().filter(|a| a.off_machine).count();
    assert!(
        d4 > 10 && acked.len() > 100,
        "{d4} D4 of {} acknowledged",
        acked.len()
    );
    std::fs::remove_dir_all(&data).unwrap();

    let restored = work.path().join("restored");
    let (ok, out) = annals(
        &[
            "restore",
            "--from",
            &url,
            "--to",
            restored.to_str().unwrap(),
        ],
        &env,
    );
    assert!(ok, "{out}");
    let log = log_of(&restored);
    for (i, (position, _)) in log.iter().enumerate() {
        assert_eq!(*position, i as u64 + 1, "positions are gapless");
    }
    let by_data: std::collections::HashMap<&str, u64> =
        log.iter().map(|(p, d)| (d.as_str(), *p)).collect();
    assert_eq!(by_data.len(), log.len(), "no event twice");
    for a in &acked {
        if a.off_machine || a.position <= shipped {
            assert_eq!(
                by_data.get(a.data.as_str()),
                Some(&a.position),
                "{a:?} (shipped through {shipped}) is restored at its position"
            );
        }
    }
    for (_, d) in &log {
        let (client, n) = d
            .strip_prefix('c')
            .and_then(|rest| rest.split_once("-n"))
            .expect("only what the clients sent");
        assert!(
            client.parse::<usize>().is_ok() && n.parse::<u64>().is_ok(),
            "{d}"
        );
    }
    eprintln!(
        "restored {} events; {} acknowledged ({d4} D4), shipped through {shipped} at the kill",
        log.len(),
        acked.len()
    );
}

/// Goal: object storage gone for seconds mid-load stops nothing: appends on files are still
/// acknowledged, the backup reports failing, then catches up once it is back, with no gap and
/// no duplicate (the backup verifies, and restores to the server's log exactly).
#[test]
fn object_storage_away_mid_load_then_the_backup_catches_up() {
    let Some(mut s3) = S3Server::start() else {
        return;
    };
    let env = env(&s3);
    let url = s3.url("outage");
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    let mut server = ServerProcess::start_with_env(&data, &["--backup", &url], &env_refs(&env));
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (1..8usize)
        .filter(|id: &usize| !id.is_multiple_of(4))
        .map(|id| {
            let (stop, acks, addr) = (stop.clone(), acks.clone(), server.http);
            std::thread::spawn(move || appender(addr, id, stop, acks))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let failures = || metric(server.http, "annals_backup_failures_total");
    let failed_before = failures().unwrap_or(0.0);
    s3.kill();
    let before = acks.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(4));
    let during = acks.load(Ordering::Relaxed) - before;
    assert!(
        during > 50,
        "appends went on while object storage was away: {during}"
    );
    // Counted and said as the backup's next tries fail, however late a loaded machine makes
    // them.
    eventually("the failures counted", Duration::from_secs(30), || {
        failures().is_some_and(|n| n > failed_before)
    });
    eventually(
        "the backup saying it fails",
        Duration::from_secs(30),
        || metric(server.http, "annals_backup_state{state=\"failing\"}") == Some(1.0),
    );
    s3.restart();
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let acked: usize = clients.into_iter().map(|c| c.join().unwrap().len()).sum();
    eventually("the backup to catch up", Duration::from_secs(60), || {
        let lag = metric(server.http, "annals_backup_lag_positions").unwrap();
        if lag == 0.0 {
            Ok(())
        } else {
            Err(format!("{lag} behind"))
        }
    });
    assert_eq!(
        metric(server.http, "annals_backup_state{state=\"shipping\"}"),
        Some(1.0)
    );
    let head = server.head();
    assert!(server.terminate().success());
    let (ok, out) = annals(&["backup", "verify", &url, "--json"], &env);
    assert!(ok, "{out}");
    let report: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(report["head"], head, "{report}");
    let restored = work.path().join("restored");
    let (ok, out) = annals(
        &[
            "restore",
            "--from",
            &url,
            "--to",
            restored.to_str().unwrap(),
        ],
        &env,
    );
    assert!(ok, "{out}");
    assert_eq!(log_of(&restored), log_of(&data));
    eprintln!("{acked} acknowledged; {during} while object storage was away");
}

/// Goal: bad input gets a clear error and changes nothing: a malformed URL, a bucket that
/// does not exist, wrong credentials, a prefix holding another store, a restore into a
/// directory that is not empty, and an object corrupted on purpose (named by verify and by
/// restore).
#[test]
fn bad_backup_input_is_refused_clearly() {
    let Some(s3) = S3Server::start() else { return };
    let env = env(&s3);
    let work = tempfile::tempdir().unwrap();
    let dir = |name: &str| work.path().join(name).display().to_string();
    let serve = |data: &str, backup: &str, env: &[(&'static str, String)]| {
        annals(
            &[
                "serve",
                "--data-dir",
                data,
                "--http",
                "127.0.0.1:0",
                "--grpc",
                "off",
                "--backup",
                backup,
            ],
            env,
        )
    };
    for (backup, says) in [
        ("not a url", "backup URL"),
        ("ftp://host/x", "backup URL"),
        ("s3://no-such-bucket/x", "bucket"),
    ] {
        let (ok, out) = serve(&dir("bad"), backup, &env);
        assert!(!ok && out.contains(says), "{backup}: {out}");
    }
    let mut wrong = env.clone();
    for (k, v) in &mut wrong {
        if *k == "AWS_SECRET_ACCESS_KEY" {
            *v = "not-the-secret".into();
        }
    }
    let (ok, out) = serve(&dir("bad"), &s3.url("p"), &wrong);
    assert!(!ok && out.contains("credentials"), "{out}");

    // A store with a backup, and another store's server given the same prefix.
    let url = s3.url("first");
    let mut a =
        ServerProcess::start_with_env(Path::new(&dir("a")), &["--backup", &url], &env_refs(&env));
    for i in 0..300 {
        a.append(&format!(
            r#"{{"events":[{{"type":"T","tags":["k:{i}"],"data":"{}"}}]}}"#,
            "x".repeat(200)
        ));
    }
    // A clean stop releases the lease.
    assert!(a.terminate().success());
    let b = Store::open(dir("b"), Options::default()).unwrap();
    b.append(&[annals::NewEvent::new("Other", "b")], None)
        .unwrap();
    b.close().unwrap();
    let (ok, out) = serve(&dir("b"), &url, &env);
    assert!(!ok && out.contains("backs up another store"), "{out}");

    // Verify and restore refuse a location without a backup, and put nothing there: a bucket
    // that does not exist, an empty prefix, and a prefix above the backup.
    let parent = url.trim_end_matches("/first").to_string();
    for (location, says) in [
        ("s3://no-such-bucket/x".to_string(), "no backup at"),
        (s3.url("nothing-here"), "holds nothing"),
        (parent.clone(), "backups are below it"),
    ] {
        let (ok, out) = annals(&["backup", "verify", &location], &env);
        assert!(
            !ok && out.contains("no backup at") && out.contains(says),
            "{location}: {out}"
        );
        let (ok, out) = annals(
            &["restore", "--from", &location, "--to", &dir("none")],
            &env,
        );
        assert!(!ok && out.contains("no backup at"), "{location}: {out}");
        assert!(!Path::new(&dir("none")).exists(), "restore made its store");
    }
    let mut options = BackupOptions::new(s3.url("nothing-here"));
    for (k, v) in &env {
        options = options.setting(*k, v);
    }
    let empty = annals::objects::Objects::open_with(&options.url, &options.settings).unwrap();
    let (objects, folders) = empty.list_top(10).unwrap();
    assert!(
        objects.is_empty() && folders.is_empty(),
        "objects were made"
    );

    std::fs::create_dir_all(dir("full")).unwrap();
    std::fs::write(work.path().join("full/file"), b"x").unwrap();
    let (ok, out) = annals(&["restore", "--from", &url, "--to", &dir("full")], &env);
    assert!(!ok && out.contains("not empty"), "{out}");

    // One object damaged on purpose: found by verify and by restore, by name.
    let mut options = BackupOptions::new(&url);
    for (k, v) in &env {
        options = options.setting(*k, v);
    }
    let objects = annals::objects::Objects::open_with(&options.url, &options.settings).unwrap();
    let listed = objects.list("log", None).unwrap();
    let victim = listed.first().expect("a chunk to damage").name.clone();
    let (bytes, _) = objects.get(&victim).unwrap().unwrap();
    let mut damaged = bytes.to_vec();
    let at = damaged.len() / 2;
    damaged[at] ^= 0x40;
    objects.delete(&victim).unwrap();
    objects
        .put_new(&victim, vec![bytes::Bytes::from(damaged)])
        .unwrap();
    let (ok, out) = annals(&["backup", "verify", &url], &env);
    assert!(
        !ok && out.contains(&victim) && out.contains("damaged"),
        "{out}"
    );
    let (ok, out) = annals(&["restore", "--from", &url, "--to", &dir("c")], &env);
    assert!(!ok && out.contains(&victim), "{out}");
}

/// Goal: a replica serving from the backup another server writes follows that primary under
/// load and answers the same reads; an append to it is refused, naming the primary.
#[test]
fn a_replica_follows_a_primary_under_load() {
    let Some(s3) = S3Server::start() else { return };
    let env = env(&s3);
    let url = s3.url("replicated");
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("primary");
    let mut primary = ServerProcess::start_with_env(&data, &["--backup", &url], &env_refs(&env));
    primary.append(r#"{"events":[{"type":"First","tags":["k:0"],"data":"0"}]}"#);
    let mut replica = ServerProcess::launch_with(&["--replica-of", &url], &env_refs(&env));
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (1..7usize)
        .map(|id| {
            let (stop, acks, addr) = (stop.clone(), acks.clone(), primary.http);
            std::thread::spawn(move || appender(addr, id, stop, acks))
        })
        .collect();
    // Under load the replica's head moves.
    // Past the first event, which the primary held before the load began.
    let seen = replica.head().max(1);
    eventually(
        "the replica following under load",
        Duration::from_secs(30),
        || replica.head() > seen,
    );
    let refused = replica.post(
        "/v1/append",
        r#"{"events":[{"type":"T","tags":[],"data":"x"}]}"#,
    );
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert_eq!(refused.kind(), "read_only_replica");
    assert!(refused.text().contains("directory"), "{}", refused.text());
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let head = primary.head();
    eventually("the replica to catch up", Duration::from_secs(30), || {
        replica.head() >= head
    });
    assert_eq!(replica.read("{}", "{}"), primary.read("{}", "{}"));
    let tagged = r#"{"items":[{"tags":["client:3"]}]}"#;
    assert_eq!(
        replica.read(tagged, r#"{"backwards":true,"limit":5}"#),
        primary.read(tagged, r#"{"backwards":true,"limit":5}"#)
    );
    assert!(replica.terminate().success());
    assert!(primary.terminate().success());
}

/// Goal: a store on PostgreSQL ships what the database committed; a second server of the
/// database started with the same backup stands by, answers D4 appends once the first has
/// shipped them, and ships once the first is killed (its lease lapsed); the backup verifies
/// and restores into a directory and into another (empty) database, append for append.
#[test]
fn a_store_on_postgres_is_backed_up_and_restored_into_a_database() {
    let Some(s3) = S3Server::start() else { return };
    let Some(cluster) = annals_testkit::Cluster::start() else {
        return;
    };
    cluster.sql("CREATE DATABASE restored");
    let env = env(&s3);
    let url = s3.url("on-postgres");
    let database = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    let mut env = env;
    env.push(("ANNALS_BACKUP_LEASE_SECONDS", "3".to_string()));
    let mut server =
        ServerProcess::launch_with(&["--store", &database, "--backup", &url], &env_refs(&env));
    for i in 0..300 {
        server.append(&format!(
            r#"{{"events":[{{"type":"T","tags":["k:{}"],"data":"{i}"}},{{"type":"U","tags":[],"data":"{i}"}}]}}"#,
            i % 5
        ));
    }
    let head = server.head();
    eventually(
        "the backup to ship what the database committed",
        Duration::from_secs(30),
        || metric(server.http, "annals_backup_shipped_position") == Some(head as f64),
    );
    let mut standby =
        ServerProcess::launch_with(&["--store", &database, "--backup", &url], &env_refs(&env));
    assert_eq!(
        metric(standby.http, "annals_backup_state{state=\"standby\"}"),
        Some(1.0)
    );
    let d4 =
        r#"{"events":[{"type":"D","tags":["k:d4"],"data":"on the standby"}],"durability":"d4"}"#;
    for _ in 0..5 {
        assert_eq!(standby.post("/v1/append", d4).status, 200);
    }
    // The shipping server dies without releasing its lease: the standby takes over once the
    // lease lapses (3 s without renewal), and ships what both appended.
    server.kill9();
    for i in 0..20 {
        standby.append(&format!(
            r#"{{"events":[{{"type":"S","tags":["k:{i}"],"data":"after the kill"}}]}}"#
        ));
    }
    let head = standby.head();
    eventually(
        "the standby to take over the backup",
        Duration::from_secs(60),
        || {
            if metric(standby.http, "annals_backup_shipped_position") == Some(head as f64) {
                Ok(())
            } else {
                Err(metric(
                    standby.http,
                    "annals_backup_state{state=\"shipping\"}",
                ))
            }
        },
    );
    assert_eq!(
        metric(standby.http, "annals_backup_state{state=\"shipping\"}"),
        Some(1.0)
    );
    let events = standby.read("{}", "{}");
    assert_eq!(events.len(), 600 + 5 + 20);
    assert!(standby.terminate().success());
    let (ok, out) = annals(&["backup", "verify", &url, "--json"], &env);
    assert!(ok, "{out}");
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("restored");
    let (ok, out) = annals(
        &["restore", "--from", &url, "--to", dir.to_str().unwrap()],
        &env,
    );
    assert!(ok, "{out}");
    let restored = ServerProcess::start(&dir, &[]);
    assert_eq!(restored.read("{}", "{}"), events);
    drop(restored);
    let target = format!("postgres://postgres@127.0.0.1:{}/restored", cluster.port());
    let (ok, out) = annals(&["restore", "--from", &url, "--to", &target], &env);
    assert!(ok, "{out}");
    let restored = ServerProcess::launch_with(&["--store", &target], &[]);
    assert_eq!(restored.read("{}", "{}"), events);
}

/// Goal: with data subjects, the backup holds their keys and never their clear data (a marker
/// is in no file of the object store's data directory); an erasure answers only once the
/// backup's keys are replaced; a restore (with the master key) reads every other subject back
/// and has the erased one erased.
#[test]
fn a_subjects_backup_holds_no_clear_data_and_restores_the_erasure() {
    const MARKER: &str = "MARKER-s3-subject-3b9d";
    let Some(s3) = S3Server::start() else { return };
    let env = env(&s3);
    let root = tempfile::tempdir().unwrap();
    let master = root.path().join("master.key");
    std::fs::write(&master, "c3".repeat(32)).unwrap();
    let master = master.display().to_string();
    let url = s3.url("subjects");
    let data = root.path().join("data");
    let flags = [
        "--backup",
        &url,
        "--subject-tags",
        "customer:",
        "--master-key-file",
        &master,
    ];
    let mut server = ServerProcess::start_with_env(&data, &flags, &env_refs(&env));
    for i in 0..40 {
        let body = common::append_body(
            &[(
                "Moved",
                &[&format!("customer:{}", i % 4)],
                &format!("{MARKER} {i}"),
            )],
            None,
        );
        assert_eq!(server.post("/v1/append", &body).status, 200);
    }
    let erased = server
        .post("/v1/admin/erase", r#"{"tag":"customer:1"}"#)
        .json();
    assert_eq!(erased["events"], 10);
    assert_eq!(erased["inBackup"], true, "{erased}");
    let head = server.head();
    eventually("the backup to catch up", Duration::from_secs(30), || {
        metric(server.http, "annals_backup_lag_positions") == Some(0.0)
    });
    assert!(server.terminate().success());
    // Nothing of the subjects' data in the object store's files.
    let mut stack = vec![s3.data_dir()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap_or_default();
                assert!(
                    !bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()),
                    "{} holds clear data",
                    p.display()
                );
            }
        }
    }
    // A restore without the master key is refused and writes nothing; with it, it restores.
    let to = root.path().join("restored");
    let to_s = to.display().to_string();
    let (ok, out) = annals(&["restore", "--from", &url, "--to", &to_s], &env);
    assert!(!ok && out.contains("master key"), "{out}");
    assert!(!to.exists() || std::fs::read_dir(&to).unwrap().next().is_none());
    let (ok, out) = annals(
        &[
            "restore",
            "--from",
            &url,
            "--to",
            &to_s,
            "--subject-tags",
            "customer:",
            "--master-key-file",
            &master,
        ],
        &env,
    );
    assert!(ok, "{out}");
    let mut restored = ServerProcess::start(&to, &flags[2..]);
    assert_eq!(restored.head(), head);
    let events = restored.read("{}", "{}");
    for (i, e) in events.iter().take(40).enumerate() {
        if i % 4 == 1 {
            assert_eq!(e["erased"], true, "{e}");
        } else {
            assert_eq!(e["data"], format!("{MARKER} {i}"));
        }
    }
    let refused = restored.post(
        "/v1/append",
        &common::append_body(&[("Moved", &["customer:1"], "x")], None),
    );
    assert_eq!(refused.status, 409);
    assert!(restored.terminate().success());

    // Restored into PostgreSQL: the keys go into the database's table.
    let Some(cluster) = annals_testkit::Cluster::start() else {
        return;
    };
    let database = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    let subjects = ["--subject-tags", "customer:", "--master-key-file", &master];
    let (ok, out) = annals(
        &[
            &["restore", "--from", &url, "--to", &database][..],
            &subjects[..],
        ]
        .concat(),
        &env,
    );
    assert!(ok, "{out}");
    let on_postgres = ServerProcess::launch_with(
        &[&["--store", database.as_str()][..], &subjects[..]].concat(),
        &[],
    );
    assert_eq!(on_postgres.read("{}", "{}"), events);
    let refused = on_postgres.post(
        "/v1/append",
        &common::append_body(&[("Moved", &["customer:1"], "x")], None),
    );
    assert_eq!(refused.status, 409);
}
