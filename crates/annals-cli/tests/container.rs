//! The container image (scripts/image) run by a real container engine, podman with runc and
//! the project's engine settings (packaging/containers.conf), as the README runs it: keys from
//! a mounted file, data in a volume that outlives the container, TLS, HTTP and gRPC (UmaDB's
//! client) from outside, SIGTERM under load, the health check, and the README's PostgreSQL,
//! backup and replica commands. The image is built once, from this build's binary.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use annals_testkit::free_port;
use common::answers::{appender, check_answers};
use common::umadb_event as event;
use umadb_client::UmaDbClient;
use umadb_dcb::DcbEventStoreSync;

/// The image's name in the engine's local storage.
const IMAGE: &str = "localhost/annals-test:latest";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `podman` with the project's engine settings.
fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .env("CONTAINERS_CONF", root().join("packaging/containers.conf"))
        .output()
        .expect("podman runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(out.status.success(), "podman {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Whether the tests must find podman and buildah (the test command says so); otherwise a
/// test without them skips, saying why.
fn required() -> bool {
    std::env::var_os("ANNALS_REQUIRE_CONTAINERS").is_some_and(|v| v == "1")
}

/// The image, built once per run by scripts/image from this build's `annals`; None (saying
/// why) when podman or buildah is missing and not required.
fn image() -> Option<&'static str> {
    static BUILT: OnceLock<bool> = OnceLock::new();
    let built = *BUILT.get_or_init(|| {
        let present = |tool: &str| {
            Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !annals_testkit::tools_allowed() || !present("podman") || !present("buildah") {
            assert!(
                !required(),
                "podman and buildah are required (ANNALS_REQUIRE_CONTAINERS=1): run scripts/setup"
            );
            eprintln!(
                "skipped: podman and buildah are not installed (scripts/setup installs them)"
            );
            return false;
        }
        // The previous run's image, if any, goes: its containers were removed with it.
        let _ = podman(&["rmi", "-f", IMAGE]);
        let out = Command::new(root().join("scripts/image"))
            .args(["--binary", env!("CARGO_BIN_EXE_annals"), "--tag", IMAGE])
            .env("CONTAINERS_CONF", root().join("packaging/containers.conf"))
            .output()
            .expect("scripts/image runs");
        assert!(out.status.success(), "scripts/image: {}", text(&out));
        true
    });
    built.then_some(IMAGE)
}

/// A name of this run's own, for a container or a volume.
fn name(what: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("annals-test-{what}-{}-{n}", std::process::id())
}

/// A named volume, removed when dropped.
struct Volume(String);

impl Volume {
    fn new() -> Volume {
        let volume = Volume(name("data"));
        podman_ok(&["volume", "create", &volume.0]);
        volume
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = podman(&["volume", "rm", "-f", &self.0]);
    }
}

/// A container run detached, removed when dropped; its ports on the host's loopback.
struct Container {
    name: String,
    http: SocketAddr,
    grpc: SocketAddr,
}

impl Container {
    /// `podman run -d` of the image with `args` before it (volumes, variables) and the
    /// server's two ports published on loopback ports the engine picks (free when it binds).
    fn run(image: &str, args: &[&str]) -> Container {
        let name = name("server");
        let mut all = vec!["run", "-d", "--name", &name];
        all.extend(["-p", "127.0.0.1::7400", "-p", "127.0.0.1::50051"]);
        all.extend_from_slice(args);
        all.push(image);
        podman_ok(&all);
        // None (0.0.0.0:0) once the container has exited: a start that was refused.
        let published = |port: &str| -> SocketAddr {
            let answer = podman_ok(&["port", &name, port]);
            answer
                .lines()
                .next()
                .and_then(|l| l.trim().parse().ok())
                .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)))
        };
        Container {
            http: published("7400/tcp"),
            grpc: published("50051/tcp"),
            name,
        }
    }

    /// Waits for `annals health` inside the container (the image's health check) to answer.
    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = podman(&["healthcheck", "run", &self.name]);
            if out.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} never became healthy: {}\n{}",
                self.name,
                text(&out),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `podman run -d` on the host's network (to reach a database or an object store on the
    /// host's loopback), the server's listeners on free loopback ports.
    fn run_on_host(image: &str, args: &[&str]) -> Container {
        let (http, grpc) = (free_port(), free_port());
        let container = Container {
            name: name("server"),
            http: SocketAddr::from(([127, 0, 0, 1], http)),
            grpc: SocketAddr::from(([127, 0, 0, 1], grpc)),
        };
        let listen_http = format!("ANNALS_HTTP_LISTEN={}", container.http);
        let listen_grpc = format!("ANNALS_GRPC_LISTEN={}", container.grpc);
        let mut all = vec!["run", "-d", "--name", &container.name, "--network", "host"];
        all.extend(["-e", &listen_http, "-e", &listen_grpc]);
        all.extend_from_slice(args);
        all.push(image);
        podman_ok(&all);
        container
    }

    /// A request with the bearer `key`.
    fn call(&self, key: &str, method: &str, path: &str, body: &str) -> common::Response {
        let bearer = format!("Bearer {key}");
        let headers = [
            ("authorization", bearer.as_str()),
            ("content-type", "application/json"),
        ];
        common::request(self.http, method, path, &headers, body.as_bytes())
    }

    /// Every event, read over HTTP with `key`.
    fn events(&self, key: &str) -> Vec<serde_json::Value> {
        let r = self.call(key, "GET", "/v1/read", "");
        assert_eq!(r.status, 200, "{}", r.text());
        r.json().as_array().expect("an array of events").clone()
    }

    fn logs(&self) -> String {
        text(&podman(&["logs", &self.name]))
    }

    /// `podman stop` (SIGTERM, then SIGKILL after `grace`): the exit code.
    fn stop(&self, grace: Duration) -> i64 {
        let grace = grace.as_secs().to_string();
        podman_ok(&["stop", "-t", &grace, &self.name]);
        self.exit_code()
    }

    fn exit_code(&self) -> i64 {
        podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &self.name])
            .parse()
            .expect("an exit code")
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.name]);
    }
}

/// `annals` of this build (a client from outside the container).
fn annals(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_annals"))
        .args(args)
        .output()
        .expect("annals runs");
    (out.status.success(), text(&out))
}

/// Every event an HTTPS server holds, read with the command line client.
fn read_all(url: &str, key: &str, ca: &Path) -> Vec<serde_json::Value> {
    let ca = ca.to_str().unwrap();
    let (ok, out) = annals(&[
        "read",
        "--url",
        url,
        "--api-key",
        key,
        "--ca-cert",
        ca,
        "--format",
        "ndjson",
    ]);
    assert!(ok, "annals read: {out}");
    common::cli::lines(&out)
}

/// Goal: the image runs as the README says: keys from a mounted file, TLS, data in a volume;
/// appends over HTTPS (the command line client) and gRPC (UmaDB's Rust client) from outside
/// are all there after SIGTERM and a new container on the same volume; the health check
/// answers over TLS with a certificate of the server's own issuer, which the container does
/// not trust; the image runs as a non-root user and names its version and commit.
#[test]
fn keys_tls_and_a_volume_keep_every_event_across_containers() {
    let Some(image) = image() else { return };
    let dir = tempfile::tempdir().unwrap();
    // Files the container's user (not root) reads.
    let secrets = dir.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    std::fs::write(secrets.join("cert.pem"), cert.cert.pem()).unwrap();
    std::fs::write(secrets.join("key.pem"), cert.key_pair.serialize_pem()).unwrap();
    let key = "container-key-0000000001";
    std::fs::write(secrets.join("keys"), format!("{key} read,append,admin\n")).unwrap();
    for file in ["cert.pem", "key.pem", "keys"] {
        use std::os::unix::fs::PermissionsExt;
        let path = secrets.join(file);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let mount = format!("{}:/run/secrets/annals:ro", secrets.display());
    let volume = Volume::new();
    let data = format!("{}:/data", volume.0);
    let args = [
        "-v",
        &mount,
        "-v",
        &data,
        "-e",
        "ANNALS_API_KEYS_FILE=/run/secrets/annals/keys",
        "-e",
        "ANNALS_TLS_CERT=/run/secrets/annals/cert.pem",
        "-e",
        "ANNALS_TLS_KEY=/run/secrets/annals/key.pem",
    ];
    let first = Container::run(image, &args);
    first.wait_healthy();
    let url = format!("https://{}", first.http);
    let ca = secrets.join("cert.pem");
    for n in 0..20 {
        let data = format!("{{\"n\":{n}}}");
        let (ok, out) = annals(&[
            "append",
            "--url",
            &url,
            "--api-key",
            key,
            "--ca-cert",
            ca.to_str().unwrap(),
            "--type",
            "Noted",
            "--tag",
            "via:http",
            "--data",
            &data,
        ]);
        assert!(ok, "annals append: {out}");
    }
    let client = UmaDbClient::new(format!("https://{}", first.grpc))
        .ca_path(ca.to_str().unwrap().to_string())
        .api_key(key.to_string())
        .connect()
        .unwrap();
    for n in 0..20 {
        let appended = client
            .append(
                vec![event("Noted", &["via:grpc"], &n.to_string())],
                None,
                None,
            )
            .unwrap();
        assert_eq!(appended, 21 + n);
    }
    // A request without the key is refused, from outside as from inside.
    let (ok, out) = annals(&["read", "--url", &url, "--ca-cert", ca.to_str().unwrap()]);
    assert!(!ok && out.contains("401"), "{out}");
    assert_eq!(first.stop(Duration::from_secs(30)), 0, "{}", first.logs());
    drop(first);

    let second = Container::run(image, &args);
    second.wait_healthy();
    let events = read_all(&format!("https://{}", second.http), key, &ca);
    assert_eq!(events.len(), 40, "every acknowledged append is there");
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["position"], i as u64 + 1);
    }
    assert_eq!(second.stop(Duration::from_secs(30)), 0);

    let inspect = |format: &str| podman_ok(&["image", "inspect", "--format", format, image]);
    assert_eq!(inspect("{{.Config.User}}"), "10001:10001");
    let (_, version) = annals(&["--version"]);
    assert!(version.contains(&inspect(
        "{{index .Config.Labels \"org.opencontainers.image.version\"}}"
    )));
    let revision = inspect("{{index .Config.Labels \"org.opencontainers.image.revision\"}}");
    assert!(revision.len() >= 7, "the commit is named: {revision:?}");
}

/// Goal: listening on every interface, the image refuses to start without API keys, saying
/// how to give them or to allow it explicitly, and exits non-zero.
#[test]
fn without_keys_the_image_refuses_to_start() {
    let Some(image) = image() else { return };
    let container = Container::run(image, &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while podman_ok(&["inspect", "--format", "{{.State.Status}}", &container.name]) != "exited" {
        assert!(
            Instant::now() < deadline,
            "still running: {}",
            container.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(container.exit_code(), 78, "EX_CONFIG: {}", container.logs());
    let logs = container.logs();
    assert!(
        logs.contains("without API keys") && logs.contains("ANNALS_ALLOW_UNAUTHENTICATED_NETWORK"),
        "{logs}"
    );
}

/// Goal: `podman stop` (SIGTERM) under a load of appends on many connections ends the server
/// with exit 0 well inside the engine's grace period, and every append it acknowledged is in
/// the log a new container reads from the same volume.
#[test]
fn sigterm_under_load_exits_zero_with_every_acknowledged_append() {
    let Some(image) = image() else { return };
    let volume = Volume::new();
    let data = format!("{}:/data", volume.0);
    let args = ["-v", &data, "-e", "ANNALS_ALLOW_UNAUTHENTICATED_NETWORK=1"];
    let first = Container::run(image, &args);
    first.wait_healthy();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|id| {
            let (addr, stop) = (first.http, stop.clone());
            std::thread::spawn(move || appender(addr, id, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    // The engine's default grace period is 10 s.
    assert_eq!(first.stop(Duration::from_secs(10)), 0, "{}", first.logs());
    let took = started.elapsed();
    assert!(took < Duration::from_secs(8), "the stop took {took:?}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers: Vec<_> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    drop(first);

    let second = Container::run(image, &args);
    second.wait_healthy();
    let r = common::request(second.http, "GET", "/v1/read", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let events = r.json().as_array().expect("an array of events").clone();
    let tally = check_answers(&events, &answers);
    assert!(tally.stored > 100, "the load was acknowledged: {tally:?}");
}

/// Goal: the README's container commands for PostgreSQL, a backup to object storage and a
/// read replica of it run as written (keys from a variable; the database and the object
/// store, real ones, reached on the host's network): events appended through one container
/// on PostgreSQL are read through a new one; a container's backup is followed by a replica
/// container, which refuses appends.
#[test]
fn the_readmes_postgres_backup_and_replica_commands_run() {
    let Some(image) = image() else { return };
    let key = "container-key-0000000002";
    let keys = format!("ANNALS_API_KEYS={key}=read,append,admin");
    let append = |c: &Container, n: usize| {
        let body = format!(r#"{{"events":[{{"type":"Noted","tags":["n:{n}"],"data":"{n}"}}]}}"#);
        let r = c.call(key, "POST", "/v1/append", &body);
        assert_eq!(r.status, 200, "{}\n{}", r.text(), c.logs());
    };
    if let Some(cluster) = annals_testkit::Cluster::start() {
        let store = format!(
            "ANNALS_STORE={}",
            cluster.db_url("postgres", false).unwrap()
        );
        let args = ["-e", &keys, "-e", &store];
        let first = Container::run_on_host(image, &args);
        first.wait_healthy();
        (0..10).for_each(|n| append(&first, n));
        assert_eq!(first.stop(Duration::from_secs(10)), 0, "{}", first.logs());
        drop(first);
        let second = Container::run_on_host(image, &args);
        second.wait_healthy();
        assert_eq!(
            second.events(key).len(),
            10,
            "the events live in the database"
        );
        assert_eq!(second.stop(Duration::from_secs(10)), 0);
    }
    if let Some(s3) = annals_testkit::s3::S3Server::start() {
        let mut env: Vec<String> = s3.env().iter().map(|(k, v)| format!("{k}={v}")).collect();
        env.push(keys.clone());
        let with_env = |extra: &[String]| -> Vec<String> {
            env.iter()
                .chain(extra)
                .flat_map(|e| ["-e".to_string(), e.clone()])
                .collect()
        };
        let volume = Volume::new();
        let backup = format!("ANNALS_BACKUP={}", s3.url("from-a-container"));
        let mut args = vec!["-v".to_string(), format!("{}:/data", volume.0)];
        args.extend(with_env(&[backup]));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let primary = Container::run_on_host(image, &args);
        primary.wait_healthy();
        (0..10).for_each(|n| append(&primary, n));
        let replica_of = format!("ANNALS_REPLICA_OF={}", s3.url("from-a-container"));
        let replica_args = with_env(&[replica_of]);
        let replica_args: Vec<&str> = replica_args.iter().map(String::as_str).collect();
        let replica = Container::run_on_host(image, &replica_args);
        replica.wait_healthy();
        annals_testkit::eventually("the replica to follow", Duration::from_secs(60), || {
            replica.events(key).len() >= 10
        });
        assert_eq!(replica.events(key), primary.events(key));
        let refused = replica.call(
            key,
            "POST",
            "/v1/append",
            r#"{"events":[{"type":"T","tags":[],"data":"x"}]}"#,
        );
        assert_eq!(refused.kind(), "read_only_replica", "{}", refused.text());
        assert_eq!(
            replica.stop(Duration::from_secs(10)),
            0,
            "{}",
            replica.logs()
        );
        assert_eq!(
            primary.stop(Duration::from_secs(10)),
            0,
            "{}",
            primary.logs()
        );
    }
}
