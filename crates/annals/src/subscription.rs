//! Subscriptions: catch-up and live through one code path.
//!
//! A subscription repeats one step: read what matches after its cursor up to the head it sees
//! now, and when that is exhausted, wait for the head to move. Catching up and following are the
//! same step, so there is no switch-over at which an event could be missed or seen twice.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{ReadError, StoreError};
use crate::event::Event;
use crate::query::{Query, ReadOptions};
use crate::read::ReadIter;
use crate::shared::Shared;
use event_listener::Listener;

pub struct Subscription {
    shared: Arc<Shared>,
    query: Query,
    /// Every matching event at or below this position has been delivered.
    scanned: u64,
    current: Option<ReadIter>,
}

impl Subscription {
    pub(crate) fn new(shared: Arc<Shared>, query: Query, after: u64) -> Self {
        Subscription {
            shared,
            query,
            scanned: after,
            current: None,
        }
    }

    /// The position up to which every matching event has been delivered.
    pub fn position(&self) -> u64 {
        self.scanned
    }

    /// The next matching event, waiting at most `timeout` (forever when `None`). `Ok(None)`
    /// when the timeout passed or the store closed.
    pub fn next_timeout(&mut self, timeout: Option<Duration>) -> Result<Option<Event>, ReadError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let listener = self.shared.published.listen();
            if let Some(event) = self.try_next()? {
                return Ok(Some(event));
            }
            if self.shared.health.is_closed() {
                return Ok(None);
            }
            if self.shared.head() > self.scanned {
                continue;
            }
            match deadline {
                None => listener.wait(),
                Some(deadline) => {
                    if listener.wait_deadline(deadline).is_none() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Moves up to `max` matching events that are already acknowledged into `out`, without
    /// waiting. Returns how many it moved; 0 means the subscription has caught up with the head.
    pub fn try_next_batch(&mut self, max: usize, out: &mut Vec<Event>) -> Result<usize, ReadError> {
        self.try_next_batch_bytes(max, usize::MAX, out)
    }

    /// Like [`Subscription::try_next_batch`], stopping also once the events moved hold
    /// `bytes_max` stored bytes (at least one event is moved, whatever its size).
    pub fn try_next_batch_bytes(
        &mut self,
        max: usize,
        bytes_max: usize,
        out: &mut Vec<Event>,
    ) -> Result<usize, ReadError> {
        let (mut moved, mut bytes) = (0, 0usize);
        while moved < max && bytes < bytes_max {
            match self.try_next()? {
                Some(event) => {
                    bytes = bytes.saturating_add(event.stored_bytes());
                    out.push(event);
                    moved += 1;
                }
                None => break,
            }
        }
        Ok(moved)
    }

    /// The next matching event that is already acknowledged, without waiting: the one step
    /// both the blocking and the async paths take (read after the cursor up to the head seen
    /// now; when that is exhausted, the cursor is the head).
    fn try_next(&mut self) -> Result<Option<Event>, ReadError> {
        loop {
            if let Some(iter) = &mut self.current {
                match iter.next() {
                    Some(Ok(event)) => return Ok(Some(event)),
                    Some(Err(e)) => return Err(e),
                    None => {
                        self.scanned = iter.head();
                        self.current = None;
                    }
                }
            }
            let head = self.shared.head();
            if head <= self.scanned {
                if let Some(e) = self.shared.poison_error() {
                    return Err(e.into());
                }
                return Ok(None);
            }
            let options = ReadOptions::forwards().after(self.scanned);
            self.current = Some(ReadIter::new(
                self.shared.clone(),
                &self.query,
                options,
                head,
            )?);
        }
    }

    /// The next batch of at most `max` matching events, waiting asynchronously (without
    /// blocking a thread) until there is at least one. `Ok(empty)` when the store closed.
    /// This is the same step as the blocking iterator: read to the head, then wait for it to
    /// move.
    pub async fn next_batch(&mut self, max: usize) -> Result<Vec<Event>, ReadError> {
        self.next_batch_bytes(max, usize::MAX).await
    }

    /// Waits, without blocking a thread, until a call to [`Subscription::try_next_batch_bytes`]
    /// may find events: the head has moved past the cursor, a read is under way, or the store
    /// closed (`Ok(false)`). Nothing is fetched, so a caller can reserve memory for the batch
    /// first; the batch may still be empty when the new events do not match.
    pub async fn ready(&mut self) -> Result<bool, ReadError> {
        loop {
            let listener = self.shared.published.listen();
            if self.current.is_some() || self.shared.head() > self.scanned {
                return Ok(true);
            }
            if let Some(e) = self.shared.poison_error() {
                return Err(e.into());
            }
            if self.shared.health.is_closed() {
                return Ok(false);
            }
            listener.await;
        }
    }

    /// Like [`Subscription::next_batch`], the batch holding at most `bytes_max` stored bytes
    /// (or one event, if that one is larger): what a stream keeps in memory for a client is
    /// bounded whatever the events' size.
    pub async fn next_batch_bytes(
        &mut self,
        max: usize,
        bytes_max: usize,
    ) -> Result<Vec<Event>, ReadError> {
        let mut out = Vec::new();
        loop {
            let listener = self.shared.published.listen();
            if self.try_next_batch_bytes(max.max(1), bytes_max, &mut out)? > 0 {
                return Ok(out);
            }
            if self.shared.health.is_closed() {
                return Ok(out);
            }
            if self.shared.head() > self.scanned {
                continue;
            }
            listener.await;
        }
    }

    /// Like [`Subscription::next_timeout`] without a timeout, reporting a closed store as an error.
    pub fn next_event(&mut self) -> Result<Event, ReadError> {
        match self.next_timeout(None)? {
            Some(event) => Ok(event),
            None => Err(ReadError::Store(StoreError::Closed)),
        }
    }
}

impl Iterator for Subscription {
    type Item = Result<Event, ReadError>;

    /// Blocks until the next matching event; ends when the store closes.
    fn next(&mut self) -> Option<Self::Item> {
        self.next_timeout(None).transpose()
    }
}
