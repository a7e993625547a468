//! Rounding, pools, best fit, splitting, coalescing, lookups.

use super::*;

#[test]
fn requests_round_up_to_512_bytes_and_zero_takes_512() {
    let mut p = pool(PoolConfig::default());
    assert_eq!(alloc(&mut p, 0).size, 512);
    assert_eq!(alloc(&mut p, 1).size, 512);
    assert_eq!(alloc(&mut p, 512).size, 512);
    assert_eq!(alloc(&mut p, 513).size, 1024);
    assert_eq!(p.stats().requested_bytes.current, 1026);
    assert_eq!(p.stats().allocated_bytes.current, 2560);
    assert_eq!(p.stats().segment.current, 1);
}

#[test]
fn small_and_large_requests_never_share_a_segment() {
    let mut p = pool(PoolConfig::default());
    let s = alloc(&mut p, MIB);
    let l = alloc(&mut p, MIB + 1);
    let segs = p.snapshot();
    assert_eq!(segs.len(), 2);
    assert!(segs[0].small && segs[0].size == 2 * MIB && segs[0].addr == s.addr);
    assert!(!segs[1].small && segs[1].size == 20 * MIB && segs[1].addr == l.addr);
    assert_eq!(p.stats().reserved_bytes_small.current, 2 * MIB);
    assert_eq!(p.stats().reserved_bytes_large.current, 20 * MIB);
    // The large segment has 19 MiB free, yet a small request takes the small one.
    let s2 = alloc(&mut p, 4 * KIB);
    assert_eq!(s2.addr, s.addr + MIB);
    // A second small request that does not fit makes a new small segment.
    let s3 = alloc(&mut p, MIB);
    assert_eq!(p.snapshot().len(), 3);
    assert!(p.lookup(s3.addr).is_some());
    assert_eq!(p.stats().segment.current, 3);
}

#[test]
fn segment_sizes_follow_the_threshold() {
    let mut p = pool(PoolConfig::default());
    assert_eq!(alloc(&mut p, 10 * MIB).size, 10 * MIB);
    assert_eq!(alloc(&mut p, 10 * MIB + 1).size, 10 * MIB + 512);
    assert_eq!(alloc(&mut p, 10 * MIB - 512).size, 10 * MIB - 512);
    let sizes: Vec<u64> = p.snapshot().iter().map(|s| s.size).collect();
    assert_eq!(sizes, [10 * MIB, 12 * MIB, 20 * MIB]);
}

#[test]
fn a_block_is_split_only_when_the_remainder_is_worth_keeping() {
    let mut p = pool(PoolConfig::default());
    // Large: remainder of 1 MiB - 512 is not worth keeping: whole block out.
    let a = alloc(&mut p, 19 * MIB + 1);
    assert_eq!(a.size, 20 * MIB);
    // Remainder of exactly 1 MiB is kept.
    let b = alloc(&mut p, 19 * MIB);
    assert_eq!(b.size, 19 * MIB);
    assert_eq!(states(&p)[1], [(19 * MIB, BlockState::Allocated), (MIB, BlockState::Free)]);
    assert_eq!(p.stats().inactive_split_bytes.current, MIB);
    assert_eq!(p.stats().inactive_split.current, 1);
    // Small: any remainder of at least 512 B is kept.
    let mut p = pool(PoolConfig { small_max: 2 * MIB, ..PoolConfig::default() });
    assert_eq!(alloc(&mut p, 2 * MIB - 512).size, 2 * MIB - 512);
    assert_eq!(alloc(&mut p, 512).size, 512);
    assert_eq!(p.snapshot().len(), 1);
}

// Splitting blocks above max_split_size would fragment big segments for good.
#[test]
fn oversize_blocks_serve_only_oversize_requests_that_waste_under_20_mib() {
    let mut p = pool(PoolConfig { max_split_size: 32 * MIB, ..PoolConfig::default() });
    let big = alloc(&mut p, 40 * MIB - 4 * MIB + 1); // rounded to a 38 MiB segment
    assert_eq!(big.size, 38 * MIB);
    free(&mut p, big);
    // Requests below max_split_size never take the oversize block.
    let a = alloc(&mut p, 2 * MIB);
    assert_ne!(a.addr, big.addr);
    let b = alloc(&mut p, 30 * MIB);
    assert_ne!(b.addr, big.addr);
    // An oversize request takes it whole if less than 20 MiB would be wasted.
    let c = alloc(&mut p, 33 * MIB);
    assert_eq!((c.addr, c.size), (big.addr, 38 * MIB));
    free(&mut p, c);
    // ... and not if 20 MiB or more would be.
    let mut q = pool(PoolConfig { max_split_size: 32 * MIB, ..PoolConfig::default() });
    let huge = alloc(&mut q, 60 * MIB);
    free(&mut q, huge);
    let d = alloc(&mut q, 40 * MIB);
    assert_ne!(d.addr, huge.addr);
    let e = alloc(&mut q, 41 * MIB);
    assert_eq!((e.addr, e.size), (huge.addr, 60 * MIB));
}

#[test]
fn best_fit_takes_the_smallest_hole_then_the_lowest_address() {
    let mut p = pool(PoolConfig::default());
    let v: Vec<Block> = (0..6).map(|_| alloc(&mut p, 64 * KIB)).collect();
    // Free 1 and 3 (64 KiB holes) and 5 (merges with the tail).
    free(&mut p, v[3]);
    free(&mut p, v[1]);
    free(&mut p, v[5]);
    let x = alloc(&mut p, 10 * KIB);
    assert_eq!(x.addr, v[1].addr, "equal holes: lowest address wins");
    let y = alloc(&mut p, 60 * KIB);
    assert_eq!(y.addr, v[3].addr, "the 64 KiB hole beats the 54 KiB one and the tail");
    let z = alloc(&mut p, 54 * KIB);
    assert_eq!(z.addr, v[1].addr + 10 * KIB);
}

#[test]
fn freed_neighbours_merge_whatever_the_order_of_the_frees() {
    for order in [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]] {
        let mut p = pool(PoolConfig::default());
        let v: Vec<Block> = (0..3).map(|_| alloc(&mut p, 100 * KIB)).collect();
        for i in order {
            free(&mut p, v[i]);
        }
        assert_eq!(states(&p), [[(2 * MIB, BlockState::Free)]]);
        assert_eq!(p.stats().inactive_split_bytes.current, 0);
        assert_eq!(p.stats().inactive_split_bytes.peak, 2 * MIB - 100 * KIB);
    }
}

// The shim answers cuMemGetAddressRange and frees by address: any byte of a live block must find it.
#[test]
fn lookup_finds_a_live_block_from_any_address_inside_it() {
    let mut p = pool(PoolConfig::default());
    let a = alloc(&mut p, 1000);
    let b = alloc(&mut p, 3 * MIB);
    let info = p.lookup(a.addr + 1023).unwrap();
    assert_eq!((info.id, info.addr, info.size, info.requested), (a.id, a.addr, 1024, 1000));
    assert_eq!((info.segment_addr, info.segment_size), (a.addr, 2 * MIB));
    assert!(p.lookup(a.addr + 1024).is_none(), "free tail");
    assert!(p.lookup(a.addr - 1).is_none());
    assert_eq!(p.lookup(b.addr + 3 * MIB - 1).unwrap().id, b.id);
    assert!(p.lookup(b.addr + 3 * MIB).is_none());
    assert!(p.lookup(b.addr + 20 * MIB).is_none());
    let mut live: Vec<u64> = p.live_blocks().map(|i| i.addr).collect();
    live.sort();
    assert_eq!(live, [a.addr, b.addr]);
    assert_eq!(p.block_info(b.id).unwrap().segment_size, 20 * MIB);
    free(&mut p, a);
    assert!(p.block_info(a.id).is_none());
    assert_eq!(p.live_blocks().count(), 1);
}

#[test]
fn double_and_unknown_frees_change_nothing() {
    let mut p = pool(PoolConfig::default());
    let a = alloc(&mut p, 512);
    free(&mut p, a);
    free(&mut p, a);
    p.free(BlockId::from_raw(12345));
    assert_eq!(p.stats().allocation.current, 0);
    assert_eq!(p.stats().allocation.freed, 1);
}

#[test]
fn fragmentation_reports_free_bytes_and_the_largest_free_block() {
    let mut p = pool(PoolConfig::default());
    let f = p.fragmentation();
    assert_eq!((f.reserved, f.allocated, f.ratio), (0, 0, 1.0));
    let a = alloc(&mut p, MIB);
    let _b = alloc(&mut p, 512 * KIB);
    free(&mut p, a);
    let f = p.fragmentation();
    assert_eq!(f.largest_free_block, MIB);
    assert_eq!(f.free_bytes, MIB + 512 * KIB);
    assert_eq!((f.reserved, f.allocated), (2 * MIB, 512 * KIB));
    assert_eq!(f.ratio, 4.0);
}

// The hot path of a training loop: it must neither grow the slab nor touch the device.
#[test]
fn alloc_free_cycles_reuse_the_same_block_slot_and_segment() {
    let mut p = pool(PoolConfig::default());
    let first = alloc(&mut p, 4 * KIB);
    free(&mut p, first);
    for _ in 0..1000 {
        let b = p.allocate(4 * KIB).unwrap();
        assert_eq!((b.id, b.addr), (first.id, first.addr));
        p.free(b.id);
    }
    assert_eq!(p.blocks.iter().count(), 2, "one segment block + one slot for splits");
    assert_eq!(p.stats().num_device_alloc, 1);
}
