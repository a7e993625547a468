//! The VMM pool: blocks in reserved virtual ranges, backed by physical pages
//! that move to wherever live data needs them (issue 12).
//!
//! CUDA's virtual memory management (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap`, `cuMemUnmap`, `cuMemRelease`) separates addresses from memory.
//! This pool uses that split; what it asks of the device is the
//! [`PageBackend`] trait, so the core stays pure Rust (a simulated backend is
//! in [`testing`]).
//!
//! * **Virtual ranges.** Requests are rounded to 512 B. Rounded sizes up to
//!   `small_max` are placed in the small ranges, all others in the large ones,
//!   so that small churn packs into few pages instead of pinning pages all
//!   over the large ranges. Each kind reserves ranges of `va_chunk` bytes (or
//!   the request, if larger) as needed. Inside its ranges a request weighs
//!   the first few fits among the free virtual blocks (the segment pool's
//!   free index, `pool/free_index.rs`: smallest big enough, lowest address
//!   among equals), at their ends and the page boundaries next to them, and
//!   takes the place that puts the fewest pages into use (`PlaceCost`: a
//!   page a neighbour uses costs nothing more), then the one that waits for
//!   no ghost, touches fewest pages (a small block whose copies fill a page
//!   to within an eighth; other small sizes pack end to end), leaves the page grid
//!   whole (a block of whole pages), and maps fewest pages (used in place,
//!   no driver call). A small request that would put a page into use takes
//!   the free end of a page that large blocks use instead, where it fits
//!   (`fill_scraps`). The block is always split out: a virtual remainder
//!   costs nothing. Freed virtual blocks merge with free neighbours of their
//!   range at once.
//!   Ranges stay reserved for the pool's life; as with `Pool`, dropping the
//!   pool tells the backend nothing.
//! * **Physical pages.** Memory comes in pages of `small_page` / `large_page`
//!   bytes (2 MiB each by default, CUDA's usual granularity). A page of a
//!   range is mapped while some allocated block overlaps it; neighbouring
//!   blocks share the pages they both touch. When the last block on a page is
//!   freed the page becomes *idle*: still mapped, holding no live byte.
//! * **Stitching.** A block needs a page where none is mapped: the pool takes
//!   an idle page of the same size first (the highest-addressed one), unmaps
//!   it there and maps it here, and creates a new page only when no idle page
//!   is left (`remap_idle`). So a large request that fits no hole of mapped
//!   memory gets a fresh virtual range backed by pages gathered from
//!   anywhere, and no live data moves: a page holding a live byte is never
//!   unmapped. With one page size for both kinds, the pool never holds more
//!   pages than the peak of pages that live blocks touched (a property test
//!   holds it to that).
//! * **Giving back (the high-water rule).** After a free, idle pages are
//!   unmapped and released, highest address first, while the pool holds
//!   more than the larger of (a) the high-water mark of in-use bytes over the
//!   last one to two `window_ns` and (b) the in-use bytes now plus
//!   `keep_free`. A program that cycles (a training loop) reaches its peak
//!   again within the window, so its pages stay and are not created and
//!   mapped anew every iteration; memory it stopped using for longer goes
//!   back to the device. Idle pages cost no peak: a page is created only when
//!   none is idle. [`VmmPool::empty_cache`] releases every idle page. The
//!   clock is the backend's ([`Timeline::now_ns`]); one that stands still
//!   (the simulated device's, so trace replay) keeps the all-time high-water
//!   mark, and a `window_ns` of 0 keeps just `keep_free`.
//!
//! * **Fences.** A free that the [`Timeline`] tags (GPU work queued before
//!   it may still touch the block) leaves the block *pending*: its virtual
//!   range and its pages stay as they are until the tag completes, so no
//!   page under queued work is unmapped, remapped or released (on a GPU,
//!   `cuMemUnmap` does not wait for that work). Pending blocks are reclaimed
//!   when a request would need pages the idle ones cannot give; when many
//!   bytes are pending the pool waits for the oldest tag rather than create
//!   pages (`wait_share`, as in the segment pool), and it synchronizes before
//!   it reports out of memory.
//! * **Cooling.** Reuse in place is ordered behind queued work by the GPU
//!   (one stream) or by the fences above (several); unmapping is not ordered
//!   at all. So a page that goes idle *cools*: it may be used again where it
//!   is at once, but it is unmapped (remapped elsewhere or given back) only
//!   once the GPU *finished* everything queued when it went idle
//!   ([`Timeline::unmap_tag`]).
//! * **Ghosts.** When a new page would set a new peak of reserved bytes, or
//!   the device (or the `limit`) refuses one, and no cooled idle page is
//!   left, a request takes a cooling page instead
//!   (`alias_cooling`), the oldest first: the page is mapped at its new
//!   place while its old mapping stays, a *ghost*, until the work queued
//!   before it went idle finished; then the ghost is unmapped. Using the page
//!   elsewhere is ordered behind that work exactly as using it in place
//!   would be (the blocks that lived on it were all released, so their reuse
//!   was ordered); only the unmapping waits. No block is placed over a ghost
//!   (placement avoids them; with no cap, a block whose every candidate lies
//!   over one starts past the ghosts in the largest free block when that
//!   lacks no more pages and the ghost's hole is not an exact fit; one that
//!   cannot waits for the GPU, up to the first fence that covers the work
//!   queued before that page went idle rather than for everything), and a
//!   page's ghosts go before the page is
//!   unmapped or released (its own tag there is newer than theirs, so their
//!   work is done by then). So a program that never synchronizes, queuing
//!   whole steps ahead of its GPU, still fits under a cap instead of waiting
//!   or failing, and its peak is not raised by pages made beside cooling
//!   ones; below its peak the pool creates pages instead, because a move
//!   costs the program's thread an unmap more (on an H100, 16-25 µs per page
//!   mapping) and its ghost may make a later block wait. A request that can
//!   get no page at all waits for the GPU and gives idle pages back first;
//!   one that needs far more pages than the idle ones and the device's free
//!   memory fails at once. A request that fails holds nothing afterwards:
//!   the pages made or moved for it go back.

mod backing;
mod config;
mod ghosts;
mod hot;
mod pages;
mod placement;
mod stats;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub use config::VmmConfig;
use ghosts::Ghost;
use pages::PageTable;
pub use stats::{PeakBreakdown, VmmStats};

use crate::pool::block::{BlockRec, BlockSlab, State, NIL};
use crate::pool::cycles::Cycles;
use crate::pool::free_index::FreeIndex;
use crate::pool::{
    order_behind_pending, round_size, Block, BlockId, BlockInfo, Fragmentation, OutOfMemory, Timeline, SEGMENT_ALIGN,
};

const MIB: u64 = 1 << 20;
/// Virtual ranges reserved once a process could not map one of `va_chunk`
/// bytes ([`VmmPool::reserve_range`]).
const SHORT_RANGE: u64 = 1 << 30;

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A freed block waiting for its tag.
#[derive(Clone, Copy, Debug)]
struct PendingFree {
    block: u32,
    tag: u64,
    /// Its pages were to go back when it was freed: counted in `pending_unkept`.
    unkept: bool,
}

/// An idle page that is not to be unmapped before `tag` finished.
#[derive(Clone, Copy, Debug)]
struct Cooling {
    tag: u64,
    addr: u64,
    small: bool,
}
/// What the VMM pool needs from the device: address ranges and physical pages.
/// A mapping is always one whole page of a reserved range, pages counted from
/// the range's start.
pub trait PageBackend: Timeline {
    /// Reserve `size` bytes of virtual addresses aligned to `align`
    /// (`cuMemAddressReserve`). None: no address space left.
    fn reserve(&mut self, size: u64, align: u64) -> Option<u64>;
    /// Create a physical page of `size` bytes and return its handle
    /// (`cuMemCreate`). None: the device is out of memory.
    fn create_page(&mut self, size: u64) -> Option<u64>;
    /// Map page `handle` of `size` bytes at `addr`, inside a reserved range
    /// (`cuMemMap`); false when the device refused.
    fn map(&mut self, addr: u64, size: u64, handle: u64) -> bool;
    /// Unmap the page of `size` bytes mapped at `addr` (`cuMemUnmap`).
    fn unmap(&mut self, addr: u64, size: u64);
    /// Release an unmapped page (`cuMemRelease`).
    fn release_page(&mut self, handle: u64);
    /// Pages were just mapped somewhere in `[addr, addr + size)`, a span of
    /// whole mapped pages: make it accessible (one `cuMemSetAccess` for the
    /// span costs about what one page costs); false when the device refused.
    fn grant(&mut self, addr: u64, size: u64) -> bool {
        let _ = (addr, size);
        true
    }
    /// The device's free and total bytes now (`cuMemGetInfo`), if it can
    /// say: a block that needs far more pages than the pool could have fails
    /// before any is made. None: unknown, pages are made until refused.
    fn device_memory(&mut self) -> Option<(u64, u64)> {
        None
    }
}

/// A mapped page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageInfo {
    pub addr: u64,
    pub size: u64,
    pub handle: u64,
    /// Allocated blocks overlapping it (0: idle).
    pub refs: u32,
}

#[derive(Clone, Copy, Debug)]
struct Range {
    /// Start; pages are counted from here.
    addr: u64,
    size: u64,
    small: bool,
}

/// A pool over virtual ranges and physical pages from a [`PageBackend`]. The
/// allocate/free shape is that of [`crate::pool::Pool`]. Not thread-safe by
/// itself: wrap it in a mutex.
pub struct VmmPool<B: PageBackend> {
    backend: B,
    config: VmmConfig,
    blocks: BlockSlab,
    ranges: Vec<Range>,
    /// Free virtual blocks: `[large, small]`.
    free: [FreeIndex; 2],
    /// Mapped pages.
    pages: PageTable,
    /// Allocated blocks by address, and hot blocks (`State::Cached`): they
    /// stay listed so that a loop reusing one pays no map update.
    live: BTreeMap<u64, u32>,
    /// Idle pages that may be unmapped, by address: `[large, small]`.
    idle: [BTreeSet<u64>; 2],
    /// Idle pages that work queued before they went idle may still touch,
    /// oldest tag first: used again in place at once, unmapped only once
    /// the tag finished. Entries of pages used since are dropped when they
    /// come to the front.
    cooling: VecDeque<Cooling>,
    /// Freed blocks waiting for their tags, oldest first (tags non-decreasing).
    pending: VecDeque<PendingFree>,
    /// Bytes of pending blocks whose pages were to go back (sizes not kept)
    /// when they were freed.
    pending_unkept: u64,
    /// More than `keep_free` bytes of pages that go back wait for the GPU
    /// to finish: the next free asks its owner to wait (`release_doomed`).
    wait_asked: bool,
    /// Ghosts: old mappings of pages taken while cooling, by address, and
    /// the same by tag (unmapped in that order once the GPU finished).
    ghosts: BTreeMap<u64, Ghost>,
    ghosts_by_tag: BTreeSet<(u64, u64)>,
    /// The same as (where the page is mapped now, ghost address).
    ghosts_by_owner: BTreeSet<(u64, u64)>,
    /// [`VmmPool::forget`]: nothing is held, nothing is handed out.
    forgotten: bool,
    /// A range of `va_chunk` bytes was refused: later ranges are short.
    short_of_addresses: bool,
    /// Small blocks freed with no fence, kept for their size's next request.
    hot: hot::HotBlocks,
    /// Block sizes the program frees and allocates again (`cycle_regret_ns`).
    cycles: Cycles,
    /// Idle pages to give back as soon as the GPU finished with them (a
    /// bulk free under `cycle_regret_ns`), as address -> small; their bytes.
    doomed: BTreeMap<u64, bool>,
    doomed_bytes: u64,
    /// Highest tag known to be complete (reuse is safe).
    completed_upto: Option<u64>,
    /// Highest unmap tag known to be finished (unmapping is safe).
    finished_upto: Option<u64>,
    /// A page made for the block being placed took reserved bytes to a new
    /// peak: the block is added to `at_peak` once it is counted.
    peak_moved: bool,
    /// The most bytes of pages ever held: what a new page is weighed
    /// against before a cooling page is moved instead. Not the peak
    /// statistic, which [`VmmPool::reset_peak_stats`] lowers.
    most_reserved: u64,
    /// High-water marks of in-use bytes in the current and the previous
    /// window, and when the current one began.
    high_water: (u64, u64),
    window_start: u64,
    stats: VmmStats,
}

impl<B: PageBackend> VmmPool<B> {
    /// A pool with nothing reserved; `config` is passed through [`VmmConfig::validate`].
    pub fn new(backend: B, config: VmmConfig) -> Self {
        VmmPool {
            backend,
            config: config.validate(),
            blocks: BlockSlab::new(),
            ranges: Vec::new(),
            free: [FreeIndex::new(), FreeIndex::new()],
            pages: PageTable::default(),
            live: BTreeMap::new(),
            idle: [BTreeSet::new(), BTreeSet::new()],
            cooling: VecDeque::new(),
            pending: VecDeque::new(),
            pending_unkept: 0,
            wait_asked: false,
            ghosts: BTreeMap::new(),
            ghosts_by_tag: BTreeSet::new(),
            ghosts_by_owner: BTreeSet::new(),
            forgotten: false,
            short_of_addresses: false,
            hot: hot::HotBlocks::default(),
            cycles: Cycles::default(),
            doomed: BTreeMap::new(),
            doomed_bytes: 0,
            completed_upto: None,
            finished_upto: None,
            peak_moved: false,
            most_reserved: 0,
            high_water: (0, 0),
            window_start: 0,
            stats: VmmStats::default(),
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// The configuration in force (after validation).
    pub fn config(&self) -> &VmmConfig {
        &self.config
    }

    pub fn stats(&self) -> &VmmStats {
        &self.stats
    }

    /// Sets the cap on physical bytes (a request that would need more fails).
    pub fn set_limit(&mut self, limit: u64) {
        self.config.limit = limit;
    }

    /// Resets the peaks of every [`Stat`](crate::pool::Stat) to their current values.
    pub fn reset_peak_stats(&mut self) {
        let s = &mut self.stats;
        for st in [
            &mut s.allocated_bytes,
            &mut s.requested_bytes,
            &mut s.reserved_bytes,
            &mut s.in_use_bytes,
            &mut s.idle_bytes,
            &mut s.cooling_bytes,
            &mut s.allocation,
            &mut s.pending_bytes,
            &mut s.active_bytes,
        ] {
            st.reset_peak();
        }
    }

    /// The memory picture, as [`crate::pool::Pool::fragmentation`] gives it:
    /// free bytes are the idle pages (what a request can have without
    /// creating one), the largest free block the idle bytes too, since idle
    /// pages back any virtual block.
    pub fn fragmentation(&self) -> Fragmentation {
        let s = &self.stats;
        let (reserved, allocated) = (s.reserved_bytes.current, s.allocated_bytes.current);
        Fragmentation {
            largest_free_block: s.idle_bytes.current,
            free_bytes: s.idle_bytes.current,
            reserved,
            allocated,
            ratio: if allocated == 0 { 1.0 } else { reserved as f64 / allocated as f64 },
        }
    }

    /// Virtual ranges reserved.
    pub fn ranges(&self) -> usize {
        self.ranges.len()
    }

    /// Requested sizes of the allocated blocks.
    pub fn live_requests(&self) -> impl Iterator<Item = u64> + '_ {
        self.allocated().map(|i| self.blocks[i].requested)
    }

    /// Every mapped page, by address.
    pub fn pages(&self) -> impl Iterator<Item = PageInfo> + '_ {
        self.pages.iter().map(|(addr, size, s)| PageInfo { addr, size, handle: s.handle, refs: s.refs })
    }

    /// Every allocated block, by address.
    pub fn live_blocks(&self) -> impl Iterator<Item = Block> + '_ {
        self.allocated().map(|i| self.block(i))
    }

    fn allocated(&self) -> impl Iterator<Item = u32> + '_ {
        self.live.values().copied().filter(|&i| self.blocks[i].state == State::Allocated)
    }

    /// The allocated block containing `addr`, or `None` (free by pointer),
    /// as [`crate::pool::Pool::lookup`] answers it; its segment is the
    /// virtual range it lies in.
    pub fn lookup(&self, addr: u64) -> Option<BlockInfo> {
        let (_, &i) = self.live.range(..=addr).next_back()?;
        let b = &self.blocks[i];
        if b.state != State::Allocated {
            return None; // a hot block: free to the program
        }
        let r = &self.ranges[b.seg as usize];
        (addr - b.addr < b.size).then_some(BlockInfo {
            id: BlockId::from_raw(i),
            addr: b.addr,
            size: b.size,
            requested: b.requested,
            segment_addr: r.addr,
            segment_size: r.size,
        })
    }

    /// The pages under the allocated block containing `addr`, by address
    /// (the first may begin before the block, the last end after it): what
    /// another process must map to see the block (IPC through shareable
    /// page handles).
    pub fn block_pages(&self, addr: u64) -> Option<Vec<PageInfo>> {
        let b = self.lookup(addr)?;
        let seg = self.blocks[b.id.to_raw()].seg;
        let page = self.config.page(self.ranges[seg as usize].small);
        self.page_span(seg, b.addr, b.size)
            .map(|p| self.pages.get(p).map(|s| PageInfo { addr: p, size: page, handle: s.handle, refs: s.refs }))
            .collect()
    }

    fn block(&self, i: u32) -> Block {
        let b = &self.blocks[i];
        Block { id: BlockId::from_raw(i), addr: b.addr, size: b.size }
    }

    /// Allocates a block of at least `requested` bytes (0 is served as 1).
    /// Fails after waiting for the GPU and giving idle pages back failed
    /// too, or at once when far more pages are needed than could be had.
    pub fn allocate(&mut self, requested: u64) -> Result<Block, OutOfMemory> {
        let Some(rounded) = round_size(requested).filter(|&r| r <= self.config.limit && !self.forgotten) else {
            self.stats.num_ooms += 1;
            return Err(OutOfMemory);
        };
        let small = rounded <= self.config.small_max;
        // Pages made or taken from elsewhere for this block: the pool grew
        // for it, or would have without idle pages to take.
        let grown = |s: &VmmStats| s.num_page_creates + s.num_remaps;
        let before = grown(&self.stats);
        let r = self.allocate_as(small, rounded, requested);
        if let Some(regret) = self.config.cycle_regret_ns {
            // Pages are interchangeable: the pool growing soon after it gave
            // pages back regrets every give-back of that time, whatever size
            // the growing block is (a step frees blocks of some sizes and
            // then needs their pages under blocks of other sizes).
            if grown(&self.stats) > before && self.cycles.gave_back_any() {
                let now = self.backend.now_ns();
                self.cycles.regret_since(now.saturating_sub(regret));
            }
        }
        r
    }

    fn allocate_as(&mut self, small: bool, rounded: u64, requested: u64) -> Result<Block, OutOfMemory> {
        match self.try_allocate(small, rounded, requested) {
            Some(b) => Ok(b),
            // Every pending block back first: waiting costs less than failing.
            None if !self.pending.is_empty() && self.wait_for_pending() => {
                self.try_allocate(small, rounded, requested).ok_or_else(|| self.oom())
            }
            None => Err(self.oom()),
        }
    }

    fn oom(&mut self) -> OutOfMemory {
        self.stats.num_ooms += 1;
        OutOfMemory
    }

    fn try_allocate(&mut self, small: bool, rounded: u64, requested: u64) -> Option<Block> {
        if small {
            if let Some(i) = self.take_hot(rounded) {
                return Some(self.hand_out_listed(i, requested));
            }
        }
        self.order_pending();
        let (mut i, mut missing) = self.find_virtual(small, rounded)?;
        let flushed = missing > 0 && self.hot.bytes > 0;
        if flushed {
            // Hot blocks pin pages that could serve this one.
            self.make_free(i);
            self.flush_hot();
            (i, missing) = self.find_virtual(small, rounded)?;
        }
        if !self.pending.is_empty() && missing > self.movable_pages(small).saturating_sub(self.idle_under(i, rounded)) {
            // A miss: the pages it needs exist only under blocks freed
            // before queued work. Reclaim (or wait for) those, then place again.
            self.make_free(i);
            self.make_room(small, rounded);
            (i, _) = self.find_virtual(small, rounded)?;
        }
        self.split(i, rounded);
        let b = self.blocks[i];
        if !self.back(b.seg, b.addr, b.size) {
            self.make_free(i);
            self.peak_moved = false;
            return None;
        }
        self.stats.active_bytes.inc(b.size);
        let block = self.hand_out(i, requested);
        if flushed {
            // What the hot blocks left idle and this block did not take.
            self.trim_after_free();
        }
        Some(block)
    }

    /// Hands block `i` (on its pages, counted active) to the caller.
    fn hand_out(&mut self, i: u32, requested: u64) -> Block {
        self.live.insert(self.blocks[i].addr, i);
        self.hand_out_listed(i, requested)
    }

    /// [`Self::hand_out`] for a block listed in `live` already (a hot one).
    fn hand_out_listed(&mut self, i: u32, requested: u64) -> Block {
        let r = &mut self.blocks[i];
        r.state = State::Allocated;
        r.requested = requested;
        let b = *r;
        let s = &mut self.stats;
        s.allocated_bytes.inc(b.size);
        s.requested_bytes.inc(requested);
        s.allocation.inc(1);
        self.high_water.0 = self.high_water.0.max(s.in_use_bytes.current);
        if std::mem::take(&mut self.peak_moved) {
            self.stats.at_peak.allocated += b.size;
        }
        Block { id: BlockId::from_raw(i), addr: b.addr, size: b.size }
    }

    /// Blocks freed before queued work stay where they are until their tag
    /// completes, so a program running far ahead of its GPU places its next
    /// blocks elsewhere: the hole a step freed is not the one its next step
    /// fills, holes stop matching the sizes that come, and pages are made
    /// beside idle ones that may not move yet (cooling). Where the GPU can
    /// order later work behind the pending frees cheaply, do that before
    /// every placement, so blocks are reused where they were freed, as with
    /// one stream (on the CPU replay of the transformer trace with the GPU
    /// 200 ms behind: 1.129 → 1.006 of its live peak).
    fn order_pending(&mut self) {
        let newest = self.pending.back().map(|f| f.tag);
        if order_behind_pending(newest, &mut self.completed_upto, &mut self.backend) {
            self.reclaim_completed();
        }
    }

    /// Blocks freed before queued GPU work hold their pages: when the idle
    /// pages could not serve a request, reclaim those whose work is done,
    /// and wait for the oldest while the pending ones are a large share of
    /// what is held (new pages would sit idle once they complete). Pages are
    /// interchangeable, so pending blocks smaller than the request are
    /// worth it too: each of their pages is one fewer to create.
    #[cold]
    fn make_room(&mut self, small: bool, rounded: u64) {
        let need = (rounded / self.config.page(small)) + 1;
        self.reclaim_completed();
        while let Some(&PendingFree { tag, .. }) = self.pending.front() {
            let pending = self.stats.pending_bytes.current;
            if self.movable_pages(small) >= need
                || pending.saturating_mul(self.config.wait_share) < self.stats.reserved_bytes.current
                || !self.backend.wait_for(tag)
            {
                return;
            }
            self.stats.num_waits += 1;
            self.completed_upto = self.completed_upto.max(Some(tag));
            self.reclaim_completed();
        }
    }

    /// Idle pages under the first `size` bytes of free block `i`: used in
    /// place, they cannot also be moved under its missing pages.
    fn idle_under(&self, i: u32, size: u64) -> u64 {
        let b = self.blocks[i];
        let small = self.ranges[b.seg as usize].small;
        let idle = &self.idle[small as usize];
        self.page_span(b.seg, b.addr, size).filter(|a| idle.contains(a)).count() as u64
    }

    /// Idle pages of the kind a request of this size uses that may move now
    /// (not cooling).
    fn movable_pages(&self, small: bool) -> u64 {
        let page = self.config.page(small);
        [false, true]
            .into_iter()
            .filter(|&s| self.config.page(s) == page)
            .map(|s| self.idle[s as usize].len() as u64)
            .sum()
    }

    /// Frees a block returned by [`VmmPool::allocate`]. An id that does not
    /// name an allocated block (a double free) is ignored.
    pub fn free(&mut self, id: BlockId) {
        if self.free_asking_wait(id) && !self.forgotten && self.backend.synchronize() {
            // Everything queued so far is done.
            self.completed_upto = self.completed_upto.max(self.pending.back().map(|f| f.tag));
            self.finished_upto = self.finished_upto.max(self.newest_unmap_tag());
            if self.after_gpu_wait() {
                self.cool_down();
                self.trim_after_free();
            }
        }
    }

    /// [`VmmPool::free`], except for its wait: true when the pool asks its
    /// owner to wait for the GPU (with the pool's lock let go, through the
    /// backend's own means) and then to call [`VmmPool::after_gpu_wait`].
    pub fn free_asking_wait(&mut self, id: BlockId) -> bool {
        let i = id.to_raw();
        let b = match self.blocks.get(i) {
            Some(b) if b.state == State::Allocated => *b,
            _ => return false,
        };
        let s = &mut self.stats;
        s.allocated_bytes.dec(b.size);
        s.requested_bytes.dec(b.requested);
        s.allocation.dec(1);
        match self.backend.free_tag() {
            Some(tag) => {
                self.live.remove(&b.addr);
                debug_assert!(self.pending.back().is_none_or(|f| f.tag <= tag));
                self.blocks[i].state = State::Pending;
                self.stats.pending_bytes.inc(b.size);
                let unkept = self.goes_back(b.size, b.seg);
                self.pending.push_back(PendingFree { block: i, tag, unkept });
                if unkept {
                    self.pending_unkept += b.size;
                    self.wait_asked |= self.pending_unkept > self.config.keep_free;
                }
            }
            None if self.keep_hot(i) => {
                // Nothing went idle; what went idle before may go back now.
                if !self.doomed.is_empty() || self.stats.idle_bytes.current > self.config.keep_free {
                    self.trim_after_free();
                }
            }
            None => {
                self.live.remove(&b.addr);
                self.release_block(i);
                self.trim_after_free();
            }
        }
        self.take_wait_asked()
    }

    /// Was a wait asked for (by this free, or since the last one), and does
    /// the reason still hold? (It may have gone meanwhile: `empty_cache`
    /// gives back what waited, a fence finishes the cooling.)
    fn take_wait_asked(&mut self) -> bool {
        if !std::mem::take(&mut self.wait_asked) || self.forgotten {
            return false;
        }
        let keep = self.config.keep_free;
        self.pending_unkept > keep || (self.doomed_bytes > keep && self.doomed.keys().any(|&a| self.is_cooling(a)))
    }

    /// The owner waited for the GPU, as [`VmmPool::free_asking_wait`]
    /// asked: the pending blocks whose tags the backend now calls complete
    /// are reclaimed, and the pages it calls finished go back by the usual
    /// rules. True: the pool asks for one more wait (the pages of the blocks
    /// reclaimed here cool behind whatever was queued during this one).
    pub fn after_gpu_wait(&mut self) -> bool {
        self.stats.num_syncs += 1;
        self.reclaim_completed();
        self.promote();
        self.trim_after_free();
        self.take_wait_asked()
    }

    /// Do the pages of a freed block of `size` in range `seg` go back to the
    /// device (under the give-back rule, a size the program is not known to
    /// allocate again)?
    ///
    /// A block freed with several streams in use waits for its fence, which
    /// only the pool's next allocation looked at: a bulk free (CuPy's
    /// `free_all_blocks`, `empty_cache`, a C program's `cudaFree`) followed
    /// by another allocator's request (`cudaMallocAsync`, another process)
    /// found the memory still held, where `cudaFree` gives it back. So once
    /// more than `keep_free` bytes of such blocks wait, the free waits for
    /// the GPU, as for idle pages that would go back (`release_doomed`).
    pub(super) fn goes_back(&self, size: u64, seg: u32) -> bool {
        let small = self.ranges[seg as usize].small;
        self.config.cycle_regret_ns.is_some() && !self.cycles.keeps(self.cycle_key(size, small))
    }

    /// Waits for the GPU, as `cudaFree` would have, and reclaims every
    /// pending block (their pages go back or stay idle by the usual rules).
    /// False when waiting is refused (a capture) or the pool is forgotten.
    #[cold]
    fn wait_for_pending(&mut self) -> bool {
        if self.forgotten || !self.backend.synchronize() {
            return false;
        }
        self.stats.num_syncs += 1;
        self.completed_upto = self.completed_upto.max(self.pending.back().map(|f| f.tag));
        self.reclaim_completed();
        true
    }

    /// Blocks freed and still waiting for their fence.
    pub fn pending_blocks(&self) -> usize {
        self.pending.len()
    }

    /// Is `addr` inside one of the pool's virtual ranges?
    pub fn owns(&self, addr: u64) -> bool {
        self.ranges.iter().any(|r| addr.wrapping_sub(r.addr) < r.size)
    }

    /// Takes block `i` (freed, its work done) off its pages and makes its
    /// virtual range free.
    pub(super) fn release_block(&mut self, i: u32) {
        let b = self.blocks[i];
        self.stats.active_bytes.dec(b.size);
        let doom = self.goes_back(b.size, b.seg);
        self.unback(b.seg, b.addr, b.size, doom);
        self.make_free(i);
    }

    /// Sizes are told apart coarsely, as the segment pool's few segment
    /// sizes group requests: by the pages they span, in steps of √2 (a loop
    /// whose shapes vary from one iteration to the next still cycles
    /// through the same few keys; 64 and 96 MiB differ).
    pub(super) fn cycle_key(&self, size: u64, small: bool) -> u64 {
        let pages = size.div_ceil(self.config.page(small)).max(1);
        let log2 = 63 - pages.leading_zeros() as u64;
        // Half steps: past 1.5 × 2^k (close enough to √2) the next key.
        2 * log2 + u64::from(pages >= 3 << log2.saturating_sub(1) && log2 > 0) + if small { 1 << 32 } else { 0 }
    }

    pub(super) fn trim_after_free(&mut self) {
        self.release_doomed();
        let in_use = self.stats.in_use_bytes.current;
        let keep = self.recent_high_water().saturating_sub(in_use).max(self.config.keep_free);
        // Doomed pages still cooling count as idle but are not kept: they
        // must not push kept pages out.
        self.trim_idle(keep.saturating_add(self.doomed_bytes));
    }

    /// Frees the pending blocks whose tags are complete, oldest first.
    fn reclaim_completed(&mut self) -> usize {
        let mut n = 0;
        while let Some(&PendingFree { block: i, tag, unkept }) = self.pending.front() {
            if self.completed_upto.is_none_or(|c| tag > c) {
                if !self.backend.is_complete(tag) {
                    break;
                }
                self.completed_upto = Some(tag);
            }
            self.pending.pop_front();
            let b = self.blocks[i];
            self.stats.pending_bytes.dec(b.size);
            if unkept {
                // As the free counted it, whether its size is kept by now or not.
                debug_assert!(self.pending_unkept >= b.size);
                self.pending_unkept = self.pending_unkept.saturating_sub(b.size);
            }
            self.release_block(i);
            n += 1;
        }
        debug_assert!(!self.pending.is_empty() || self.pending_unkept == 0);
        if n > 0 {
            self.trim_after_free();
        }
        n
    }

    /// The high-water mark of in-use bytes over the current window and the
    /// one before it, after moving the windows on to now.
    fn recent_high_water(&mut self) -> u64 {
        let w = self.config.window_ns;
        let now = self.backend.now_ns();
        let elapsed = now.saturating_sub(self.window_start);
        if elapsed >= w {
            let prev = if elapsed >= w.saturating_mul(2) { 0 } else { self.high_water.0 };
            self.high_water = (self.stats.in_use_bytes.current, prev);
            self.window_start = now;
        }
        self.high_water.0.max(self.high_water.1)
    }

    /// The memory is gone with the CUDA context that made it: its pages,
    /// mappings and ranges died with it (on an H100, unmapping or releasing
    /// them afterwards crashed the process), so the pool drops them without
    /// a word to the backend. It keeps its books (frees of its blocks still
    /// count) but holds nothing and hands nothing out.
    pub fn forget(&mut self) {
        let mapped: Vec<u64> = self.pages().map(|pg| pg.addr).collect();
        for a in mapped {
            self.pages.remove(a);
        }
        self.idle = [BTreeSet::new(), BTreeSet::new()];
        // Released with their pages gone: only the books change.
        self.flush_hot();
        self.cooling.clear();
        self.ghosts.clear();
        self.ghosts_by_tag.clear();
        self.ghosts_by_owner.clear();
        self.stats.cooling_bytes.dec(self.stats.cooling_bytes.current);
        self.doomed.clear();
        self.doomed_bytes = 0;
        let s = &mut self.stats;
        for st in [&mut s.reserved_bytes, &mut s.in_use_bytes, &mut s.idle_bytes] {
            st.dec(st.current);
        }
        self.forgotten = true;
    }

    /// Reclaims the pending blocks whose work is done, then gives every
    /// idle page back. Returns the bytes released.
    pub fn empty_cache(&mut self) -> u64 {
        self.flush_hot();
        self.reclaim_completed();
        self.promote();
        if !self.cooling.is_empty() || !self.ghosts.is_empty() {
            // What is given back must be usable by others now: wait for the GPU.
            self.cool_down();
        }
        self.trim_idle(0)
    }

    // ---- internals -------------------------------------------------------

    /// A new virtual range for a block of `need` bytes (whole pages of
    /// `page` bytes), as (address, size): `va_chunk` bytes, or `need` if
    /// larger. Where the process may map less address space than that
    /// (`ulimit -v`, valgrind), ranges of [`SHORT_RANGE`] (or `need`) from
    /// then on: addresses running short says nothing of the device's
    /// memory, a refusal would fail a call that succeeds without the pool,
    /// and a modest range leaves the program the rest of what it may map.
    fn reserve_range(&mut self, need: u64, page: u64) -> Option<(u64, u64)> {
        // A range is whole pages and aligned to SEGMENT_ALIGN; so is its size.
        let unit = page / gcd(page, SEGMENT_ALIGN) * SEGMENT_ALIGN;
        let need = need.checked_next_multiple_of(unit)?;
        let first = if self.short_of_addresses { SHORT_RANGE } else { self.config.va_chunk };
        let mut tried = 0;
        for size in [first, SHORT_RANGE, need] {
            let size = size.checked_next_multiple_of(unit)?.max(need);
            if size == tried {
                continue;
            }
            if let Some(addr) = self.backend.reserve(size, SEGMENT_ALIGN) {
                return Some((addr, size));
            }
            // (A block larger than any range refused alone says nothing of the rest.)
            self.short_of_addresses |= size <= self.config.va_chunk;
            tried = size;
        }
        None
    }

    /// Best-fit free virtual block for `rounded` bytes, removed from the
    /// index, with the pages its first `rounded` bytes lack; reserves a new
    /// range when none fits.
    fn find_virtual(&mut self, small: bool, rounded: u64) -> Option<(u32, u64)> {
        let k = small as usize;
        if self.free[k].best_fit(rounded).is_none() {
            let p = self.config.page(small);
            let (addr, size) = self.reserve_range(rounded.checked_next_multiple_of(p)?, p)?;
            self.stats.va_reserved_bytes += size;
            let seg = self.ranges.len() as u32;
            self.ranges.push(Range { addr, size, small });
            self.pages.add_range(addr, p);
            let i = self.blocks.insert(BlockRec {
                addr,
                size,
                requested: 0,
                prev: NIL,
                next: NIL,
                seg,
                state: State::Free,
            });
            self.free[k].insert(size, addr, i);
        }
        let (e, start, missing) = self.placement(k, rounded)?;
        let kind = self.ranges[self.blocks[e.idx].seg as usize].small as usize;
        self.free[kind].remove(e.size, e.addr);
        if start == e.addr {
            return Some((e.idx, missing));
        }
        // The gap before the page boundary stays free for smaller blocks.
        let placed = self.blocks.split_off(e.idx, start - e.addr);
        self.index(e.idx);
        Some((placed, missing))
    }

    /// Cuts block `i` (free, not indexed) to `rounded` bytes; the rest is a
    /// free block of its own.
    fn split(&mut self, i: u32, rounded: u64) {
        if self.blocks[i].size == rounded {
            return;
        }
        let rest = self.blocks.split_off(i, rounded);
        self.index(rest);
    }

    /// Makes block `i` (allocated, or free and not indexed) free, merged with
    /// free neighbours, and indexes it.
    fn make_free(&mut self, i: u32) {
        let (free, ranges) = (&mut self.free, &self.ranges);
        let i = self.blocks.merge_free(i, |n| free[ranges[n.seg as usize].small as usize].remove(n.size, n.addr));
        self.index(i);
    }

    fn index(&mut self, i: u32) {
        let b = self.blocks[i];
        self.free[self.ranges[b.seg as usize].small as usize].insert(b.size, b.addr, i);
    }
}
