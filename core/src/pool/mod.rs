//! The pool: carves device segments into blocks, PyTorch-style.
//!
//! * Requests are rounded to 512 B. Rounded sizes up to `small_max` come from
//!   the small pool (2 MiB segments), all others from the large pool; the two
//!   never share a segment.
//! * A request takes the exact best fit of its pool (smallest free block that
//!   is big enough, lowest address among equals), split if the remainder is
//!   worth keeping (see [`PoolConfig::should_split`]).
//! * A freed block merges at once with free neighbours of its segment, unless
//!   the backend hands out a tag for it: then it stays pending until the tag
//!   completes, because queued GPU work may still touch it.
//! * On a miss: reclaim completed pending blocks, then grow by one segment,
//!   then synchronize, then release the cache and grow again, then fail.
//!
//! Everything is deterministic and there is no `unsafe`.

mod api;
// The VMM pool (`crate::vmm`) keeps its virtual blocks in the same records
// and the same best-fit index.
pub(crate) mod block;
mod config;
pub(crate) mod cycles;
pub(crate) mod free_index;
mod inspect;
mod size;
mod stats;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};

use block::{BlockRec, BlockSlab, SegRec, SegSlab, State, NIL};
use cycles::Cycles;
use free_index::FreeIndex;

pub(crate) use api::order_behind_pending;
pub use api::{Backend, Block, BlockId, BlockInfo, OutOfMemory, Timeline};
pub use config::{GiveBack, PoolConfig};
pub use inspect::{BlockSnapshot, BlockState, SegmentSnapshot};
pub use size::{round_size, MIN_BLOCK, SEGMENT_ALIGN};
pub use stats::{Fragmentation, PoolStats, Stat};

/// A caching allocator over segments obtained from a [`Backend`]. Not
/// thread-safe by itself: wrap it in a mutex.
pub struct Pool<B: Backend> {
    backend: B,
    config: PoolConfig,
    blocks: BlockSlab,
    segs: SegSlab,
    /// Segment start -> segment slot, for address lookups.
    seg_by_addr: BTreeMap<u64, u32>,
    /// Free blocks: `[large, small]`.
    free: [FreeIndex; 2],
    /// Pending blocks with their tags, oldest first (tags non-decreasing).
    pending: VecDeque<(u32, u64)>,
    /// Highest tag known to be complete.
    completed_upto: Option<u64>,
    /// Segment sizes the program cycles through (`GiveBack::Auto`).
    cycles: Cycles,
    /// Starts of segments that frees left empty but for blocks behind
    /// queued work: given back once the owner waited for the GPU
    /// ([`Pool::free_asking_wait`]).
    awaiting_wait: Vec<u64>,
    stats: PoolStats,
}

impl<B: Backend> Pool<B> {
    /// A pool with no segments; `config` is passed through [`PoolConfig::validate`].
    pub fn new(backend: B, config: PoolConfig) -> Self {
        Pool {
            backend,
            config: config.validate(),
            blocks: BlockSlab::new(),
            segs: SegSlab::new(),
            seg_by_addr: BTreeMap::new(),
            free: [FreeIndex::new(), FreeIndex::new()],
            pending: VecDeque::new(),
            completed_upto: None,
            cycles: Cycles::default(),
            awaiting_wait: Vec::new(),
            stats: PoolStats::default(),
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// The configuration in force (after validation).
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    pub fn stats(&self) -> &PoolStats {
        &self.stats
    }

    /// Resets the peaks of every [`Stat`] to their current values.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peaks();
    }

    /// Number of blocks freed but still waiting for their tag.
    pub fn pending_blocks(&self) -> usize {
        self.pending.len()
    }

    /// Allocates a block of at least `requested` bytes (0 is served as 1).
    /// Fails only after the whole recovery sequence failed.
    #[inline]
    pub fn allocate(&mut self, requested: u64) -> Result<Block, OutOfMemory> {
        let rounded = match round_size(requested) {
            Some(r) if r <= self.config.limit => r,
            _ => {
                self.stats.num_ooms += 1;
                return Err(OutOfMemory);
            }
        };
        let small = self.config.is_small(rounded);
        if !self.pending.is_empty() {
            self.order_pending();
        }
        match self.find_free(small, rounded) {
            Some(i) => Ok(self.take(i, small, rounded, requested)),
            None => self.allocate_slow(small, rounded, requested),
        }
    }

    #[cold]
    fn allocate_slow(&mut self, small: bool, rounded: u64, requested: u64) -> Result<Block, OutOfMemory> {
        if self.reclaim_completed() > 0 {
            if let Some(i) = self.find_free(small, rounded) {
                return Ok(self.take(i, small, rounded, requested));
            }
        }
        // Much memory freed but not yet safe to reuse: waiting for the GPU to
        // pass the oldest of those frees costs less than a new segment that
        // would sit idle once they complete.
        while let Some(&(_, tag)) = self.pending.front() {
            let pending = self.stats.active_bytes.current - self.stats.allocated_bytes.current;
            if pending < rounded || pending.saturating_mul(self.config.wait_share) < self.stats.reserved_bytes.current {
                break;
            }
            if !self.backend.wait_for(tag) {
                break;
            }
            self.stats.num_waits += 1;
            self.completed_upto = self.completed_upto.max(Some(tag));
            self.reclaim_completed();
            if let Some(i) = self.find_free(small, rounded) {
                return Ok(self.take(i, small, rounded, requested));
            }
        }
        let seg_size = self.segment_for(rounded);
        if let Some(seg_size) = seg_size {
            if self.config.release_before_grow {
                // Growing below the high-water mark costs nothing new; past it,
                // cached whole segments that could not serve this request give
                // way to the new one, so the peak tracks live memory without a
                // release (and its device synchronisation) on every growth.
                let (reserved, peak) = (self.stats.reserved_bytes.current, self.stats.reserved_bytes.peak);
                if reserved + seg_size > peak {
                    self.release_free_segments(peak.saturating_sub(seg_size));
                }
            }
            if let Some(i) = self.grow(small, seg_size) {
                return Ok(self.take(i, small, rounded, requested));
            }
        }
        // (1) Wait for the GPU and reuse every pending block.
        if !self.pending.is_empty() && self.backend.synchronize() {
            self.stats.num_syncs += 1;
            let last = self.pending.back().map(|&(_, t)| t);
            self.completed_upto = self.completed_upto.max(last);
            self.reclaim_completed();
            if let Some(i) = self.find_free(small, rounded) {
                return Ok(self.take(i, small, rounded, requested));
            }
        }
        // (2) Give every cached segment back and try the device again.
        if seg_size.is_some() {
            self.stats.num_alloc_retries += 1;
            self.release_free_segments(0);
            if let Some(i) = self.segment_for(rounded).and_then(|s| self.grow(small, s)) {
                return Ok(self.take(i, small, rounded, requested));
            }
        }
        // (3)
        self.stats.num_ooms += 1;
        Err(OutOfMemory)
    }

    /// Frees a block returned by [`Pool::allocate`]. An id that does not name
    /// an allocated block (a double free) is ignored.
    #[inline]
    pub fn free(&mut self, id: BlockId) {
        if self.free_asking_wait(id) {
            // Refused (a capture): nothing goes back now; the segments that
            // wait stay listed, and a later wait gives them back.
            if self.backend.synchronize() {
                self.completed_upto = self.completed_upto.max(self.pending.back().map(|&(_, t)| t));
                self.after_gpu_wait();
            }
        }
    }

    /// [`Pool::free`], except for its wait: true when the free left a
    /// segment to give back but for blocks of it behind queued work, and the
    /// pool asks its owner to wait for the GPU (with the pool's lock let go)
    /// and then to call [`Pool::after_gpu_wait`].
    pub fn free_asking_wait(&mut self, id: BlockId) -> bool {
        let i = id.0;
        let b = match self.blocks.get(i) {
            Some(b) if b.state == State::Allocated => *b,
            _ => return false,
        };
        let s = &mut self.stats;
        s.allocated_bytes.dec(b.size);
        s.requested_bytes.dec(b.requested);
        s.allocation.dec(1);
        self.segs[b.seg].allocated -= 1;
        match self.backend.free_tag() {
            None => self.make_free(i),
            Some(tag) => {
                debug_assert!(self.pending.back().is_none_or(|&(_, t)| t <= tag));
                self.blocks[i].state = State::Pending;
                self.pending.push_back((i, tag));
            }
        }
        if self.emptied_and_going_back(b.seg) && !self.give_back(b.seg) {
            // A segment's blocks go back as `cudaFree` would: after the GPU.
            if !self.pending.is_empty() {
                let addr = self.segs[b.seg].addr;
                if !self.awaiting_wait.contains(&addr) {
                    self.awaiting_wait.push(addr);
                }
                return true;
            }
        }
        false
    }

    /// The owner waited for the GPU, as [`Pool::free_asking_wait`] asked:
    /// pending blocks whose tags the backend now calls complete are
    /// reclaimed, and the segments that waited go back if nothing was
    /// allocated from them meanwhile. One whose blocks were freed during
    /// the wait (by another thread, which waits too) keeps waiting.
    pub fn after_gpu_wait(&mut self) {
        self.stats.num_syncs += 1;
        self.reclaim_completed();
        let mut waiting = std::mem::take(&mut self.awaiting_wait);
        waiting.retain(|addr| match self.seg_by_addr.get(addr) {
            Some(&seg) if self.emptied_and_going_back(seg) => !self.give_back(seg),
            _ => false,
        });
        self.awaiting_wait = waiting;
    }

    /// Does segment `seg` hold no allocated block, and go back by the rule?
    #[inline]
    fn emptied_and_going_back(&self, seg: u32) -> bool {
        self.segs[seg].allocated == 0 && self.gives_back(self.segs[seg].size)
    }

    /// Does a segment of `size` bytes that frees leave empty go back to the
    /// device now?
    #[inline]
    fn gives_back(&self, size: u64) -> bool {
        match self.config.give_back {
            GiveBack::Never => false,
            GiveBack::Always => true,
            GiveBack::Auto { .. } => !self.cycles.keeps(size),
        }
    }

    /// Gives segment `seg`, which holds no allocated block, back to the
    /// device if no block of it waits for queued GPU work (merging keeps
    /// the first block's slot: `head` is then the whole segment). True when
    /// it went back.
    #[cold]
    fn give_back(&mut self, seg: u32) -> bool {
        let head = self.segs[seg].head;
        let b = self.blocks[head];
        if b.state != State::Free || b.next != NIL {
            return false;
        }
        self.unindex(head);
        self.remove_segment(head);
        if matches!(self.config.give_back, GiveBack::Auto { .. }) {
            let now = self.backend.now_ns();
            self.cycles.gave_back(b.size, now);
        }
        true
    }

    /// Reclaims completed pending blocks, then gives every completely free
    /// segment back to the backend. Returns the bytes released.
    pub fn empty_cache(&mut self) -> u64 {
        self.reclaim_completed();
        self.release_free_segments(0)
    }

    /// Reclaims completed pending blocks, then gives completely free segments
    /// back, largest first (lowest address among equals), until at most
    /// `target_bytes` are reserved. Returns the bytes released.
    pub fn trim_to(&mut self, target_bytes: u64) -> u64 {
        self.reclaim_completed();
        self.release_free_segments(target_bytes)
    }

    // ---- internals -------------------------------------------------------

    /// Best fit in the pool, removed from the free index.
    #[inline]
    fn find_free(&mut self, small: bool, rounded: u64) -> Option<u32> {
        let e = self.free[small as usize].best_fit(rounded)?;
        if !self.config.may_use(small, e.size, rounded) {
            return None;
        }
        self.unindex(e.idx);
        Some(e.idx)
    }

    /// Hands out block `i` (free, not indexed), splitting off the remainder.
    #[inline]
    fn take(&mut self, i: u32, small: bool, rounded: u64, requested: u64) -> Block {
        let b = self.blocks[i];
        let size = if self.config.should_split(small, b.size, rounded) {
            let rest = self.blocks.split_off(i, rounded);
            self.index(rest);
            rounded
        } else {
            b.size
        };
        let r = &mut self.blocks[i];
        r.state = State::Allocated;
        r.requested = requested;
        self.segs[b.seg].allocated += 1;
        let s = &mut self.stats;
        s.allocated_bytes.inc(size);
        s.requested_bytes.inc(requested);
        s.active_bytes.inc(size);
        s.allocation.inc(1);
        s.active.inc(1);
        Block { id: BlockId(i), addr: b.addr, size }
    }

    /// Turns an allocated or pending block into a free one, merging it with
    /// free neighbours, and indexes the result.
    #[inline]
    fn make_free(&mut self, i: u32) {
        let b = self.blocks[i];
        self.stats.active_bytes.dec(b.size);
        self.stats.active.dec(1);
        let (free, segs, stats) = (&mut self.free, &self.segs, &mut self.stats);
        let i = self.blocks.merge_free(i, |n| remove_from_index(free, segs, stats, n));
        self.index(i);
    }

    /// Adds free block `i` to its pool's index.
    #[inline]
    fn index(&mut self, i: u32) {
        let b = &self.blocks[i];
        let small = self.segs[b.seg].small;
        self.free[small as usize].insert(b.size, b.addr, i);
        if b.is_split() {
            self.stats.inactive_split_bytes.inc(b.size);
            self.stats.inactive_split.inc(1);
        }
    }

    /// Removes free block `i` from its pool's index (before its links change).
    #[inline]
    fn unindex(&mut self, i: u32) {
        remove_from_index(&mut self.free, &self.segs, &mut self.stats, &self.blocks[i]);
    }

    /// Where the GPU can order later work behind the pending frees cheaply,
    /// does so before placing, so a program far ahead of its GPU reuses its
    /// blocks where it freed them, as with one stream, instead of placing
    /// its next step elsewhere and growing (as the VMM pool does; on the CPU
    /// replay of the transformer trace with the GPU 200 ms behind: 1.141 →
    /// 1.019 of its live peak). Segments still go back only through
    /// `cuMemFree`, which waits for the device.
    #[inline(never)]
    fn order_pending(&mut self) {
        let newest = self.pending.back().map(|&(_, tag)| tag);
        if order_behind_pending(newest, &mut self.completed_upto, &mut self.backend) {
            self.reclaim_completed();
        }
    }

    /// Frees the pending blocks whose tags are complete, oldest first.
    /// Returns how many were freed.
    fn reclaim_completed(&mut self) -> usize {
        let mut n = 0;
        while let Some(&(i, tag)) = self.pending.front() {
            let known = self.completed_upto.is_some_and(|c| tag <= c);
            if !known {
                if !self.backend.is_complete(tag) {
                    break;
                }
                self.completed_upto = Some(tag);
            }
            self.pending.pop_front();
            self.make_free(i);
            n += 1;
        }
        n
    }

    /// The segment to grow by for a request of `rounded` bytes: the
    /// configured size, shrunk near the `limit` to what still fits, but never
    /// below what the request needs. `None` when even that exceeds the limit.
    fn segment_for(&self, rounded: u64) -> Option<u64> {
        let want = self.config.segment_size(rounded)?;
        let need = size::round_up(rounded, SEGMENT_ALIGN)?.min(want);
        if need > self.config.limit {
            return None;
        }
        let room = self.config.limit.saturating_sub(self.stats.reserved_bytes.current);
        Some(want.min((room - room % SEGMENT_ALIGN).max(need)))
    }

    /// Changes the cap on reserved bytes (the shim lowers it by what the
    /// process holds outside the pool). Memory already reserved stays.
    pub fn set_limit(&mut self, limit: u64) {
        self.config.limit = limit;
    }

    /// Obtains a segment of `size` bytes; returns its single block (free,
    /// not indexed).
    fn grow(&mut self, small: bool, size: u64) -> Option<u32> {
        if self.stats.reserved_bytes.current.saturating_add(size) > self.config.limit {
            return None;
        }
        if let GiveBack::Auto { regret_ns } = self.config.give_back {
            if self.cycles.gave_back_lately(size) {
                let now = self.backend.now_ns();
                self.cycles.growing(size, now, regret_ns);
            }
        }
        let addr = self.backend.allocate_segment(size)?;
        debug_assert_eq!(addr % MIN_BLOCK, 0, "segment address not 512-aligned");
        self.stats.segment_added(size, small);
        let seg = self.segs.insert(SegRec { addr, size, small, head: NIL, allocated: 0 });
        let i =
            self.blocks.insert(BlockRec { addr, size, requested: 0, prev: NIL, next: NIL, seg, state: State::Free });
        self.segs[seg].head = i;
        self.seg_by_addr.insert(addr, seg);
        Some(i)
    }

    /// Releases completely free segments, largest first (lowest address among
    /// equals), while more than `target` bytes are reserved.
    fn release_free_segments(&mut self, target: u64) -> u64 {
        if self.stats.reserved_bytes.current <= target {
            return 0;
        }
        let mut whole: Vec<(u64, u64, u32)> = Vec::new();
        for ix in &self.free {
            for e in ix.iter() {
                if !self.blocks[e.idx].is_split() {
                    whole.push((e.size, e.addr, e.idx));
                }
            }
        }
        whole.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut released = 0;
        for (size, _, i) in whole {
            if self.stats.reserved_bytes.current <= target {
                break;
            }
            self.unindex(i);
            self.remove_segment(i);
            released += size;
        }
        released
    }

    /// Gives back the segment whose only block is `i` (free, not indexed).
    fn remove_segment(&mut self, i: u32) {
        let BlockRec { addr, size, seg, .. } = self.blocks[i];
        let small = self.segs[seg].small;
        self.blocks.remove(i);
        self.segs.remove(seg);
        self.seg_by_addr.remove(&addr);
        self.stats.segment_removed(size, small);
        self.backend.release_segment(addr, size);
    }
}

/// Takes free block `b` out of its pool's index (before its links change).
#[inline]
fn remove_from_index(free: &mut [FreeIndex; 2], segs: &SegSlab, stats: &mut PoolStats, b: &BlockRec) {
    free[segs[b.seg].small as usize].remove(b.size, b.addr);
    if b.is_split() {
        stats.inactive_split_bytes.dec(b.size);
        stats.inactive_split.dec(1);
    }
}
