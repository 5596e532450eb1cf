//! Reading a backup back: restoring a store from it (whole, to a position or to a time) and
//! checking every object of it without restoring. The objects are read in log order: at each
//! position, the sealed segment's object that begins there, else the chunk that does.

use std::collections::BTreeMap;

use crate::archive::{
    decode_object, parse_name, Decoded, Manifest, ObjectKind, KEYS_DIR, LEASE, LOG_DIR, MANIFEST,
    SEGMENTS_DIR,
};
use crate::copy::append_all;
use crate::error::StoreError;
use crate::objects::{ObjectError, ObjectFault, Objects};
use crate::options::BackupOptions;
use crate::record::{StoredAppend, HEADER_BYTES};
use crate::store::Store;

/// Where a restore stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreLimit {
    /// The last position to restore; an append that holds it is restored only when it ends
    /// there (appends are atomic: the restore stops before one that would cross it).
    pub position: Option<u64>,
    /// Restore only appends made at or before this time (microseconds since the epoch).
    pub time_us: Option<u64>,
}

/// What a restore did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RestoreReport {
    /// The last position in the backup.
    pub backup_head: u64,
    /// The restored store's head.
    pub head: u64,
    pub appends: u64,
    pub events: u64,
    pub objects: u64,
    pub bytes: u64,
}

/// What checking a backup found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct BackupReport {
    pub head: u64,
    pub objects: u64,
    pub segments: u64,
    pub chunks: u64,
    pub records: u64,
    pub bytes: u64,
    /// Chunks a segment object covers (left by a delete that failed); skipped by reads.
    pub covered_chunks: u64,
}

fn object_error(url: &str, e: ObjectError) -> StoreError {
    let hint = match e.fault {
        ObjectFault::NotFound => " (does the bucket exist?)",
        ObjectFault::Refused => " (check the credentials)",
        _ => "",
    };
    StoreError::Backup(format!("{url}: {e}{hint}"))
}

/// The objects of a backup in log order.
struct Walk<'a> {
    objects: &'a Objects,
    segments: BTreeMap<u64, u64>,
    chunks: BTreeMap<u64, u64>,
    next: u64,
    relisted: bool,
}

impl<'a> Walk<'a> {
    fn new(objects: &'a Objects) -> Result<Walk<'a>, StoreError> {
        let mut walk = Walk {
            objects,
            segments: BTreeMap::new(),
            chunks: BTreeMap::new(),
            next: 1,
            relisted: false,
        };
        walk.list()?;
        Ok(walk)
    }

    fn list(&mut self) -> Result<(), StoreError> {
        let url = self.objects.url();
        for (kind, map) in [
            (ObjectKind::Segment, &mut self.segments),
            (ObjectKind::Chunk, &mut self.chunks),
        ] {
            map.clear();
            for l in self
                .objects
                .list(kind.dir(), None)
                .map_err(|e| object_error(url, e))?
            {
                match parse_name(kind, &l.name) {
                    Some(first) => {
                        map.insert(first, l.size);
                    }
                    None => {
                        return Err(StoreError::Backup(format!(
                            "{url}: {} is not a backup object's name",
                            l.name
                        )))
                    }
                }
            }
        }
        Ok(())
    }

    /// Bytes of the objects listed.
    fn listed_bytes(&self) -> u64 {
        self.segments.values().chain(self.chunks.values()).sum()
    }

    /// The next object in log order, checked; None past the last.
    fn next_object(&mut self) -> Result<Option<Decoded>, StoreError> {
        let url = self.objects.url().to_string();
        let kind = if self.segments.contains_key(&self.next) {
            ObjectKind::Segment
        } else if self.chunks.contains_key(&self.next) {
            ObjectKind::Chunk
        } else {
            let beyond = self.segments.range(self.next..).next().is_some()
                || self.chunks.range(self.next..).next().is_some();
            if beyond && !self.relisted {
                // A chunk deleted since the listing, its segment written meanwhile.
                self.relisted = true;
                self.list()?;
                return self.next_object();
            }
            if beyond {
                return Err(StoreError::Backup(format!(
                    "{url}: no object holds position {}, yet objects after it exist (a gap \
                     in the backup)",
                    self.next
                )));
            }
            return Ok(None);
        };
        let name = kind.name(self.next);
        let bytes = match self.objects.get(&name).map_err(|e| object_error(&url, e))? {
            Some((bytes, _)) => bytes,
            None if !self.relisted => {
                self.relisted = true;
                self.list()?;
                return self.next_object();
            }
            None => {
                return Err(StoreError::Backup(format!(
                    "{url}: {name} was listed and is gone"
                )))
            }
        };
        self.relisted = false;
        let decoded = decode_object(bytes, Some(self.next))
            .map_err(|e| StoreError::Backup(format!("{url}: object {name} is damaged: {e}")))?;
        if decoded.header.kind != kind {
            return Err(StoreError::Backup(format!(
                "{url}: object {name} is not of its directory's kind"
            )));
        }
        self.next = decoded.header.last + 1;
        Ok(Some(decoded))
    }
}

/// Opens the backup at `from` for reading, refusing a location that holds none: neither its
/// manifest nor a lease (a store that began shipping into it), nor any of its objects. So a
/// mistyped location, a bucket that does not exist, or a prefix above or beside a backup is
/// an error that names what the location holds, never an empty backup. Creates nothing.
fn open_backup(from: &BackupOptions) -> Result<(Objects, Option<Manifest>), StoreError> {
    let objects = Objects::open_existing(&from.url, &from.settings).map_err(StoreError::Backup)?;
    let url = objects.url().to_string();
    let no_backup = |what: String| StoreError::Backup(format!("no backup at {url}: {what}"));
    let manifest = match objects.get(MANIFEST) {
        Ok(found) => found,
        Err(e) if e.fault == ObjectFault::NotFound => {
            return Err(no_backup(format!("{e} (a bucket that does not exist?)")))
        }
        Err(e) => return Err(object_error(&url, e)),
    };
    let manifest = match manifest {
        Some((bytes, _)) => {
            Some(Manifest::decode(&bytes).map_err(|e| StoreError::Backup(format!("{url}: {e}")))?)
        }
        None => None,
    };
    if manifest.is_some() {
        return Ok((objects, manifest));
    }
    let (top, folders) = match objects.list_top(8) {
        Ok(listed) => listed,
        Err(e) if e.fault == ObjectFault::NotFound => {
            return Err(no_backup(format!("{e} (a bucket that does not exist?)")))
        }
        Err(e) => return Err(object_error(&url, e)),
    };
    let ours = [LEASE, SEGMENTS_DIR, LOG_DIR, KEYS_DIR];
    let is_ours = |name: &str| ours.contains(&name.trim_end_matches('/'));
    if top.iter().chain(&folders).any(|n| is_ours(n)) {
        // A store shipping into it has not put its first records yet, or the manifest is
        // missing (which the readers below report).
        return Ok((objects, None));
    }
    if top.is_empty() && folders.is_empty() {
        return Err(no_backup(
            "it holds nothing (a mistyped location, or a bucket that does not exist?)".into(),
        ));
    }
    // A backup one folder below, as when the location names its bucket or parent.
    let mut below = Vec::new();
    for folder in &folders {
        let name = format!("{folder}{MANIFEST}");
        if let Ok(Some(_)) = objects.get(&name) {
            below.push(format!(
                "{}/{}",
                url.trim_end_matches('/'),
                folder.trim_end_matches('/')
            ));
        }
    }
    let mut held: Vec<&str> = top.iter().chain(&folders).map(String::as_str).collect();
    held.truncate(8);
    Err(no_backup(match below.is_empty() {
        true => format!("it holds other objects ({})", held.join(", ")),
        false => format!("backups are below it, at {}", below.join(", ")),
    }))
}

/// Refuses a backup location that holds no backup, creating nothing there (see
/// [`restore`]): for a caller that checks before it makes the store to restore into.
pub fn require_backup(from: &BackupOptions) -> Result<(), StoreError> {
    open_backup(from).map(|_| ())
}

/// Writes the data subjects' key file the backup at `from` holds (its newest epoch) into
/// `dir`, the directory of a store [`restore`] filled, once that store is closed; answers
/// whether there was one. The restore's store must have been opened with subjects
/// (`Options::subjects`, the same master key), and is opened with them again afterwards:
/// that open appends the receipt of any erasure the restored log does not hold yet (a
/// restore to a position before it).
pub fn restore_keys(from: &BackupOptions, dir: &std::path::Path) -> Result<bool, StoreError> {
    let Some(bytes) = key_file(from)? else {
        return Ok(false);
    };
    crate::io::write_file_durably(&crate::io::RealIo, dir, crate::keys::KEYS_FILE, &bytes)
        .map_err(|e| StoreError::io("write the key file", dir, 0, e))?;
    Ok(true)
}

/// The data subjects' key file the backup at `from` holds (its newest epoch), if any: for a
/// store on a database that [`restore`] filled, [`Store::import_subject_keys`] puts it into
/// the store's keys table (a store on files takes it with [`restore_keys`]). Opened again
/// afterwards, that store too appends the receipt of any erasure the restored log does not
/// hold yet, after the positions restored.
pub fn key_file(from: &BackupOptions) -> Result<Option<Vec<u8>>, StoreError> {
    let (objects, _) = open_backup(from)?;
    crate::archive::read_keys(&objects).map_err(StoreError::Backup)
}

/// Whether the backup at `from` holds data subjects' keys (a restore then needs the master
/// key).
pub fn holds_keys(from: &BackupOptions) -> Result<bool, StoreError> {
    let (objects, _) = open_backup(from)?;
    has_keys(&objects)
}

fn has_keys(objects: &Objects) -> Result<bool, StoreError> {
    let extent =
        crate::archive::keys_extent(objects).map_err(|e| object_error(objects.url(), e))?;
    Ok(extent.is_some())
}

/// Restores the backup at `url` into `to`, an empty store: every append in the backup, or
/// those up to `limit`. `progress` is told the position reached and the backup's last.
pub fn restore(
    from: &BackupOptions,
    to: &Store,
    limit: RestoreLimit,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RestoreReport, StoreError> {
    let (objects, manifest) = open_backup(from)?;
    let url = objects.url().to_string();
    if to.head() != 0 {
        return Err(StoreError::Backup(format!(
            "restore into a store that holds {} events: give an empty one",
            to.head()
        )));
    }
    if !to.has_subjects() && has_keys(&objects)? {
        return Err(StoreError::Backup(format!(
            "{url} holds data subjects' keys: open the store to restore into with its master \
             key (Options::subjects), then install the keys with backup::restore_keys"
        )));
    }
    let mut walk = Walk::new(&objects)?;
    if manifest.is_none() && (!walk.segments.is_empty() || !walk.chunks.is_empty()) {
        return Err(StoreError::Backup(format!(
            "{url}: objects without a manifest ({MANIFEST}): not a backup of Annals"
        )));
    }
    let backup_head = last_position(&objects, &walk)?;
    if let Some(p) = limit.position.filter(|&p| p > backup_head) {
        return Err(StoreError::Backup(format!(
            "{url} ends at position {backup_head}; it cannot restore to position {p}"
        )));
    }
    let mut report = RestoreReport {
        backup_head,
        objects: 0,
        bytes: 0,
        ..RestoreReport::default()
    };
    let mut first = true;
    // One object at a time: decoded, its appends handed to the store, the next fetched.
    let mut failure: Option<StoreError> = None;
    let mut stop = false;
    while !stop {
        let Some(object) = walk.next_object()? else {
            break;
        };
        report.objects += 1;
        report.bytes += object.bytes.len() as u64;
        let mut appends = Vec::with_capacity(object.records.len());
        for (i, (header, _)) in object.records.iter().enumerate() {
            if first {
                first = false;
                if let Some(m) = &manifest {
                    if !m.names(header) {
                        failure = Some(StoreError::Backup(format!(
                            "{url}: the first record is not the one its manifest names"
                        )));
                        break;
                    }
                }
            }
            let beyond_position = limit.position.is_some_and(|p| header.last_position() > p);
            let beyond_time = limit.time_us.is_some_and(|t| header.appended_at_us > t);
            if beyond_position || beyond_time {
                stop = true;
                break;
            }
            let frame = object.frame(i);
            let body = frame.slice(HEADER_BYTES..HEADER_BYTES + header.body_len as usize);
            appends.push(Ok(StoredAppend::new(
                header.first_position,
                header.event_count,
                header.appended_at_us,
                header.trailer_len,
                body,
            )));
        }
        if let Some(e) = failure.take() {
            return Err(e);
        }
        let (a, e) = append_all(to, appends.into_iter(), &mut |p| progress(p, backup_head))?;
        report.appends += a;
        report.events += e;
    }
    report.head = to.head();
    progress(report.head, backup_head);
    Ok(report)
}

/// The last position a backup holds (0 when empty), from its newest objects' headers.
fn last_position(objects: &Objects, walk: &Walk<'_>) -> Result<u64, StoreError> {
    let url = objects.url();
    let mut last = 0;
    for (kind, map) in [
        (ObjectKind::Segment, &walk.segments),
        (ObjectKind::Chunk, &walk.chunks),
    ] {
        if let Some((&first, _)) = map.iter().next_back() {
            let name = kind.name(first);
            let head = objects
                .get_range(&name, 0..crate::archive::OBJECT_HEADER_BYTES as u64)
                .map_err(|e| object_error(url, e))?;
            let header = crate::archive::decode_object_header(&head)
                .map_err(|e| StoreError::Backup(format!("{url}: object {name}: {e}")))?;
            last = last.max(header.last);
        }
    }
    Ok(last)
}

/// Checks every object of the backup at `url` without restoring it: each one's CRCs and
/// records, the positions from 1 without a gap, the manifest against the first record.
/// `progress` is told the position reached and the backup's last.
pub fn verify_backup(
    backup: &BackupOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<BackupReport, StoreError> {
    let (objects, manifest) = open_backup(backup)?;
    let url = objects.url().to_string();
    let mut walk = Walk::new(&objects)?;
    if manifest.is_none() && (!walk.segments.is_empty() || !walk.chunks.is_empty()) {
        return Err(StoreError::Backup(format!(
            "{url}: objects without a manifest ({MANIFEST}): not a backup of Annals"
        )));
    }
    let backup_head = last_position(&objects, &walk)?;
    let mut report = BackupReport {
        bytes: walk.listed_bytes(),
        ..BackupReport::default()
    };
    while let Some(object) = walk.next_object()? {
        if report.objects == 0 {
            if let (Some(m), Some((first, _))) = (&manifest, object.records.first()) {
                if !m.names(first) {
                    return Err(StoreError::Backup(format!(
                        "{url}: the first record is not the one its manifest names"
                    )));
                }
            }
        }
        report.objects += 1;
        match object.header.kind {
            ObjectKind::Segment => report.segments += 1,
            ObjectKind::Chunk => report.chunks += 1,
        }
        report.records += object.records.len() as u64;
        report.head = object.header.last;
        progress(report.head, backup_head);
    }
    // Chunks inside a segment's range are left from a failed delete: harmless, counted.
    let walk = Walk::new(&objects)?;
    for &first in walk.chunks.keys() {
        if let Some((&seg_first, _)) = walk.segments.range(..=first).next_back() {
            let name = ObjectKind::Segment.name(seg_first);
            let head = objects
                .get_range(&name, 0..crate::archive::OBJECT_HEADER_BYTES as u64)
                .map_err(|e| object_error(&url, e))?;
            let header = crate::archive::decode_object_header(&head)
                .map_err(|e| StoreError::Backup(format!("{url}: object {name}: {e}")))?;
            if first <= header.last {
                report.covered_chunks += 1;
            }
        }
    }
    Ok(report)
}
