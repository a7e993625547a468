//! Unit tests of the VMM pool's rules on the simulated device.

use super::testing::SimulatedPages;
use super::*;
use crate::pool::testing::Fences;

fn pool() -> VmmPool<SimulatedPages> {
    VmmPool::new(SimulatedPages::new(), VmmConfig::default())
}

#[test]
fn neighbours_share_pages() {
    let mut p = pool();
    let a = p.allocate(3 * MIB).unwrap();
    let b = p.allocate(3 * MIB).unwrap();
    assert_eq!(b.addr, a.addr + 3 * MIB, "packed end to end");
    // 6 MiB over 2 MiB pages: 3 pages, not 4.
    assert_eq!(p.stats().reserved_bytes.current, 6 * MIB);
    assert_eq!(p.backend().held(), 6 * MIB);
    p.free(a.id);
    // The first page held only `a`: idle, kept (below keep_free).
    assert_eq!(p.stats().idle_bytes.current, 2 * MIB);
    assert_eq!(p.stats().in_use_bytes.current, 4 * MIB);
    assert_eq!(p.empty_cache(), 2 * MIB);
    assert_eq!(p.backend().held(), 4 * MIB);
}

#[test]
fn a_large_request_is_stitched_from_idle_pages() {
    let mut p = pool();
    // Four 4 MiB blocks, then every other one freed: 8 MiB idle, in two holes.
    let blocks: Vec<Block> = (0..4).map(|_| p.allocate(4 * MIB).unwrap()).collect();
    p.free(blocks[0].id);
    p.free(blocks[2].id);
    let live_handles: Vec<_> = [blocks[1], blocks[3]].iter().map(|b| p.backend().handle_at(b.addr).unwrap()).collect();
    // 8 MiB fits no hole: a new virtual block, backed by the four idle pages.
    let big = p.allocate(8 * MIB).unwrap();
    assert!(big.addr >= blocks[3].addr + 4 * MIB);
    assert_eq!(p.stats().reserved_bytes.peak, 16 * MIB, "no page created");
    assert_eq!(p.stats().num_remaps, 4);
    assert_eq!(p.stats().idle_bytes.current, 0);
    // The live blocks kept their pages.
    for (b, h) in [blocks[1], blocks[3]].iter().zip(live_handles) {
        assert_eq!(p.backend().handle_at(b.addr), Some(h));
    }
}

#[test]
fn small_requests_pack_into_their_own_pages() {
    let mut p = pool();
    // Whole pages: no room left in them.
    let large = p.allocate(4 * MIB).unwrap();
    let small: Vec<Block> = (0..64).map(|_| p.allocate(32 << 10).unwrap()).collect();
    // 64 x 32 KiB = 2 MiB: one small page, away from the large ranges.
    assert_eq!(p.stats().reserved_bytes.current, 4 * MIB + 2 * MIB);
    assert!(small.iter().all(|b| b.addr.abs_diff(large.addr) >= p.config().va_chunk));
    for b in &small {
        p.free(b.id);
    }
    p.free(large.id);
    assert_eq!(p.stats().allocated_bytes.current, 0);
    // The last small block freed is kept hot for the next request of its size.
    assert_eq!(p.hot_blocks().collect::<Vec<_>>(), vec![*small.last().unwrap()]);
    assert_eq!(p.stats().in_use_bytes.current, 2 * MIB, "its page");
    p.empty_cache();
    assert_eq!(p.stats().in_use_bytes.current, 0);
    assert_eq!(p.backend().held(), 0);
}

/// A small request that would need a page of its own takes the free end
/// of a page that a large block uses instead: 5 MiB leaves 1 MiB of its
/// third page free, which holds 32 blocks of 32 KiB; the other 64 fill one
/// small page. Without that, 96 of them took two small pages.
#[test]
fn small_requests_fill_the_free_ends_of_large_blocks_pages() {
    for (fill_scraps, pages) in [(true, 3 + 1), (false, 3 + 2)] {
        let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig { fill_scraps, ..VmmConfig::default() });
        let large = p.allocate(5 * MIB).unwrap();
        let small: Vec<Block> = (0..96).map(|_| p.allocate(32 << 10).unwrap()).collect();
        assert_eq!(p.stats().reserved_bytes.current, pages * 2 * MIB, "fill_scraps {fill_scraps}");
        let in_scrap = small.iter().filter(|b| b.addr.abs_diff(large.addr) < p.config().va_chunk).count();
        assert_eq!(in_scrap, if fill_scraps { 32 } else { 0 });
        if fill_scraps {
            assert_eq!(small[0].addr, large.addr + 5 * MIB, "right after it");
        }
        // Freed, they leave the large block's pages as they found them.
        small.iter().for_each(|b| p.free(b.id));
        p.free(large.id);
        p.empty_cache();
        assert_eq!((p.stats().allocated_bytes.current, p.backend().held()), (0, 0));
    }
}

/// A small block is placed so that it touches no more pages than it must:
/// one that would straddle a page boundary at the end of its hole starts at
/// the boundary, and the gap stays free for smaller blocks.
#[test]
fn a_small_block_that_would_straddle_two_pages_starts_at_the_next_one() {
    let mut p = pool();
    let a = p.allocate(MIB).unwrap();
    let b = p.allocate(192 << 10).unwrap();
    // At b's end, 1 MiB would cross into the second page: it starts there.
    let c = p.allocate(MIB).unwrap();
    assert_eq!(c.addr, a.addr + 2 * MIB);
    assert_eq!(p.block_pages(c.addr).unwrap().len(), 1);
    // The first page's tail stays free for blocks that fit in it, so once
    // c is gone one page holds every live block.
    p.free(c.id);
    let d = p.allocate(128 << 10).unwrap();
    assert_eq!(d.addr, b.addr + (192 << 10));
    assert_eq!(p.pages().filter(|pg| pg.refs > 0).count(), 1);
    // Where a hole would have it cross a boundary, a place on one page
    // that is in use already is taken instead; the hole stays free.
    let mut q = pool();
    let k = 512 << 10;
    let _a = q.allocate(MIB).unwrap();
    let _b = q.allocate(k).unwrap();
    let hole: Vec<Block> = (0..2).map(|_| q.allocate(k).unwrap()).collect();
    let e = q.allocate(k).unwrap();
    assert_eq!(q.pages().count(), 2);
    hole.iter().for_each(|h| q.free(h.id));
    let f = q.allocate(MIB).unwrap();
    assert_eq!(f.addr, e.addr + k, "past e, on e's page, not across the hole's 1.5..2.5 MiB");
    assert_eq!(q.block_pages(f.addr).unwrap().len(), 1);
    assert_eq!(q.pages().count(), 2, "no page made for it");
}

/// Small blocks whose size leaves much of a page over when kept within
/// one page (0.38 of a page: two to a page, 0.23 of it empty) pack end to
/// end across boundaries instead: twelve take five pages, not six.
#[test]
fn small_blocks_that_would_leave_much_of_a_page_empty_pack_across_boundaries() {
    let mut p = pool();
    let size = 806_400;
    assert!(size <= p.config().small_max);
    let blocks: Vec<Block> = (0..12).map(|_| p.allocate(size).unwrap()).collect();
    for pair in blocks.windows(2) {
        assert_eq!(pair[1].addr, pair[0].addr + size, "end to end");
    }
    assert_eq!(p.stats().reserved_bytes.current, 5 * 2 * MIB);
    // A size that packs a page nearly whole still keeps to one page.
    let mut q = pool();
    let quarter = (512 << 10) - 512;
    let c: Vec<Block> = (0..5).map(|_| q.allocate(quarter).unwrap()).collect();
    assert!(c.iter().all(|b| q.block_pages(b.addr).unwrap().len() == 1), "{c:?}");
}

/// A loop that allocates and frees one small size gets the same block back
/// without placing it again; a request that needs pages gives hot blocks up
/// first, so they never cost a page.
#[test]
fn a_small_block_freed_is_kept_hot_for_its_size() {
    let mut p = pool();
    let a = p.allocate(4096).unwrap();
    p.free(a.id);
    assert_eq!(p.lookup(a.addr), None, "freed, as the program sees it");
    assert_eq!(p.stats().allocated_bytes.current, 0);
    let b = p.allocate(4000).unwrap(); // the same rounded size
    assert_eq!((b.id, b.addr), (a.id, a.addr));
    let other = p.allocate(8192).unwrap();
    assert_ne!(other.addr, a.addr);
    p.free(b.id);
    p.free(other.id);
    assert_eq!(p.hot_blocks().count(), 2);
    p.free(b.id); // a double free of a hot block changes nothing
    assert_eq!(p.hot_blocks().count(), 2);
    // Only idle pages are given back: none, the hot blocks hold the page.
    assert_eq!(p.stats().idle_bytes.current, 0);
    // 3 MiB (large) needs new pages: the hot blocks go first, and their
    // page moves under it instead of a page being made.
    let big = p.allocate(3 * MIB).unwrap();
    assert_eq!(p.hot_blocks().count(), 0);
    assert_eq!(p.stats().num_page_creates, 2);
    assert_eq!(p.stats().num_remaps, 1);
    assert_eq!(p.stats().active_bytes.current, big.size);
}

#[test]
fn idle_pages_beyond_keep_free_are_given_back() {
    let cfg = VmmConfig { keep_free: 4 * MIB, window_ns: 0, ..VmmConfig::default() };
    let mut p = VmmPool::new(SimulatedPages::new(), cfg);
    let a = p.allocate(10 * MIB).unwrap();
    p.free(a.id);
    assert_eq!(p.stats().idle_bytes.current, 4 * MIB);
    assert_eq!(p.stats().reserved_bytes.current, 4 * MIB);
    assert_eq!(p.stats().num_page_releases, 3);
    assert_eq!(p.backend().held(), 4 * MIB);
}

#[test]
fn out_of_memory_undoes_the_attempt() {
    let dev = SimulatedPages::new().with_capacity(Some(6 * MIB));
    let mut p = VmmPool::new(dev, VmmConfig::default());
    let a = p.allocate(3 * MIB).unwrap();
    assert_eq!(p.allocate(6 * MIB), Err(OutOfMemory));
    assert_eq!(p.stats().num_ooms, 1);
    assert_eq!(p.stats().allocation.current, 1);
    assert_eq!(p.stats().in_use_bytes.current, 4 * MIB);
    // The page the failed attempt made went back; the next request is served.
    assert_eq!(p.backend().held(), 4 * MIB);
    let b = p.allocate(MIB + 512).unwrap();
    p.free(a.id);
    p.free(b.id);
    assert_eq!(p.stats().in_use_bytes.current, 0);
    assert!(p.backend().held() <= 6 * MIB);
}

#[test]
fn pytorch_expandable_keeps_pages_where_they_were() {
    let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig::pytorch_expandable());
    let a = p.allocate(30 * MIB).unwrap();
    assert_eq!(p.stats().reserved_bytes.current, 40 * MIB, "two 20 MiB pages");
    p.free(a.id);
    let b = p.allocate(50 * MIB).unwrap();
    // The hole is at the start of the range: the block takes it and grows it.
    assert_eq!(b.addr, a.addr);
    assert_eq!(p.stats().reserved_bytes.current, 60 * MIB);
    assert_eq!(p.stats().num_remaps, 0);
    p.free(b.id);
    assert_eq!(p.stats().reserved_bytes.current, 60 * MIB, "only empty_cache gives back");
    assert_eq!(p.empty_cache(), 60 * MIB);
}

#[test]
fn lookup_finds_the_block_containing_an_address() {
    let mut p = pool();
    let a = p.allocate(4 * MIB - 1).unwrap();
    let b = p.allocate(1000).unwrap();
    let found = |p: &VmmPool<SimulatedPages>, addr| p.lookup(addr).map(|i| (i.id, i.addr, i.size, i.requested));
    assert_eq!(found(&p, a.addr), Some((a.id, a.addr, a.size, 4 * MIB - 1)));
    assert_eq!(found(&p, a.addr + 4 * MIB - 1), Some((a.id, a.addr, a.size, 4 * MIB - 1)));
    assert_eq!(found(&p, a.addr + 4 * MIB), None);
    assert_eq!(found(&p, b.addr + 512), Some((b.id, b.addr, 1024, 1000)));
    assert_eq!(found(&p, 0), None);
    let info = p.lookup(b.addr).unwrap();
    assert_eq!((info.segment_size, b.addr - info.segment_addr < info.segment_size), (p.config().va_chunk, true));
    p.free(a.id);
    assert_eq!(p.lookup(a.addr), None);
    assert_eq!(p.live_blocks().collect::<Vec<_>>(), [b]);
}

#[test]
fn double_free_is_ignored() {
    let mut p = pool();
    let a = p.allocate(100).unwrap();
    p.free(a.id);
    p.free(a.id);
    assert_eq!(p.stats().allocation.current, 0);
}

#[test]
fn idle_pages_up_to_the_recent_high_water_mark_stay() {
    let s = 1_000_000_000;
    let cfg = VmmConfig { keep_free: 2 * MIB, window_ns: s, ..VmmConfig::default() };
    let mut p = VmmPool::new(SimulatedPages::new(), cfg);
    let a = p.allocate(20 * MIB).unwrap();
    let small = p.allocate(MIB).unwrap();
    // A loop: the same 20 MiB every half second. Its pages stay.
    for i in 1..6 {
        p.free(a.id);
        assert_eq!(p.stats().reserved_bytes.current, 22 * MIB, "iteration {i}");
        p.backend_mut().now = i * s / 2;
        let b = p.allocate(20 * MIB).unwrap();
        assert_eq!(b.addr, a.addr);
    }
    assert_eq!(p.stats().num_page_creates, 11);
    let a = p.live_blocks().find(|b| b.size == 20 * MIB).unwrap();
    // The loop ends: within two windows, the pages beyond keep_free go back.
    p.free(a.id);
    p.backend_mut().now += 2 * s;
    p.free(small.id);
    assert_eq!(p.stats().idle_bytes.current, 2 * MIB);
    assert_eq!(p.stats().reserved_bytes.current, 2 * MIB);
}

#[test]
fn validate_clamps() {
    let c = VmmConfig { small_max: 0, small_page: 1, large_page: 20 * MIB + 1, va_chunk: 0, ..VmmConfig::default() }
        .validate();
    assert_eq!((c.small_max, c.small_page, c.large_page), (512, 64 << 10, 20 * MIB + (64 << 10)));
    assert_eq!(c.va_chunk % c.large_page, 0);
    assert!(c.va_chunk >= 1 << 30);
    assert_eq!(VmmConfig::default().validate(), VmmConfig::default());
    assert_eq!(VmmConfig::pytorch_expandable().validate(), VmmConfig::pytorch_expandable());
}

#[test]
fn a_refused_map_or_grant_fails_the_request_and_leaves_no_page_ungranted() {
    for refuse_maps in [true, false] {
        let mut p = pool();
        let a = p.allocate(3 * MIB).unwrap();
        p.free(a.id); // two idle pages, mapped and granted
        let before = p.backend().granted.len();
        p.backend_mut().refuse_maps = refuse_maps;
        p.backend_mut().refuse_grants = !refuse_maps;
        assert!(p.allocate(9 * MIB).is_err(), "refuse_maps {refuse_maps}");
        // Whatever was mapped for the failed request went back: an idle page
        // is either one granted before or none at all.
        let s = p.stats().clone();
        assert_eq!(s.in_use_bytes.current, 0);
        assert_eq!(s.reserved_bytes.current, p.backend().held());
        assert_eq!(s.reserved_bytes.current, s.idle_bytes.current);
        assert_eq!(s.num_maps - s.num_unmaps, p.pages().count() as u64);
        if !refuse_maps {
            assert_eq!(s.idle_bytes.current, 0, "pages mapped for a refused grant were kept");
        }
        // The device works again: the request is served and granted whole.
        p.backend_mut().refuse_maps = false;
        p.backend_mut().refuse_grants = false;
        let b = p.allocate(9 * MIB).unwrap();
        let granted = &p.backend().granted[before..];
        let end = b.addr + b.size;
        let covered = granted.iter().any(|&(g, n)| g <= b.addr && g + n >= end)
            || p.pages().filter(|pg| pg.addr < end && pg.addr + pg.size > b.addr).count() as u64 * 2 * MIB >= b.size; // pages that were already granted plus the new span
        assert!(covered);
        assert_eq!(p.stats().num_ooms, 1);
    }
}

#[test]
fn pending_blocks_keep_their_pages_until_their_work_completes() {
    use crate::pool::testing::Fences;
    let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig { keep_free: 0, window_ns: 0, ..VmmConfig::default() });
    // Live memory beside it, so the pending bytes are too small a share of
    // what is held to be worth waiting for (`wait_share`).
    let _live = p.allocate(64 * MIB).unwrap();
    p.backend_mut().fences = Fences::AtQueued;
    p.backend_mut().launch();
    let a = p.allocate(4 * MIB).unwrap();
    let handles = p.backend().handle_at(a.addr).unwrap();
    p.free(a.id);
    assert_eq!(p.pending_blocks(), 1);
    assert_eq!(p.stats().pending_bytes.current, 4 * MIB);
    assert_eq!(p.stats().in_use_bytes.current, 68 * MIB, "the pages stay in use");
    assert!(p.lookup(a.addr).is_none());
    // Another request cannot take those pages while the work runs: new ones.
    let b = p.allocate(4 * MIB).unwrap();
    assert_ne!(b.addr, a.addr);
    assert_eq!(p.backend().handle_at(a.addr), Some(handles));
    assert_eq!(p.stats().num_remaps, 0);
    // Once it completes, the next request that needs pages reclaims them.
    p.backend_mut().complete_all();
    p.free(b.id);
    let c = p.allocate(8 * MIB).unwrap();
    assert_eq!(p.pending_blocks(), 0, "{:?}", c);
    assert_eq!(p.stats().reserved_bytes.peak, 72 * MIB, "both blocks' pages were reused");
    assert_eq!(p.stats().num_waits + p.stats().num_syncs, 0);
}

#[test]
fn a_forgotten_pool_holds_nothing_tells_the_device_nothing_and_keeps_its_books() {
    let mut p = pool();
    let a = p.allocate(3 * MIB).unwrap();
    let b = p.allocate(100).unwrap();
    let held = p.backend().held();
    p.forget();
    assert_eq!(p.backend().held(), held, "no call: the memory died with its context");
    assert_eq!(p.pages().count(), 0);
    assert_eq!(p.stats().reserved_bytes.current, 0);
    assert!(p.allocate(100).is_err());
    // Frees of its blocks still balance the books.
    p.free(a.id);
    p.free(b.id);
    assert_eq!(p.stats().allocation.current, 0);
    assert_eq!(p.stats().allocated_bytes.current, 0);
}

#[test]
fn a_hole_with_its_pages_mapped_wins_over_a_tighter_one_without() {
    let mut p = pool();
    let x1 = p.allocate(6 * MIB).unwrap();
    let _x2 = p.allocate(2 * MIB).unwrap();
    let x3 = p.allocate(4 * MIB).unwrap();
    let _x4 = p.allocate(2 * MIB).unwrap();
    p.free(x3.id);
    assert_eq!(p.empty_cache(), 4 * MIB, "x3's hole is unmapped");
    p.free(x1.id); // a 6 MiB hole whose pages stay mapped (idle)
    let (creates, maps) = (p.stats().num_page_creates, p.stats().num_maps);
    let b = p.allocate(4 * MIB).unwrap();
    assert_eq!(b.addr, x1.addr, "placed on mapped pages, not in the tighter unmapped hole");
    assert_eq!((p.stats().num_page_creates, p.stats().num_maps), (creates, maps), "no driver call");
}

#[test]
fn a_miss_behind_pending_frees_orders_them_and_reuses_their_pages_in_place() {
    use crate::pool::testing::Fences;
    let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig { keep_free: 0, window_ns: 0, ..VmmConfig::default() });
    let a = p.allocate(8 * MIB).unwrap();
    // Three 4 MiB holes between live 2 MiB blocks: idle pages, but each
    // hole too small for the request below.
    let holes: Vec<Block> = (0..3)
        .map(|_| {
            let h = p.allocate(4 * MIB).unwrap();
            p.allocate(2 * MIB).unwrap();
            h
        })
        .collect();
    p.backend_mut().barrier = true; // waits order work on the GPU, they do not finish it
    p.backend_mut().launch();
    for h in &holes {
        p.free(h.id); // no fence needed for reuse, but their pages cool
    }
    assert_eq!(p.stats().idle_bytes.current, 12 * MIB);
    p.backend_mut().fences = Fences::AtQueued;
    p.free(a.id);
    assert_eq!(p.pending_blocks(), 1);
    let creates = p.stats().num_page_creates;
    // The request fits only beyond the mapped pages, and the idle ones cannot
    // move yet: the pending block is ordered behind instead and its pages
    // are used where they are.
    let b = p.allocate(8 * MIB).unwrap();
    assert_eq!(b.addr, a.addr);
    assert_eq!(p.stats().num_page_creates, creates, "no page created");
    assert_eq!((p.stats().num_waits, p.stats().num_remaps), (1, 0));
    assert!(p.backend().unmapped.is_empty(), "nothing unmapped while the work may run");
}

/// Several streams, the GPU behind: a block freed before queued work is
/// reused where it was freed once the GPU can be told to order later work
/// behind it (no waiting, no page made), at most once per `order_every_ns`;
/// otherwise the request lands in another hole and the layout drifts.
#[test]
fn pending_frees_are_ordered_behind_before_placing_where_the_gpu_can_order_them() {
    let placed = |order_every_ns: Option<u64>| {
        let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig { keep_free: u64::MAX, ..VmmConfig::default() });
        let a = p.allocate(4 * MIB).unwrap();
        p.allocate(2 * MIB).unwrap();
        let h = p.allocate(6 * MIB).unwrap();
        p.allocate(2 * MIB).unwrap();
        p.free(h.id); // a 6 MiB hole of mapped pages, free at once
        p.backend_mut().fences = Fences::AtQueued;
        p.backend_mut().order_every_ns = order_every_ns;
        p.backend_mut().launch();
        p.free(a.id);
        assert_eq!(p.pending_blocks(), 1);
        let b = p.allocate(4 * MIB).unwrap();
        let s = p.stats();
        assert_eq!((s.num_page_creates, s.num_waits, s.num_syncs), (7, 0, 0), "no page made, no wait");
        (b.addr == a.addr, b.addr == h.addr, p)
    };
    let (at_a, _, mut p) = placed(Some(1000));
    assert!(at_a, "ordered behind: reused where it was freed");
    assert_eq!((p.pending_blocks(), p.backend().orders), (0, 1));
    assert!(p.backend().unmapped.is_empty(), "its pages are not unmapped while the work may run");
    // Within the interval the next free stays pending; after it, it is ordered.
    let c = p.allocate(MIB).unwrap();
    p.backend_mut().launch();
    p.free(c.id);
    p.allocate(MIB).unwrap();
    assert_eq!((p.pending_blocks(), p.backend().orders), (1, 1));
    p.backend_mut().now += 1000;
    p.allocate(MIB).unwrap();
    assert_eq!((p.pending_blocks(), p.backend().orders), (0, 2));
    let (_, at_h, _) = placed(None);
    assert!(at_h, "not ordered: the request takes the other hole, the freed one waits");
}

#[test]
fn block_pages_are_the_mapped_pages_under_a_block() {
    let mut p = pool();
    let a = p.allocate(3 * MIB).unwrap();
    let b = p.allocate(3 * MIB).unwrap();
    let small = p.allocate(1000).unwrap();
    let addrs = |pages: Vec<PageInfo>| pages.iter().map(|pg| (pg.addr, pg.size)).collect::<Vec<_>>();
    assert_eq!(addrs(p.block_pages(a.addr).unwrap()), [(a.addr, 2 * MIB), (a.addr + 2 * MIB, 2 * MIB)]);
    // b starts inside a's second page and shares it.
    let under_b = p.block_pages(b.addr + 5).unwrap();
    assert_eq!(addrs(under_b.clone()), [(a.addr + 2 * MIB, 2 * MIB), (a.addr + 4 * MIB, 2 * MIB)]);
    for pg in &under_b {
        assert_eq!(Some((pg.addr, pg.handle)), p.backend().handle_at(pg.addr + 1));
    }
    assert_eq!(p.block_pages(small.addr).unwrap().len(), 1);
    p.free(a.id);
    assert_eq!(p.block_pages(a.addr), None, "a freed block has no pages to share");
}

/// `cycle_regret_ns` (the shim's settings): what a program frees in bulk
/// goes back at once; a size it frees and allocates again within the regret
/// time keeps its pages from then on; a bulk free of another size after that
/// still goes back. The replay's four phases of `tests/fake/pool_give_back.c`.
#[test]
fn bulk_frees_go_back_and_cycling_sizes_stay() {
    let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig::shim_default());
    let bulk: Vec<Block> = (0..8).map(|_| p.allocate(64 * MIB).unwrap()).collect();
    for b in &bulk {
        p.free(b.id);
    }
    assert_eq!(p.backend().held(), 0, "a bulk free goes back");
    for round in 0..3 {
        let b = p.allocate(64 * MIB).unwrap();
        p.free(b.id);
        assert_eq!(p.backend().held(), 64 * MIB, "round {round}: a size regrown within a second stays");
    }
    assert_eq!(p.stats().num_page_creates, 8 * 32 + 32, "pages made for the bulk and once for the loop");
    let other: Vec<Block> = (0..4).map(|_| p.allocate(96 * MIB).unwrap()).collect();
    for b in &other {
        p.free(b.id);
    }
    // The kept pages went into the 96 MiB blocks (no page is made while
    // one is idle) and back with them: 96 MiB is not a size that cycles.
    assert_eq!(p.backend().held(), 0);
    assert_eq!(p.empty_cache(), 0);
}

#[test]
fn a_size_allocated_again_after_the_regret_time_is_not_kept() {
    let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig::shim_default());
    let a = p.allocate(8 * MIB).unwrap();
    p.free(a.id);
    p.backend_mut().now += 2_000_000_000;
    let a = p.allocate(8 * MIB).unwrap();
    p.free(a.id);
    assert_eq!(p.backend().held(), 0, "two seconds apart: not a cycle");
}

#[test]
fn doomed_pages_wait_for_the_gpu_before_they_go() {
    let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig { keep_free: u64::MAX, ..VmmConfig::shim_default() });
    let a = p.allocate(4 * MIB).unwrap();
    p.backend_mut().fences = Fences::AtQueued;
    p.backend_mut().launch();
    p.free(a.id);
    // The free waits for its fence; then its pages cool until the work is done.
    assert_eq!(p.backend().held(), 4 * MIB);
    p.backend_mut().complete_all();
    p.backend_mut().fences = Fences::Off;
    // The next free (no work behind it) reclaims the first and gives both back.
    let b = p.allocate(MIB).unwrap();
    p.free(b.id);
    assert_eq!(p.backend().held(), 0, "given back once the GPU finished");
    assert!(p.backend().unmapped.iter().all(|&(_, done)| done >= 1), "no page unmapped under queued work");
}

/// A loop whose shapes change from one iteration to the next (eight
/// sequence lengths) cycles through a few page-count keys, not eight sizes:
/// once each key has come back within a second, nothing goes back.
#[test]
fn a_loop_of_varying_shapes_keeps_its_pages() {
    let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig::shim_default());
    let mut released_by = Vec::new();
    for i in 0..16u64 {
        // 40..54 MiB: 20..27 pages, two keys (20..23 and 24..27 pages).
        let b = p.allocate((40 + (i * 7 % 8) * 2) * MIB).unwrap();
        p.free(b.id);
        released_by.push(p.stats().num_page_releases);
    }
    // Exact sizes would each go back once before they cycle: ~190 pages.
    assert!(released_by[7] <= 3 * 27, "{released_by:?}");
    assert_eq!(released_by[7], released_by[15], "the second pass of the eight shapes gives nothing back");
    assert!(p.backend().held() > 0, "the loop's pages stay");
}

/// With the GPU behind (one stream: reuse is ordered, unmapping is not) and
/// the device full, a page freed under queued work serves a new block
/// elsewhere at once: it is mapped there while its old mapping stays, as a
/// ghost, until that work is done.
#[test]
fn a_cooling_page_serves_a_new_block_while_its_ghost_waits_for_the_gpu() {
    let mut p = VmmPool::new(SimulatedPages::new().with_capacity(Some(6 * MIB)), VmmConfig::default());
    let a = p.allocate(2 * MIB).unwrap();
    let b = p.allocate(2 * MIB).unwrap();
    let handle = p.backend().handle_at(a.addr).unwrap().1;
    p.backend_mut().launch();
    p.free(a.id); // idle, cooling: the launched work may still touch it
    assert_eq!(p.stats().cooling_bytes.current, 2 * MIB);
    // 4 MiB fits no hole with pages: a new place, one page made (the
    // device's last), the cooling one taken for the other.
    let c = p.allocate(4 * MIB).unwrap();
    assert_eq!(p.stats().num_page_creates, 3);
    assert_eq!(p.stats().num_aliases, 1);
    assert_eq!(p.stats().num_syncs, 0, "no wait for the GPU");
    assert_eq!(p.backend().ghosts().get(&a.addr), Some(&handle), "still mapped where the work may touch it");
    let under_c = [c.addr, c.addr + 2 * MIB].map(|x| p.backend().handle_at(x).unwrap().1);
    assert!(under_c.contains(&handle));
    assert!(p.backend().unmapped.is_empty(), "nothing unmapped under queued work");
    // Once the work is done, the ghost goes (at the next page decision).
    p.backend_mut().complete_all();
    p.free(b.id);
    p.empty_cache();
    assert!(p.backend().ghosts().is_empty());
    assert!(p.backend().unmapped.iter().all(|&(_, done)| done >= 1), "unmapped only after the work");
    p.free(c.id);
    assert_eq!(p.empty_cache(), 4 * MIB);
    assert_eq!(p.backend().held(), 0);
}

/// A page that would set a new peak is a cooling page taken instead, its
/// old mapping a ghost until the work queued before it went idle finished.
/// A block placed over that ghost waits for that work only, not for
/// everything queued since.
#[test]
fn a_page_that_would_set_a_new_peak_is_a_cooling_page_taken_instead() {
    const GIB: u64 = 1 << 30;
    let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig { va_chunk: GIB, ..VmmConfig::default() });
    let a = p.allocate(2 * MIB).unwrap();
    let _b = p.allocate(2 * MIB).unwrap();
    p.backend_mut().launch();
    // a's page cools: the work just queued may still touch it.
    p.free(a.id);
    // 4 MiB fits no hole with pages: of its two pages, one is a's, taken.
    let _c = p.allocate(4 * MIB).unwrap();
    assert_eq!((p.stats().num_page_creates, p.stats().num_aliases), (3, 1));
    assert_eq!(p.stats().reserved_bytes.peak, 6 * MIB, "not 8");
    assert_eq!(p.backend().ghosts().len(), 1);
    // Newer work. With the rest of the range taken, the one hole left is the
    // ghost's: the block there waits for the work before a's free, not the
    // newer work.
    p.backend_mut().launch();
    let _rest = p.allocate(GIB - 8 * MIB).unwrap();
    let again = p.allocate(2 * MIB).unwrap();
    assert_eq!(again.addr, a.addr);
    assert_eq!(p.stats().num_ghost_waits, 1);
    assert_eq!((p.backend().completed, p.backend().queued), (1, 2), "only the ghost's work waited for");
    assert!(p.backend().ghosts().is_empty());
}

/// Below its peak the pool makes a page rather than move a cooling one: a
/// move costs driver calls every time, and a ghost may make a block wait.
#[test]
fn below_its_peak_the_pool_makes_pages_beside_cooling_ones() {
    let mut p = pool();
    let big = p.allocate(8 * MIB).unwrap();
    p.free(big.id);
    p.empty_cache();
    let x = p.allocate(2 * MIB).unwrap();
    let _w = p.allocate(2 * MIB).unwrap();
    p.backend_mut().launch();
    p.free(x.id);
    // A reset of the peak statistics (`cupool.track_peak` makes one per
    // call) does not lower the mark that moves are weighed against.
    p.reset_peak_stats();
    let _y = p.allocate(4 * MIB).unwrap(); // 4 + 4 MiB: the old peak, not past it
    assert_eq!(p.stats().num_aliases, 0);
    assert_eq!(p.stats().reserved_bytes.current, 8 * MIB);
    assert_eq!(p.stats().cooling_bytes.current, 2 * MIB);
}

/// The first range full (a, b, then the rest), a freed, then a second
/// range whole on a device one page short of both: a's cooling page is
/// taken for it, and a ghost stays where a was. Then b is freed.
fn ghost_beside_a_free_page(limit: u64) -> (VmmPool<SimulatedPages>, Block, Block) {
    const GIB: u64 = 1 << 30;
    let pages = SimulatedPages::new().with_capacity(Some(2 * GIB - 2 * MIB));
    let mut p = VmmPool::new(pages, VmmConfig { va_chunk: GIB, limit, ..VmmConfig::default() });
    let a = p.allocate(2 * MIB).unwrap();
    let b = p.allocate(2 * MIB).unwrap();
    let _rest = p.allocate(GIB - 4 * MIB).unwrap();
    p.backend_mut().launch();
    p.free(a.id);
    let _second = p.allocate(GIB).unwrap();
    assert_eq!(p.stats().num_aliases, 1);
    assert_eq!(p.backend().ghosts().len(), 1);
    p.free(b.id);
    (p, a, b)
}

/// Under a cap or not, the block goes where b's page is still mapped, past
/// the ghost: no wait, no page made, and the ghost waits for its work alone.
/// (It fails if placement ignores the ghost or weighs one place per hole.)
#[test]
fn a_block_that_would_wait_for_a_ghost_takes_a_freed_page_in_place() {
    for limit in [2 * (1 << 30) - 2 * MIB, u64::MAX] {
        let (mut p, _, b) = ghost_beside_a_free_page(limit);
        let creates = p.stats().num_page_creates;
        let again = p.allocate(2 * MIB).unwrap();
        assert_eq!(again.addr, b.addr);
        assert_eq!(p.stats().num_ghost_waits, 0);
        assert_eq!(p.stats().num_page_creates, creates);
        assert_eq!(p.backend().completed, 0, "nothing waited for the GPU");
        assert_eq!(p.backend().ghosts().len(), 1);
    }
}

/// Going past a ghost must not cost pages: a block whose place over the
/// ghost would share a mapped page with a live neighbour waits for the GPU
/// rather than start past the ghost on two unmapped pages.
#[test]
fn a_block_that_would_lack_more_pages_past_a_ghost_waits_for_it() {
    const GIB: u64 = 1 << 30;
    let page = 2 * MIB;
    let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig { va_chunk: GIB + 4 * page, ..VmmConfig::default() });
    // Range 1: pages 0..=508 live, then P (1.5 MiB) at page 509 and G (2 MiB) on page 510.
    let _l = p.allocate(GIB - 3 * page).unwrap();
    let _p = p.allocate(3 * MIB / 2).unwrap();
    let g = p.allocate(page).unwrap();
    p.backend_mut().launch();
    p.free(g.id);
    // A new range at the peak takes G's cooling page 510 (a ghost stays), then fills up.
    let _z = p.allocate(8 * page).unwrap();
    assert_eq!(p.stats().num_aliases, 1);
    let _w = p.allocate(GIB + 4 * page - 8 * page).unwrap();
    // Over the ghost, 2.5 MiB lacks one page (509 is mapped); past it, two.
    let again = p.allocate(5 * MIB / 2).unwrap();
    assert_eq!(again.addr, _p.addr + _p.size, "right after P, over the ghost");
    assert_eq!(p.stats().num_ghost_waits, 1);
    assert!(p.backend().ghosts().is_empty());
}

/// Pages are interchangeable: a request larger than the blocks pending on
/// queued work still orders them behind (a GPU-side barrier) and takes their
/// pages, creating only the rest.
#[test]
fn pending_blocks_smaller_than_a_request_still_give_it_their_pages() {
    let mut p = pool();
    let a = p.allocate(4 * MIB).unwrap();
    p.backend_mut().fences = Fences::AtQueued;
    p.backend_mut().barrier = true;
    p.backend_mut().launch();
    p.free(a.id);
    assert_eq!(p.stats().pending_bytes.current, 4 * MIB);
    let b = p.allocate(8 * MIB).unwrap();
    assert_eq!(p.pending_blocks(), 0);
    assert_eq!(p.stats().num_waits, 1, "ordered behind by a barrier, no host wait");
    assert_eq!(p.stats().num_syncs, 0);
    assert_eq!(p.stats().reserved_bytes.peak, 8 * MIB, "two pages reused, two created");
    assert_eq!(p.backend().completed, 0, "the work itself still runs");
    p.free(b.id);
}

/// The peak breakdown says what held the pages when they peaked: the live
/// blocks (the one that made the pool grow included), a block freed under
/// queued work with several streams in use (pending), and a page that went
/// idle under queued work with one stream (cooling).
#[test]
fn the_peak_breakdown_names_pending_and_cooling_pages() {
    // Without aliasing, the cooling page stays beside the new ones.
    let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig { alias_cooling: false, ..VmmConfig::default() });
    // Live memory beside them, so the pending bytes are too small a share
    // of what is held to be worth waiting for (`wait_share`).
    let _live = p.allocate(64 * MIB).unwrap();
    let a = p.allocate(2 * MIB).unwrap();
    let b = p.allocate(2 * MIB).unwrap();
    p.backend_mut().launch();
    p.free(a.id); // one stream: a's page idles at once, cooling
    p.backend_mut().fences = Fences::AtQueued;
    p.free(b.id); // several streams: b waits for its fence
    let _c = p.allocate(4 * MIB).unwrap();
    let peak = p.stats().at_peak;
    let expected =
        PeakBreakdown { reserved: 72 * MIB, allocated: 68 * MIB, pending: 2 * MIB, idle: 2 * MIB, cooling: 2 * MIB };
    assert_eq!(peak, expected);
    assert_eq!(p.stats().reserved_bytes.peak, 72 * MIB);
}

/// A request whose best place already has idle pages under it cannot also
/// move those pages under its missing ones: pending frees are reclaimed
/// for the difference instead of pages being made.
#[test]
fn idle_pages_under_a_placement_do_not_count_as_movable() {
    let mut p = pool();
    // Teach the pool that the (empty) GPU timeline is finished, so that a
    // page freed untagged is idle at once rather than cooling.
    let e = p.allocate(2 * MIB).unwrap();
    p.free(e.id);
    p.empty_cache();
    p.backend_mut().fences = Fences::AtQueued;
    let a = p.allocate(4 * MIB).unwrap();
    let b = p.allocate(4 * MIB).unwrap();
    let c = p.allocate(4 * MIB).unwrap();
    p.backend_mut().fences = Fences::Off;
    p.free(c.id); // idle at once: two pages at the end of the range
    assert_eq!((p.stats().idle_bytes.current, p.stats().cooling_bytes.current), (4 * MIB, 0));
    p.backend_mut().fences = Fences::AtQueued;
    p.free(b.id); // pending (its work is done: nothing was launched)
    p.free(a.id);
    let held = p.backend().held();
    // 8 MiB goes where c was: two idle pages there, two missing. The idle
    // pages under it are no pages to move, so a and b are reclaimed (their
    // work is done) and the block goes where they were, on their pages.
    let big = p.allocate(8 * MIB).unwrap();
    assert_eq!(big.addr, a.addr);
    assert_eq!(p.backend().held(), held, "every page reused, none made");
    assert_eq!(p.pending_blocks(), 0);
}

/// A context that died takes its pages; hot blocks leave the books with
/// them, and blocks freed afterwards are not kept.
#[test]
fn a_forgotten_pool_keeps_no_hot_blocks() {
    let mut p = pool();
    let a = p.allocate(4096).unwrap();
    let b = p.allocate(8192).unwrap();
    p.free(a.id);
    assert_eq!(p.hot_blocks().count(), 1);
    p.forget();
    assert_eq!(p.hot_blocks().count(), 0);
    p.free(b.id);
    assert_eq!(p.hot_blocks().count(), 0);
    assert_eq!(p.stats().active_bytes.current, 0);
    assert_eq!(p.stats().allocated_bytes.current, 0);
}

/// A request the device cannot back fails with the GPU behind as with it
/// idle: the pages made for it were touched by no work, so they go back at
/// once instead of cooling, and what the device holds for the pool is what
/// it held before (else the next allocation outside the pool, or of another
/// process, fails for memory this one only tried to use).
#[test]
fn a_failed_request_gives_back_the_pages_it_made_at_once_with_the_gpu_behind() {
    let mut p = VmmPool::new(SimulatedPages::new().with_capacity(Some(64 * MIB)), VmmConfig::default());
    let a = p.allocate(3 * MIB).unwrap();
    p.backend_mut().launch();
    p.free(a.id); // its pages cool
    p.backend_mut().launch();
    let (held, reserved) = (p.backend().held(), p.stats().reserved_bytes.current);
    let peaks = p.stats().clone();
    assert_eq!(p.allocate(64 * MIB + 1), Err(OutOfMemory));
    assert_eq!(p.backend().held(), held, "the failed attempt's pages went back");
    assert_eq!(p.stats().reserved_bytes.current, reserved);
    // Nor is it the pool's peak: no block used those pages.
    assert_eq!(p.stats().reserved_bytes.peak, peaks.reserved_bytes.peak);
    assert_eq!(p.stats().in_use_bytes.peak, peaks.in_use_bytes.peak);
    assert_eq!(p.stats().at_peak, peaks.at_peak);
    assert_eq!(p.stats().in_use_bytes.current, 0);
    assert_eq!(p.stats().idle_bytes.current, reserved, "idle, cooling ones included, is all that is held");
    let b = p.allocate(60 * MIB).unwrap();
    p.free(b.id);
}

/// A block that needs far more pages than the pool could have (idle pages
/// and what the device has free), or more than the device has beside the
/// pages in use, fails before a page is made, as `cudaMalloc` fails at
/// once; close to what looks free, the pages are tried and the device decides.
#[test]
fn a_request_far_beyond_the_device_fails_before_any_page_is_made() {
    const GIB: u64 = 1 << 30;
    let mut p = VmmPool::new(SimulatedPages::new().with_capacity(Some(GIB)), VmmConfig::default());
    let a = p.allocate(100 * MIB).unwrap();
    p.free(a.id);
    let before = p.stats().clone();
    let made = before.num_page_creates;
    assert_eq!(p.allocate(2 * GIB), Err(OutOfMemory));
    assert_eq!(p.stats().num_page_creates, made, "no page made for a request twice the device");
    // Nor anything else changed: no page moved, none counted, no peak.
    let expected = VmmStats { num_ooms: before.num_ooms + 1, va_reserved_bytes: p.stats().va_reserved_bytes, ..before };
    assert_eq!(p.stats(), &expected);
    // Past the device's total beside the pages in use: never tried.
    assert_eq!(p.allocate(GIB + 32 * MIB), Err(OutOfMemory));
    assert_eq!(p.stats().num_page_creates, made, "more than the device has");
    // Another process holds a quarter of the device. Within a sixteenth of
    // what looks free (it may be freeing memory) the device is asked; far
    // beyond, it is not.
    p.empty_cache();
    p.backend_mut().others = GIB / 4;
    let made = p.stats().num_page_creates;
    assert_eq!(p.allocate(GIB * 3 / 4 + 32 * MIB), Err(OutOfMemory));
    assert!(p.stats().num_page_creates > made, "within a sixteenth, the device is asked");
    let made = p.stats().num_page_creates;
    assert_eq!(p.allocate(GIB * 7 / 8), Err(OutOfMemory));
    assert_eq!(p.stats().num_page_creates, made, "beyond what looks free by more than a sixteenth");
    let b = p.allocate(GIB * 3 / 4 - 4 * MIB).unwrap();
    p.free(b.id);
    p.backend_mut().others = 0;
    assert_eq!(p.backend().held(), p.stats().reserved_bytes.current);
    let b = p.allocate(GIB - 4 * MIB).unwrap();
    p.free(b.id);
}

/// A pool as the shim makes it, whose frees wait for fences, with an 8 MiB
/// and a 256 MiB block behind queued work; and its `keep_free`.
fn small_and_big_behind_queued_work() -> (VmmPool<SimulatedPages>, Block, Block, u64) {
    let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig::shim_default());
    p.backend_mut().fences = Fences::AtQueued;
    let small = p.allocate(8 * MIB).unwrap();
    let big = p.allocate(256 * MIB).unwrap();
    p.backend_mut().launch();
    (p, small, big, VmmConfig::shim_default().keep_free)
}

/// With several streams a freed block waits for its fence, which only the
/// pool's next allocation looked at: CuPy's `free_all_blocks` of a 70 %
/// block, then a `cudaMallocAsync` of 70 %, failed under the pool on an
/// H200. Once frees whose pages would go back add up to more than the pool
/// keeps idle, the free waits for the GPU, as `cudaFree` would, and their
/// pages go back; fewer bytes, or a size the program cycles through, stay
/// pending without a wait.
#[test]
fn frees_behind_queued_work_go_back_once_they_add_up() {
    let (mut p, small, big, keep) = small_and_big_behind_queued_work();
    p.free(small.id);
    assert_eq!((p.pending_blocks(), p.stats().num_syncs), (1, 0), "a small free waits for its fence, not the GPU");
    p.free(big.id);
    assert_eq!(p.pending_blocks(), 0);
    assert_eq!(p.stats().num_syncs, 1, "{:?}", p.stats());
    assert!(p.backend().held() <= keep, "held {}", p.backend().held());
    // A size regrown within the regret time is kept: its next free does not wait.
    let again = p.allocate(256 * MIB).unwrap();
    p.backend_mut().launch();
    p.free(again.id);
    assert_eq!((p.pending_blocks(), p.stats().num_syncs), (1, 1), "{:?}", p.stats());
    // Many small frees (PyTorch's `empty_cache` of 20 MiB segments) add up.
    let parts: Vec<Block> = (0..8).map(|_| p.allocate(20 * MIB).unwrap()).collect();
    p.backend_mut().launch();
    let syncs = p.stats().num_syncs;
    for (n, b) in parts.iter().enumerate() {
        p.free(b.id);
        let waited = p.stats().num_syncs > syncs;
        assert_eq!(waited, (n + 1) as u64 * 20 * MIB > keep, "after {} frees: {:?}", n + 1, p.stats());
        if waited {
            break;
        }
    }
    assert_eq!(p.pending_blocks(), 0, "{:?}", p.stats());
}

/// The same rule with the wait left to the pool's owner (the shim waits with
/// the pool's lock let go): the free asks for it and waits for nothing
/// itself; once the owner has waited, `after_gpu_wait` reclaims the blocks
/// and their pages go back.
#[test]
fn a_free_can_leave_its_wait_to_the_owner() {
    let (mut p, small, big, keep) = small_and_big_behind_queued_work();
    assert!(!p.free_asking_wait(small.id), "a small free waits for its fence, not the GPU");
    assert!(p.free_asking_wait(big.id));
    assert_eq!((p.pending_blocks(), p.stats().num_syncs), (2, 0), "the pool waited for nothing itself");
    assert!(p.backend().held() > keep);
    assert!(p.backend_mut().synchronize());
    p.after_gpu_wait();
    assert_eq!((p.pending_blocks(), p.stats().num_syncs), (0, 1), "{:?}", p.stats());
    assert!(p.backend().held() <= keep, "held {}", p.backend().held());
}

/// One stream, the GPU behind: a bulk free's pages cool before they can go
/// back. The free asks its owner to wait for the GPU instead of waiting
/// itself (the shim waits with the pool's lock let go), and the pages go
/// back once it has; `free` still waits on its own.
#[test]
fn a_bulk_free_of_cooling_pages_leaves_its_wait_to_the_owner() {
    let keep = VmmConfig::shim_default().keep_free;
    let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig::shim_default());
    let big = p.allocate(256 * MIB).unwrap();
    p.backend_mut().launch();
    assert!(p.free_asking_wait(big.id));
    assert_eq!((p.pending_blocks(), p.stats().num_syncs), (0, 0), "freed at once, and no wait by the pool");
    assert!(p.backend().held() > keep, "its pages cool: held {}", p.backend().held());
    assert!(p.backend_mut().synchronize());
    p.after_gpu_wait();
    assert!(p.backend().held() <= keep, "held {}", p.backend().held());
    assert_eq!(p.stats().num_syncs, 1);
    // `free` waits by itself, as before.
    let again = p.allocate(512 * MIB).unwrap();
    p.backend_mut().launch();
    p.free(again.id);
    assert!(p.backend().held() <= keep, "held {}", p.backend().held());
    assert_eq!(p.stats().num_syncs, 2);
}

/// A free whose pages would go back counts toward the wait rule
/// (`pending_unkept`) until its block is reclaimed. When its size comes to be
/// kept in between (the program cycles through it), the reclaim must still
/// take off what the free put on: it once asked the size again, found it
/// kept, took off nothing, and later frees waited for the GPU early.
#[test]
fn a_pending_free_counts_toward_the_wait_until_it_is_reclaimed_even_if_its_size_comes_to_be_kept() {
    let mut p = VmmPool::new(SimulatedPages::new(), VmmConfig::shim_default());
    p.backend_mut().fences = Fences::AtQueued;
    let keep = VmmConfig::shim_default().keep_free;
    let a = p.allocate(24 * MIB).unwrap();
    let x = p.allocate(4 * MIB).unwrap();
    // Freed later: of a size (class) of their own, and made now so that
    // making them does not wait for X.
    let more: Vec<Block> = (0..2).map(|_| p.allocate(20 * MIB).unwrap()).collect();
    assert_ne!(p.cycle_key(more[0].size, false), p.cycle_key(a.size, false));
    p.backend_mut().launch();
    p.free(a.id);
    p.backend_mut().launch();
    p.free(x.id);
    assert_eq!(p.pending_unkept, a.size + x.size, "both sizes are new: their pages would go back");
    // The program is seen to cycle through A's size: from now on it is kept.
    let key = p.cycle_key(a.size, false);
    p.cycles.gave_back(key, 0);
    p.cycles.regret_since(0);
    assert!(!p.goes_back(a.size, 0));
    // A's work completes, X's does not: A is reclaimed, X still waits.
    p.backend_mut().complete(1);
    p.reclaim_completed();
    assert_eq!(p.pending_blocks(), 1);
    assert_eq!(p.pending_unkept, x.size, "A's bytes are off the count, as they were put on");
    // So frees whose bytes, with X's, stay within `keep_free` do not wait
    // (with A's bytes still counted, the second one would).
    assert!(x.size + 2 * more[0].size <= keep && a.size + x.size + 2 * more[0].size > keep);
    p.backend_mut().launch();
    let asked: Vec<bool> = more.iter().map(|b| p.free_asking_wait(b.id)).collect();
    assert_eq!(asked, [false, false], "{:?}", p.stats());
    assert_eq!(p.pending_blocks(), 3, "X and both frees wait for their fences");
}

#[test]
fn a_process_short_of_address_space_gets_short_ranges_not_refusals() {
    // Room for less than one default range (64 GiB) of addresses.
    let mut dev = SimulatedPages::new();
    dev.address_space = Some(40 << 30);
    let mut p = VmmPool::new(dev, VmmConfig::default());
    let large = p.allocate(4 * MIB).expect("a large block in a short range");
    let small = p.allocate(4 << 10).expect("a small block in a short range");
    assert_eq!(p.stats().num_ooms, 0);
    // One refused 64 GiB range, then 1 GiB ranges: most addresses stay the program's.
    assert_eq!(p.stats().va_reserved_bytes, 2 << 30);
    let big = p.allocate(3 << 30).expect("a block larger than a short range gets its own");
    assert_eq!(p.stats().va_reserved_bytes, 5 << 30);
    // Addresses exhausted: a block no range can hold is refused, and counted.
    assert!(p.allocate(36 << 30).is_err());
    assert_eq!(p.stats().num_ooms, 1);
    for b in [large, small, big] {
        p.free(b.id);
    }
    assert_eq!(p.stats().allocation.current, 0);
}

#[test]
fn ranges_stay_whole_pages_aligned_to_segments_whatever_the_page_size() {
    // Pages of 64 KiB and of 20 MiB + 64 KiB: a range is a multiple of both
    // the page and SEGMENT_ALIGN (the simulated device refuses any other).
    for page in [64 << 10, 20 * MIB + (64 << 10)] {
        let mut dev = SimulatedPages::new();
        dev.address_space = Some(3 << 30);
        let config = VmmConfig { small_page: page, large_page: page, ..VmmConfig::default() };
        let mut p = VmmPool::new(dev, config);
        let blocks: Vec<Block> = [4 << 10, 3 * MIB, 1 << 30].iter().map(|&n| p.allocate(n).unwrap()).collect();
        for b in blocks {
            p.free(b.id);
        }
        // Too little room left for one more range: refused, never a misaligned one.
        let mut tight = SimulatedPages::new();
        tight.address_space = Some(3 * MIB / 2);
        let mut q = VmmPool::new(tight, config);
        assert!(q.allocate(4 << 10).is_err(), "page {page}");
    }
}
