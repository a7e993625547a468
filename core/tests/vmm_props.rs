//! The VMM pool against a simple model, over long random sequences of
//! allocate / free / empty_cache / clock ticks, with and without a device capacity, for
//! cupool's settings, for giving every idle page back at once, and for the
//! PyTorch expandable-segments model.
//!
//! The model is the set of live blocks (address, size, requested) and, for
//! each, the page handles under it when it was allocated. The simulated
//! device panics on a page mapped twice, an address mapped twice, an unmap of
//! nothing and a release of a mapped page. After every operation:
//!
//! * live blocks are the model's, none overlap, and all lie in page-aligned
//!   ranges of 512 B multiples;
//! * every byte of every live block is mapped, by the same handle as when the
//!   block was allocated (no live byte unmapped, stitching never moves live
//!   data);
//! * each mapped page counts exactly the live blocks over it; pages with
//!   none are idle, and (without the high-water window) idle bytes stay
//!   within `keep_free` after a free;
//! * the stats agree: allocated, requested and allocation with the model;
//!   reserved with the device's pages held and with in-use + idle; in-use
//!   with the pages that live blocks touch; with one page size and idle
//!   pages remapped, the peak of reserved is the peak of in-use;
//! * an out-of-memory happens only when the device capacity leaves no room
//!   for the pages the request could need, and leaves the device holding no
//!   more than before and the reserved peak where it was.
//!
//! With fences on (frees wait for simulated GPU work, which completes only
//! when the test says so or the pool synchronizes), a freed block is
//! *pending* in the model until the pool reclaims it (in free order): until
//! then its pages stay mapped under it by the same handles, and the pool may
//! reclaim it only once its work completed. The pool may reuse a page at
//! once where it is mapped (work on it is ordered), or elsewhere while its
//! old mapping stays (a ghost, under no block), but it may unmap a page or a
//! ghost only once the work queued before its last block was freed completed
//! (checked against every unmap the simulated device saw). A stream capture
//! may come and go: the pool cannot wait for the GPU then, and the same
//! checks hold (an allocation may fail then, and `empty_cache` may keep
//! pages whose work may still run).

use std::collections::{BTreeMap, VecDeque};

use cupool_core::pool::testing::Fences;
use cupool_core::pool::Block;
use cupool_core::vmm::testing::SimulatedPages;
use cupool_core::vmm::{VmmConfig, VmmPool};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64),
    Free(usize),
    EmptyCache,
    /// The device clock moves on by this many tenths of a second.
    Tick(u8),
    /// Frees from now on wait for the newest queued GPU work (or not).
    Deferred(bool),
    /// GPU work is queued.
    Launch,
    /// This many pieces of queued work complete.
    Complete(u8),
    /// Waits order later work behind the tag on the GPU (the shim's
    /// barrier) instead of waiting for it: reuse, not unmapping, is safe.
    Barrier(bool),
    /// Placements first order pending frees behind on the GPU (or not).
    Order(bool),
    /// A stream capture is under way (or not): the pool cannot wait for
    /// the GPU, so whatever needs a wait must stay as it is.
    Capture(bool),
}

/// A live block as the model keeps it: the block, its requested size, and
/// (page start, handle) of every page under it when it was allocated.
type Live = (Block, u64, Vec<(u64, u64)>);

struct Harness {
    pool: VmmPool<SimulatedPages>,
    /// Live blocks by address.
    live: BTreeMap<u64, Live>,
    /// Freed blocks the pool has not reclaimed yet, with their tags, oldest first.
    pending: VecDeque<(Live, u64)>,
    capacity: Option<u64>,
    /// Page start -> the newest work queued when a block over it was freed.
    last_free: BTreeMap<u64, u64>,
    /// Unmaps of the simulated device already checked.
    unmaps_seen: usize,
    /// Work was ever queued (pages may then cool instead of being remapped).
    launched: bool,
}

impl Harness {
    fn new(cfg: VmmConfig, capacity: Option<u64>) -> Self {
        let pool = VmmPool::new(SimulatedPages::new().with_capacity(capacity), cfg);
        Harness {
            pool,
            live: BTreeMap::new(),
            pending: VecDeque::new(),
            capacity,
            last_free: BTreeMap::new(),
            unmaps_seen: 0,
            launched: false,
        }
    }

    fn page_of(&self, size: u64) -> u64 {
        let c = self.pool.config();
        if size <= c.small_max {
            c.small_page
        } else {
            c.large_page
        }
    }

    /// (page start, handle) of every page under `[addr, addr + size)`; panics
    /// on an unmapped byte. Page sizes are the device's: a small block may
    /// lie on a large range's page.
    fn handles_under(&self, addr: u64, size: u64) -> Vec<(u64, u64)> {
        let dev = self.pool.backend();
        let mut out = Vec::new();
        let mut x = addr;
        while x < addr + size {
            let (start, handle) = dev.handle_at(x).unwrap_or_else(|| panic!("live byte {x:#x} unmapped"));
            out.push((start, handle));
            x = start + self.page_size(handle);
        }
        out
    }

    fn page_size(&self, handle: u64) -> u64 {
        self.pool.backend().pages()[&handle].0
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Alloc(req) => {
                let before = self.pool.stats().clone();
                let held = self.pool.backend().held();
                match self.pool.allocate(req) {
                    Ok(b) => {
                        assert!(b.size >= req.max(1) && b.size.is_multiple_of(512) && b.size - req.max(1) < 512);
                        let handles = self.handles_under(b.addr, b.size);
                        assert!(self.live.insert(b.addr, (b, req, handles)).is_none(), "address handed out twice");
                    }
                    Err(_) => {
                        let p = self.page_of(req.max(1).next_multiple_of(512));
                        let need = (req.max(1).div_ceil(p) + 1) * p;
                        // The pool waits for every pending free before it fails, but
                        // for during a capture (the shim then serves nothing from it).
                        let room = self.capacity.map(|c| c.saturating_sub(self.live_page_bytes()));
                        let capturing = self.pool.backend().capturing;
                        assert!(
                            capturing || room.is_some_and(|r| r < need),
                            "out of memory with room {room:?} for {req}"
                        );
                        let s = self.pool.stats();
                        assert_eq!(s.allocation.current, before.allocation.current);
                        assert!(s.in_use_bytes.current <= before.in_use_bytes.current);
                        // What it made for nothing went back, and is no peak.
                        assert!(self.pool.backend().held() <= held, "a failed request left pages held");
                        assert_eq!(s.reserved_bytes.peak, before.reserved_bytes.peak);
                    }
                }
            }
            Op::Free(sel) if !self.live.is_empty() => {
                let addr = *self.live.keys().nth(sel % self.live.len()).unwrap();
                let live = self.live.remove(&addr).unwrap();
                let id = live.0.id;
                let tag = self.pool.backend().queued;
                for &(start, _) in &live.2 {
                    let t = self.last_free.entry(start).or_default();
                    *t = (*t).max(tag);
                }
                let fenced = self.pool.backend().fences != Fences::Off;
                if fenced {
                    self.pending.push_back((live, tag));
                }
                self.pool.free(id);
                self.pool.free(id); // a double free changes nothing
                let all_done = self.pool.backend().queued == self.pool.backend().completed;
                if !fenced && all_done && self.pool.pending_blocks() == 0 && self.pool.config().window_ns == 0 {
                    assert!(self.pool.stats().idle_bytes.current <= self.pool.config().keep_free);
                }
            }
            Op::Free(_) => {}
            Op::Tick(t) => self.pool.backend_mut().now += t as u64 * 100_000_000,
            Op::Deferred(on) => self.pool.backend_mut().fences = if on { Fences::AtQueued } else { Fences::Off },
            Op::Launch => {
                self.launched = true;
                self.pool.backend_mut().launch()
            }
            Op::Complete(n) => self.pool.backend_mut().complete(n as u64),
            Op::Barrier(on) => self.pool.backend_mut().barrier = on,
            Op::Order(on) => self.pool.backend_mut().order_every_ns = on.then_some(0),
            Op::Capture(on) => self.pool.backend_mut().capturing = on,
            Op::EmptyCache => {
                self.pool.empty_cache();
                // During a capture, pages whose work may still run stay (no wait).
                if !self.pool.backend().capturing {
                    assert_eq!(self.pool.stats().idle_bytes.current, 0);
                }
            }
        }
        self.reclaimed();
        self.unmaps_checked();
        self.check();
    }

    /// No page was unmapped before the work queued when its last block was freed completed.
    fn unmaps_checked(&mut self) {
        let unmapped = &self.pool.backend().unmapped;
        for &(addr, done) in &unmapped[self.unmaps_seen..] {
            let freed = self.last_free.get(&addr).copied().unwrap_or(0);
            assert!(
                freed <= done,
                "page {addr:#x} unmapped with work {freed} queued before its free, {done} completed"
            );
        }
        self.unmaps_seen = unmapped.len();
    }

    /// Drops from the model the pending blocks the pool reclaimed (oldest
    /// first); each must have had its work completed.
    fn reclaimed(&mut self) {
        while self.pending.len() > self.pool.pending_blocks() {
            let ((b, _, _), tag) = self.pending.pop_front().unwrap();
            let d = self.pool.backend();
            let done = d.completed.max(d.ordered);
            assert!(
                tag <= done,
                "block {:#x} reclaimed before its work ({tag}) completed or was ordered ({done})",
                b.addr
            );
        }
    }

    /// Bytes of the pages live blocks touch.
    fn live_page_bytes(&self) -> u64 {
        let mut pages = BTreeMap::new();
        for (_, _, handles) in self.live.values() {
            for &(start, handle) in handles {
                pages.insert(start, self.page_size(handle));
            }
        }
        pages.values().sum()
    }

    fn check(&self) {
        let pool = &self.pool;
        let s = pool.stats();
        // Live blocks.
        let blocks: Vec<Block> = pool.live_blocks().collect();
        assert_eq!(blocks.len(), self.live.len());
        let mut end = 0;
        for b in &blocks {
            let (m, _, handles) = &self.live[&b.addr];
            assert_eq!(b, m);
            let info = pool.lookup(b.addr + b.size - 1).expect("a live block is found by address");
            assert_eq!((info.id, info.addr, info.size, info.requested), (b.id, b.addr, b.size, self.live[&b.addr].1));
            assert!(b.addr >= end, "blocks overlap at {:#x}", b.addr);
            end = b.addr + b.size;
            assert_eq!(&self.handles_under(b.addr, b.size), handles, "live data moved");
        }
        for ((b, _, handles), _) in &self.pending {
            let under = self.handles_under(b.addr, b.size);
            assert_eq!(&under, handles, "a page under queued work was unmapped or moved");
            assert!(pool.lookup(b.addr).is_none(), "a freed block is still found");
        }
        // Hot blocks (freed, kept whole for their size) lie on mapped pages,
        // apart from every live block.
        let hot: Vec<Block> = pool.hot_blocks().collect();
        for h in &hot {
            assert!(pool.lookup(h.addr).is_none(), "a hot block is found as live");
            assert!(self.live.values().all(|(b, _, _)| b.addr + b.size <= h.addr || h.addr + h.size <= b.addr));
        }
        let hot_pages: Vec<Vec<(u64, u64)>> = hot.iter().map(|h| self.handles_under(h.addr, h.size)).collect();
        // Pages: each counts the live, pending and hot blocks over it.
        let mut refs: BTreeMap<u64, u32> = BTreeMap::new();
        for handles in self.live.values().chain(self.pending.iter().map(|(l, _)| l)).map(|l| &l.2).chain(&hot_pages) {
            for &(start, _) in handles {
                *refs.entry(start).or_default() += 1;
            }
        }
        let (mut in_use, mut idle) = (0, 0);
        for pg in pool.pages() {
            assert_eq!(pg.refs, refs.get(&pg.addr).copied().unwrap_or(0), "page {:#x}", pg.addr);
            assert_eq!(pool.backend().pages()[&pg.handle], (pg.size, Some(pg.addr)));
            if pg.refs > 0 {
                in_use += pg.size;
            } else {
                idle += pg.size;
            }
        }
        assert_eq!(refs.len(), pool.pages().filter(|p| p.refs > 0).count());
        // Stats.
        assert_eq!(s.in_use_bytes.current, in_use);
        assert_eq!(s.idle_bytes.current, idle);
        assert_eq!(s.reserved_bytes.current, in_use + idle);
        assert_eq!(s.reserved_bytes.current, pool.backend().held());
        assert_eq!(s.allocation.current, self.live.len() as u64);
        assert_eq!(s.allocated_bytes.current, self.live.values().map(|(b, _, _)| b.size).sum::<u64>());
        assert_eq!(s.requested_bytes.current, self.live.values().map(|(_, r, _)| r).sum::<u64>());
        assert_eq!(s.pending_bytes.current, self.pending.iter().map(|((b, _, _), _)| b.size).sum::<u64>());
        let hot_bytes: u64 = hot.iter().map(|h| h.size).sum();
        assert_eq!(s.active_bytes.current, s.allocated_bytes.current + s.pending_bytes.current + hot_bytes);
        assert_eq!(s.num_page_creates - s.num_page_releases, pool.backend().pages().len() as u64);
        let ghosts = pool.backend().ghosts();
        assert_eq!(s.num_maps - s.num_unmaps, (pool.pages().count() + ghosts.len()) as u64);
        // A ghost (the old mapping of a page taken while cooling) lies under
        // no live or pending block: no block's bytes share a page with another's.
        for (&g, &handle) in ghosts {
            let blocks =
                self.live.values().chain(self.pending.iter().map(|(l, _)| l)).map(|l| l.0).chain(hot.iter().copied());
            for b in blocks {
                assert!(
                    g + self.page_size(handle) <= b.addr || g >= b.addr + b.size,
                    "a block over the ghost at {g:#x}"
                );
            }
        }
        let c = pool.config();
        if c.remap_idle && c.small_page == c.large_page && !self.launched {
            assert_eq!(s.reserved_bytes.peak, s.in_use_bytes.peak, "a page created while one was idle");
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..=MIB).prop_map(Op::Alloc),
        3 => (MIB..12 * MIB).prop_map(Op::Alloc),
        1 => (12 * MIB..48 * MIB).prop_map(Op::Alloc),
        // Past 64 pages: the pool asks whether the device could give them before making any.
        1 => (128 * MIB..320 * MIB).prop_map(Op::Alloc),
        5 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::EmptyCache),
        1 => (0u8..30).prop_map(Op::Tick),
        1 => any::<bool>().prop_map(Op::Deferred),
        2 => Just(Op::Launch),
        1 => (0u8..4).prop_map(Op::Complete),
        1 => any::<bool>().prop_map(Op::Barrier),
        1 => any::<bool>().prop_map(Op::Order),
        1 => any::<bool>().prop_map(Op::Capture),
    ]
}

fn config() -> impl Strategy<Value = VmmConfig> {
    prop_oneof![
        Just(VmmConfig::default()),
        Just(VmmConfig { keep_free: 0, window_ns: 0, ..VmmConfig::default() }),
        Just(VmmConfig { keep_free: 4 * MIB, window_ns: 0, ..VmmConfig::default() }),
        Just(VmmConfig { small_max: 64 << 10, large_page: 4 * MIB, ..VmmConfig::default() }),
        Just(VmmConfig { keep_free: 0, window_ns: 1_000_000_000, ..VmmConfig::default() }),
        Just(VmmConfig::pytorch_expandable()),
        Just(VmmConfig::shim_default()),
        Just(VmmConfig { keep_free: 0, ..VmmConfig::shim_default() }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn vmm_pool_keeps_live_data_mapped_in_place(
        cfg in config(),
        capacity in prop_oneof![Just(None), (16u64..160).prop_map(|m| Some(m * MIB))],
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let mut h = Harness::new(cfg, capacity);
        for o in &ops {
            h.apply(o);
        }
        h.pool.backend_mut().fences = Fences::Off;
        h.pool.backend_mut().capturing = false;
        let ids: Vec<Block> = h.live.values().map(|(b, _, _)| *b).collect();
        for b in ids {
            h.pool.free(b.id);
        }
        h.live.clear();
        h.pool.backend_mut().complete_all();
        h.pool.empty_cache();
        h.reclaimed();
        h.check();
        prop_assert_eq!(h.pool.pending_blocks(), 0);
        prop_assert_eq!(h.pool.stats().in_use_bytes.current, 0);
    }
}
