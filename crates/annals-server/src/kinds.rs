//! How the server answers each kind of error, in one table for both front ends: the kind the
//! library gives an error (`StoreError::kind`, `InputError::kind`, `AppendError::kind`), the
//! kind an HTTP answer names (the same word, except where the HTTP API named it otherwise
//! first: the store's internal faults, which clients see as one `store_error`, `closed` as
//! `shutting_down`, a malformed stored append as `invalid_input`), its HTTP status, and its
//! gRPC code and UmaDB error type. A test walks every kind the library lists
//! (`annals::ERROR_KINDS`), so that a new kind is not answered by a guess.

use axum::http::StatusCode;
use tonic::Code;
use umadb_proto::v1::error_response::ErrorType;

/// How one kind of error is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    /// The `kind` of an HTTP error body.
    pub http_kind: &'static str,
    pub http: StatusCode,
    pub grpc: Code,
    pub error_type: ErrorType,
}

const fn row(
    http_kind: &'static str,
    http: StatusCode,
    grpc: Code,
    error_type: ErrorType,
) -> Answer {
    Answer {
        http_kind,
        http,
        grpc,
        error_type,
    }
}

/// The request is wrong: fix it; nothing was changed.
const fn invalid(http_kind: &'static str) -> Answer {
    row(
        http_kind,
        StatusCode::BAD_REQUEST,
        Code::InvalidArgument,
        ErrorType::InvalidArgument,
    )
}

/// A fault of the store's own: the client can only report it.
const INTERNAL: Answer = row(
    "store_error",
    StatusCode::INTERNAL_SERVER_ERROR,
    Code::Internal,
    ErrorType::Internal,
);

/// Every kind of `annals::ERROR_KINDS`, and its answer.
const TABLE: &[(&str, Answer)] = &[
    ("no_events", invalid("no_events")),
    ("too_many_events", invalid("too_many_events")),
    ("event_too_large", invalid("event_too_large")),
    ("append_too_large", invalid("append_too_large")),
    ("invalid_type", invalid("invalid_type")),
    ("too_many_tags", invalid("too_many_tags")),
    ("invalid_tag", invalid("invalid_tag")),
    ("query_too_large", invalid("query_too_large")),
    ("invalid_read_options", invalid("invalid_read_options")),
    ("invalid_tracking", invalid("invalid_tracking")),
    ("sync_unavailable", invalid("sync_unavailable")),
    ("malformed_stored_append", invalid("invalid_input")),
    ("not_a_subject", invalid("not_a_subject")),
    ("reserved_type", invalid("reserved_type")),
    // Retry later: the writer drains the queue in batches.
    (
        "queue_full",
        row(
            "queue_full",
            StatusCode::SERVICE_UNAVAILABLE,
            Code::Unavailable,
            ErrorType::Io,
        ),
    ),
    // Well-formed requests this server refuses: it has no backup for D4, it is a replica, the
    // subject was erased, it keeps no subjects. Over gRPC they stay INVALID_ARGUMENT, which
    // UmaDB's clients do not read as a failed condition (FAILED_PRECONDITION).
    (
        "off_machine_unavailable",
        row(
            "off_machine_unavailable",
            StatusCode::CONFLICT,
            Code::InvalidArgument,
            ErrorType::InvalidArgument,
        ),
    ),
    (
        "read_only_replica",
        row(
            "read_only_replica",
            StatusCode::FORBIDDEN,
            Code::InvalidArgument,
            ErrorType::InvalidArgument,
        ),
    ),
    (
        "subject_erased",
        row(
            "subject_erased",
            StatusCode::CONFLICT,
            Code::InvalidArgument,
            ErrorType::InvalidArgument,
        ),
    ),
    (
        "no_subjects",
        row(
            "no_subjects",
            StatusCode::CONFLICT,
            Code::InvalidArgument,
            ErrorType::InvalidArgument,
        ),
    ),
    // Expected outcomes of an append: over HTTP a failed condition is a 200 answer that says
    // so; over gRPC both are UmaDB's integrity errors.
    (
        "condition_failed",
        row(
            "condition_failed",
            StatusCode::OK,
            Code::FailedPrecondition,
            ErrorType::Integrity,
        ),
    ),
    (
        "tracking_not_increasing",
        row(
            "tracking_not_increasing",
            StatusCode::CONFLICT,
            Code::FailedPrecondition,
            ErrorType::Integrity,
        ),
    ),
    (
        "store_poisoned",
        row(
            "store_poisoned",
            StatusCode::SERVICE_UNAVAILABLE,
            Code::Unavailable,
            ErrorType::Io,
        ),
    ),
    (
        "closed",
        row(
            "shutting_down",
            StatusCode::SERVICE_UNAVAILABLE,
            Code::Unavailable,
            ErrorType::Io,
        ),
    ),
    (
        "database_unavailable",
        row(
            "database_unavailable",
            StatusCode::SERVICE_UNAVAILABLE,
            Code::Unavailable,
            ErrorType::Io,
        ),
    ),
    // Nothing was appended; appends are taken again once there is room.
    (
        "disk_full",
        row(
            "disk_full",
            StatusCode::INSUFFICIENT_STORAGE,
            Code::ResourceExhausted,
            ErrorType::Io,
        ),
    ),
    // Nothing was appended: the schemas changed while the append was judged; sent again, it
    // is judged by the new ones (the server does so itself a few times first).
    (
        "admission_changed",
        row(
            "admission_changed",
            StatusCode::CONFLICT,
            Code::Aborted,
            ErrorType::Io,
        ),
    ),
    // Neither success nor failure: the client must find out (read, or retry with ids). Not
    // UNAVAILABLE, which gRPC clients may retry by themselves, storing the append twice.
    (
        "outcome_unknown",
        row(
            "outcome_unknown",
            StatusCode::SERVICE_UNAVAILABLE,
            Code::Unknown,
            ErrorType::Io,
        ),
    ),
    ("io", INTERNAL),
    ("corrupt", INTERNAL),
    ("locked", INTERNAL),
    ("invalid_option", INTERNAL),
    ("database", INTERNAL),
    ("copy", INTERNAL),
    ("backup", INTERNAL),
    ("subjects", INTERNAL),
];

/// How an error of `kind` is answered. A kind the table does not hold (which its test rules
/// out) is answered as the store's own fault, never as the client's.
pub(crate) fn answer(kind: &'static str) -> Answer {
    TABLE
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(INTERNAL, |(_, answer)| *answer)
}

/// How a request the store refused is answered: by the table, or, refused by an admission
/// check (`InputError::NotAdmitted`), as a bad request under the check's own kind, whatever
/// row that word might name.
pub(crate) fn refused(e: &annals::InputError) -> Answer {
    match e {
        // Well-formed, but its events do not fit their types' schemas.
        annals::InputError::NotAdmitted(refusal) if refusal.kind == "schema_violation" => row(
            "schema_violation",
            StatusCode::UNPROCESSABLE_ENTITY,
            Code::InvalidArgument,
            ErrorType::InvalidArgument,
        ),
        // The registry could not read the log: the server's trouble, not the request's.
        annals::InputError::NotAdmitted(refusal) if refusal.kind == "schema_unavailable" => row(
            "schema_unavailable",
            StatusCode::SERVICE_UNAVAILABLE,
            Code::Unavailable,
            ErrorType::Io,
        ),
        annals::InputError::NotAdmitted(refusal) => invalid(refusal.kind),
        _ => answer(e.kind()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: every kind the library gives an error has its row, and the table holds no row
    /// for a kind the library does not give. Method: both lists compared.
    #[test]
    fn every_kind_of_error_has_one_answer() {
        for kind in annals::ERROR_KINDS {
            assert_eq!(
                TABLE.iter().filter(|(k, _)| k == kind).count(),
                1,
                "{kind} needs exactly one row"
            );
        }
        for (kind, _) in TABLE {
            assert!(annals::ERROR_KINDS.contains(kind), "{kind} is no error's");
        }
        let refusal = annals::InputError::NotAdmitted(annals::admission::Refusal::append(
            "condition_failed",
            "a check's own word, whatever row it names",
        ));
        assert_eq!(refused(&refusal).http, StatusCode::BAD_REQUEST);
        assert_eq!(refused(&refusal).http_kind, "condition_failed");
        assert_eq!(
            answer("no_such_kind").http,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    /// Goal: every kind an append can answer reaches a client as the table says, over HTTP
    /// and over gRPC, whatever value of the library's errors carries it. Method: one value of
    /// every kind (`annals::append_error_examples`, kept whole by the library's own test)
    /// answered by each front end's function for a failed append (the one both the append
    /// and the erase handlers use); the status, the body's kind, the gRPC code and UmaDB's
    /// error type in the details compared with the row of its kind, and the message given.
    #[test]
    fn every_kind_an_append_answers_reaches_both_front_ends_by_the_table() {
        use prost::Message;
        let examples = annals::append_error_examples();
        let mut walked: Vec<&str> = Vec::new();
        for e in &examples {
            let kind = e.kind();
            let row = answer(kind);
            let http = crate::http::append_error(e);
            assert_eq!(http.status, row.http, "{kind} over HTTP");
            assert_eq!(http.kind, row.http_kind, "{kind} over HTTP");
            assert!(!http.message.is_empty(), "{kind}");
            let grpc = crate::grpc::append_status(e);
            assert_eq!(grpc.code(), row.grpc, "{kind} over gRPC");
            let details = umadb_proto::v1::ErrorResponse::decode(grpc.details()).unwrap();
            assert_eq!(
                details.error_type, row.error_type as i32,
                "{kind} over gRPC"
            );
            assert_eq!(details.message, grpc.message(), "{kind}");
            walked.push(kind);
        }
        for kind in annals::ERROR_KINDS {
            assert!(walked.contains(kind), "{kind} was not walked");
        }
        // What UmaDB's adapters and clients read in a message.
        let condition =
            crate::grpc::append_status(&annals::AppendError::ConditionFailed { position: 3 });
        assert!(condition.message().starts_with("Integrity error: "));
        let erased = crate::grpc::append_status(&annals::AppendError::SubjectErased {
            tag: "customer:1".into(),
        });
        assert!(erased.message().starts_with("subject_erased: "));
    }
}
