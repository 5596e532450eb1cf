//! Deliberately broken variants of the store that the test harnesses must catch ("testing the
//! testers"). They are compiled in only with the test-only feature `canaries`, which the
//! crate's own tests turn on, and each is off until a test selects it at run time with
//! [`select`]. Without the feature, [`on`] is a constant `false` and the checks vanish.

/// One deliberate breakage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Canary {
    /// Acknowledges appends before their fdatasync: the crash harness must notice.
    AckBeforeFsync = 1,
    /// Accepts records whatever their CRC: the damage harness must notice.
    SkipCrc = 2,
    /// Checks append conditions outside the writer, against the published head: the race
    /// harness must notice.
    ConditionOutsideWriter = 3,
}

#[cfg(feature = "canaries")]
static SELECTED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Selects the breakage every store of this process has from now on (`None`: none). Stores
/// that are open keep what they read at open where the breakage is decided at open.
#[cfg(feature = "canaries")]
pub fn select(canary: Option<Canary>) {
    let value = canary.map_or(0, |c| c as u8);
    SELECTED.store(value, std::sync::atomic::Ordering::SeqCst);
}

/// Whether `canary` is selected.
#[inline]
pub(crate) fn on(canary: Canary) -> bool {
    #[cfg(feature = "canaries")]
    {
        SELECTED.load(std::sync::atomic::Ordering::Relaxed) == canary as u8
    }
    #[cfg(not(feature = "canaries"))]
    {
        let _ = canary;
        false
    }
}
