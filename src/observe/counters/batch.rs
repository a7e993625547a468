//! A batch of counter changes: each thread's book (`observe::books`) counts
//! its pooled allocations and frees in one, and adds it to the shared
//! counters every [`OPS`] calls, or sooner once its net change reaches
//! [`NET_BYTES`], with one read-modify-write per counter instead of one per
//! call. A batch keeps the highest point its own running total reached, so
//! the peak it adds is exact for an order of events in which each batch
//! happens at once, where it is added; that order differs from the order of
//! the calls only by what other threads still hold in their batches: less
//! than [`NET_BYTES`] and [`OPS`] allocations each. A program that allocates
//! from one thread gets its exact peak.
//!
//! Readers (the end record, phases, `cupool_memory_stats`, peak resets, a
//! refused free) add every batch first; a thread that exits adds its own.

use super::Counters;
use std::sync::atomic::Ordering;

/// Calls a batch holds at most. Adding a batch is four read-modify-writes
/// on lines every thread writes: at 64 calls a batch, eight threads of an
/// H100 host spent 4.7 ns a pair there (`perf`), against 0.9 from one.
const OPS: u32 = 1024;
/// Net bytes at which a batch is added at once (an allocation this large
/// is counted at once).
const NET_BYTES: i64 = 64 << 10;

#[derive(Default)]
pub struct Batch {
    /// The counters the batch is for (one device's): another device's call
    /// adds the batch first.
    counters: Option<&'static Counters>,
    /// Calls counted: together fewer than [`OPS`].
    allocs: u32,
    frees: u32,
    bytes: i64,
    /// Highest points of the running `bytes` and count (0 at the start).
    top_bytes: i64,
    top_count: i64,
}

impl Batch {
    /// Counts an allocation of `bytes` on `c`. Only an allocation can raise
    /// the running totals to a new high.
    #[inline(always)]
    pub fn count_alloc(&mut self, c: &'static Counters, bytes: i64) {
        self.switch_to(c);
        self.allocs += 1;
        self.bytes += bytes;
        self.top_bytes = self.top_bytes.max(self.bytes);
        self.top_count = self.top_count.max(i64::from(self.allocs) - i64::from(self.frees));
        self.add_when_full();
    }

    /// Counts a free of `bytes` on `c`.
    #[inline(always)]
    pub fn count_free(&mut self, c: &'static Counters, bytes: i64) {
        self.switch_to(c);
        self.frees += 1;
        self.bytes -= bytes;
        self.add_when_full();
    }

    #[inline(always)]
    fn switch_to(&mut self, c: &'static Counters) {
        if !self.counters.is_some_and(|mine| std::ptr::eq(mine, c)) {
            self.add_to_counters();
            self.counters = Some(c);
        }
    }

    #[inline(always)]
    fn add_when_full(&mut self) {
        if self.allocs + self.frees >= OPS || self.bytes.abs() >= NET_BYTES {
            self.add_to_counters();
        }
    }

    /// Adds the batch to its counters and starts again.
    #[cold]
    pub fn add_to_counters(&mut self) {
        let Some(c) = self.counters else { return };
        if self.allocs + self.frees == 0 {
            return;
        }
        let relaxed = Ordering::Relaxed;
        let _section = crate::runtime::bias::SHARED_BOOKS.access();
        if self.allocs > 0 {
            c.allocs.fetch_add(u64::from(self.allocs), relaxed);
        }
        if self.frees > 0 {
            c.frees.fetch_add(u64::from(self.frees), relaxed);
        }
        // Two's complement: a net decrease wraps the addition around.
        let before = c.current_bytes.fetch_add(self.bytes as u64, relaxed);
        super::raise_peak(&c.peak_bytes, before.wrapping_add(self.top_bytes as u64));
        let count = i64::from(self.allocs) - i64::from(self.frees);
        let before = c.current_count.fetch_add(count as u64, relaxed);
        super::raise_peak(&c.peak_count, before.wrapping_add(self.top_count as u64));
        *self = Batch { counters: self.counters, ..Batch::default() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn leaked() -> &'static Counters {
        Box::leak(Box::default())
    }

    fn get(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }

    #[test]
    fn a_batch_adds_its_calls_and_its_own_peak() {
        let c = leaked();
        let mut b = Batch::default();
        // 3 allocations of 4 KiB, then 3 frees: nothing reaches the counters
        // until the batch is added, and then its peak does.
        for _ in 0..3 {
            b.count_alloc(c, 4096);
        }
        for _ in 0..3 {
            b.count_free(c, 4096);
        }
        assert_eq!(get(&c.allocs), 0);
        b.add_to_counters();
        assert_eq!((get(&c.allocs), get(&c.frees)), (3, 3));
        assert_eq!((get(&c.current_bytes), get(&c.current_count)), (0, 0));
        assert_eq!((get(&c.peak_bytes), get(&c.peak_count)), (3 * 4096, 3));
    }

    #[test]
    fn a_batch_is_added_after_its_calls_or_its_bytes_and_on_another_device() {
        let (c, d) = (leaked(), leaked());
        let mut b = Batch::default();
        // Allocations and frees in turn: the net change stays below NET_BYTES.
        for i in 0..OPS - 1 {
            if i % 2 == 0 {
                b.count_alloc(c, 512);
            } else {
                b.count_free(c, 512);
            }
            assert_eq!(get(&c.allocs), 0);
        }
        b.count_free(c, 512);
        let half = u64::from(OPS / 2);
        assert_eq!((get(&c.allocs), get(&c.frees)), (half, half));
        // Net bytes: 16 × 4 KiB reaches NET_BYTES.
        for _ in 0..16 {
            b.count_alloc(c, 4096);
        }
        assert_eq!(get(&c.current_bytes), 16 * 4096);
        b.count_alloc(c, 4096);
        b.count_alloc(d, 4096);
        assert_eq!(get(&c.allocs), half + 17, "another device's call adds the batch");
        b.add_to_counters();
        assert_eq!(get(&d.allocs), 1);
    }

    #[test]
    fn frees_added_before_their_allocations_make_no_peak() {
        let c = leaked();
        let (mut frees, mut allocs) = (Batch::default(), Batch::default());
        for _ in 0..4 {
            frees.count_free(c, 4096);
            allocs.count_alloc(c, 4096);
        }
        frees.add_to_counters();
        assert_eq!(get(&c.peak_bytes), 0, "below zero is no peak");
        allocs.add_to_counters();
        assert_eq!((get(&c.current_bytes), get(&c.current_count)), (0, 0));
        assert_eq!(get(&c.peak_bytes), 0);
        assert_eq!(get(&c.peak_count), 0);
    }
}
