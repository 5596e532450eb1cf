//! Snapshot tests of the server's hand-written outputs: each is compared with the copy
//! committed in `tests/snapshots/`, which `ANNALS_UPDATE_SNAPSHOTS=1` writes anew, so that a
//! change to an output is a visible decision.

/// Panics unless `text` is the committed snapshot `name` (written anew first when
/// `ANNALS_UPDATE_SNAPSHOTS` is set), naming the first line that differs.
pub(crate) fn assert_snapshot(name: &str, text: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("snapshots")
        .join(name);
    if std::env::var_os("ANNALS_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, text).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != text {
        let first = committed
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(text.lines().count()));
        panic!(
            "{name} differs from {} from line {} on; if the change is meant, run the test with \
             ANNALS_UPDATE_SNAPSHOTS=1 and commit the file",
            path.display(),
            first + 1
        );
    }
}
