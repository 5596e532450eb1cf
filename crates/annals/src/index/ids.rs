//! Event ids by position, and the galloping search of posting lists.

/// Event ids by position, in two parallel columns (24 bytes per event with an id).
#[derive(Default)]
pub(crate) struct IdColumn {
    pub(super) positions: Vec<u64>,
    pub(super) ids: Vec<u128>,
}

impl IdColumn {
    pub(crate) fn push(&mut self, position: u64, id: u128) {
        assert!(
            self.positions.last().is_none_or(|&p| p < position),
            "ids are pushed in position order"
        );
        self.positions.push(position);
        self.ids.push(id);
    }

    pub(crate) fn get(&self, position: u64) -> Option<u128> {
        let i = first_at_least(&self.positions, position);
        (self.positions.get(i) == Some(&position)).then(|| self.ids[i])
    }

    pub(crate) fn reserve(&mut self, additional: usize) {
        self.positions.reserve(additional);
        self.ids.reserve(additional);
    }

    /// The entries up to `head`, in position order.
    pub(crate) fn up_to(&self, head: u64) -> impl Iterator<Item = (u64, u128)> + '_ {
        let end = first_at_least(&self.positions, head.saturating_add(1));
        self.positions[..end]
            .iter()
            .copied()
            .zip(self.ids[..end].iter().copied())
    }

    /// The columns' bytes: their capacity when `held`, their length otherwise.
    pub(super) fn bytes(&self, held: bool) -> usize {
        let (positions, ids) = if held {
            (self.positions.capacity(), self.ids.capacity())
        } else {
            (self.positions.len(), self.ids.len())
        };
        positions * 8 + ids * 16
    }
}

/// The index of the first position in the sorted `list` that is at least `x` (`list.len()` if
/// none is).
///
/// Most searches start near one end of a list: a read from the beginning, or (far more often
/// under load) an append condition or a cached decision state asking for what came after a
/// recent position, near the tail. A binary search over a course's thousand positions costs
/// three or four cache misses far from the tail; this one gallops back from the tail and
/// touches only the lines near where the answer lies (and none for a search from position 1:
/// positions start at 1).
pub(super) fn first_at_least(list: &[u64], x: u64) -> usize {
    if x <= 1 {
        return 0;
    }
    // Double the step back from the tail until list[n - bound] < x (or the head is passed):
    // the answer then lies in (n - bound, n - bound / 2].
    let n = list.len();
    let mut bound = 1;
    while bound <= n && list[n - bound] >= x {
        bound *= 2;
    }
    let lo = n.saturating_sub(bound);
    let hi = n - bound / 2;
    lo + list[lo..hi].partition_point(|&p| p < x)
}
