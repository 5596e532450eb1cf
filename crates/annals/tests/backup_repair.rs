//! Repair: the background scrub finds a byte flipped in a sealed segment and, with a backup,
//! puts the record back from the backup's copy; without one it reports the damage and keeps
//! reporting it.
mod common;

use std::time::Duration;

use annals::Store;
use annals_testkit::eventually;
use common::backup::*;

/// Goal: a byte flipped in a sealed segment is found by the scrub and, with a backup, put
/// back online from the backup's copy: every read afterwards returns the original bytes, and
/// the stats say what was repaired.
#[test]
fn a_flipped_byte_is_found_by_the_scrub_and_repaired_from_the_backup() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let opts = scrubbing(options(&url));
    let path = dir.path().join("store");
    let store = Store::open(&path, opts).unwrap();
    fill(&store, 2000);
    let original = all_data(&store).unwrap();
    eventually("the backup ships everything", WAIT, || {
        store.stats().backup.unwrap().lag_positions == 0
    });
    flip_a_byte(&path);
    eventually("the scrub repairs the damage", WAIT, || {
        store.stats().scrub.unwrap().repaired >= 1
    });
    let scrub = store.stats().scrub.unwrap();
    assert!(scrub.damaged.is_empty(), "{scrub:?}");
    assert!(
        scrub.last_repair.as_deref().unwrap().contains("segments/"),
        "{scrub:?}"
    );
    assert_eq!(all_data(&store).unwrap(), original);
    store.close().unwrap();
    assert!(annals::verify(&path).unwrap().is_clean());
}

/// Goal: without a backup the damage is reported and stays reported (never hidden), and a
/// read that crosses it fails rather than return wrong bytes.
#[test]
fn without_a_backup_the_scrub_reports_the_damage() {
    let dir = tempfile::tempdir().unwrap();
    let opts = scrubbing(plain(&options("file:///unused")));
    let path = dir.path().join("store");
    let store = Store::open(&path, opts).unwrap();
    fill(&store, 2000);
    flip_a_byte(&path);
    eventually("the scrub finds the damage", WAIT, || {
        !store.stats().scrub.unwrap().damaged.is_empty()
    });
    let scrub = store.stats().scrub.unwrap();
    assert!(scrub.damaged[0].contains("0000000002.seg"), "{scrub:?}");
    assert_eq!(scrub.repaired, 0);
    assert!(all_data(&store).is_err(), "a read across the damage fails");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        store.stats().scrub.unwrap().damaged.len(),
        1,
        "still reported"
    );
}
