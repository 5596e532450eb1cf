//! The notifier thread: publishes synced groups and wakes their callers.

use super::*;

/// Publishes synced groups and wakes their clients, so that the syncer can start the next
/// fdatasync at once instead of spending tens of microseconds per client on wake-ups.
pub(crate) struct Notifier {
    /// The store's one right to publish.
    right: PublishRight,
    queue: Mutex<NotifierQueue>,
    wake: Condvar,
}

#[derive(Default)]
struct NotifierQueue {
    batches: Vec<(Option<Mark>, Vec<Waiter>)>,
    stop: bool,
}

impl Notifier {
    pub(crate) fn new(right: PublishRight) -> Self {
        Notifier {
            right,
            queue: Mutex::new(NotifierQueue::default()),
            wake: Condvar::new(),
        }
    }

    pub(super) fn push(&self, mark: Option<Mark>, waiters: Vec<Waiter>) {
        let mut queue = self.queue.lock();
        queue.batches.push((mark, waiters));
        self.wake.notify_one();
    }

    pub(crate) fn stop(&self) {
        self.queue.lock().stop = true;
        self.wake.notify_one();
    }

    pub(crate) fn run(&self, shared: Arc<Shared>) {
        let mut batches = Vec::new();
        loop {
            {
                let mut queue = self.queue.lock();
                while queue.batches.is_empty() {
                    if queue.stop {
                        return;
                    }
                    self.wake.wait(&mut queue);
                }
                std::mem::swap(&mut batches, &mut queue.batches);
            }
            let mut answers = Answers::default();
            for (mark, waiters) in batches.drain(..) {
                if let Some(mark) = mark {
                    shared.published.publish(&self.right, mark);
                }
                for w in waiters {
                    answers.send(w.reply, w.outcome);
                }
            }
            answers.wake();
            shared.maybe_checkpoint();
        }
    }
}
