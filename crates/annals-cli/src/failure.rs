//! How a command ends when it fails: its message on standard error, and an exit status that a
//! supervisor or a script can act on, in the numbers of BSD's `sysexits.h`:
//!
//! - 78 (`EX_CONFIG`): fix the configuration, as restarting as is fails again (kinds
//!   `config`, `tls`, `invalid_option`, `subjects`);
//! - 75 (`EX_TEMPFAIL`): try again later (`listen`, `locked`, `database_unavailable`,
//!   `disk_full`);
//! - 65 (`EX_DATAERR`): the store is damaged; verify, repair or restore it (`corrupt`);
//! - 1: anything else.
//!
//! (clap answers a malformed command line with 2 itself.)

use std::fmt;

/// A command's failure: what to print and the status to exit with.
#[derive(Debug)]
pub struct Failure {
    message: String,
    kind: &'static str,
    status: i32,
}

/// The exit status of a failure of `kind` (the kinds of `annals::OpenError::kind` and
/// `annals_server::StartError::kind`).
pub fn status_of(kind: &str) -> i32 {
    match kind {
        "config" | "tls" | "invalid_option" | "subjects" => 78,
        "listen" | "locked" | "database_unavailable" | "disk_full" => 75,
        "corrupt" => 65,
        _ => 1,
    }
}

impl Failure {
    /// A failure of `kind`, told by `message`.
    pub fn of_kind(kind: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            kind,
            status: status_of(kind),
        }
    }

    /// The kind of what failed (`failed` for a failure the command words itself).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    pub fn status(&self) -> i32 {
        self.status
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for Failure {
    /// A failure the command words itself: status 1.
    fn from(message: String) -> Self {
        Failure {
            message,
            kind: "failed",
            status: 1,
        }
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Self {
        Failure::from(message.to_string())
    }
}

impl From<annals_server::StartError> for Failure {
    fn from(e: annals_server::StartError) -> Self {
        Failure::of_kind(e.kind(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a server that cannot start because of its configuration exits 78, one that may
    /// start later 75, a damaged store 65, and every kind an opening answers has a status.
    /// Method: the start's and the opening's errors of each kind, mapped.
    #[test]
    fn a_failed_start_exits_with_what_a_supervisor_can_act_on() {
        let open = |source| annals_server::StartError::Open {
            store: "d".into(),
            source,
        };
        let cases = [
            (annals_server::StartError::Config("x".into()), 78),
            (annals_server::StartError::Tls("x".into()), 78),
            (open(annals::OpenError::Subjects("x".into())), 78),
            (open(annals::OpenError::InvalidOption("x".into())), 78),
            (open(annals::OpenError::Locked { path: "d".into() }), 75),
            (
                open(annals::OpenError::Unavailable { reason: "x".into() }),
                75,
            ),
            (open(annals::OpenError::DiskFull { reason: "x".into() }), 75),
            (
                open(annals::OpenError::Store(annals::StoreError::Corrupt {
                    path: "f".into(),
                    offset: 0,
                    reason: "x".into(),
                })),
                65,
            ),
            (annals_server::StartError::Hosted("x".into()), 1),
        ];
        for (e, status) in cases {
            let kind = e.kind();
            assert_eq!(Failure::from(e).status(), status, "{kind}");
        }
        assert_eq!(Failure::from("x".to_string()).status(), 1);
    }
}
