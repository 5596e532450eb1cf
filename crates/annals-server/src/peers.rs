//! Connection slots per peer: each listener lets one IP address hold at most a share of its
//! connections, so that a few peers opening connections cannot lock everyone else out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

pub(crate) struct PeerSlots {
    per_peer_max: usize,
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One connection's slot; given back when dropped.
pub(crate) struct PeerSlot {
    peer: IpAddr,
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PeerSlots {
    pub(crate) fn new(per_peer_max: usize) -> Self {
        PeerSlots {
            per_peer_max: per_peer_max.max(1),
            held: Arc::default(),
        }
    }

    /// A slot for a new connection from `peer`, or None when it holds its share already.
    pub(crate) fn take(&self, peer: IpAddr) -> Option<PeerSlot> {
        let mut held = self.held.lock();
        let count = held.entry(peer).or_insert(0);
        if *count >= self.per_peer_max {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            peer,
            held: self.held.clone(),
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut held = self.held.lock();
        if let Some(count) = held.get_mut(&self.peer) {
            assert!(*count > 0, "a peer's slots are given back once each");
            *count -= 1;
            if *count == 0 {
                held.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a peer gets at most its share; a slot given back can be taken again; other
    /// peers are not affected.
    #[test]
    fn a_peer_holds_at_most_its_share() {
        let slots = PeerSlots::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = slots.take(a).unwrap();
        let _second = slots.take(a).unwrap();
        assert!(slots.take(a).is_none());
        assert!(slots.take(b).is_some());
        drop(first);
        assert!(slots.take(a).is_some());
    }
}
