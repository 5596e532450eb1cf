//! Why a server did not start, typed by what the operator can do about it: fix the
//! configuration, free a port, wait for the database, mend the store.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Why [`crate::Server::start`] (or `start_with_store`) did not start a server. A start that
/// fails leaves no store behind that it made, except where [`StartError::LeftBehind`] says.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is refused: nothing was opened.
    #[error("{0}")]
    Config(String),
    /// The TLS certificate or key cannot be used.
    #[error("{0}")]
    Tls(String),
    /// A listener could not be bound: the port is in use, or the address is not this host's.
    #[error("cannot listen on {addr} ({api}): {source}")]
    Listen {
        api: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The store could not be opened; its own error says why (see [`annals::OpenError`]).
    #[error("cannot open the store in {store}: {source}")]
    Open {
        store: String,
        #[source]
        source: annals::OpenError,
    },
    /// A hosted read model or the hosted exchange could not start.
    #[error("{0}")]
    Hosted(String),
    /// The start failed, and what it had made could not be removed.
    #[error("{error} (what this start made in {} could not be removed: {source})", path.display())]
    LeftBehind {
        error: Box<StartError>,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl StartError {
    /// A stable word for what went wrong: `config`, `tls`, `listen`, `hosted`, or an
    /// opening's kind ([`annals::OpenError::kind`]: `locked`, `database_unavailable`,
    /// `subjects`, `corrupt`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            StartError::Config(_) => "config",
            StartError::Tls(_) => "tls",
            StartError::Listen { .. } => "listen",
            StartError::Open { source, .. } => source.kind(),
            StartError::Hosted(_) => "hosted",
            StartError::LeftBehind { error, .. } => error.kind(),
        }
    }
}
