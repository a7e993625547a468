//! Statistics with PyTorch's names (`torch.cuda.memory_stats`), so numbers from
//! cupool and from PyTorch can be put side by side.

/// One gauge: current value, its peak, and the totals of increments and
/// decrements since the pool was created (`allocated - freed == current`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: u64,
    pub peak: u64,
    /// Sum of all increments.
    pub allocated: u64,
    /// Sum of all decrements.
    pub freed: u64,
}

impl Stat {
    #[inline]
    pub fn inc(&mut self, n: u64) {
        self.current += n;
        self.allocated += n;
        if self.current > self.peak {
            self.peak = self.current;
        }
    }

    #[inline]
    pub fn dec(&mut self, n: u64) {
        debug_assert!(self.current >= n, "stat underflow");
        self.current -= n;
        self.freed += n;
    }

    /// Forgets the peak: it becomes the current value.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// Counters of one [`super::Pool`]. Reading them is free; they are updated in
/// place on every operation.
///
/// A block is *allocated* from the moment `allocate` returns it until `free`;
/// it stays *active* after `free` until the backend says GPU work that may
/// touch it is complete (pending), then becomes *inactive* (free). Every byte
/// of a segment is in exactly one block, so
/// `reserved = active + free bytes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Rounded sizes of the blocks handed out and not yet freed.
    pub allocated_bytes: Stat,
    /// Sizes as requested by the caller of the blocks handed out.
    pub requested_bytes: Stat,
    /// Bytes of all segments obtained from the backend.
    pub reserved_bytes: Stat,
    /// `reserved_bytes` of the small pool only.
    pub reserved_bytes_small: Stat,
    /// `reserved_bytes` of the large pool only.
    pub reserved_bytes_large: Stat,
    /// Allocated plus pending-free bytes.
    pub active_bytes: Stat,
    /// Free bytes in segments that also hold other blocks (free blocks that
    /// are not a whole segment): memory that `empty_cache` cannot return.
    pub inactive_split_bytes: Stat,
    /// Number of blocks handed out and not yet freed.
    pub allocation: Stat,
    /// Number of segments.
    pub segment: Stat,
    /// Number of allocated or pending blocks.
    pub active: Stat,
    /// Number of free blocks that are not a whole segment.
    pub inactive_split: Stat,
    /// Segments obtained from the backend.
    pub num_device_alloc: u64,
    /// Segments given back to the backend.
    pub num_device_free: u64,
    /// Allocations that had to release cached segments and try again.
    pub num_alloc_retries: u64,
    /// Allocations that failed.
    pub num_ooms: u64,
    /// Successful `Backend::synchronize` calls made by the pool.
    pub num_syncs: u64,
    /// Misses that waited for pending frees (`Backend::wait_for`) instead of growing.
    pub num_waits: u64,
}

impl PoolStats {
    /// A segment of `size` bytes was obtained from the backend.
    pub(crate) fn segment_added(&mut self, size: u64, small: bool) {
        self.num_device_alloc += 1;
        self.segment.inc(1);
        self.reserved_bytes.inc(size);
        if small {
            self.reserved_bytes_small.inc(size);
        } else {
            self.reserved_bytes_large.inc(size);
        }
    }

    /// A segment of `size` bytes was given back to the backend.
    pub(crate) fn segment_removed(&mut self, size: u64, small: bool) {
        self.num_device_free += 1;
        self.segment.dec(1);
        self.reserved_bytes.dec(size);
        if small {
            self.reserved_bytes_small.dec(size);
        } else {
            self.reserved_bytes_large.dec(size);
        }
    }

    /// Resets every peak to the current value (like
    /// `torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peaks(&mut self) {
        for s in [
            &mut self.allocated_bytes,
            &mut self.requested_bytes,
            &mut self.reserved_bytes,
            &mut self.reserved_bytes_small,
            &mut self.reserved_bytes_large,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
        ] {
            s.reset_peak();
        }
    }
}

/// How well the reserved memory is used; see [`super::Pool::fragmentation`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fragmentation {
    /// Size of the largest free block (either pool).
    pub largest_free_block: u64,
    /// Bytes in free blocks (pending-free blocks are not free).
    pub free_bytes: u64,
    /// Bytes of all segments.
    pub reserved: u64,
    /// Bytes of allocated blocks (rounded sizes).
    pub allocated: u64,
    /// `reserved / allocated`; 1.0 when nothing is allocated.
    pub ratio: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_tracks_peak_and_totals() {
        let mut s = Stat::default();
        s.inc(10);
        s.inc(5);
        s.dec(12);
        s.inc(4);
        assert_eq!(s, Stat { current: 7, peak: 15, allocated: 19, freed: 12 });
        s.reset_peak();
        assert_eq!(s.peak, 7);
    }
}
