//! Bytes held by streamed answers, bounded per connection and for the whole server.
//!
//! A streamed answer (a read longer than one chunk, an SSE or NDJSON subscription, a gRPC Read
//! or Subscribe, market data) makes its chunks one after another while the client takes them.
//! Each chunk is bounded in size where it is made; this module bounds how many of them the
//! server holds at once. Before a stream makes a chunk it reserves bytes from its
//! connection's budget and then from the server's; the reservation travels with the chunk and
//! is returned when hyper has written the chunk out and dropped it (gRPC: when tonic has
//! encoded the message and asks for the next one; from there on the encoded bytes sit in
//! HTTP/2's send buffer, bounded per stream by its own setting).
//!
//! A client that does not read keeps its reservations, so a connection's budget bounds what
//! one connection can hold, and the server's budget what all of them can. A stream that cannot
//! reserve within [`WAIT_MAX`] ends with an error, so that streams stuck behind others that
//! do not read end visibly rather than hang: SSE clients resume from their last event id.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a stream may wait for room before it ends.
pub(crate) const WAIT_MAX: Duration = Duration::from_secs(30);

/// One pool of bytes: a connection's or the server's.
#[derive(Clone)]
pub(crate) struct Budget {
    semaphore: Arc<Semaphore>,
    max: u32,
}

impl Budget {
    pub(crate) fn new(bytes: usize) -> Self {
        let max = u32::try_from(bytes.max(1)).unwrap_or(u32::MAX);
        Budget {
            semaphore: Arc::new(Semaphore::new(max as usize)),
            max,
        }
    }

    /// Bytes reserved now.
    pub(crate) fn held(&self) -> usize {
        self.max as usize - self.semaphore.available_permits()
    }

    /// A reservation of `bytes` (all of the budget when it is smaller), waiting for room.
    async fn reserve(&self, bytes: usize) -> OwnedSemaphorePermit {
        let n = u32::try_from(bytes).unwrap_or(u32::MAX).clamp(1, self.max);
        let permit = self
            .semaphore
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("a budget's semaphore is never closed");
        debug_assert_eq!(permit.num_permits(), n as usize);
        permit
    }
}

/// A connection's budget, carried in each of its requests' extensions.
#[derive(Clone)]
pub(crate) struct ConnectionBudget(Budget);

impl ConnectionBudget {
    pub(crate) fn new(bytes: usize) -> Self {
        ConnectionBudget(Budget::new(bytes))
    }
}

/// The budgets a stream draws from: its connection's, when it has one (requests that did not
/// arrive over a listener, as in unit tests, have none), and the server's.
#[derive(Clone)]
pub(crate) struct StreamBudget {
    connection: Option<Budget>,
    server: Budget,
    /// How long a reservation may wait ([`WAIT_MAX`]).
    wait: Duration,
}

/// The stream could not reserve room within [`WAIT_MAX`].
#[derive(Debug)]
pub(crate) struct Exhausted;

impl std::fmt::Display for Exhausted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server's buffers for streamed answers stayed full for {} s (clients not reading \
             their streams); resume from the last position received",
            WAIT_MAX.as_secs()
        )
    }
}

impl StreamBudget {
    #[cfg(test)]
    pub(crate) fn new(connection: Option<Budget>, server: Budget, wait: Duration) -> Self {
        StreamBudget {
            connection,
            server,
            wait,
        }
    }

    /// The budgets of a request that arrived on `connection`, served by the server of `state`.
    pub(crate) fn of(state: &crate::AppState, connection: Option<&ConnectionBudget>) -> Self {
        StreamBudget {
            connection: connection.map(|c| c.0.clone()),
            server: state.stream_bytes.clone(),
            wait: WAIT_MAX,
        }
    }

    /// Reserves `bytes`, the connection's first (so that a connection waiting on itself does
    /// not hold the server's room meanwhile).
    pub(crate) async fn reserve(&self, bytes: usize) -> Result<Held, Exhausted> {
        let reserve = async {
            let connection = match &self.connection {
                Some(c) => Some(c.reserve(bytes).await),
                None => None,
            };
            let server = self.server.reserve(bytes).await;
            Held {
                connection,
                server: Some(server),
                budget: self.clone(),
            }
        };
        tokio::time::timeout(self.wait, reserve)
            .await
            .map_err(|_| Exhausted)
    }
}

/// Bytes reserved for one chunk; returned to the budgets when dropped.
pub(crate) struct Held {
    connection: Option<OwnedSemaphorePermit>,
    server: Option<OwnedSemaphorePermit>,
    budget: StreamBudget,
}

impl Held {
    #[cfg(test)]
    fn amount(&self) -> usize {
        self.server.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Makes the reservation match a chunk of `bytes` actually made: the excess is returned,
    /// a shortfall (one event larger than the chunk it was reserved for) reserved, never more
    /// than a whole budget.
    pub(crate) async fn fit(&mut self, bytes: usize) -> Result<(), Exhausted> {
        let budget = self.budget.clone();
        let grow = async {
            let pools = [
                (&mut self.connection, budget.connection.as_ref()),
                (&mut self.server, Some(&budget.server)),
            ];
            for (permit, pool) in pools {
                let (Some(permit), Some(pool)) = (permit.as_mut(), pool) else {
                    continue;
                };
                let target = bytes.clamp(1, pool.max as usize);
                let have = permit.num_permits();
                if target < have {
                    drop(permit.split(have - target));
                } else if target > have {
                    permit.merge(pool.reserve(target - have).await);
                }
                debug_assert_eq!(permit.num_permits(), target);
            }
        };
        tokio::time::timeout(budget.wait, grow)
            .await
            .map_err(|_| Exhausted)
    }

    /// `chunk`, carrying this reservation until the last copy of it is dropped.
    pub(crate) fn attach(self, chunk: Bytes) -> Bytes {
        Bytes::from_owner(Carried { chunk, _held: self })
    }
}

struct Carried {
    chunk: Bytes,
    _held: Held,
}

impl AsRef<[u8]> for Carried {
    fn as_ref(&self) -> &[u8] {
        &self.chunk
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a reservation fitted to its chunk returns the excess, and the chunk carries it
    /// until dropped; the connection's budget bounds one connection before the server's.
    #[tokio::test]
    async fn chunks_carry_their_reservation() {
        let server = Budget::new(1000);
        let connection = Budget::new(300);
        let budget = StreamBudget::new(Some(connection.clone()), server.clone(), WAIT_MAX);
        let mut held = budget.reserve(250).await.unwrap();
        assert_eq!((connection.held(), server.held()), (250, 250));
        held.fit(100).await.unwrap();
        assert_eq!((connection.held(), server.held()), (100, 100));
        let chunk = held.attach(Bytes::from(vec![7u8; 100]));
        let copy = chunk.clone();
        drop(chunk);
        assert_eq!(server.held(), 100, "a copy still carries it");
        // The connection has 200 left: a reservation of 250 waits until the chunk is gone.
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.reserve(250).await.map(|h| h.amount()) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        assert_eq!(
            server.held(),
            100,
            "nothing of the server's taken while waiting"
        );
        drop(copy);
        assert_eq!(waiting.await.unwrap().unwrap(), 250);
        assert_eq!((connection.held(), server.held()), (0, 0));
    }

    /// Goal: a chunk larger than its reservation reserves the rest; one larger than a whole
    /// budget takes all of it rather than waiting forever.
    #[tokio::test]
    async fn a_large_chunk_takes_at_most_the_whole_budget() {
        let server = Budget::new(500);
        let budget = StreamBudget::new(None, server.clone(), WAIT_MAX);
        let mut held = budget.reserve(100).await.unwrap();
        held.fit(300).await.unwrap();
        assert_eq!(server.held(), 300);
        held.fit(10_000).await.unwrap();
        assert_eq!(server.held(), 500);
        drop(held);
        assert_eq!(server.held(), 0);
    }

    /// Goal: a stream that cannot reserve within the wait ends with an error.
    #[tokio::test]
    async fn waiting_past_the_limit_is_an_error() {
        let budget = StreamBudget::new(None, Budget::new(10), Duration::from_millis(20));
        let _all = budget.reserve(10).await.unwrap();
        assert!(budget.reserve(1).await.is_err());
    }
}
