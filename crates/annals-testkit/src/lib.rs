//! Throwaway PostgreSQL clusters for tests, made the way a user would: `initdb` into a
//! temporary directory, `pg_ctl` to start it on a free loopback port, removed at the end. A
//! cluster can be killed (SIGKILL to the postmaster), restarted, and given a streaming standby
//! that it waits for on every commit (synchronous replication), which can then be promoted.
//!
//! The binaries are found in `ANNALS_PG_BIN`, else in the newest `/usr/lib/postgresql/*/bin`
//! (Debian's packages), else beside `initdb` on the `PATH`. PostgreSQL refuses to run as root;
//! under root the commands run as the `postgres` user (Debian's packages create it), through
//! `runuser`.
//!
//! Also: where scripts/setup's other tools are (`tools_dir`, `umadb_bin`, `h2spec_bin`,
//! `python`), and whether a test may use them at all (`tools_allowed`); a throwaway S3 server
//! (`s3::S3Server`, SeaweedFS); a running `annals serve` (`server::ServerProcess`) and a small
//! HTTP client (`http`); waiting for what happens in the background (`eventually`); format
//! fixtures, data directories committed to the repository (`fixtures`).

pub mod fixtures;
pub mod http;
pub mod jaeger;
mod ports;
pub mod s3;
pub mod server;
pub mod spans;
mod wait;

pub use ports::free_port;
pub use wait::{eventually, poll, Awaited};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Where PostgreSQL's programs are, or None when it is not installed.
pub fn bin_dir() -> Option<PathBuf> {
    if !tools_allowed() {
        return None;
    }
    if let Some(dir) = std::env::var_os("ANNALS_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .find(|dir| dir.join("initdb").exists() && dir.join("pg_ctl").exists())
}

/// Whether the tests must find PostgreSQL (the test command says so); otherwise a test
/// without it skips, saying why.
pub fn required() -> bool {
    std::env::var_os("ANNALS_REQUIRE_POSTGRES").is_some_and(|v| v == "1")
}

/// A running (or stopped) throwaway cluster.
pub struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    run_as_postgres: bool,
}

impl Cluster {
    /// A fresh cluster with PostgreSQL's defaults (fsync on, synchronous_commit on), started;
    /// None when PostgreSQL is not installed and the tests do not require it.
    pub fn start() -> Option<Cluster> {
        Self::start_with(&[])
    }

    /// [`Cluster::start`] with extra `postgresql.conf` lines.
    pub fn start_with(settings: &[&str]) -> Option<Cluster> {
        let Some(bin) = bin_dir() else {
            if required() {
                panic!("PostgreSQL is required (ANNALS_REQUIRE_POSTGRES=1) but initdb was not found; run scripts/setup");
            }
            eprintln!("skipped: PostgreSQL is not installed (run scripts/setup)");
            return None;
        };
        let cluster = Self::init(bin, None);
        cluster.configure(settings);
        cluster.start_server();
        Some(cluster)
    }

    fn init(bin: PathBuf, from: Option<&Cluster>) -> Cluster {
        // SAFETY: geteuid takes nothing and cannot fail.
        let run_as_postgres = unsafe { libc::geteuid() } == 0;
        let dir = tempfile::Builder::new()
            .prefix("annals-pg")
            .tempdir()
            .expect("a temporary directory");
        let cluster = Cluster {
            dir,
            bin,
            port: free_port(),
            run_as_postgres,
        };
        if run_as_postgres {
            let status = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(cluster.dir.path())
                .status()
                .expect("chown");
            assert!(
                status.success(),
                "chown the cluster's directory to postgres"
            );
        }
        match from {
            None => cluster.run(
                "initdb",
                &[
                    "-D",
                    cluster.data().to_str().unwrap(),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--no-instructions",
                ],
            ),
            Some(primary) => cluster.run(
                "pg_basebackup",
                &[
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &primary.port.to_string(),
                    "-U",
                    "postgres",
                    "-D",
                    cluster.data().to_str().unwrap(),
                    "-R",
                    "-X",
                    "stream",
                    "--checkpoint=fast",
                ],
            ),
        }
        cluster
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A fresh cluster, started, that accepts TCP connections only over TLS, with a server
    /// certificate for 127.0.0.1 issued by a CA of its own; answers the CA's PEM file (to give
    /// as `sslrootcert`). Certificates are made with the `openssl` program.
    pub fn start_tls() -> Option<(Cluster, PathBuf)> {
        let bin = bin_dir().or_else(|| {
            assert!(
                !required(),
                "PostgreSQL is required but was not found; run scripts/setup"
            );
            None
        })?;
        let cluster = Self::init(bin, None);
        let data = cluster.data();
        let ca = cluster.dir.path().join("ca.pem");
        let ca_key = cluster.dir.path().join("ca.key");
        let (cert, key, csr) = (
            data.join("server.crt"),
            data.join("server.key"),
            data.join("server.csr"),
        );
        let ext = cluster.dir.path().join("server.ext");
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let p = |p: &Path| p.to_str().unwrap().to_owned();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &[
                &["req", "-x509"][..],
                &ec,
                &[
                    "-days",
                    "2",
                    "-subj",
                    "/CN=annals test CA",
                    "-keyout",
                    &p(&ca_key),
                    "-out",
                    &p(&ca),
                ],
            ]
            .concat(),
        );
        openssl(
            &[
                &["req"][..],
                &ec,
                &[
                    "-subj",
                    "/CN=127.0.0.1",
                    "-keyout",
                    &p(&key),
                    "-out",
                    &p(&csr),
                ],
            ]
            .concat(),
        );
        openssl(&[
            "x509",
            "-req",
            "-in",
            &p(&csr),
            "-CA",
            &p(&ca),
            "-CAkey",
            &p(&ca_key),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &p(&ext),
            "-out",
            &p(&cert),
        ]);
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        if cluster.run_as_postgres {
            let status = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&cert)
                .arg(&key)
                .status()
                .expect("chown");
            assert!(
                status.success(),
                "chown the server's certificate to postgres"
            );
        }
        std::fs::write(
            data.join("pg_hba.conf"),
            "hostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n\
             hostssl replication all 127.0.0.1/32 trust\n",
        )
        .unwrap();
        cluster.configure(&[
            "ssl = on",
            "ssl_cert_file = 'server.crt'",
            "ssl_key_file = 'server.key'",
        ]);
        cluster.start_server();
        Some((cluster, ca))
    }

    /// Appends lines to postgresql.conf (they take effect at the next start).
    pub fn configure(&self, settings: &[&str]) {
        use std::io::Write;
        let conf = self.data().join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .expect("postgresql.conf");
        writeln!(file, "\n# set by the test").unwrap();
        writeln!(file, "port = {}", self.port).unwrap();
        writeln!(file, "listen_addresses = '127.0.0.1'").unwrap();
        // Its Unix socket in its own directory (see `Cluster::socket_url`), not the system's;
        // none when the directory's path is too long for a socket's.
        let sockets = if self.socket_fits() {
            self.dir.path().display().to_string()
        } else {
            String::new()
        };
        writeln!(file, "unix_socket_directories = '{sockets}'").unwrap();
        for line in settings {
            writeln!(file, "{line}").unwrap();
        }
    }

    fn start_server(&self) {
        let log = self.dir.path().join("log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                self.data().to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
    }

    /// A connection string for the cluster's `postgres` database.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// Whether the socket's path (the directory, `/.s.PGSQL.` and the port) fits the 107 bytes
    /// a Unix socket's path may have.
    fn socket_fits(&self) -> bool {
        self.dir.path().as_os_str().len() + "/.s.PGSQL.65535".len() <= 107
    }

    /// A URL for database `db` over the cluster's Unix socket, as a client on the database's
    /// machine connects (libpq's default there): the socket's directory, percent-encoded, is
    /// the host. None when the cluster has no socket (its directory's path is too long).
    pub fn socket_url(&self, db: &str) -> Option<String> {
        if !self.socket_fits() {
            return None;
        }
        let dir: String = self
            .dir
            .path()
            .display()
            .to_string()
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        Some(format!("postgres://postgres@{dir}:{}/{db}", self.port))
    }

    /// A URL for database `db`: over the Unix socket ([`Cluster::socket_url`]) or TCP on
    /// 127.0.0.1.
    pub fn db_url(&self, db: &str, socket: bool) -> Result<String, String> {
        if socket {
            self.socket_url(db).ok_or_else(|| {
                format!(
                    "the cluster in {} has no Unix socket: its path is too long",
                    self.dir.path().display()
                )
            })
        } else {
            Ok(format!("postgres://postgres@127.0.0.1:{}/{db}", self.port))
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the postmaster with SIGKILL (its backends go with it when it is gone), as a
    /// machine's loss would.
    pub fn kill9(&self) {
        if let Some(pid) = self.postmaster_pid() {
            // The postmaster and its children at once, as when the machine is lost: a backend
            // left behind would go on answering its client's queries for a moment from a
            // database that is gone.
            let children = children_of(pid);
            for process in std::iter::once(pid).chain(children) {
                // SAFETY: kill takes plain integers; a pid that is gone only makes it fail.
                unsafe {
                    libc::kill(process, libc::SIGKILL);
                }
            }
            // The backends notice their postmaster is gone and exit; wait for the port to free.
            eventually(
                "the killed cluster to stop answering",
                Duration::from_secs(30),
                || std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err(),
            );
            // Children may linger a moment after the port closes.
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Starts the cluster again after a stop or a kill (crash recovery runs).
    pub fn restart(&self) {
        let _ = std::fs::remove_file(self.data().join("postmaster.pid"));
        self.start_server();
    }

    /// Stops the cluster (fast shutdown).
    pub fn stop(&self) {
        self.run(
            "pg_ctl",
            &[
                "-D",
                self.data().to_str().unwrap(),
                "-m",
                "fast",
                "-w",
                "stop",
            ],
        );
    }

    /// A streaming standby of this cluster, started, that this cluster then waits for on
    /// every commit (`synchronous_standby_names = '*'`, reloaded).
    pub fn synchronous_standby(&self) -> Cluster {
        let standby = Self::init(self.bin.clone(), Some(self));
        standby.configure(&[]);
        standby.start_server();
        self.sql("ALTER SYSTEM SET synchronous_standby_names = '*'");
        self.sql("SELECT pg_reload_conf()");
        eventually(
            "the standby to stream synchronously",
            Duration::from_secs(60),
            || {
                let state =
                    self.sql_value("SELECT coalesce(max(sync_state), '') FROM pg_stat_replication");
                if state == "sync" {
                    Ok(())
                } else {
                    Err(state)
                }
            },
        );
        standby
    }

    /// Promotes a standby to primary and waits until it accepts writes.
    pub fn promote(&self) {
        self.run(
            "pg_ctl",
            &["-D", self.data().to_str().unwrap(), "-w", "promote"],
        );
        eventually(
            "the standby to leave recovery",
            Duration::from_secs(60),
            || self.sql_value("SELECT pg_is_in_recovery()") == "f",
        );
    }

    /// Runs SQL through psql; panics on failure.
    pub fn sql(&self, sql: &str) {
        let out = self.psql(sql);
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The single value a query answers, as psql prints it.
    pub fn sql_value(&self, sql: &str) -> String {
        let out = self.psql(sql);
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn psql(&self, sql: &str) -> std::process::Output {
        let psql = self.bin.join("psql");
        let psql = if psql.exists() {
            psql
        } else {
            PathBuf::from("psql")
        };
        Command::new(psql)
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"])
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-d", "postgres", "-c", sql])
            .output()
            .expect("run psql")
    }

    fn postmaster_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// One of PostgreSQL's programs, as the user that may run it.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.run_as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program)
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        if !out.status.success() {
            let log = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
            panic!(
                "{program} {args:?} failed: {}{}\nserver log:\n{log}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// The cluster's directory (data and server log).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `pg_dump` of the cluster's `postgres` database, as text; panics on failure.
    pub fn dump(&self) -> String {
        let out = Command::new(self.bin.join("pg_dump"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "postgres"])
            .output()
            .unwrap_or_else(|e| panic!("run pg_dump: {e}"));
        assert!(
            out.status.success(),
            "pg_dump: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.postmaster_pid().is_some() {
            let data = self.data();
            let _ = self
                .command("pg_ctl")
                .args([
                    "-D",
                    data.to_str().unwrap(),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A small file system that a test can fill and grow: a tmpfs mounted on a directory of its
/// own, unmounted on drop. Mounting needs root (CI runs as root).
pub struct Tmpfs {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `mib` MiB, or None, saying why, when this process may not mount (in
    /// CI, which runs as root, that fails the test instead).
    pub fn mount(mib: u64) -> Option<Tmpfs> {
        // SAFETY: geteuid only reads the process's credentials.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root and must be able to mount a tmpfs"
            );
            eprintln!("not root, so no file system to fill: skipped");
            return None;
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("fs");
        std::fs::create_dir(&path).expect("the mount point");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&path)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root and must be able to mount a tmpfs"
            );
            eprintln!("mounting a tmpfs failed: skipped");
            return None;
        }
        Some(Tmpfs { _dir: dir, path })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Grows (or shrinks) it to `mib` MiB, as an operator who adds space does.
    pub fn resize(&self, mib: u64) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={mib}m")])
            .arg(&self.path)
            .status()
            .expect("run mount");
        assert!(status.success(), "remount to {mib} MiB");
    }

    /// Hands it to the `postgres` user, as a tablespace's directory must be when the clusters
    /// run as that user (under root).
    pub fn give_to_postgres(&self) {
        let status = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(&self.path)
            .status()
            .expect("run chown");
        assert!(status.success(), "chown the tmpfs to postgres");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}

/// The processes whose parent is `pid` (from /proc).
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let child: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // "pid (name) state ppid ...": the name may hold spaces and parentheses.
            let (_, after_name) = stat.rsplit_once(')')?;
            let parent: i32 = after_name.split_whitespace().nth(1)?.parse().ok()?;
            (parent == pid).then_some(child)
        })
        .collect()
}

/// The directory where scripts/setup installs the tools the tests drive, once per machine:
/// `ANNALS_TOOLS`, else `$XDG_CACHE_HOME/annals-tools`, else `~/.cache/annals-tools`.
pub fn tools_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ANNALS_TOOLS") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("annals-tools")
}

/// Whether the tests may drive programs from outside the Rust build (PostgreSQL, UmaDB's server,
/// Python, h2spec, Chromium): not under `ANNALS_NO_TOOLS=1`, which `scripts/test quick` sets so
/// that the inner loop needs nothing but cargo.
pub fn tools_allowed() -> bool {
    std::env::var_os("ANNALS_NO_TOOLS").is_none_or(|v| v.is_empty() || v == "0")
}

/// A tool scripts/setup installs: the path in the environment variable `var` (scripts/test sets
/// them from setup's answer), else `relative` inside [`tools_dir`]; None when it is not there
/// or tools are not allowed.
pub fn tool(var: &str, relative: &str) -> Option<PathBuf> {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| tools_dir().join(relative));
    (tools_allowed() && path.exists()).then_some(path)
}

/// UmaDB's own server (`ANNALS_UMADB_BIN`).
pub fn umadb_bin() -> Option<PathBuf> {
    tool("ANNALS_UMADB_BIN", "umadb-0.7.8/bin/umadb")
}

/// h2spec (`ANNALS_H2SPEC_BIN`).
pub fn h2spec_bin() -> Option<PathBuf> {
    tool("ANNALS_H2SPEC_BIN", "h2spec-2.2.1/h2spec")
}

/// The Python with the clients the tests drive (`ANNALS_PYTHON`).
pub fn python() -> Option<PathBuf> {
    tool("ANNALS_PYTHON", "python/bin/python")
}

/// Every file under `dir` whose bytes hold `needle`: where a marker that must never be stored
/// in the clear was found.
pub fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    walk(dir)
        .into_iter()
        .filter(|path| {
            std::fs::read(path)
                .unwrap_or_default()
                .windows(needle.len())
                .any(|w| w == needle)
        })
        .collect()
}

/// Every file under `dir`, recursively, sorted (none when it cannot be read).
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Swaps the paths `a` and `b` in one step (`renameat2` with `RENAME_EXCHANGE`): a backup's
/// directory and a plain file, say, which makes the backup unreadable and unwritable to every
/// process at once (root included, whom permissions do not stop) and whole again on the next
/// swap, with no moment between in which a writer could make a new directory in its place.
pub fn exchange(a: &Path, b: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let a_c = std::ffi::CString::new(a.as_os_str().as_bytes()).expect("a path without NUL");
    let b_c = std::ffi::CString::new(b.as_os_str().as_bytes()).expect("a path without NUL");
    // SAFETY: both are NUL-terminated paths that live across the call.
    let done = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a_c.as_ptr(),
            libc::AT_FDCWD,
            b_c.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(
        done,
        0,
        "swap {} and {}: {}",
        a.display(),
        b.display(),
        std::io::Error::last_os_error()
    );
}
