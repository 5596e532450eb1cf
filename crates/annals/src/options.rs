//! How a store is opened: durability class, limits and sizes.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::limits::Limits;
pub use crate::subject::SubjectOptions;

/// What is true of an append when it is acknowledged (the README's durability table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Durability {
    /// D0: in memory only; nothing survives the process.
    Memory,
    /// D1: written to the operating system's page cache, not synced.
    Written,
    /// D2: acknowledged first, synced soon after by a background group commit.
    SyncedLater,
    /// D3: synced before acknowledgement; one fdatasync covers a whole group of appends.
    Synced,
    /// D4: synced, and in object storage before acknowledgement (a store with a backup,
    /// `Options::backup`); one put covers a whole group of appends.
    OffMachine,
}

impl Durability {
    /// The class's short label: d0, d1, d2, d3 or d4.
    pub fn label(self) -> &'static str {
        match self {
            Durability::Memory => "d0",
            Durability::Written => "d1",
            Durability::SyncedLater => "d2",
            Durability::Synced => "d3",
            Durability::OffMachine => "d4",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Durability::Memory => "D0 memory only: nothing survives the process",
            Durability::Written => "D1 written to the page cache, not synced: a power loss loses acknowledged events",
            Durability::SyncedLater => "D2 acknowledged before fsync, synced by a background group commit: a power loss loses the last unsynced group",
            Durability::Synced => "D3 fsynced before acknowledgement",
            Durability::OffMachine => "D4 fsynced and in object storage before acknowledgement",
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "d0" | "memory" => Ok(Durability::Memory),
            "d1" | "written" => Ok(Durability::Written),
            "d2" | "synced-later" => Ok(Durability::SyncedLater),
            "d3" | "synced" => Ok(Durability::Synced),
            "d4" | "off-machine" => Ok(Durability::OffMachine),
            other => Err(format!(
                "unknown durability {other:?}: expected d0, d1, d2, d3 or d4"
            )),
        }
    }
}

/// How a new segment's space is reserved before appends write into it. Either way appends
/// never change a segment's size, so an fdatasync never has the file's length to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preallocation {
    /// Write zeros over the whole segment. Each later fdatasync is then a pure data flush, the
    /// cheapest there is for small appends; the price is writing every segment twice (zeros,
    /// then records), which a log of large appends feels as half its disk bandwidth.
    Zeros,
    /// fallocate the segment (zeros written where the file system has no fallocate). Writing
    /// into fallocated space converts its extents, which makes each fdatasync write the file's
    /// extent metadata too (a journal commit where the file system journals): about a third of
    /// the rate of small synced appends on ext4 here, noise beside an fdatasync of megabytes.
    Fallocate,
    /// Zeros or fallocate for each new segment, from how the writer used the space before it:
    /// fallocate once fdatasyncs cover [`Preallocation::ADAPTIVE_FALLOCATE_FROM_BYTES`] or more
    /// each on average, zeros below (and for a store's first segment).
    Adaptive,
}

impl Preallocation {
    /// Where `Adaptive` changes from zeros to fallocate, in bytes written per fdatasync.
    pub const ADAPTIVE_FALLOCATE_FROM_BYTES: u64 = 256 << 10;

    /// Whether a new segment is zero-filled, given the bytes written and the fdatasyncs issued
    /// while the space before it was used (`None`: no history yet).
    pub fn zero_fill(self, history: Option<(u64, u64)>) -> bool {
        match self {
            Preallocation::Zeros => true,
            Preallocation::Fallocate => false,
            Preallocation::Adaptive => match history {
                // No history: zeros, the better choice for small appends.
                None => true,
                Some((bytes, syncs)) => bytes / syncs.max(1) < Self::ADAPTIVE_FALLOCATE_FROM_BYTES,
            },
        }
    }

    /// The name used by the command line: zeros, fallocate or adaptive.
    pub fn label(self) -> &'static str {
        match self {
            Preallocation::Zeros => "zeros",
            Preallocation::Fallocate => "fallocate",
            Preallocation::Adaptive => "adaptive",
        }
    }
}

impl FromStr for Preallocation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "zeros" => Ok(Preallocation::Zeros),
            "fallocate" => Ok(Preallocation::Fallocate),
            "adaptive" => Ok(Preallocation::Adaptive),
            other => Err(format!(
                "unknown preallocation {other:?}: expected zeros, fallocate or adaptive"
            )),
        }
    }
}

impl fmt::Display for Preallocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// How a store ships its log into object storage (`Options::backup`).
#[derive(Clone, PartialEq, Eq)]
pub struct BackupOptions {
    /// `s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix` or
    /// `file:///directory`.
    pub url: String,
    /// Provider settings given here rather than in the environment, named as the provider's
    /// environment variables are (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ...; for GCS
    /// `GOOGLE_...`, for Azure `AZURE_...`); they override the environment. Never printed.
    pub settings: Vec<(String, String)>,
    /// The least time between two puts of the active segment's records, unless a D4 append
    /// waits: fewer, larger objects for a store that does not ask for D4.
    pub interval: Duration,
    /// How long a D4 append waits for object storage before it is answered `OutcomeUnknown`.
    pub off_machine_timeout: Duration,
    /// How long the prefix's lease holds after the shipping server last renewed it (every
    /// third of it): how soon another server of the same database standing by, or a new
    /// server, may take the prefix over once this one is gone (at once after a clean close).
    /// Whole seconds, at least one.
    pub lease: Duration,
    /// The most record bytes one object carries (a record larger than this goes alone). A
    /// sealed segment goes out in objects of this size, and a put of one takes about as long
    /// as a put of a full chunk, so that no D4 append waits behind a much longer one.
    pub object_bytes_max: usize,
}

impl BackupOptions {
    pub fn new(url: impl Into<String>) -> Self {
        BackupOptions {
            url: url.into(),
            settings: Vec::new(),
            interval: Duration::from_millis(100),
            off_machine_timeout: Duration::from_secs(10),
            lease: Duration::from_secs(30),
            object_bytes_max: 8 << 20,
        }
    }

    /// Adds a provider setting (see [`BackupOptions::settings`]).
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }
}

impl fmt::Debug for BackupOptions {
    /// Settings may hold secrets: only their names are shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackupOptions")
            .field("url", &self.url)
            .field(
                "settings",
                &self.settings.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .field("interval", &self.interval)
            .field("off_machine_timeout", &self.off_machine_timeout)
            .field("lease", &self.lease)
            .field("object_bytes_max", &self.object_bytes_max)
            .finish()
    }
}

/// How the background scrub re-reads sealed segments (`Options::scrub`): every record's CRC
/// and position, at a bounded rate, a pass after each pause. Damage is reported (stats,
/// `/health`, `/metrics`, the log) and, with a backup, repaired from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrubOptions {
    /// The most bytes read per second.
    pub bytes_per_second: u64,
    /// The wait before each pass (the first one included).
    pub pause: Duration,
}

impl Default for ScrubOptions {
    fn default() -> Self {
        ScrubOptions {
            bytes_per_second: 8 << 20,
            pause: Duration::from_secs(600),
        }
    }
}

/// Options for [`crate::Store::open`].
#[derive(Debug, Clone)]
pub struct Options {
    pub durability: Durability,
    pub limits: Limits,
    /// Size of each segment file, preallocated in full (see `preallocation`).
    pub segment_bytes: u64,
    /// The most bytes one group commit writes before it syncs.
    pub group_bytes_max: usize,
    /// The most bytes written but not yet synced: the writer waits for the syncer beyond it.
    /// Bounds acknowledgement latency under large appends and the tail a crash can tear.
    pub unsynced_bytes_max: usize,
    /// How new segments are preallocated (see [`Preallocation`]).
    pub preallocation: Preallocation,
    /// Write an index checkpoint in the background after this many new events (0: never), so
    /// that opening after a crash scans only the events since.
    pub checkpoint_interval_events: u64,
    /// Write the index checkpoint when the store is closed.
    pub checkpoint_on_close: bool,
    /// For crash tests: after every sync, record the synced length of the current segment in
    /// the file `synced-length` (unsynced), so a test can cut the segment back to it to emulate
    /// a power loss after killing the process.
    pub record_synced_length: bool,
    /// Free space of the file system holding the log that the store leaves alone, for derived
    /// files, other programs and the operator: a new segment is begun only while the room left
    /// after it stays at least this large, and appends that need one are refused
    /// ([`crate::AppendError::DiskFull`]) until it does. None: one segment's size.
    pub disk_reserve_bytes: Option<u64>,
    /// Ship the log continuously into object storage (feature `object-store`); see
    /// [`BackupOptions`]. Needed by the off-machine class, D4.
    pub backup: Option<BackupOptions>,
    /// Re-read sealed segments in the background (see [`ScrubOptions`]); None: never. Only
    /// a store on files scrubs (a PostgreSQL store's mirror is refilled from the database).
    pub scrub: Option<ScrubOptions>,
    /// Data subjects: the events carrying a subject's tag are stored encrypted under that
    /// subject's key, and erasing the subject ([`crate::Store::erase_subject`]) deletes the
    /// key. None: no encryption, and no cost.
    pub subjects: Option<SubjectOptions>,
    /// A check every append made through the store must pass before it is sealed (see
    /// [`crate::admission`]); its refusal is [`crate::InputError::NotAdmitted`]. None: the
    /// store's own limits alone.
    pub admission: Option<std::sync::Arc<dyn crate::admission::Admission>>,
}

impl Options {
    /// The free space the store leaves alone (see [`Options::disk_reserve_bytes`]).
    pub(crate) fn disk_reserve(&self) -> u64 {
        self.disk_reserve_bytes.unwrap_or(self.segment_bytes)
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Synced,
            limits: Limits::default(),
            segment_bytes: 64 << 20,
            group_bytes_max: 32 << 20,
            unsynced_bytes_max: 16 << 20,
            preallocation: Preallocation::Adaptive,
            checkpoint_interval_events: 1_000_000,
            checkpoint_on_close: true,
            record_synced_length: false,
            disk_reserve_bytes: None,
            backup: None,
            scrub: Some(ScrubOptions::default()),
            subjects: None,
            admission: None,
        }
    }
}

impl Options {
    pub(crate) fn validate(&self) -> Result<(), String> {
        let record_max = self.limits.append_bytes_max as u64 + 64;
        if self.segment_bytes > u64::from(u32::MAX) {
            return Err("segment_bytes must be below 4 GiB".into());
        }
        if self.segment_bytes < record_max + 64 {
            return Err(format!(
                "segment_bytes ({}) must exceed the largest append ({} bytes) plus headers",
                self.segment_bytes, self.limits.append_bytes_max
            ));
        }
        if self.group_bytes_max < self.limits.append_bytes_max {
            return Err("group_bytes_max must be at least limits.append_bytes_max".into());
        }
        if self.unsynced_bytes_max < self.limits.append_bytes_max {
            return Err("unsynced_bytes_max must be at least limits.append_bytes_max".into());
        }
        if let Some(s) = &self.subjects {
            s.validate()?;
        }
        if self.limits.queue_depth_max == 0 {
            return Err("queue_depth_max must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Preallocation;

    /// Goal: adaptive preallocation picks zeros without history, for little written and for
    /// small fdatasyncs, fallocate at and above the threshold per fdatasync (and with writes but
    /// no fdatasync, as in D1); the names round-trip and a wrong one is refused with the choices.
    #[test]
    fn preallocation_choices_and_names() {
        let at = Preallocation::ADAPTIVE_FALLOCATE_FROM_BYTES;
        let adaptive = Preallocation::Adaptive;
        assert!(adaptive.zero_fill(None));
        assert!(adaptive.zero_fill(Some((at - 1, 0))));
        assert!(adaptive.zero_fill(Some((64 * at, 65))));
        assert!(!adaptive.zero_fill(Some((64 * at, 64))));
        assert!(!adaptive.zero_fill(Some((at, 0))));
        assert!(Preallocation::Zeros.zero_fill(Some((64 * at, 1))));
        assert!(!Preallocation::Fallocate.zero_fill(None));
        for p in [
            Preallocation::Zeros,
            Preallocation::Fallocate,
            Preallocation::Adaptive,
        ] {
            assert_eq!(p.label().parse::<Preallocation>(), Ok(p));
        }
        let refused = "sparse".parse::<Preallocation>().unwrap_err();
        assert!(
            refused.contains("zeros, fallocate or adaptive"),
            "{refused}"
        );
    }
}
