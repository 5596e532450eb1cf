//! A small blocking HTTP client for the commands that work against a running server
//! (`--url`, `--api-key`): ureq over rustls (aws-lc), redirects not followed, no timeouts but
//! where a command sets one (`annals health`),
//! answers read whole or streamed line by line.

use std::io::{BufRead, BufReader};
use std::net::ToSocketAddrs;
use std::sync::Arc;

use bytes::Bytes;
use ureq::http;

/// Where a running server is and how to reach it: shared by every command that can work
/// against one.
#[derive(clap::Args)]
pub struct RemoteArgs {
    /// A running server, e.g. http://127.0.0.1:7400 (or https://). Env: ANNALS_URL
    #[arg(long, value_name = "URL", env = "ANNALS_URL", conflicts_with = "store")]
    pub url: Option<String>,
    /// API key for the server (sent as a bearer token). Env: ANNALS_API_KEY
    #[arg(
        long,
        value_name = "KEY",
        env = "ANNALS_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// For https:// URLs: the CA certificate (PEM) to trust instead of the system's roots.
    /// Env: ANNALS_CA_CERT
    #[arg(long, value_name = "FILE", env = "ANNALS_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,
}

impl RemoteArgs {
    /// Connects when a URL was given.
    pub fn connect(&self) -> Option<Result<Remote, String>> {
        let url = self.url.as_deref()?;
        Some(Remote::connect(
            url,
            self.api_key.as_deref(),
            self.ca_cert.as_deref(),
        ))
    }
}

pub struct Remote {
    agent: ureq::Agent,
    /// `http(s)://host:port`, which request paths follow.
    base: String,
    /// The URL as given, for messages.
    url: String,
    authorization: Option<String>,
}

/// The roots to trust: the given CA certificate (PEM), or the system's.
fn root_certs(ca_cert: Option<&std::path::Path>) -> Result<ureq::tls::RootCerts, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let certs: Vec<CertificateDer<'static>> = match ca_cert {
        Some(path) => {
            let error = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
            let mut certs = Vec::new();
            // Each is checked as a root here, so that a bad file is reported and not skipped.
            let mut check = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(path).map_err(|e| error(&e))? {
                let cert = cert.map_err(|e| error(&e))?;
                check.add(cert.clone()).map_err(|e| error(&e))?;
                certs.push(cert);
            }
            certs
        }
        None => rustls_native_certs::load_native_certs().certs,
    };
    Ok(certs
        .iter()
        .map(|c| ureq::tls::Certificate::from_der(c).to_owned())
        .into())
}

impl Remote {
    /// Connects to `url` (http:// or https://; for https, `ca_cert` names the CA to trust,
    /// else the system's roots are used). The connection itself is made by the first request.
    pub fn connect(
        url: &str,
        api_key: Option<&str>,
        ca_cert: Option<&std::path::Path>,
    ) -> Result<Remote, String> {
        Remote::connect_within(url, api_key, ca_cert, None, true)
    }

    /// [`Remote::connect`], each request failing after `timeout` when one is given, and with
    /// the server's certificate not verified when `verify` is false: only for a server on
    /// this host's loopback that is sent no credentials (`annals health`).
    pub fn connect_within(
        url: &str,
        api_key: Option<&str>,
        ca_cert: Option<&std::path::Path>,
        timeout: Option<std::time::Duration>,
        verify: bool,
    ) -> Result<Remote, String> {
        assert!(
            verify || api_key.is_none(),
            "credentials go only to a server whose certificate is verified"
        );
        let (scheme, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
            (Some(rest), _) => ("https", rest),
            (None, Some(rest)) => ("http", rest),
            _ => return Err(format!("{url}: expected an http:// or https:// URL")),
        };
        let authority = rest.trim_end_matches('/').trim_end_matches("/v1");
        authority
            .to_socket_addrs()
            .map_err(|e| format!("{url}: {e}"))?
            .next()
            .ok_or_else(|| format!("{url}: no address"))?;
        let mut tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(Arc::new(
                rustls::crypto::aws_lc_rs::default_provider(),
            ));
        if scheme == "https" {
            tls = match verify {
                true => tls.root_certs(root_certs(ca_cert)?),
                false => tls.disable_verification(true),
            };
        }
        let agent = ureq::Agent::config_builder()
            .tls_config(tls.build())
            // Error statuses are answers whose body says why; redirects are not followed, and
            // no proxy from the environment is used.
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(None)
            .timeout_global(timeout)
            .build()
            .new_agent();
        Ok(Remote {
            agent,
            base: format!("{scheme}://{authority}"),
            url: url.to_string(),
            authorization: api_key.map(|k| format!("Bearer {k}")),
        })
    }

    fn send(
        &mut self,
        method: &str,
        path: &str,
        accept: &str,
        body: Vec<u8>,
    ) -> Result<http::Response<ureq::Body>, String> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("accept", accept)
            .header("content-type", "application/json");
        if let Some(a) = &self.authorization {
            request = request.header("authorization", a.as_str());
        }
        let answer = if body.is_empty() && method == "GET" {
            self.agent.run(request.body(()).map_err(|e| e.to_string())?)
        } else {
            self.agent
                .run(request.body(body).map_err(|e| e.to_string())?)
        };
        answer.map_err(|e| self.failed(e))
    }

    /// What a failed request says: the connection refused, TLS that failed, or else.
    fn failed(&self, error: ureq::Error) -> String {
        use std::io::ErrorKind;
        let url = &self.url;
        match &error {
            ureq::Error::Rustls(_) | ureq::Error::Tls(_) => format!("TLS with {url}: {error}"),
            ureq::Error::Io(e) if e.get_ref().is_some_and(|e| e.is::<rustls::Error>()) => {
                format!("TLS with {url}: {e}")
            }
            ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => {
                format!("cannot connect to {url}: {error}")
            }
            ureq::Error::Io(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused
                        | ErrorKind::AddrNotAvailable
                        | ErrorKind::HostUnreachable
                        | ErrorKind::NetworkUnreachable
                ) =>
            {
                format!("cannot connect to {url}: {e}")
            }
            _ => format!("request failed: {error}"),
        }
    }

    /// A request whose answer is read whole; an error status becomes the server's message.
    pub fn call(&mut self, method: &str, path: &str, body: Vec<u8>) -> Result<Bytes, String> {
        let mut response = self.send(method, path, "application/json", body)?;
        let status = response.status();
        let bytes = read_whole(response.body_mut())?;
        if !status.is_success() {
            return Err(server_error(status, &bytes));
        }
        Ok(bytes.into())
    }

    /// A request whose answer is NDJSON, handed over line by line as it arrives; `line`
    /// returns false to stop.
    pub fn stream_lines(
        &mut self,
        path: &str,
        line: impl FnMut(&[u8]) -> Result<bool, String>,
    ) -> Result<(), String> {
        self.stream_lines_of("GET", path, Vec::new(), line)
    }

    /// [`Remote::stream_lines`] of a request with a method and a body.
    pub fn stream_lines_of(
        &mut self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        mut line: impl FnMut(&[u8]) -> Result<bool, String>,
    ) -> Result<(), String> {
        let mut response = self.send(method, path, "application/x-ndjson", body)?;
        let status = response.status();
        if !status.is_success() {
            return Err(server_error(status, &read_whole(response.body_mut())?));
        }
        let mut reader = BufReader::new(response.into_body().into_reader());
        let mut pending: Vec<u8> = Vec::new();
        loop {
            pending.clear();
            let read = reader
                .read_until(b'\n', &mut pending)
                .map_err(|e| format!("the stream broke: {e}"))?;
            if read == 0 {
                return Ok(());
            }
            let text = pending.strip_suffix(b"\n").unwrap_or(&pending);
            if !line(text)? {
                return Ok(());
            }
        }
    }
}

/// A body read whole, however long.
fn read_whole(body: &mut ureq::Body) -> Result<Vec<u8>, String> {
    body.with_config()
        .limit(u64::MAX)
        .read_to_vec()
        .map_err(|e| e.to_string())
}

/// The server's message, and the stored events a schema refused, one per line (an append's
/// faults are in the message itself).
fn server_error(status: http::StatusCode, body: &[u8]) -> String {
    let answer = serde_json::from_slice::<serde_json::Value>(body).ok();
    refusal_text(status, answer.as_ref(), body)
}

/// What a refusal says (its `error`, and the stored events a schema refused), or the body.
pub fn refusal_text(
    status: impl std::fmt::Display,
    answer: Option<&serde_json::Value>,
    body: &[u8],
) -> String {
    let mut message = answer
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let empty = Vec::new();
    let violations = answer
        .and_then(|v| v["violations"].as_array())
        .unwrap_or(&empty);
    for v in violations.iter().filter(|v| v["position"].is_u64()) {
        let at = v["instancePath"]
            .as_str()
            .filter(|p| !p.is_empty())
            .unwrap_or("/");
        message.push_str(&format!(
            "\n  position {} at {at}: {}",
            v["position"],
            v["message"].as_str().unwrap_or("")
        ));
    }
    format!("the server answered {status}: {message}")
}
