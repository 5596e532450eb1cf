//! A lock-free histogram with power-of-two buckets, for counters that outside tools scrape
//! (fsync latency, group sizes). Recording is two relaxed atomic adds; no allocation.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

const BUCKETS: usize = 32;

/// Bucket `i` counts values in `(2^(i-1), 2^i]`; bucket 0 counts 0 and 1; the last bucket
/// also holds everything larger.
pub struct Log2Histogram {
    buckets: [AtomicU64; BUCKETS],
    sum: AtomicU64,
}

impl Default for Log2Histogram {
    fn default() -> Self {
        Log2Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum: AtomicU64::new(0),
        }
    }
}

impl Log2Histogram {
    pub fn record(&self, value: u64) {
        let bucket = if value <= 1 {
            0
        } else {
            (64 - (value - 1).leading_zeros() as usize).min(BUCKETS - 1)
        };
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = 0;
        let mut buckets = Vec::new();
        for (i, bucket) in self.buckets.iter().enumerate() {
            let count = bucket.load(Ordering::Relaxed);
            cumulative += count;
            // Leave out the empty tail; the total count stands for +Inf.
            if count > 0 || (cumulative > 0 && i + 1 < BUCKETS) {
                buckets.push((1u64 << i, cumulative));
            }
        }
        while buckets.len() > 1 && buckets[buckets.len() - 1].1 == buckets[buckets.len() - 2].1 {
            buckets.pop();
        }
        HistogramSnapshot {
            buckets,
            count: cumulative,
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

/// A histogram as cumulative counts: `buckets` holds `(upper bound, count of values <= it)`
/// in increasing order, the form Prometheus expects.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Default, Serialize)]
pub struct HistogramSnapshot {
    pub buckets: Vec<(u64, u64)>,
    pub count: u64,
    pub sum: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the latency histogram counts each value in the bucket of the next power of two, the
    /// buckets are cumulative, and count and sum are exact.
    #[test]
    fn buckets_are_cumulative_powers_of_two() {
        let h = Log2Histogram::default();
        for v in [0, 1, 2, 3, 4, 5, 1000] {
            h.record(v);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 7);
        assert_eq!(s.sum, 1015);
        // 0,1 -> le 1; 2 -> le 2; 3,4 -> le 4; 5 -> le 8; 1000 -> le 1024.
        assert_eq!(s.buckets[0], (1, 2));
        assert_eq!(s.buckets[1], (2, 3));
        assert_eq!(s.buckets[2], (4, 5));
        assert_eq!(s.buckets[3], (8, 6));
        assert_eq!(*s.buckets.last().unwrap(), (1024, 7));
        assert!(s
            .buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
    }

    /// Goal: a histogram that recorded nothing reports no count and no buckets.
    #[test]
    fn empty_histogram_has_no_buckets() {
        let s = Log2Histogram::default().snapshot();
        assert_eq!(s.count, 0);
        assert!(s.buckets.is_empty());
    }
}
