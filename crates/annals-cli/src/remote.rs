//! A small blocking HTTP client for the commands that work against a running server
//! (`--url`, `--api-key`): one keep-alive connection, answers read whole or streamed line by
//! line.

use std::net::ToSocketAddrs;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

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
    runtime: tokio::runtime::Runtime,
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    authority: String,
    authorization: Option<String>,
}

/// The TLS client configuration: the given CA certificate (PEM), or the system's roots.
fn tls_config(
    ca_cert: Option<&std::path::Path>,
) -> Result<tokio_rustls::rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    match ca_cert {
        Some(path) => {
            for cert in CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("{}: {e}", path.display()))?
            {
                let cert = cert.map_err(|e| format!("{}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    Ok(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

impl Remote {
    /// Connects to `url` (http:// or https://; for https, `ca_cert` names the CA to trust,
    /// else the system's roots are used).
    pub fn connect(
        url: &str,
        api_key: Option<&str>,
        ca_cert: Option<&std::path::Path>,
    ) -> Result<Remote, String> {
        let (tls, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
            (Some(rest), _) => (true, rest),
            (None, Some(rest)) => (false, rest),
            _ => return Err(format!("{url}: expected an http:// or https:// URL")),
        };
        let authority = rest
            .trim_end_matches('/')
            .trim_end_matches("/v1")
            .to_string();
        let addr = authority
            .to_socket_addrs()
            .map_err(|e| format!("{url}: {e}"))?
            .next()
            .ok_or_else(|| format!("{url}: no address"))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let host = authority
            .rsplit_once(':')
            .map_or(authority.as_str(), |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let connector = if tls {
            Some(tokio_rustls::TlsConnector::from(std::sync::Arc::new(
                tls_config(ca_cert)?,
            )))
        } else {
            None
        };
        let sender = runtime.block_on(async {
            let stream = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| format!("cannot connect to {url}: {e}"))?;
            let _ = stream.set_nodelay(true);
            match connector {
                None => {
                    let (sender, connection) =
                        hyper::client::conn::http1::handshake(TokioIo::new(stream))
                            .await
                            .map_err(|e| format!("{url}: {e}"))?;
                    tokio::spawn(connection);
                    Ok::<_, String>(sender)
                }
                Some(connector) => {
                    let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host)
                        .map_err(|e| format!("{url}: {e}"))?;
                    let stream = connector
                        .connect(name, stream)
                        .await
                        .map_err(|e| format!("TLS with {url}: {e}"))?;
                    let (sender, connection) =
                        hyper::client::conn::http1::handshake(TokioIo::new(stream))
                            .await
                            .map_err(|e| format!("{url}: {e}"))?;
                    tokio::spawn(connection);
                    Ok(sender)
                }
            }
        })?;
        Ok(Remote {
            runtime,
            sender,
            authority,
            authorization: api_key.map(|k| format!("Bearer {k}")),
        })
    }

    fn send(
        &mut self,
        method: &str,
        path: &str,
        accept: &str,
        body: Vec<u8>,
    ) -> Result<hyper::Response<Incoming>, String> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.authority.as_str())
            .header("accept", accept)
            .header("content-type", "application/json");
        if let Some(a) = &self.authorization {
            request = request.header("authorization", a.as_str());
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let sender = &mut self.sender;
        self.runtime
            .block_on(async { sender.send_request(request).await })
            .map_err(|e| format!("request failed: {e}"))
    }

    /// A request whose answer is read whole; an error status becomes the server's message.
    pub fn call(&mut self, method: &str, path: &str, body: Vec<u8>) -> Result<Bytes, String> {
        let response = self.send(method, path, "application/json", body)?;
        let status = response.status();
        let bytes = self
            .runtime
            .block_on(response.into_body().collect())
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(server_error(status, &bytes));
        }
        Ok(bytes)
    }

    /// A request whose answer is NDJSON, handed over line by line as it arrives; `line`
    /// returns false to stop.
    pub fn stream_lines(
        &mut self,
        path: &str,
        mut line: impl FnMut(&[u8]) -> Result<bool, String>,
    ) -> Result<(), String> {
        let response = self.send("GET", path, "application/x-ndjson", Vec::new())?;
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            let bytes = self
                .runtime
                .block_on(body.collect())
                .map_err(|e| e.to_string())?
                .to_bytes();
            return Err(server_error(status, &bytes));
        }
        let mut pending: Vec<u8> = Vec::new();
        loop {
            let frame = self.runtime.block_on(body.frame());
            let Some(frame) = frame else { break };
            let frame = frame.map_err(|e| format!("the stream broke: {e}"))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            let mut start = 0;
            while let Some(at) = pending[start..].iter().position(|&b| b == b'\n') {
                let keep_going = line(&pending[start..start + at])?;
                start += at + 1;
                if !keep_going {
                    return Ok(());
                }
            }
            pending.drain(..start);
        }
        if !pending.is_empty() {
            line(&pending)?;
        }
        Ok(())
    }
}

fn server_error(status: http::StatusCode, body: &[u8]) -> String {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    format!("the server answered {status}: {message}")
}
