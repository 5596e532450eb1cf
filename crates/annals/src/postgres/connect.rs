//! Where and how the PostgreSQL backend reaches its database: the connection string, and TLS.
//!
//! The connection string is libpq's, as a URL (`postgres://user:password@host:port/db?...`,
//! several hosts as `host1:port1,host2:port2`) or as `key=value` pairs. Two of libpq's
//! settings are read here rather than by the client library, which does not know all of their
//! values: `sslmode` and `sslrootcert` (or the environment variables `PGSSLMODE` and
//! `PGSSLROOTCERT`, as libpq reads them when the string does not set them).
//!
//! - `sslmode=disable`, `allow`, `prefer` (libpq's default) or none: no TLS. (libpq's `prefer`
//!   encrypts without checking whom it talks to when the server offers TLS; here it does not
//!   encrypt at all. Ask for `require` to encrypt.)
//! - `sslmode=require`, `verify-ca` or `verify-full`: TLS, refused unless the server's
//!   certificate chains to a trusted root and names the host connected to. This is libpq's
//!   `verify-full` for all three: an encrypted connection to a server that was not checked
//!   protects against nobody who can redirect the connection.
//! - `sslrootcert=PATH`: the PEM file of the roots to trust (a private CA, a cloud provider's
//!   bundle); without it, the system's roots.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use postgres::config::SslMode;
use postgres::{Client, Config, NoTls};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::StoreError;

/// A database to connect to: the client library's settings and, when TLS is asked for, the
/// connector that checks the server's certificate.
#[derive(Clone)]
pub(crate) struct Target {
    config: Config,
    tls: Option<MakeRustlsConnect>,
}

impl Target {
    /// Reads a connection string; refuses an unknown `sslmode` or an unreadable root file.
    pub(crate) fn parse(url: &str) -> Result<Target, StoreError> {
        let invalid = |why: String| StoreError::InvalidOption(format!("PostgreSQL {why}"));
        let (rest, ssl_mode, root_cert) = take_tls_settings(url);
        let ssl_mode = ssl_mode.or_else(|| std::env::var("PGSSLMODE").ok());
        let root_cert = root_cert.or_else(|| std::env::var("PGSSLROOTCERT").ok());
        let mut config: Config = rest
            .parse()
            .map_err(|e| invalid(format!("connection string: {e}")))?;
        if config.get_application_name().is_none() {
            config.application_name("annals");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        config.keepalives(true);
        config.keepalives_idle(Duration::from_secs(10));
        let tls = match ssl_mode.as_deref().unwrap_or("prefer") {
            "disable" | "allow" | "prefer" => None,
            "require" | "verify-ca" | "verify-full" => {
                Some(connector(root_cert.map(PathBuf::from)).map_err(invalid)?)
            }
            other => {
                return Err(invalid(format!(
                    "sslmode {other:?}: expected disable, allow, prefer, require, verify-ca or \
                     verify-full"
                )))
            }
        };
        config.ssl_mode(if tls.is_some() {
            SslMode::Require
        } else {
            SslMode::Disable
        });
        Ok(Target { config, tls })
    }

    /// Whether connections are encrypted.
    #[cfg(test)]
    fn encrypted(&self) -> bool {
        self.tls.is_some()
    }

    /// Connects; `warned` is set when the server says a commit happened locally but its
    /// replication was not confirmed (see `Committer::commit` in committer.rs).
    pub(crate) fn connect(
        &self,
        warned: Option<Arc<AtomicBool>>,
    ) -> Result<Client, postgres::Error> {
        let mut config = self.config.clone();
        if let Some(warned) = warned {
            config.notice_callback(move |notice| {
                // PostgreSQL's warning when a wait for synchronous replication is cancelled
                // after the local commit ("canceling wait for synchronous replication ...",
                // detail "The transaction has already committed locally, but might not have
                // been replicated to the standby."): the commit is not known to be on the
                // standby.
                let detail = notice.detail().unwrap_or("");
                if notice.message().contains("synchronous replication")
                    || detail.contains("committed locally")
                {
                    warned.store(true, Ordering::Release);
                }
            });
        }
        match &self.tls {
            Some(tls) => config.connect(tls.clone()),
            None => config.connect(NoTls),
        }
    }
}

impl Target {
    /// Asks the server to cancel what the connection of `token` is running.
    pub(crate) fn cancel(&self, token: &postgres::CancelToken) -> Result<(), postgres::Error> {
        match &self.tls {
            Some(tls) => token.cancel_query(tls.clone()),
            None => token.cancel_query(NoTls),
        }
    }
}

/// Drops a value holding connections (a `postgres` client) off any async runtime: the client
/// closes its connection by blocking on it, which panics on a thread that drives a runtime (a
/// server that fails to start drops its store there).
pub(crate) fn close<T: Send + 'static>(value: T) {
    if tokio::runtime::Handle::try_current().is_ok() {
        let _ = std::thread::spawn(move || drop(value)).join();
    } else {
        drop(value);
    }
}

/// Splits `sslmode` and `sslrootcert` off a connection string (URL or `key=value` pairs):
/// the rest, and their values when given.
fn take_tls_settings(url: &str) -> (String, Option<String>, Option<String>) {
    let (mut mode, mut root) = (None, None);
    let mut take = |key: &str, value: String| match key {
        "sslmode" => mode = Some(value),
        "sslrootcert" => root = Some(value),
        _ => unreachable!("only the TLS settings are taken"),
    };
    let is_tls = |key: &str| key == "sslmode" || key == "sslrootcert";
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_string(),
            Some((base, query)) => {
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|pair| {
                        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                        if is_tls(key) {
                            take(key, percent_decoded(value));
                            false
                        } else {
                            true
                        }
                    })
                    .collect();
                if kept.is_empty() {
                    base.to_string()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        url.split_whitespace()
            .filter(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                if is_tls(key.trim()) {
                    take(key.trim(), value.trim_matches('\'').to_string());
                    false
                } else {
                    true
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    (rest, mode, root)
}

/// `%XX` sequences decoded; anything malformed kept as written.
fn percent_decoded(value: &str) -> String {
    percent_encoding::percent_decode_str(value)
        .decode_utf8_lossy()
        .into_owned()
}

/// A TLS connector that trusts the roots in `root_cert` (PEM), or else the system's.
fn connector(root_cert: Option<PathBuf>) -> Result<MakeRustlsConnect, String> {
    let mut roots = rustls::RootCertStore::empty();
    match &root_cert {
        Some(path) => {
            let pem =
                std::fs::read(path).map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
            }
            if roots.is_empty() {
                return Err(format!(
                    "sslrootcert {}: no certificate in the file",
                    path.display()
                ));
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                // A system root this TLS library cannot use is one fewer to trust.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(
                    "TLS: the system has no root certificates; give the server's CA with \
                     sslrootcert=PATH"
                        .into(),
                );
            }
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// A connection of a side table's own (companion files, subjects' keys), opened when first
/// needed (running `setup`, which creates the table) and again after a failure.
pub(crate) struct SideConnection {
    target: Target,
    setup: &'static str,
    client: parking_lot::Mutex<Option<Client>>,
    /// Set when PostgreSQL says a commit is local only (its standby did not confirm it).
    warned: Arc<AtomicBool>,
}

impl Drop for SideConnection {
    fn drop(&mut self) {
        if let Some(client) = self.client.get_mut().take() {
            close(client);
        }
    }
}

impl SideConnection {
    pub(crate) fn new(target: Target, setup: &'static str) -> Self {
        SideConnection {
            target,
            setup,
            client: parking_lot::Mutex::new(None),
            warned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Runs `f` on the connection, connecting first when there is none; a failed call drops
    /// the connection, so the next one starts afresh. A write the primary committed without
    /// its synchronous standby's confirmation is an error. Called on a thread that drives an
    /// async runtime (a server's handler sealing an append for a new subject), it runs on a
    /// thread of its own: the client blocks on a runtime of its own.
    pub(crate) fn with<T: Send>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error> + Send,
    ) -> Result<T, String> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return std::thread::scope(|scope| {
                scope
                    .spawn(|| self.with_here(f))
                    .join()
                    .unwrap_or_else(|_| Err("a database call panicked".into()))
            });
        }
        self.with_here(f)
    }

    fn with_here<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, String> {
        let error = |e: postgres::Error| format!("PostgreSQL: {e}");
        let mut slot = self.client.lock();
        if slot.is_none() {
            let mut client = self
                .target
                .connect(Some(self.warned.clone()))
                .map_err(error)?;
            client.batch_execute(self.setup).map_err(error)?;
            *slot = Some(client);
        }
        let client = slot.as_mut().expect("connected above");
        self.warned.store(false, Ordering::Release);
        match f(client) {
            Ok(value) if self.warned.load(Ordering::Acquire) => {
                drop(value);
                Err(
                    "PostgreSQL committed the write locally but its synchronous standby did \
                     not confirm it"
                        .into(),
                )
            }
            Ok(value) => Ok(value),
            Err(e) => {
                *slot = None;
                Err(error(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the TLS settings of a PostgreSQL connection string are taken out of it, from a URL or
    /// from key=value pairs, the rest of the string left as it was.
    #[test]
    fn tls_settings_are_taken_from_urls_and_pairs() {
        let (rest, mode, root) = take_tls_settings(
            "postgres://u@h1:5432,h2:5433/db?sslmode=verify-full&target_session_attrs=read-write&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(
            rest,
            "postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write"
        );
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("/etc/ca.pem"));
        let (rest, mode, root) = take_tls_settings("postgres://u@h/db?sslmode=require");
        assert_eq!(rest, "postgres://u@h/db");
        assert_eq!(mode.as_deref(), Some("require"));
        assert_eq!(root, None);
        let (rest, mode, root) =
            take_tls_settings("host=h port=5432 sslmode=verify-ca sslrootcert='/ca.pem' user=u");
        assert_eq!(rest, "host=h port=5432 user=u");
        assert_eq!(mode.as_deref(), Some("verify-ca"));
        assert_eq!(root.as_deref(), Some("/ca.pem"));
        let (rest, mode, _) = take_tls_settings("postgres://u@h/db");
        assert_eq!((rest.as_str(), mode), ("postgres://u@h/db", None));
    }

    /// Goal: the sslmode of a connection string decides whether the connection is encrypted; an
    /// unknown mode or a missing root certificate file is refused naming it.
    #[test]
    fn sslmode_decides_encryption_and_unknown_modes_are_refused() {
        for (mode, encrypted) in [("disable", false), ("prefer", false), ("allow", false)] {
            let target = Target::parse(&format!("postgres://u@h/db?sslmode={mode}")).unwrap();
            assert_eq!(target.encrypted(), encrypted, "{mode}");
        }
        let missing = Target::parse("postgres://u@h/db?sslmode=require&sslrootcert=/nonexistent")
            .err()
            .expect("a missing root file is refused");
        assert!(missing.to_string().contains("/nonexistent"), "{missing}");
        let unknown = Target::parse("postgres://u@h/db?sslmode=sometimes")
            .err()
            .expect("an unknown sslmode is refused");
        assert!(unknown.to_string().contains("sometimes"), "{unknown}");
        assert!(percent_decoded("a%2Fb%zz%") == "a/b%zz%");
    }
}
