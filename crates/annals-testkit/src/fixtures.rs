//! Format fixtures: small data directories committed to the repository, one per on-disk format
//! version that the code still reads, each opened by a test with the code of the day. A test
//! opens a copy ([`copy`]), never the committed directory, which opening would change. The
//! directories are written once, by a generator beside the test that runs when
//! `ANNALS_UPDATE_FIXTURES` is set ([`updating`]), and then kept as they are: a fixture made
//! anew by a later build would prove nothing about the files an earlier build left.

use std::path::Path;

/// Whether the fixtures of `format` are to be written anew: `ANNALS_UPDATE_FIXTURES=1` asks
/// for all of them, `ANNALS_UPDATE_FIXTURES=<format>,<format>` for those named only (a format
/// that gained a version, without rewriting the others).
pub fn updating(format: &str) -> bool {
    let asked = std::env::var("ANNALS_UPDATE_FIXTURES").unwrap_or_default();
    asked == "1" || asked.split(',').any(|f| f.trim() == format)
}

/// Whether any fixture is to be written anew (see [`updating`]).
pub fn updating_any() -> bool {
    std::env::var("ANNALS_UPDATE_FIXTURES").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Files a store makes for itself and never reads as data, left out of a fixture: the lock
/// held while it is open, and files being written aside.
fn left_out(name: &str) -> bool {
    name == "LOCK" || name.ends_with(".tmp")
}

/// Copies the directory `from` into `to` (made if missing), recursively, leaving out
/// [`left_out`] files.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("make {}: {e}", to.display()));
    let mut entries: Vec<_> = std::fs::read_dir(from)
        .unwrap_or_else(|e| panic!("read {}: {e}", from.display()))
        .map(|e| e.unwrap())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        if left_out(&name.to_string_lossy()) {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(&name));
        } else {
            std::fs::copy(&path, to.join(&name))
                .unwrap_or_else(|e| panic!("copy {}: {e}", path.display()));
        }
    }
}

/// A copy of the fixture directory `fixture` in a new temporary directory, for a test to
/// open.
pub fn copy(fixture: &Path) -> tempfile::TempDir {
    assert!(
        fixture.is_dir(),
        "no fixture {} (written with ANNALS_UPDATE_FIXTURES=1 by its generator)",
        fixture.display()
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    copy_dir(fixture, dir.path());
    dir
}

/// Replaces the fixture directory `fixture` with a copy of `from` (a data directory a
/// generator just wrote and closed).
pub fn write(fixture: &Path, from: &Path) {
    if fixture.exists() {
        std::fs::remove_dir_all(fixture)
            .unwrap_or_else(|e| panic!("remove {}: {e}", fixture.display()));
    }
    copy_dir(from, fixture);
}

/// Every file under `dir` with its size, by path relative to `dir`, sorted: what a fixture
/// holds, for a test to check its shape.
pub fn files(dir: &Path) -> Vec<(String, u64)> {
    crate::walk(dir)
        .into_iter()
        .map(|path| {
            let size = std::fs::metadata(&path).map_or(0, |m| m.len());
            let relative = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (relative, size)
        })
        .collect()
}
