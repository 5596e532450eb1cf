//! The backup tests' helpers (backup_ship.rs, backup_restore.rs, backup_replica.rs,
//! backup_repair.rs): a store's options with a backup into a directory, appends to fill it,
//! a whole restore compared with its source, and the backup's objects as files.

use std::time::Duration;

use annals::backup::{restore, RestoreLimit};
use annals::{compare, BackupOptions, Durability, Limits, NewEvent, Options, Store};

/// How long a test waits for the backup, a replica or the scrub to get somewhere.
pub const WAIT: Duration = Duration::from_secs(30);

pub fn options(url: &str) -> Options {
    let limits = Limits {
        append_bytes_max: 64 << 10,
        event_bytes_max: 16 << 10,
        ..Limits::default()
    };
    let mut backup = BackupOptions::new(url);
    backup.interval = Duration::from_millis(5);
    Options {
        limits,
        segment_bytes: 256 << 10,
        group_bytes_max: 64 << 10,
        unsynced_bytes_max: 64 << 10,
        backup: Some(backup),
        ..Options::default()
    }
}

pub fn plain(options: &Options) -> Options {
    Options {
        backup: None,
        ..options.clone()
    }
}

pub fn events(from: u64, n: u64) -> Vec<NewEvent> {
    (from..from + n)
        .map(|i| {
            NewEvent::new("Happened", format!("event {i} {}", "x".repeat(300)))
                .tag(format!("k:{}", i % 7))
        })
        .collect()
}

pub fn fill(store: &Store, appends: u64) {
    for i in 0..appends {
        store.append(&events(i * 3, 1 + i % 3), None).unwrap();
    }
}

/// Restores the whole backup at `url` into a new store in `into` and compares it with
/// `source`: answers the appends compared.
pub fn restores_whole(source: &Store, into: &std::path::Path, url: &str, opts: &Options) -> u64 {
    let head = source.head();
    let whole = Store::open(into, plain(opts)).unwrap();
    let restored = restore(
        &BackupOptions::new(url),
        &whole,
        RestoreLimit::default(),
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(restored.head, head);
    let compared = compare(source, &whole, head, &mut |_| {}).unwrap();
    assert_eq!(compared, restored.appends);
    compared
}

/// The objects under `dir` of a backup, by name, with their sizes.
pub fn listed(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut found: Vec<(String, u64)> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap())
                .map(|e| {
                    let size = e.metadata().unwrap().len();
                    (e.file_name().to_string_lossy().into_owned(), size)
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

pub fn opts_d3(opts: &Options) -> Options {
    Options {
        durability: Durability::Synced,
        ..opts.clone()
    }
}

/// Flips one byte in the middle of the store's second segment file, on disk.
pub fn flip_a_byte(dir: &std::path::Path) {
    use std::os::unix::fs::FileExt;
    let path = dir.join(annals::files::segment(2));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let at = 100_000;
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    assert_ne!(byte[0], 0, "the byte is inside a record");
    file.write_all_at(&[byte[0] ^ 0x20], at).unwrap();
}

pub fn all_data(store: &Store) -> Result<Vec<Vec<u8>>, annals::ReadError> {
    store
        .read(&annals::Query::all(), annals::ReadOptions::forwards())?
        .map(|e| e.map(|e| e.data().to_vec()))
        .collect()
}

pub fn scrubbing(mut opts: Options) -> Options {
    opts.scrub = Some(annals::ScrubOptions {
        bytes_per_second: 256 << 20,
        pause: Duration::from_millis(20),
    });
    opts
}

/// The names of the key objects of the backup in `dir`, failing when any object holds
/// `marker`.
pub fn key_objects(dir: &std::path::Path, marker: &str) -> Vec<String> {
    let mut stack = vec![dir.to_path_buf()];
    let mut files = Vec::new();
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let bytes = std::fs::read(&p).unwrap();
            assert!(
                !bytes.windows(marker.len()).any(|w| w == marker.as_bytes()),
                "{} holds the clear data",
                p.display()
            );
            if p.parent().unwrap().ends_with("keys") {
                files.push(p.file_name().unwrap().to_string_lossy().to_string());
            }
        }
    }
    files
}
