//! Pending frees, synchronization, out-of-memory recovery, releasing segments.

use super::*;

#[test]
fn pending_blocks_wait_for_their_tag() {
    let mut p = pool(PoolConfig::default());
    p.backend_mut().fences = Fences::PerFree;
    // Six segments' worth of live memory, so that one pending block is a small
    // share of what is reserved: the pool grows rather than wait for it.
    let keep: Vec<Block> = (0..5).map(|_| alloc(&mut p, MIB)).collect();
    let a = alloc(&mut p, MIB);
    free(&mut p, a);
    assert_eq!(p.pending_blocks(), 1);
    assert_eq!(p.stats().active_bytes.current, 6 * MIB);
    assert_eq!(p.stats().allocated_bytes.current, 5 * MIB);
    assert!(p.lookup(a.addr).is_none());
    // Not complete: a new small segment is made instead of reusing `a`.
    let c = alloc(&mut p, MIB);
    let _c2 = alloc(&mut p, MIB);
    assert_ne!(c.addr, a.addr);
    assert_eq!(p.snapshot().len(), 4);
    // The GPU finishes the work queued before `a`'s free (tag 1, the first
    // free): the next miss reclaims `a` before growing.
    p.backend_mut().completed = 1;
    let d = alloc(&mut p, MIB);
    assert_eq!(p.snapshot().len(), 4, "no growth: {:?}", states(&p));
    assert_eq!(d.addr, a.addr);
    free(&mut p, keep[0]);
    assert_eq!(p.pending_blocks(), 1);
    assert_eq!(p.stats().num_syncs + p.stats().num_waits, 0);
}

#[test]
fn a_large_pending_share_is_waited_for_not_grown_around() {
    let mut p = pool(PoolConfig::default());
    p.backend_mut().fences = Fences::PerFree;
    let a = alloc(&mut p, MIB);
    let _b = alloc(&mut p, MIB);
    free(&mut p, a);
    // 1 MiB pending of 2 MiB reserved: waiting beats a new segment.
    let c = alloc(&mut p, MIB);
    assert_eq!(c.addr, a.addr);
    assert_eq!(p.snapshot().len(), 1);
    assert_eq!(p.stats().num_waits, 1);
}

#[test]
fn reclaim_happens_only_on_a_miss() {
    let mut p = pool(PoolConfig::default());
    p.backend_mut().fences = Fences::PerFree;
    let a = alloc(&mut p, 4 * KIB);
    free(&mut p, a);
    p.backend_mut().completed = u64::MAX; // every fence has completed
                                          // A hit in the tail does not look at the pending queue.
    let b = alloc(&mut p, 4 * KIB);
    assert_eq!(b.addr, a.addr + 4 * KIB);
    assert_eq!(p.pending_blocks(), 1);
    // empty_cache reclaims it (and releases nothing: the segment is in use).
    assert_eq!(p.empty_cache(), 0);
    assert_eq!(p.pending_blocks(), 0);
    assert_eq!(alloc(&mut p, 4 * KIB).addr, a.addr);
}

#[test]
fn pending_blocks_are_ordered_behind_before_placing_where_the_gpu_can_order_them() {
    let placed = |order_every_ns: Option<u64>| {
        let mut p = pool(PoolConfig::default());
        p.backend_mut().fences = Fences::PerFree;
        p.backend_mut().order_every_ns = order_every_ns;
        let a = alloc(&mut p, 4 * KIB);
        free(&mut p, a);
        let b = alloc(&mut p, 4 * KIB);
        (b.addr == a.addr, p)
    };
    let (reused, p) = placed(Some(0));
    assert!(reused, "ordered behind: reused where it was freed");
    assert_eq!((p.pending_blocks(), p.backend().orders), (0, 1));
    assert_eq!(p.stats().num_syncs + p.stats().num_waits, 0, "no host wait");
    let (reused, p) = placed(None);
    assert!(!reused, "not ordered: the tail serves it, the freed block waits");
    assert_eq!(p.pending_blocks(), 1);
}

#[test]
fn pending_blocks_stay_pending_while_a_stream_capture_refuses_to_wait() {
    let mut p = pool(PoolConfig { limit: 2 * MIB, ..PoolConfig::default() });
    p.backend_mut().fences = Fences::PerFree;
    p.backend_mut().capturing = true;
    let a = alloc(&mut p, MIB);
    let b = alloc(&mut p, MIB);
    free(&mut p, a);
    free(&mut p, b);
    assert!(p.allocate(512).is_err());
    p.check_invariants().unwrap();
    assert_eq!(p.pending_blocks(), 2);
    assert_eq!(p.stats().num_syncs, 0);
    assert_eq!(p.stats().num_ooms, 1);
    assert_eq!(p.stats().num_alloc_retries, 1);
    assert_eq!(p.empty_cache(), 0, "pending blocks keep the segment");
    p.backend_mut().capturing = false;
    let c = alloc(&mut p, 512);
    assert_eq!(c.addr, a.addr);
    assert_eq!(p.stats().num_waits, 1, "the miss waited for the pending frees");
    assert_eq!(p.pending_blocks(), 0);
}

#[test]
fn oom_recovery_releases_cached_segments() {
    let mut p = pool(PoolConfig::default());
    p.backend_mut().capacity = Some(22 * MIB);
    let s = alloc(&mut p, 512);
    free(&mut p, s);
    let l = alloc(&mut p, 19 * MIB + 1); // a whole 20 MiB segment: 22 MiB in all
                                         // 3 MiB more needs another 20 MiB segment: the small one is released first,
                                         // still not enough.
    assert_eq!(p.allocate(3 * MIB), Err(OutOfMemory));
    p.check_invariants().unwrap();
    assert_eq!(p.backend().released(), [(s.addr, 2 * MIB)]);
    assert_eq!((p.stats().num_alloc_retries, p.stats().num_ooms), (1, 1));
    free(&mut p, l);
    // The segment is cached: a hit, no backend call.
    let calls = p.backend().segment_requests();
    assert_eq!(alloc(&mut p, 3 * MIB).addr, l.addr);
    assert_eq!(p.backend().segment_requests(), calls);
    // Recovery that succeeds: the cached small segment makes room.
    let mut q = pool(PoolConfig::default());
    q.backend_mut().capacity = Some(20 * MIB);
    let s = alloc(&mut q, 512);
    free(&mut q, s);
    let l = alloc(&mut q, 2 * MIB);
    assert_eq!(q.stats().num_alloc_retries, 1);
    assert_eq!(q.stats().num_ooms, 0);
    assert_eq!(q.stats().reserved_bytes.current, 20 * MIB);
    assert_eq!(q.stats().reserved_bytes.peak, 20 * MIB);
    assert_eq!(l.size, 2 * MIB);
}

#[test]
fn limit_caps_reserved_bytes() {
    let mut p = pool(PoolConfig { limit: 24 * MIB, ..PoolConfig::default() });
    assert_eq!(p.allocate(24 * MIB + 1), Err(OutOfMemory));
    assert_eq!(p.allocate(u64::MAX), Err(OutOfMemory));
    assert_eq!(p.backend().segment_requests(), 0, "hopeless requests never reach the device");
    alloc(&mut p, 4 * MIB); // 20 MiB segment
    for _ in 0..4 {
        alloc(&mut p, MIB); // two full small segments: 24 MiB
    }
    assert_eq!(p.allocate(512), Err(OutOfMemory));
    assert_eq!(p.stats().num_alloc_retries, 1);
    assert_eq!(p.stats().reserved_bytes.current, 24 * MIB);
    assert_eq!(p.stats().num_ooms, 3);
}

#[test]
fn trim_and_empty_cache_release_whole_free_segments_largest_first() {
    let mut p = pool(PoolConfig::default());
    let v: Vec<Block> = [512, 19 * MIB, 12 * MIB, 30 * MIB, 12 * MIB].iter().map(|&n| alloc(&mut p, n)).collect();
    let keep = alloc(&mut p, 512);
    for b in &v {
        free(&mut p, *b);
    }
    let reserved = p.stats().reserved_bytes.current;
    assert_eq!(reserved, 2 * MIB + 20 * MIB + 12 * MIB + 30 * MIB + 12 * MIB);
    assert_eq!(p.trim_to(reserved), 0);
    // Largest first, lowest address among equals.
    assert_eq!(p.trim_to(46 * MIB), 30 * MIB);
    assert_eq!(p.trim_to(30 * MIB), 20 * MIB);
    assert_eq!(p.trim_to(14 * MIB), 12 * MIB);
    assert_eq!(p.empty_cache(), 12 * MIB);
    let released = [(v[3].addr, 30 * MIB), (v[1].addr, 20 * MIB), (v[2].addr, 12 * MIB), (v[4].addr, 12 * MIB)];
    assert_eq!(p.backend().released(), released);
    assert_eq!(p.stats().reserved_bytes.current, 2 * MIB, "the used small segment stays");
    free(&mut p, keep);
    assert_eq!(p.empty_cache(), 2 * MIB);
    assert_eq!(p.stats().reserved_bytes.current, 0);
    assert_eq!(p.stats().num_device_free, p.stats().num_device_alloc);
    p.check_invariants().unwrap();
}

#[test]
fn near_the_limit_segments_shrink_to_what_fits() {
    // 4 MiB cap, 2 MiB cached by a freed small block: a 3 MiB request would
    // want a 20 MiB segment. The cache gives way and a 4 MiB segment serves it.
    let mut p = pool(PoolConfig { limit: 4 * MIB, ..PoolConfig::default() });
    let small = alloc(&mut p, KIB);
    free(&mut p, small);
    let big = alloc(&mut p, 3 * MIB);
    assert_eq!(p.stats().reserved_bytes.current, 4 * MIB, "{:?}", states(&p));
    free(&mut p, big);
    // Room for more than the request, but less than the configured segment:
    // the segment is what is left of the cap.
    let mut p = pool(PoolConfig { limit: 30 * MIB, ..PoolConfig::default() });
    let _a = alloc(&mut p, 11 * MIB);
    let b = alloc(&mut p, 2 * MIB);
    assert_eq!(p.snapshot().len(), 2);
    assert_eq!(p.stats().reserved_bytes.current, 30 * MIB, "a 12 MiB segment, then the 18 MiB left");
    free(&mut p, b);
    // Past the cap, even after giving everything cached back: out of memory.
    assert!(p.allocate(20 * MIB).is_err());
}

/// A free that empties a segment whose blocks wait for queued work, as the
/// shim makes it: the wait is left to the owner (who waits with the pool's
/// lock let go), and the segment goes back once it has waited; one that was
/// allocated from meanwhile stays.
#[test]
fn an_emptied_segment_waits_for_its_owners_wait_to_go_back() {
    let mut p = pool(PoolConfig { give_back: GiveBack::Always, ..PoolConfig::default() });
    p.backend_mut().fences = Fences::AtQueued;
    let a = alloc(&mut p, 30 * MIB);
    p.backend_mut().launch();
    assert!(p.free_asking_wait(a.id));
    p.check_invariants().unwrap();
    assert_eq!((p.stats().segment.current, p.stats().num_syncs), (1, 0), "nothing went back, no wait yet");
    assert!(p.backend_mut().synchronize());
    p.after_gpu_wait();
    p.check_invariants().unwrap();
    assert_eq!((p.stats().segment.current, p.stats().num_syncs), (0, 1));
    // Reused between the free and the wait: it stays.
    let b = alloc(&mut p, 30 * MIB);
    p.backend_mut().launch();
    assert!(p.free_asking_wait(b.id));
    assert!(p.backend_mut().synchronize());
    let c = alloc(&mut p, 30 * MIB);
    p.after_gpu_wait();
    p.check_invariants().unwrap();
    assert_eq!(c.addr, b.addr, "the GPU is done: the block is reused where it was");
    assert_eq!(p.stats().segment.current, 1, "the segment holds a block again: it stays");
    assert!(p.lookup(c.addr).is_some());
}

/// A pool whose segments go back when emptied and whose frees each get a
/// fence of their own, with two 30 MiB blocks: a segment each.
fn two_segments_freed_behind_work() -> (Pool<SimulatedDevice>, Block, Block) {
    let mut p = pool(PoolConfig { give_back: GiveBack::Always, ..PoolConfig::default() });
    p.backend_mut().fences = Fences::PerFree;
    let a = alloc(&mut p, 30 * MIB);
    let b = alloc(&mut p, 30 * MIB);
    (p, a, b)
}

/// Two threads' frees empty two segments, each behind its own work, and
/// each asks for a wait: the first wait, which covers only the first
/// free's work, gives back the first segment and keeps the second waiting
/// for the next wait, instead of forgetting it.
#[test]
fn a_wait_that_covers_one_emptied_segment_keeps_the_other_waiting() {
    let (mut p, a, b) = two_segments_freed_behind_work();
    assert!(p.free_asking_wait(a.id));
    assert!(p.free_asking_wait(b.id));
    p.backend_mut().complete(1); // the first free's work, not the second's
    p.after_gpu_wait();
    p.check_invariants().unwrap();
    assert_eq!(p.stats().segment.current, 1, "the first segment went back");
    p.backend_mut().complete_all();
    p.after_gpu_wait();
    p.check_invariants().unwrap();
    assert_eq!(p.stats().segment.current, 0, "the second one, at the second wait");
}

/// A wait refused by a capture gives nothing back and forgets nothing: the
/// emptied segment waits listed, and the next wait gives it back with its
/// own. (A refused wait once emptied the list, so one thread's capture-time
/// free dropped the segment another thread was waiting to give back.)
#[test]
fn a_segment_whose_wait_was_refused_goes_back_at_the_next_wait() {
    let (mut p, a, b) = two_segments_freed_behind_work();
    p.backend_mut().capturing = true;
    p.free(a.id);
    assert_eq!(p.stats().segment.current, 2, "nothing goes back during a capture");
    p.backend_mut().capturing = false;
    p.free(b.id);
    p.check_invariants().unwrap();
    assert_eq!(p.stats().segment.current, 0, "both went back at the wait after the capture");
}
