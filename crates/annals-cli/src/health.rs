//! `annals health`: asks a running server whether it serves, for a container's health check
//! or a script. The server is the one the configuration file and the environment configure
//! for `annals serve` (a listener on every interface asked on loopback, https when it serves
//! TLS, its certificate not verified there), unless `--url` names another.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::failure::Failure;
use crate::remote::Remote;

#[derive(clap::Args)]
pub struct HealthArgs {
    /// The server to ask, e.g. http://127.0.0.1:7400. Default: the HTTP listener that
    /// `annals serve` would take from ANNALS_CONFIG and the ANNALS_* variables. Env: ANNALS_URL
    #[arg(long, value_name = "URL", env = "ANNALS_URL")]
    url: Option<String>,
    /// Ask /ready instead of /health: whether the server takes appends (a full disk or a
    /// replica's first fill answer not ready), not only whether it serves.
    #[arg(long)]
    ready: bool,
    /// Seconds to wait for the answer.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    timeout: f64,
    /// For an https --url: the CA certificate (PEM) to trust instead of the system's roots.
    /// Env: ANNALS_CA_CERT
    #[arg(long, value_name = "FILE", env = "ANNALS_CA_CERT")]
    ca_cert: Option<std::path::PathBuf>,
}

/// The URL that reaches `listen` from the same host: a listener on every interface is asked
/// on loopback.
fn local_url(listen: SocketAddr, tls: bool) -> String {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{}", SocketAddr::new(ip, listen.port()))
}

pub fn run(args: HealthArgs) -> Result<(), Failure> {
    // The listener configured here is asked on loopback, where a certificate made out to
    // the server's name does not match: it is not verified then. Nothing secret is sent, and
    // what is asked is whether this host's server answers. A URL given is verified.
    let (url, verify) = match &args.url {
        Some(url) => (url.clone(), true),
        None => {
            let (listen, tls) =
                crate::serve::configured_http().map_err(|e| Failure::of_kind("config", e))?;
            (local_url(listen, tls), false)
        }
    };
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        return Err(Failure::of_kind(
            "invalid_option",
            "--timeout: expected a number of seconds above zero",
        ));
    }
    let timeout = Duration::from_secs_f64(args.timeout);
    let mut remote =
        Remote::connect_within(&url, None, args.ca_cert.as_deref(), Some(timeout), verify)?;
    let path = if args.ready { "/ready" } else { "/health" };
    let answer = remote.call("GET", path, Vec::new())?;
    let answer: serde_json::Value = serde_json::from_slice(&answer)
        .map_err(|e| format!("{url}{path}: the answer is not JSON ({e})"))?;
    println!("{answer}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the health check asks the listener the environment configures, on loopback
    /// when it listens on every interface, over TLS when the server serves TLS.
    #[test]
    fn asks_the_configured_listener() {
        let at = |text: &str| text.parse::<SocketAddr>().expect("an address");
        assert_eq!(
            local_url(at("127.0.0.1:7400"), false),
            "http://127.0.0.1:7400"
        );
        assert_eq!(
            local_url(at("0.0.0.0:8080"), false),
            "http://127.0.0.1:8080"
        );
        assert_eq!(local_url(at("[::]:8080"), true), "https://[::1]:8080");
        assert_eq!(
            local_url(at("10.1.2.3:7400"), false),
            "http://10.1.2.3:7400"
        );
    }
}
