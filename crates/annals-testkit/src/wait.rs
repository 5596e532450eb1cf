//! Waiting for something that happens in the background (a thread, a server, another process):
//! one helper, [`eventually`], that polls a probe until it says done or a deadline passes, and
//! then fails naming what was awaited and what the probe saw last.

use std::fmt::Debug;
use std::time::{Duration, Instant};

/// What a probe of [`eventually`] answers: done, with a value, or not yet, with what it saw.
pub trait Awaited {
    /// What the wait answers once it is over.
    type Value;
    /// The value when done, else what was seen instead (for the failure's message).
    fn done(self) -> Result<Self::Value, String>;
}

/// Done when true.
impl Awaited for bool {
    type Value = ();
    fn done(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("false".into())
        }
    }
}

/// Done when there is a value.
impl<T> Awaited for Option<T> {
    type Value = T;
    fn done(self) -> Result<T, String> {
        self.ok_or_else(|| "nothing yet".into())
    }
}

/// Done when `Ok`; an `Err` is what was seen meanwhile (a value that does not fit yet, or an
/// error worth showing when the wait fails).
impl<T, E: Debug> Awaited for Result<T, E> {
    type Value = T;
    fn done(self) -> Result<T, String> {
        self.map_err(|seen| format!("{seen:?}"))
    }
}

/// Polls `probe` until it answers done and returns its value, or, once `within` has passed,
/// answers an error naming `what` was awaited and the last answer seen. For harnesses that
/// report failures as values; tests use [`eventually`].
pub fn poll<A: Awaited>(
    what: &str,
    within: Duration,
    mut probe: impl FnMut() -> A,
) -> Result<A::Value, String> {
    let started = Instant::now();
    // Short pauses first, so that what happens at once is seen at once, growing to a cap,
    // so that a long wait does not busy a core.
    let mut pause = Duration::from_millis(1);
    loop {
        let seen = match probe().done() {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        if started.elapsed() >= within {
            return Err(format!(
                "waited {within:?} for {what}; the last answer seen: {seen}"
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Polls `probe` until it answers done (true, `Some`, `Ok`) and returns its value; panics once
/// `within` has passed, naming `what` was awaited and the last answer seen.
///
/// ```
/// use std::time::Duration;
/// let started = std::time::Instant::now();
/// let waited = annals_testkit::eventually("a moment to pass", Duration::from_secs(10), || {
///     let elapsed = started.elapsed();
///     if elapsed >= Duration::from_millis(5) { Ok(elapsed) } else { Err(elapsed) }
/// });
/// assert!(waited >= Duration::from_millis(5));
/// ```
#[track_caller]
pub fn eventually<A: Awaited>(what: &str, within: Duration, probe: impl FnMut() -> A) -> A::Value {
    poll(what, within, probe).unwrap_or_else(|failure| panic!("{failure}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a probe that comes true is waited for and its value returned; one that never does
    /// fails after the deadline, naming what was awaited and the last answer.
    #[test]
    fn waits_for_the_value_and_names_what_never_came() {
        let mut calls = 0;
        let value = eventually("the third call", Duration::from_secs(10), || {
            calls += 1;
            if calls >= 3 {
                Ok(calls)
            } else {
                Err(calls)
            }
        });
        assert_eq!(value, 3);
        let failure = poll("the answer", Duration::from_millis(20), || None::<u8>).unwrap_err();
        assert!(failure.contains("the answer") && failure.contains("nothing yet"));
        let failure = poll("a lag of zero", Duration::from_millis(20), || {
            Err::<(), _>(7)
        })
        .unwrap_err();
        assert!(failure.contains("a lag of zero") && failure.ends_with('7'));
        let panicked = std::panic::catch_unwind(|| {
            eventually("never", Duration::from_millis(5), || false);
        });
        assert!(panicked.is_err());
    }
}
