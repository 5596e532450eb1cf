//! How a caller waits for its append's outcome and how it is answered: blocking, async,
//! or by callback, one reply per append whatever happens to it.

use super::*;

/// Where a caller waits for its append's outcome.
pub(crate) struct Completion {
    slot: Mutex<Option<Result<u64, AppendError>>>,
    /// Set with `slot`, for a caller polling without the lock.
    filled: AtomicBool,
    ready: Condvar,
}

thread_local! {
    /// A caller waits for one append at a time, so each thread reuses one completion.
    static COMPLETION: Arc<Completion> = Arc::new(Completion {
        slot: Mutex::new(None),
        filled: AtomicBool::new(false),
        ready: Condvar::new(),
    });
}

impl Completion {
    pub(crate) fn for_this_thread() -> Arc<Completion> {
        let completion = COMPLETION.with(Arc::clone);
        // Nothing can be pending here (one append at a time per thread); clear it regardless.
        *completion.slot.lock() = None;
        completion.filled.store(false, Ordering::Relaxed);
        completion
    }

    fn set(&self, outcome: Result<u64, AppendError>) {
        *self.slot.lock() = Some(outcome);
        self.filled.store(true, Ordering::Release);
        self.ready.notify_one();
    }

    /// Waits for the outcome; polls first while `waiting` says it is worth it.
    pub(crate) fn wait(&self, waiting: Waiting) -> Result<u64, AppendError> {
        while waiting.keep_polling() && !self.filled.load(Ordering::Acquire) {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
        }
        let mut slot = self.slot.lock();
        loop {
            if let Some(outcome) = slot.take() {
                // Only now: a sleeping caller still counts as waiting.
                drop(waiting);
                return outcome;
            }
            self.ready.wait(&mut slot);
        }
    }
}

pub(crate) enum ReplyTo {
    Blocking(Arc<Completion>),
    Callback(Box<dyn FnOnce(Result<u64, AppendError>) + Send>),
    Async(Arc<AsyncSlot>),
}

/// Where an async caller ([`crate::Store::append_async`]) finds its outcome.
///
/// A synced group answers tens of async callers at once. Waking each task from the store's
/// thread costs a wake-up of a parked runtime thread per task when that thread, woken on the
/// same core, preempts the store's thread, runs its one task and parks again: a trace of 64
/// async writers on two cores showed acknowledgements 20-40 us apart. So a group's async
/// answers are filled in first and only one task is woken, holding the other tasks' wakers;
/// it wakes them from its runtime's own thread, where a wake-up is a push on a local queue
/// (see [`Answers`]).
#[derive(Default)]
pub(crate) struct AsyncSlot {
    state: Mutex<AsyncState>,
    /// Set with the outcome, for a lone caller polling without the lock.
    filled: AtomicBool,
}

#[derive(Default)]
struct AsyncState {
    outcome: Option<Result<u64, AppendError>>,
    /// The waiting task's waker, once it has been polled.
    waker: Option<Waker>,
    /// The wakers of other tasks answered with this one, for this task to wake.
    delegated: Vec<Waker>,
    /// The caller took its outcome or stopped waiting: it will never wake `delegated`.
    gone: bool,
}

impl AsyncSlot {
    pub(crate) fn filled(&self) -> bool {
        self.filled.load(Ordering::Acquire)
    }

    /// Stores the outcome; returns the waker to wake, if a task waits for it.
    fn fill(&self, outcome: Result<u64, AppendError>) -> Option<Waker> {
        let mut state = self.state.lock();
        state.outcome = Some(outcome);
        self.filled.store(true, Ordering::Release);
        if state.gone {
            None
        } else {
            state.waker.take()
        }
    }

    /// Waits for the outcome (and, when woken first of a group, wakes the others).
    pub(crate) fn wait(&self) -> AsyncWait<'_> {
        AsyncWait(self)
    }
}

/// The future of [`AsyncSlot::wait`].
pub(crate) struct AsyncWait<'a>(&'a AsyncSlot);

impl std::future::Future for AsyncWait<'_> {
    type Output = Result<u64, AppendError>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.0.state.lock();
        match state.outcome.take() {
            Some(outcome) => {
                leave(state);
                Poll::Ready(outcome)
            }
            None => {
                match &mut state.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    slot => *slot = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for AsyncWait<'_> {
    /// A caller that stops waiting (its future dropped) still wakes what it was handed.
    fn drop(&mut self) {
        leave(self.0.state.lock());
    }
}

/// The caller stops waiting (its outcome taken, or its wait dropped): marks it gone and wakes,
/// outside the lock, the tasks whose wakers it was handed.
fn leave(mut state: MutexGuard<'_, AsyncState>) {
    state.gone = true;
    let delegated = std::mem::take(&mut state.delegated);
    drop(state);
    for waker in delegated {
        waker.wake();
    }
}

/// Answers a batch of replies: blocking callers and callbacks at once, async callers filled
/// in and woken through the first of them that still waits (see [`AsyncSlot`]).
#[derive(Default)]
pub(crate) struct Answers {
    woken: Vec<(Arc<AsyncSlot>, Waker)>,
}

impl Answers {
    pub(crate) fn send(&mut self, mut reply: Reply, outcome: Result<u64, AppendError>) {
        match reply.0.take() {
            Some(ReplyTo::Async(slot)) => {
                if let Some(waker) = slot.fill(outcome) {
                    self.woken.push((slot, waker));
                }
            }
            to => Reply(to).send(outcome),
        }
    }

    /// Wakes the async callers answered since the last call: the first still waiting holds
    /// the others' wakers.
    pub(crate) fn wake(&mut self) {
        let mut pending = self.woken.drain(..);
        while let Some((slot, waker)) = pending.next() {
            let mut state = slot.state.lock();
            if !state.gone {
                state.delegated.extend(pending.by_ref().map(|(_, w)| w));
            }
            drop(state);
            waker.wake();
        }
    }
}

impl Drop for Answers {
    fn drop(&mut self) {
        self.wake();
    }
}

/// Where an append's outcome goes. Every reply is answered exactly once: one dropped unanswered
/// (a panic unwinding through the writer) answers with an error, so no caller waits forever.
pub(crate) struct Reply(pub(crate) Option<ReplyTo>);

impl Reply {
    pub(crate) fn new(to: ReplyTo) -> Self {
        Reply(Some(to))
    }

    /// Drops the reply without answering: the request never reached the writer, and the
    /// caller learns why from the submitting call's own error.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }

    pub(crate) fn send(mut self, outcome: Result<u64, AppendError>) {
        match self.0.take() {
            Some(ReplyTo::Blocking(c)) => c.set(outcome),
            Some(ReplyTo::Callback(f)) => f(outcome),
            Some(ReplyTo::Async(slot)) => {
                if let Some(waker) = slot.fill(outcome) {
                    waker.wake();
                }
            }
            None => {}
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if self.0.is_some() {
            let reply = Reply(self.0.take());
            reply.send(Err(StoreError::Poisoned {
                reason: "the append was dropped unanswered (the writer stopped)".into(),
            }
            .into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::sim::SimIo;
    use crate::{Options, Store};

    /// A waker that counts its wake-ups.
    struct Counting(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Async callers, each with its slot, its pinned wait and its counting waker.
    struct Callers {
        slots: Vec<Arc<AsyncSlot>>,
        wakes: Vec<Arc<Counting>>,
    }

    impl Callers {
        fn new(n: usize) -> Self {
            Callers {
                slots: (0..n).map(|_| Arc::new(AsyncSlot::default())).collect(),
                wakes: (0..n)
                    .map(|_| Arc::new(Counting(std::sync::atomic::AtomicUsize::new(0))))
                    .collect(),
            }
        }

        fn poll(&self, i: usize, wait: &mut AsyncWait<'_>) -> Poll<Result<u64, AppendError>> {
            let waker = Waker::from(self.wakes[i].clone());
            std::future::Future::poll(std::pin::Pin::new(wait), &mut Context::from_waker(&waker))
        }

        fn woken(&self) -> Vec<usize> {
            self.wakes
                .iter()
                .map(|w| w.0.load(Ordering::SeqCst))
                .collect()
        }

        /// Answers caller i with position i + 1, all in one batch.
        fn answer(&self) {
            let mut answers = Answers::default();
            for (i, slot) in self.slots.iter().enumerate() {
                answers.send(Reply::new(ReplyTo::Async(slot.clone())), Ok(i as u64 + 1));
            }
            answers.wake();
        }
    }

    /// Goal: answering a batch of async callers wakes only the first, which wakes the others when
    /// it runs; each finds its own answer and none is woken twice.
    #[test]
    fn a_batch_of_async_answers_wakes_one_caller_which_wakes_the_others() {
        let callers = Callers::new(5);
        let mut waits: Vec<_> = callers.slots.iter().map(|s| s.wait()).collect();
        for (i, wait) in waits.iter_mut().enumerate() {
            assert!(callers.poll(i, wait).is_pending());
        }
        callers.answer();
        assert_eq!(callers.woken(), [1, 0, 0, 0, 0], "only the first is woken");
        assert!(callers.slots.iter().all(|s| s.filled()));
        assert!(matches!(callers.poll(0, &mut waits[0]), Poll::Ready(Ok(1))));
        assert_eq!(
            callers.woken(),
            [1, 1, 1, 1, 1],
            "the first woke the others"
        );
        for (i, wait) in waits.iter_mut().enumerate().skip(1) {
            match callers.poll(i, wait) {
                Poll::Ready(Ok(p)) => assert_eq!(p, i as u64 + 1),
                _ => panic!("caller {i} has no answer"),
            }
        }
        drop(waits);
        assert_eq!(callers.woken(), [1, 1, 1, 1, 1], "nobody is woken twice");
    }

    /// Goal: a batch's wake-ups reach every caller still asleep even when callers before them never
    /// slept, stopped waiting, or dropped their wait unpolled; a lone answer wakes its caller
    /// directly.
    #[test]
    fn callers_that_stopped_waiting_or_never_slept_pass_the_wake_ups_on() {
        // Caller 0 polls without sleeping (never registered a waker), caller 1 stops waiting
        // before the answers, caller 2 is woken first and then drops its wait unpolled.
        let callers = Callers::new(5);
        let mut waits: Vec<_> = callers.slots.iter().map(|s| s.wait()).collect();
        for (i, wait) in waits.iter_mut().enumerate().skip(1) {
            assert!(callers.poll(i, wait).is_pending());
        }
        let mut waits = waits.into_iter();
        let first = waits.next().unwrap();
        drop(waits.next());
        let third = waits.next().unwrap();
        let mut rest: Vec<_> = waits.collect();
        callers.answer();
        assert_eq!(
            callers.woken(),
            [0, 0, 1, 0, 0],
            "the first still asleep leads"
        );
        drop(third);
        assert_eq!(
            callers.woken(),
            [0, 0, 1, 1, 1],
            "dropped, it still woke the others"
        );
        for (i, wait) in rest.iter_mut().enumerate() {
            assert!(callers.poll(i + 3, wait).is_ready());
        }
        assert!(callers.slots[0].filled(), "the poller finds its answer");
        drop(first);

        // A lone answer wakes its caller directly.
        let callers = Callers::new(1);
        let mut wait = callers.slots[0].wait();
        assert!(callers.poll(0, &mut wait).is_pending());
        Reply::new(ReplyTo::Async(callers.slots[0].clone())).send(Ok(9));
        assert_eq!(callers.woken(), [1]);
        assert!(matches!(callers.poll(0, &mut wait), Poll::Ready(Ok(9))));
    }

    /// Goal: a caller waiting for its append polls instead of sleeping only while it waits alone,
    /// the disk syncs fast, and its polling budget lasts; otherwise it sleeps at once.
    #[test]
    fn only_a_lone_caller_polls_and_only_on_a_fast_disk() {
        let store =
            Store::open_with_io(Arc::new(SimIo::new(7)), Path::new("/s"), Options::default())
                .unwrap();
        let shared = store.shared();
        shared
            .counters
            .fsync_recent_us
            .store(200, Ordering::Relaxed);
        let first = Waiting::start(shared);
        assert!(first.keep_polling(), "alone on a fast disk");
        let second = Waiting::start(shared);
        assert!(
            !second.keep_polling(),
            "a caller arriving second sleeps at once"
        );
        assert!(!first.keep_polling(), "the first stops once another waits");
        drop(second);
        assert!(first.keep_polling(), "alone again, within its budget");
        drop(first);
        assert_eq!(shared.waiting.load(Ordering::Relaxed), 0);
        shared
            .counters
            .fsync_recent_us
            .store(5_000, Ordering::Relaxed);
        assert!(
            !Waiting::start(shared).keep_polling(),
            "a slow disk: sleep at once"
        );
        // The budget runs out.
        shared.counters.fsync_recent_us.store(1, Ordering::Relaxed);
        let lone = Waiting::start(shared);
        std::thread::sleep(Duration::from_millis(5));
        assert!(!lone.keep_polling(), "past its budget");
    }
}
