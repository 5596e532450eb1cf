//! Annals: a durable event store implementing DCB (Dynamic Consistency Boundaries).
//!
//! One append-only log in segment files, one writer with group commit (one fdatasync per batch
//! of appends, no timer), in-memory type and tag indexes, DCB reads and conditional appends,
//! subscriptions, crash recovery.
//!
//! ```
//! use annals::{AppendCondition, NewEvent, Options, Query, QueryItem, ReadOptions, Store};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path(), Options::default()).unwrap();
//! let registered = NewEvent::new("UserRegistered", &b"{\"name\":\"ada\"}"[..]).tag("username:ada");
//! // Claim the username only if nobody has it yet.
//! let claim = AppendCondition::new(Query::item(QueryItem::tags(["username:ada"])), None);
//! let position = store.append(&[registered.clone()], Some(&claim)).unwrap();
//! assert_eq!(position, 1);
//! // A second claim fails, naming the event that holds the name.
//! let again = store.append(&[registered], Some(&claim)).unwrap_err();
//! assert_eq!(again.conflict_position(), Some(1));
//! let events: Vec<_> = store
//!     .read(&Query::item(QueryItem::tags(["username:ada"])), ReadOptions::forwards())
//!     .unwrap()
//!     .collect::<Result<_, _>>()
//!     .unwrap();
//! assert_eq!(events[0].event_type(), "UserRegistered");
//! ```

pub mod admission;
mod aead;
mod append;
pub mod archive;
#[cfg(feature = "object-store")]
pub mod backup;
mod batch;
#[doc(hidden)]
pub mod canary;
mod checkpoint;
pub mod companions;
mod copy;
pub mod decide;
mod error;
mod event;
mod health;
mod histogram;
mod index;
pub mod io;
mod kept;
mod keys;
mod limits;
mod log;
pub mod numbers;
#[cfg(feature = "object-store")]
pub mod objects;
mod open;
mod options;
mod parts;
#[cfg(feature = "postgres")]
mod postgres;
mod published;
mod query;
mod read;
pub mod readmodel;
mod record;
mod recovery;
#[cfg(feature = "event-schemas")]
pub mod registry;
#[cfg(feature = "object-store")]
mod replica;
mod request;
mod route;
mod saved;
#[cfg(feature = "schema")]
pub mod schema;
mod scrub;
mod seal;
mod segment;
mod shared;
mod shelf;
#[cfg(feature = "object-store")]
mod ship;
pub mod sim;
pub mod snapshot;
mod spans;
pub mod state;
mod stats;
mod store;
mod subject;
mod subscription;
mod verify;
mod writer;

pub use aead::CIPHER as SUBJECT_CIPHER;
pub use append::Append;
pub use append::{AppendOptions, Tracking};
pub use batch::{EventBatch, EventWriter};
pub use copy::{compare, copy, Appends, CopyPhase, CopyReport};
#[doc(hidden)]
pub use error::append_error_examples;
pub use error::{AppendError, InputError, OpenError, ReadError, StoreError, ERROR_KINDS};
pub use event::{Event, NewEvent, Tags};
pub use histogram::{HistogramSnapshot, Log2Histogram};
pub use limits::Limits;
pub use open::{is_database_url, Location};
pub use options::{BackupOptions, Durability, Options, Preallocation, ScrubOptions};
#[cfg(feature = "postgres")]
#[doc(hidden)]
pub use postgres::lone_commit_statement;
pub use query::{AppendCondition, Query, QueryItem, ReadOptions};
pub use read::ReadIter;
pub use record::StoredAppend;
pub use route::Backend;
pub use store::subjects::Erasure;
pub use store::{
    BackupStats, DatabaseStats, IndexSource, LiveCheck, MirrorKind, OpenReport, ReplicaStats,
    ScrubStats, Stats, Store,
};
pub use subject::{MasterKey, SubjectOptions, SUBJECT_ERASED_TYPE};
pub use subscription::Subscription;
pub use verify::{verify, verify_with_progress, VerifyReport};

/// docs/GUIDE.md, whose examples run as doc tests so the guide stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/GUIDE.md")]
pub struct Guide;

/// File names inside a data directory, for tools and tests.
pub mod files {
    pub use crate::checkpoint::FILE_NAME as CHECKPOINT;
    pub use crate::segment::SYNCED_LENGTH;

    /// The file name of segment `number`.
    pub fn segment(number: u32) -> String {
        crate::segment::file_name(number)
    }
}
