//! Read replicas: a store that follows a primary through its backup, serves what the backup
//! holds, reports its lag and a backup it cannot read, follows the data subjects' keys and
//! erasures, and keeps its copy across a clean close.
mod common;

use std::time::Duration;

use annals::{InputError, NewEvent, Store};
use annals_testkit::eventually;
use common::backup::*;

/// Goal: a read replica serves what the primary's backup holds, follows it as it grows (a
/// subscription on the replica sees the new events), answers the same reads, and refuses
/// appends naming the primary.
#[test]
fn a_replica_follows_the_primary_through_its_backup() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let opts = options(&url);
    let primary = Store::open(dir.path().join("primary"), opts.clone()).unwrap();
    fill(&primary, 700);
    eventually("the backup ships everything", WAIT, || {
        primary.stats().backup.unwrap().lag_positions == 0
    });
    let backup = opts.backup.clone().unwrap();
    let replica = Store::open_replica(&backup, plain(&opts)).unwrap();
    assert_eq!(replica.head(), primary.head(), "caught up at open");
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());
    let opened_at = replica.head();
    let mut subscription = replica.subscribe(&annals::Query::all(), opened_at).unwrap();

    // The primary goes on, across several segments; the replica follows.
    fill(&primary, 1500);
    eventually("the backup ships everything", WAIT, || {
        primary.stats().backup.unwrap().lag_positions == 0
    });
    eventually("the replica follows", WAIT, || {
        replica.head() == primary.head()
    });
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());
    let next = subscription
        .next_timeout(Some(Duration::from_secs(5)))
        .unwrap()
        .expect("the subscription sees the next event");
    assert_eq!(next.position(), opened_at + 1);
    let stats = replica.stats();
    assert_eq!(stats.backend, "replica");
    assert_eq!(stats.replica.as_ref().unwrap().head, primary.head());

    let e = replica.append(&events(1, 1), None).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(
            e,
            annals::AppendError::Input(InputError::ReadOnlyReplica { .. })
        ) && text.contains(&url)
            && text.contains("directory"),
        "{text}"
    );
    assert_eq!(replica.head(), primary.head(), "nothing was appended");
    replica.close().unwrap();
    primary.close().unwrap();
}

/// Goal: a read replica tells how far behind its backup it is, and when it cannot read it.
/// Story: a replica whose backup became unreadable said nothing: its stats read as those of a
/// backup that had stopped growing, nothing made it not ready, and what it took in was
/// counted on no commit route. Method: a primary ships to a local directory and a replica
/// follows it; the directory is swapped for a plain file while the primary goes on appending:
/// the replica's stats say failing with the reason, its lag in seconds grows, and its
/// readiness names it; swapped back, the replica follows again, catches up with the primary,
/// is ready, and has counted every append it took in on the `replicated` route.
#[test]
fn a_replica_reports_its_lag_and_a_backup_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let location = dir.path().join("backup");
    let url = format!("file://{}", location.display());
    let opts = options(&url);
    let primary = Store::open(dir.path().join("primary"), opts.clone()).unwrap();
    fill(&primary, 50);
    eventually("the backup ships everything", WAIT, || {
        primary.stats().backup.unwrap().lag_positions == 0
    });
    let shipped = primary.head();
    let replica = Store::open_replica(opts.backup.as_ref().unwrap(), plain(&opts)).unwrap();
    let stats = replica.stats();
    let following = stats.replica.clone().unwrap();
    assert_eq!(following.state, "following", "{following:?}");
    assert_eq!(
        (
            following.head,
            following.backup_head,
            following.lag_positions
        ),
        (shipped, shipped, 0),
        "{following:?}"
    );
    assert!(following.last_poll_at_us > 0, "{following:?}");
    assert!(stats.unready_reasons().is_empty(), "{stats:?}");
    assert_eq!(stats.commits["replicated"], 50, "{:?}", stats.commits);
    assert_eq!(stats.durability, "replica");
    assert!(
        stats
            .durability_description
            .contains("acknowledges no appends"),
        "{}",
        stats.durability_description
    );

    // The backup becomes unreadable, to the primary too, which goes on appending.
    let blocked = dir.path().join("blocked");
    std::fs::write(&blocked, "not a backup").unwrap();
    annals_testkit::exchange(&location, &blocked);
    fill(&primary, 20);
    eventually("the replica fails", WAIT, || {
        replica.stats().replica.unwrap().state == "failing"
    });
    let lag = replica.stats().replica.unwrap().lag_seconds;
    eventually("its lag grows", WAIT, || {
        replica.stats().replica.unwrap().lag_seconds > lag + 0.5
    });
    let stats = replica.stats();
    let failing = stats.replica.clone().unwrap();
    assert!(
        failing.failures > 0
            && failing
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains(&url))
            && failing.last_poll_age_seconds > 0.5,
        "{failing:?}"
    );
    assert_eq!(replica.head(), shipped, "nothing new could be read");
    let reasons = stats.unready_reasons();
    assert!(
        reasons.len() == 1 && reasons[0].starts_with("replica_failing:"),
        "{reasons:?}"
    );

    // The backup is back: the primary ships what it held, the replica takes it in.
    annals_testkit::exchange(&location, &blocked);
    eventually("the backup ships everything", WAIT, || {
        primary.stats().backup.unwrap().lag_positions == 0
    });
    eventually("the replica catches up", WAIT, || {
        let r = replica.stats().replica.unwrap();
        r.head == primary.head() && r.backup_head == r.head && r.state == "following"
    });
    let stats = replica.stats();
    let caught_up = stats.replica.clone().unwrap();
    assert_eq!(caught_up.lag_positions, 0, "{caught_up:?}");
    assert!(caught_up.last_error.is_none(), "{caught_up:?}");
    assert!(stats.unready_reasons().is_empty(), "{stats:?}");
    assert_eq!(stats.commits["replicated"], 70, "{:?}", stats.commits);
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());
    replica.close().unwrap();
    primary.close().unwrap();
}

/// Goal: a read replica of a primary with data subjects reads their events (keys taken from
/// the backup, followed as the primary makes more), sees an erasure on the primary, and
/// refuses erasures itself; without the master key it is refused at open.
#[test]
fn a_replica_follows_the_subjects_keys_and_erasures() {
    use annals::{MasterKey, SubjectOptions};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let master = MasterKey::generate().unwrap();
    let mut opts = options(&url);
    opts.subjects = Some(SubjectOptions::new(["customer:"], master));
    let primary = Store::open(dir.path().join("primary"), opts.clone()).unwrap();
    let moved =
        |i: u64| NewEvent::new("Moved", format!("address {i}")).tag(format!("customer:{i}"));
    for i in 0..20 {
        primary.append(&[moved(i)], None).unwrap();
    }
    let shipped = |primary: &Store| {
        eventually("the backup ships everything", WAIT, || {
            primary.stats().backup.unwrap().lag_positions == 0
        })
    };
    shipped(&primary);
    let backup = opts.backup.clone().unwrap();
    let e = Store::open_replica(&backup, plain(&options(&url)))
        .err()
        .unwrap();
    assert!(e.to_string().contains("master key"), "{e}");
    let replica = Store::open_replica(&backup, plain(&opts)).unwrap();
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());

    // New subjects on the primary: their keys follow their events.
    for i in 20..40 {
        primary.append(&[moved(i)], None).unwrap();
    }
    primary.erase_subject("customer:3").unwrap();
    shipped(&primary);
    eventually("the replica follows", WAIT, || {
        replica.head() == primary.head()
    });
    let read = |store: &Store| -> Vec<(bool, Vec<u8>)> {
        store
            .read(&annals::Query::all(), annals::ReadOptions::forwards())
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.is_erased(), e.data().to_vec()))
            .collect()
    };
    assert_eq!(read(&replica), read(&primary));
    assert!(read(&replica)[3].0, "the erasure holds on the replica");
    assert_eq!(read(&replica)[30].1, b"address 30");
    let e = replica.erase_subject("customer:5").unwrap_err();
    assert!(
        matches!(
            e,
            annals::AppendError::Input(InputError::ReadOnlyReplica { .. })
        ),
        "{e}"
    );
    replica.close().unwrap();
    primary.close().unwrap();
}

/// Goal: a replica drops an erased subject's key as it takes in the erasure's receipt, and an
/// older key file read after the receipt does not bring the key back.
/// Regression: the replica dropped the key only when it read the primary's new key file, and
/// the key file it read replaced its keys whole; so while the backup held the receipt and
/// still the old key file (the primary ships the two apart), the replica went on opening the
/// erased subject's events. Method: the backup's key objects are put back as they were before
/// the erasure, once the receipt is shipped; the replica takes in the receipt and that older
/// key file, and must read the subject's event as erased.
#[test]
fn a_replica_forgets_a_subject_at_its_receipt_whatever_key_file_comes_after() {
    use annals::{MasterKey, SubjectOptions};
    let dir = tempfile::tempdir().unwrap();
    let backup_dir = dir.path().join("backup");
    let url = format!("file://{}", backup_dir.display());
    let mut opts = options(&url);
    opts.subjects = Some(SubjectOptions::new(
        ["customer:"],
        MasterKey::generate().unwrap(),
    ));
    let primary = Store::open(dir.path().join("primary"), opts.clone()).unwrap();
    for i in 0..3 {
        let moved = NewEvent::new("Moved", format!("address {i}")).tag(format!("customer:{i}"));
        primary.append(&[moved], None).unwrap();
    }
    let shipped = |primary: &Store| {
        eventually("the backup ships everything", WAIT, || {
            primary.stats().backup.unwrap().lag_positions == 0
        })
    };
    shipped(&primary);
    let replica = Store::open_replica(opts.backup.as_ref().unwrap(), plain(&opts)).unwrap();
    let keys_dir = backup_dir.join(annals::archive::KEYS_DIR);
    let before: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(&keys_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|path| (path.clone(), std::fs::read(&path).unwrap()))
        .collect();
    assert!(!before.is_empty(), "the backup holds the key file");

    primary.erase_subject("customer:1").unwrap();
    shipped(&primary);
    for entry in std::fs::read_dir(&keys_dir).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    for (path, bytes) in &before {
        std::fs::write(path, bytes).unwrap();
    }
    eventually("the replica takes in the receipt", WAIT, || {
        replica.refresh().unwrap() == primary.head()
    });
    // Two more polls: the older key file is read after the receipt.
    replica.refresh().unwrap();
    replica.refresh().unwrap();
    let erased: Vec<bool> = replica
        .read(&annals::Query::all(), annals::ReadOptions::forwards())
        .unwrap()
        .map(|e| e.unwrap().is_erased())
        .collect();
    assert_eq!(erased[..3], [false, true, false]);
    replica.close().unwrap();
    primary.close().unwrap();
}

/// Goal: a replica whose copy is kept (`Location::Replica`'s `copy`) takes in, after a clean
/// close, only what the backup holds beyond the copy; a copy left by a replica that did not close (no
/// record of a clean close), or one whose last append the backup does not hold (another
/// store's backup), is filled again from the backup; either way it serves the primary's log.
#[test]
fn a_kept_replica_copy_resumes_after_a_clean_close_and_is_refilled_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let opts = options(&url);
    let primary = Store::open(dir.path().join("primary"), opts.clone()).unwrap();
    fill(&primary, 1500);
    let shipped = |primary: &Store| {
        eventually("the backup ships everything", WAIT, || {
            primary.stats().backup.unwrap().lag_positions == 0
        })
    };
    shipped(&primary);
    let backup = opts.backup.clone().unwrap();
    let kept = dir.path().join("copy");
    let replica_options = plain(&opts);
    let kept_copy = |copy: &std::path::Path| annals::Location::Replica {
        backup: backup.clone(),
        copy: Some(copy.to_path_buf()),
    };
    let replica = Store::open_at(&kept_copy(&kept), replica_options.clone()).unwrap();
    let report = replica.open_report().mirror.clone().unwrap();
    assert_eq!(report.resumed_at, None);
    assert!(report.rebuilt.unwrap().contains("none was kept"));
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());
    let objects_first = replica.stats().replica.unwrap().objects_read;
    assert!(objects_first > 1, "filled from {objects_first} objects");
    let closed_at = replica.head();
    replica.close().unwrap();

    // Reopened after a clean close: the copy is used; what the primary shipped since is
    // taken in.
    fill(&primary, 5);
    shipped(&primary);
    let replica = Store::open_at(&kept_copy(&kept), replica_options.clone()).unwrap();
    let report = replica.open_report().mirror.clone().unwrap();
    assert_eq!(report.resumed_at, Some(closed_at), "{report:?}");
    assert_eq!(replica.head(), primary.head());
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());
    let objects = replica.stats().replica.unwrap().objects_read;
    assert!(
        objects < objects_first,
        "{objects} objects read after a clean close, {objects_first} to fill"
    );
    // One replica per copy: a second is refused while the first holds it.
    let second = Store::open_at(&kept_copy(&kept), replica_options.clone());
    assert!(
        matches!(second, Err(annals::OpenError::Locked { .. })),
        "{:?}",
        second.err()
    );
    replica.close().unwrap();
    let other_kept = dir.path().join("copy-2");
    let other_options = replica_options.clone();
    let replica = Store::open_at(&kept_copy(&other_kept), other_options.clone()).unwrap();
    replica.close().unwrap();
    // Its segments cut short as a crash would leave them and the record of its close gone:
    // filled again.
    std::fs::remove_file(other_kept.join("closed")).unwrap();
    let replica = Store::open_at(&kept_copy(&other_kept), other_options.clone()).unwrap();
    let report = replica.open_report().mirror.clone().unwrap();
    assert_eq!(report.resumed_at, None);
    assert!(
        report
            .rebuilt
            .as_deref()
            .unwrap()
            .contains("not closed cleanly"),
        "{report:?}"
    );
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());
    replica.close().unwrap();

    // Another store's backup at another prefix, followed with this copy: the backup does not
    // hold the copy's last append, so the copy is filled from it again.
    let other_url = format!("file://{}/backup-other", dir.path().display());
    let other_opts = options(&other_url);
    let other = Store::open(dir.path().join("other"), other_opts.clone()).unwrap();
    fill(&other, 50);
    shipped(&other);
    let other_backup = other_opts.backup.clone().unwrap();
    let replica = Store::open_at(
        &annals::Location::Replica {
            backup: other_backup,
            copy: Some(other_kept.clone()),
        },
        other_options,
    )
    .unwrap();
    let report = replica.open_report().mirror.clone().unwrap();
    assert_eq!(report.resumed_at, None);
    assert!(report.rebuilt.is_some(), "{report:?}");
    assert_eq!(all_data(&replica).unwrap(), all_data(&other).unwrap());
    replica.close().unwrap();
    other.close().unwrap();
    primary.close().unwrap();
}
