//! The brute-force reference model used by `pool_props.rs`. It drives its
//! own `SimulatedDevice`, a twin of the pool's, which must end up equal to it.
//!
//! The model keeps each segment as a `Vec` of blocks and does everything by
//! linear search, straight from the rules: best fit is the minimum
//! `(size, addr)` over every allowed free block of the pool; merging looks at
//! the two neighbours in the `Vec`; stats are recomputed from scratch.

use std::collections::{BTreeMap, VecDeque};

use cupool_core::pool::testing::SimulatedDevice;
use cupool_core::pool::{
    Backend, BlockSnapshot, BlockState, GiveBack, PoolConfig, PoolStats, SegmentSnapshot, Timeline,
};

pub const MIB: u64 = 1 << 20;
pub const ALIGN: u64 = 2 * MIB;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum St {
    Alloc,
    Pending,
    Free,
}

#[derive(Clone, Copy, Debug)]
pub struct MBlock {
    addr: u64,
    size: u64,
    requested: u64,
    st: St,
}

pub struct MSeg {
    size: u64,
    small: bool,
    blocks: Vec<MBlock>,
}

/// Stats in a fixed order: the bytes and counts of `PoolStats`.
pub const NSTATS: usize = 11;

pub fn pool_stats(s: &PoolStats) -> [(u64, u64); NSTATS] {
    [
        &s.allocated_bytes,
        &s.requested_bytes,
        &s.reserved_bytes,
        &s.reserved_bytes_small,
        &s.reserved_bytes_large,
        &s.active_bytes,
        &s.inactive_split_bytes,
        &s.allocation,
        &s.segment,
        &s.active,
        &s.inactive_split,
    ]
    .map(|st| (st.current, st.peak))
}

pub struct Model {
    pub cfg: PoolConfig,
    pub be: SimulatedDevice,
    pub segs: BTreeMap<u64, MSeg>,
    pub fifo: VecDeque<(u64, u64)>,
    pub peaks: [u64; NSTATS],
    /// Successful allocations, bytes handed out, segments obtained, bytes obtained.
    pub totals: [u64; 4],
    /// num_device_alloc, num_device_free, num_alloc_retries, num_ooms, num_syncs, num_waits.
    pub counters: [u64; 6],
    /// `GiveBack::Auto`: give-backs as (size, when), and sizes that cycled.
    pub given_back: Vec<(u64, u64)>,
    pub kept_sizes: Vec<u64>,
    /// Emptied segments that wait for a synchronisation to go back (one was
    /// refused during a capture), by address, in the order they came.
    pub awaiting: Vec<u64>,
}

impl Model {
    pub fn new(cfg: PoolConfig, be: SimulatedDevice) -> Self {
        Model {
            cfg,
            be,
            segs: BTreeMap::new(),
            fifo: VecDeque::new(),
            peaks: [0; NSTATS],
            totals: [0; 4],
            counters: [0; 6],
            given_back: Vec::new(),
            kept_sizes: Vec::new(),
            awaiting: Vec::new(),
        }
    }

    pub fn truth(&self) -> [u64; NSTATS] {
        let mut t = [0u64; NSTATS];
        for seg in self.segs.values() {
            t[2] += seg.size;
            t[if seg.small { 3 } else { 4 }] += seg.size;
            t[8] += 1;
            for b in &seg.blocks {
                match b.st {
                    St::Alloc => {
                        t[0] += b.size;
                        t[1] += b.requested;
                        t[5] += b.size;
                        t[7] += 1;
                        t[9] += 1;
                    }
                    St::Pending => {
                        t[5] += b.size;
                        t[9] += 1;
                    }
                    St::Free if seg.blocks.len() > 1 => {
                        t[6] += b.size;
                        t[10] += 1;
                    }
                    St::Free => {}
                }
            }
        }
        t
    }

    /// Records the state after one step for the peaks.
    fn observe(&mut self) {
        let t = self.truth();
        for (p, v) in self.peaks.iter_mut().zip(t) {
            *p = (*p).max(v);
        }
    }

    pub fn allowed(&self, small: bool, size: u64, rounded: u64) -> bool {
        let c = &self.cfg;
        size >= rounded
            && (small
                || size < c.max_split_size
                || (rounded >= c.max_split_size && size < rounded.saturating_add(c.large_segment)))
    }

    /// Brute-force best fit: (size, addr) minimum over allowed free blocks.
    fn best_fit(&self, small: bool, rounded: u64) -> Option<(u64, u64)> {
        self.segs
            .values()
            .filter(|s| s.small == small)
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.st == St::Free && self.allowed(small, b.size, rounded))
            .map(|b| (b.size, b.addr))
            .min()
    }

    fn seg_of(&mut self, addr: u64) -> (&mut MSeg, usize) {
        let seg = self.segs.range_mut(..=addr).next_back().unwrap().1;
        let i = seg.blocks.iter().position(|b| b.addr == addr).unwrap();
        (seg, i)
    }

    fn take(&mut self, small: bool, addr: u64, rounded: u64, requested: u64) -> (u64, u64) {
        let c = self.cfg;
        let (seg, i) = self.seg_of(addr);
        let b = seg.blocks[i];
        let rest = b.size - rounded;
        let split = if small { rest >= 512 } else { rest >= c.min_split_remainder_large && b.size < c.max_split_size };
        let size = if split { rounded } else { b.size };
        seg.blocks[i] = MBlock { addr, size, requested, st: St::Alloc };
        if split {
            let r = MBlock { addr: addr + rounded, size: rest, requested: 0, st: St::Free };
            seg.blocks.insert(i + 1, r);
        }
        self.totals[0] += 1;
        self.totals[1] += size;
        self.observe();
        (addr, size)
    }

    /// The configured segment size, shrunk near the limit to what still fits
    /// (never below what the request needs).
    fn segment_for(&self, small: bool, rounded: u64) -> Option<u64> {
        let c = self.cfg;
        let want = if small {
            c.small_segment
        } else if rounded < c.large_segment_threshold {
            c.large_segment
        } else {
            rounded.checked_next_multiple_of(ALIGN)?
        };
        let need = rounded.checked_next_multiple_of(ALIGN)?.min(want);
        if need > c.limit {
            return None;
        }
        let reserved: u64 = self.segs.values().map(|s| s.size).sum();
        let room = c.limit.saturating_sub(reserved) / ALIGN * ALIGN;
        Some(want.min(room.max(need)))
    }

    fn try_fit(&mut self, small: bool, rounded: u64, req: u64) -> Option<(u64, u64)> {
        let (_, addr) = self.best_fit(small, rounded)?;
        Some(self.take(small, addr, rounded, req))
    }

    fn try_grow(&mut self, small: bool, size: u64, rounded: u64, req: u64) -> Option<(u64, u64)> {
        let reserved: u64 = self.segs.values().map(|s| s.size).sum();
        if reserved + size > self.cfg.limit {
            return None;
        }
        if let GiveBack::Auto { regret_ns } = self.cfg.give_back {
            let now = self.be.now_ns();
            let recent = &self.given_back[self.given_back.len().saturating_sub(32)..];
            if recent.iter().any(|&(s, t)| s == size && now.saturating_sub(t) < regret_ns)
                && !self.kept_sizes.contains(&size)
            {
                self.kept_sizes.push(size);
            }
        }
        let addr = self.be.allocate_segment(size)?;
        self.counters[0] += 1;
        self.totals[2] += 1;
        self.totals[3] += size;
        let blocks = vec![MBlock { addr, size, requested: 0, st: St::Free }];
        self.segs.insert(addr, MSeg { size, small, blocks });
        Some(self.take(small, addr, rounded, req))
    }

    fn make_free(&mut self, addr: u64) {
        let (seg, mut i) = self.seg_of(addr);
        seg.blocks[i].st = St::Free;
        seg.blocks[i].requested = 0;
        if i > 0 && seg.blocks[i - 1].st == St::Free {
            seg.blocks[i - 1].size += seg.blocks[i].size;
            seg.blocks.remove(i);
            i -= 1;
        }
        if i + 1 < seg.blocks.len() && seg.blocks[i + 1].st == St::Free {
            seg.blocks[i].size += seg.blocks[i + 1].size;
            seg.blocks.remove(i + 1);
        }
        self.observe();
    }

    pub fn reclaim(&mut self, all: bool) -> usize {
        let mut n = 0;
        while let Some(&(addr, tag)) = self.fifo.front() {
            if !all && !self.be.is_complete(tag) {
                break;
            }
            self.fifo.pop_front();
            self.make_free(addr);
            n += 1;
        }
        n
    }

    /// Frees pending blocks oldest first while their tag is at most `upto`
    /// (known complete: the device was waited for up to it) or the backend
    /// says it is complete.
    fn reclaim_upto(&mut self, upto: u64) -> usize {
        let mut n = 0;
        while let Some(&(addr, tag)) = self.fifo.front() {
            if tag > upto && !self.be.is_complete(tag) {
                break;
            }
            self.fifo.pop_front();
            self.make_free(addr);
            n += 1;
        }
        n
    }

    /// Bytes freed but still waiting for their tag.
    fn pending_bytes(&self) -> u64 {
        self.segs.values().flat_map(|s| s.blocks.iter()).filter(|b| b.st == St::Pending).map(|b| b.size).sum()
    }

    pub fn release(&mut self, target: u64) -> u64 {
        let mut whole: Vec<(u64, u64)> = self
            .segs
            .iter()
            .filter(|(_, s)| s.blocks.len() == 1 && s.blocks[0].st == St::Free)
            .map(|(&a, s)| (s.size, a))
            .collect();
        whole.sort_by(|x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)));
        let mut released = 0;
        for (size, addr) in whole {
            let reserved: u64 = self.segs.values().map(|s| s.size).sum();
            if reserved <= target {
                break;
            }
            self.segs.remove(&addr);
            self.be.release_segment(addr, size);
            self.counters[1] += 1;
            released += size;
        }
        released
    }

    pub fn allocate(&mut self, req: u64) -> Option<(u64, u64)> {
        let c = self.cfg;
        let rounded = match req.max(1).checked_next_multiple_of(512) {
            Some(r) if r <= c.limit => r,
            _ => {
                self.counters[3] += 1;
                return None;
            }
        };
        let small = rounded <= c.small_max;
        if let Some(r) = self.try_fit(small, rounded, req) {
            return Some(r);
        }
        if self.reclaim(false) > 0 {
            if let Some(r) = self.try_fit(small, rounded, req) {
                return Some(r);
            }
        }
        // Wait for the oldest pending free while the pending bytes could serve
        // the request and are a large enough share of what is reserved.
        while let Some(&(_, tag)) = self.fifo.front() {
            let pending = self.pending_bytes();
            let reserved: u64 = self.segs.values().map(|s| s.size).sum();
            if pending < rounded || pending.saturating_mul(self.cfg.wait_share.max(1)) < reserved {
                break;
            }
            // The device does not override `wait_for`: the default synchronizes.
            if !self.be.wait_for(tag) {
                break;
            }
            self.counters[5] += 1;
            self.reclaim_upto(tag);
            if let Some(r) = self.try_fit(small, rounded, req) {
                return Some(r);
            }
        }
        let seg = self.segment_for(small, rounded);
        if let Some(s) = seg {
            if c.release_before_grow {
                let reserved: u64 = self.segs.values().map(|s| s.size).sum();
                let peak = self.peaks[2]; // reserved_bytes, as in `pool_stats`
                if reserved + s > peak {
                    self.release(peak.saturating_sub(s));
                }
            }
            if let Some(r) = self.try_grow(small, s, rounded, req) {
                return Some(r);
            }
        }
        if !self.fifo.is_empty() && self.be.synchronize() {
            self.counters[4] += 1;
            self.reclaim(true);
            if let Some(r) = self.try_fit(small, rounded, req) {
                return Some(r);
            }
        }
        if seg.is_some() {
            self.counters[2] += 1;
            self.release(0);
            let seg = self.segment_for(small, rounded);
            if let Some(r) = seg.and_then(|s| self.try_grow(small, s, rounded, req)) {
                return Some(r);
            }
        }
        self.counters[3] += 1;
        None
    }

    pub fn free(&mut self, addr: u64) {
        match self.be.free_tag() {
            None => self.make_free(addr),
            Some(tag) => {
                let (seg, i) = self.seg_of(addr);
                seg.blocks[i].st = St::Pending;
                self.fifo.push_back((addr, tag));
                self.observe();
            }
        }
        let seg_addr = *self.segs.range(..=addr).next_back().expect("a segment holds the block").0;
        if self.gives_back(seg_addr) && !self.whole(seg_addr) {
            // Its pending blocks go first: wait for the device, then give
            // back every emptied segment that waits, this one among them.
            if !self.awaiting.contains(&seg_addr) {
                self.awaiting.push(seg_addr);
            }
            if self.be.synchronize() {
                self.counters[4] += 1;
                self.reclaim(true);
                for a in std::mem::take(&mut self.awaiting) {
                    if self.gives_back(a) {
                        if self.whole(a) {
                            self.give_back(a);
                        } else {
                            self.awaiting.push(a);
                        }
                    }
                }
            }
        } else if self.gives_back(seg_addr) {
            self.give_back(seg_addr);
        }
    }

    /// Does the segment at `seg_addr` exist, hold no allocated block, and
    /// go back by the give-back rule?
    fn gives_back(&self, seg_addr: u64) -> bool {
        let Some(seg) = self.segs.get(&seg_addr) else { return false };
        let rule = match self.cfg.give_back {
            GiveBack::Never => false,
            GiveBack::Always | GiveBack::Auto { .. } => !self.kept_sizes.contains(&seg.size),
        };
        rule && !seg.blocks.iter().any(|b| b.st == St::Alloc)
    }

    /// Is the segment one free block (nothing pending)?
    fn whole(&self, seg_addr: u64) -> bool {
        let s = &self.segs[&seg_addr];
        s.blocks.len() == 1 && s.blocks[0].st == St::Free
    }

    /// Gives a wholly free segment back to the device.
    fn give_back(&mut self, seg_addr: u64) {
        let size = self.segs.remove(&seg_addr).unwrap().size;
        self.be.release_segment(seg_addr, size);
        self.counters[1] += 1;
        if matches!(self.cfg.give_back, GiveBack::Auto { .. }) {
            self.given_back.push((size, self.be.now_ns()));
        }
        self.observe();
    }

    pub fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let state = |s: St| match s {
            St::Alloc => BlockState::Allocated,
            St::Pending => BlockState::PendingFree,
            St::Free => BlockState::Free,
        };
        self.segs
            .iter()
            .map(|(&addr, s)| SegmentSnapshot {
                addr,
                size: s.size,
                small: s.small,
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| BlockSnapshot { addr: b.addr, size: b.size, requested: b.requested, state: state(b.st) })
                    .collect(),
            })
            .collect()
    }
}
