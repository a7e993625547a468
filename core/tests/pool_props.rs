//! The pool against a brute-force reference model, over long random sequences
//! of allocate / free / empty_cache / trim_to with deferred frees, stream
//! captures (synchronize refused), a device capacity and a reserve limit.
//!
//! The model (`model/mod.rs`) works by brute force straight from the rules.
//! After every operation the pool must agree with it exactly: block handed
//! out, every segment and block (snapshot), the simulated device's state
//! (segments held, releases in order, segment requests), every stat
//! (current and peak) and counter. Independently of the model, every live
//! block is checked (aligned, inside one segment, no overlap, findable by
//! address), and every out-of-memory is checked to be forced by the limit or
//! the device capacity.

mod model;

use cupool_core::pool::testing::{Fences, SimulatedDevice};
use cupool_core::pool::{Block, BlockState, GiveBack, Pool, PoolConfig};
use model::{pool_stats, Model, ALIGN, MIB};
use proptest::prelude::*;

// ---- the comparison -------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64),
    Free(usize),
    EmptyCache,
    Trim(u8),
    Deferred(bool),
    Launch,
    Complete(u8),
    Capture(bool),
}

struct Harness {
    pool: Pool<SimulatedDevice>,
    model: Model,
    /// Live blocks with their requested sizes.
    live: Vec<(Block, u64)>,
}

impl Harness {
    fn new(cfg: PoolConfig, cap: Option<u64>) -> Self {
        // Adjacent segments: a merge across two of them would show.
        let device = SimulatedDevice::new().with_capacity(cap);
        let pool = Pool::new(device.clone(), cfg);
        let model = Model::new(*pool.config(), device);
        Harness { pool, model, live: Vec::new() }
    }

    fn both(&mut self, f: impl Fn(&mut SimulatedDevice)) {
        f(self.pool.backend_mut());
        f(&mut self.model.be);
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Alloc(req) => {
                let got = self.pool.allocate(req);
                let want = self.model.allocate(req);
                assert_eq!(got.map(|b| (b.addr, b.size)).ok(), want, "allocate({req})");
                match got {
                    Ok(b) => self.live.push((b, req)),
                    Err(_) => self.check_oom_justified(req),
                }
            }
            Op::Free(sel) if !self.live.is_empty() => {
                let (b, _) = self.live.swap_remove(sel % self.live.len());
                self.pool.free(b.id);
                self.model.free(b.addr);
            }
            Op::Free(_) => {}
            Op::EmptyCache => {
                self.model.reclaim(false);
                assert_eq!(self.pool.empty_cache(), self.model.release(0));
            }
            Op::Trim(pct) => {
                let target = self.pool.stats().reserved_bytes.current / 100 * pct as u64;
                self.model.reclaim(false);
                assert_eq!(self.pool.trim_to(target), self.model.release(target));
                assert!(self.pool.stats().reserved_bytes.current <= target || self.no_whole_free());
            }
            Op::Deferred(on) => self.both(|f| f.fences = if on { Fences::AtQueued } else { Fences::Off }),
            Op::Launch => self.both(|f| f.launch()),
            Op::Complete(n) => self.both(|f| f.complete(n as u64)),
            Op::Capture(on) => self.both(|f| f.capturing = on),
        }
    }

    fn no_whole_free(&self) -> bool {
        self.pool.snapshot().iter().all(|s| s.blocks.len() > 1 || s.blocks[0].state != BlockState::Free)
    }

    /// An allocation failed: the limit or the device capacity must really
    /// leave no room, with every cached segment already given back.
    fn check_oom_justified(&self, req: u64) {
        let c = self.pool.config();
        let Some(rounded) = req.max(1).checked_next_multiple_of(512) else {
            return;
        };
        if rounded > c.limit {
            return;
        }
        let small = rounded <= c.small_max;
        let snap = self.pool.snapshot();
        for s in snap.iter().filter(|s| s.small == small) {
            for b in s.blocks.iter().filter(|b| b.state == BlockState::Free) {
                assert!(!self.model.allowed(small, b.size, rounded), "a free block fits");
            }
        }
        if !self.pool.backend().capturing {
            assert_eq!(self.pool.pending_blocks(), 0, "did not synchronize");
        }
        let seg = if small {
            c.small_segment
        } else if rounded < c.large_segment_threshold {
            c.large_segment
        } else {
            rounded.next_multiple_of(ALIGN)
        };
        if seg > c.limit {
            return;
        }
        assert!(self.no_whole_free(), "gave up with cached segments left");
        let be = self.pool.backend();
        let reserved = self.pool.stats().reserved_bytes.current;
        assert!(
            reserved + seg > c.limit || be.capacity.is_some_and(|cap| be.outstanding() + seg > cap),
            "OOM with room for a {seg}-byte segment"
        );
    }

    fn check(&self) {
        let p = &self.pool;
        let m = &self.model;
        if let Err(e) = p.check_invariants() {
            panic!("invariant broken: {e}");
        }
        let snap = p.snapshot();
        assert_eq!(snap, m.snapshot(), "segments differ from the model");
        assert_eq!(p.backend(), &m.be, "backend state differs");
        for s in &snap {
            for w in s.blocks.windows(2) {
                let both_free = w.iter().all(|b| b.state == BlockState::Free);
                assert!(!both_free, "adjacent free blocks in {:#x}", s.addr);
            }
        }
        // Stats: current and peak of every gauge, totals and counters.
        let truth = m.truth();
        let got = pool_stats(p.stats());
        for (k, ((cur, peak), (t, tp))) in got.iter().zip(truth.iter().zip(m.peaks)).enumerate() {
            assert_eq!((*cur, *peak), (*t, tp), "stat #{k} (current, peak)");
        }
        let s = p.stats();
        assert_eq!(
            [s.allocation.allocated, s.allocated_bytes.allocated, s.segment.allocated],
            [m.totals[0], m.totals[1], m.totals[2]]
        );
        assert_eq!(s.reserved_bytes.allocated, m.totals[3]);
        assert_eq!(s.allocated_bytes.allocated - s.allocated_bytes.freed, s.allocated_bytes.current);
        let counters =
            [s.num_device_alloc, s.num_device_free, s.num_alloc_retries, s.num_ooms, s.num_syncs, s.num_waits];
        assert_eq!(counters, m.counters);
        let f = p.fragmentation();
        let free: Vec<u64> =
            snap.iter().flat_map(|s| s.blocks.iter()).filter(|b| b.state == BlockState::Free).map(|b| b.size).collect();
        assert_eq!(f.largest_free_block, free.iter().copied().max().unwrap_or(0));
        assert_eq!(f.free_bytes, free.iter().sum::<u64>());
        assert_eq!((f.reserved, f.allocated), (truth[2], truth[0]));
        // Live blocks: aligned, big enough, inside one segment, no overlap.
        let mut by_addr: Vec<_> = self.live.iter().map(|(b, _)| *b).collect();
        by_addr.sort_by_key(|b| b.addr);
        for w in by_addr.windows(2) {
            assert!(w[0].addr + w[0].size <= w[1].addr, "live blocks overlap");
        }
        for &(b, req) in &self.live {
            assert_eq!(b.addr % 512, 0);
            assert!(b.size >= req && b.size.is_multiple_of(512));
            let info = p.lookup(b.addr + b.size - 1).expect("live block not found");
            assert_eq!((info.id, info.addr, info.size, info.requested), (b.id, b.addr, b.size, req));
            assert!(info.segment_addr <= b.addr);
            assert!(b.addr + b.size <= info.segment_addr + info.segment_size);
        }
        let mut reported: Vec<_> = p.live_blocks().map(|i| (i.addr, i.size, i.id)).collect();
        reported.sort_by_key(|r| r.0);
        let mine: Vec<_> = by_addr.iter().map(|b| (b.addr, b.size, b.id)).collect();
        assert_eq!(reported, mine);
    }

    /// Frees everything, lets the GPU finish, and empties the cache: nothing
    /// may stay reserved and every segment must have been released once.
    fn finish(mut self) {
        for (b, _) in std::mem::take(&mut self.live) {
            self.pool.free(b.id);
            self.model.free(b.addr);
        }
        self.both(|f| {
            f.capturing = false;
            f.complete_all();
        });
        self.model.reclaim(false);
        assert_eq!(self.pool.empty_cache(), self.model.release(0));
        self.check();
        let s = self.pool.stats();
        assert_eq!(s.reserved_bytes.current, 0);
        assert_eq!(s.active_bytes.current, 0);
        assert_eq!(s.num_device_alloc, s.num_device_free);
        assert_eq!(s.reserved_bytes.allocated, s.reserved_bytes.freed);
        assert!(self.pool.backend().live_segments().is_empty());
        assert_eq!(self.pool.backend().outstanding(), 0);
    }
}

// ---- strategies -----------------------------------------------------------

fn size() -> impl Strategy<Value = u64> {
    let edges = vec![
        0,
        1,
        511,
        512,
        513,
        MIB - 1,
        MIB,
        MIB + 1,
        2 * MIB,
        4 * MIB - 512,
        10 * MIB - 512,
        10 * MIB,
        19 * MIB,
        20 * MIB,
        32 * MIB,
        33 * MIB,
        48 * MIB + 512,
        u64::MAX,
    ];
    prop_oneof![
        8 => (0u32..=20).prop_flat_map(|b| 0u64..=(1u64 << b)),
        3 => (20u32..=25).prop_flat_map(|b| (1u64 << b)..=(1u64 << (b + 1))),
        1 => prop::sample::select(edges),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => size().prop_map(Op::Alloc),
        10 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::EmptyCache),
        1 => (0u8..=100).prop_map(Op::Trim),
        1 => any::<bool>().prop_map(Op::Deferred),
        2 => Just(Op::Launch),
        2 => (0u8..4).prop_map(Op::Complete),
        1 => prop::bool::weighted(0.3).prop_map(Op::Capture),
    ]
}

fn config() -> impl Strategy<Value = (PoolConfig, Option<u64>)> {
    (
        prop::sample::select(vec![MIB, 256 << 10, 2 * MIB]),
        prop::sample::select(vec![2 * MIB, 4 * MIB]),
        prop::sample::select(vec![(20 * MIB, 10 * MIB), (8 * MIB, 4 * MIB)]),
        prop::sample::select(vec![MIB, 512, 64 << 10]),
        prop::sample::select(vec![u64::MAX, 32 * MIB, 48 * MIB]),
        prop::sample::select(vec![u64::MAX, 64 * MIB, 160 * MIB]),
        prop::sample::select(vec![None, Some(48 * MIB), Some(128 * MIB)]),
        (
            any::<bool>(),
            prop::sample::select(vec![1u64, 4, 16]),
            prop::sample::select(vec![GiveBack::Never, GiveBack::Always, GiveBack::Auto { regret_ns: 1 }]),
        ),
    )
        .prop_map(
            |(small_max, small_segment, (ls, lt), split, max_split, limit, cap, (rbg, wait_share, give_back))| {
                let cfg = PoolConfig {
                    small_max,
                    small_segment,
                    large_segment: ls,
                    large_segment_threshold: lt,
                    min_split_remainder_large: split,
                    max_split_size: max_split,
                    limit,
                    release_before_grow: rbg,
                    wait_share,
                    give_back,
                };
                (cfg, cap)
            },
        )
}

fn run(cfg: PoolConfig, cap: Option<u64>, ops: &[Op]) {
    let mut h = Harness::new(cfg, cap);
    h.check();
    for op in ops {
        h.apply(op);
        h.check();
    }
    h.finish();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn pool_matches_model((cfg, cap) in config(), ops in prop::collection::vec(op(), 1..400)) {
        run(cfg, cap, &ops);
    }

    /// Small blocks only, many of them: deep fragmentation of few segments.
    #[test]
    fn small_blocks_only_match_the_model(
        ops in prop::collection::vec(
            prop_oneof![
                3 => (0u64..=64 << 10).prop_map(Op::Alloc),
                2 => any::<usize>().prop_map(Op::Free),
                1 => Just(Op::Launch),
                1 => (0u8..2).prop_map(Op::Complete),
                1 => any::<bool>().prop_map(Op::Deferred),
            ],
            1..600,
        )
    ) {
        run(PoolConfig { limit: 8 * MIB, ..PoolConfig::default() }, None, &ops);
    }

    /// Large blocks only, no device cap: many splits of shared 20 MiB
    /// segments, and oversize blocks when max_split_size is set.
    #[test]
    fn large_blocks_only_match_the_model(
        max_split in prop::sample::select(vec![u64::MAX, 32 * MIB, 24 * MIB]),
        ops in prop::collection::vec(
            prop_oneof![
                3 => (MIB + 1..=10 * MIB).prop_map(Op::Alloc),
                1 => (10 * MIB..=48 * MIB).prop_map(Op::Alloc),
                3 => any::<usize>().prop_map(Op::Free),
                1 => Just(Op::Launch),
                1 => (0u8..2).prop_map(Op::Complete),
                1 => any::<bool>().prop_map(Op::Deferred),
                1 => (0u8..=100).prop_map(Op::Trim),
            ],
            1..400,
        )
    ) {
        let cfg = PoolConfig { max_split_size: max_split, limit: 1 << 30, ..PoolConfig::default() };
        run(cfg, None, &ops);
    }

    /// Sizes that divide each other and the segment sizes, frees mostly
    /// deferred: the pending bytes often equal the request or a quarter of
    /// the reserved bytes exactly, the edges of the wait rule.
    #[test]
    fn edges_of_the_wait_rule_match_the_model(
        ops in prop::collection::vec(
            prop_oneof![
                4 => prop::sample::select(vec![512, 64 << 10, 512 << 10, MIB, 2 * MIB, 5 * MIB, 10 * MIB, 20 * MIB])
                    .prop_map(Op::Alloc),
                3 => any::<usize>().prop_map(Op::Free),
                1 => Just(Op::Launch),
                1 => (0u8..2).prop_map(Op::Complete),
                1 => prop::bool::weighted(0.8).prop_map(Op::Deferred),
                1 => prop::bool::weighted(0.2).prop_map(Op::Capture),
            ],
            1..300,
        )
    ) {
        let ops: Vec<Op> = std::iter::once(Op::Deferred(true)).chain(ops).collect();
        run(PoolConfig { limit: 256 * MIB, ..PoolConfig::default() }, Some(192 * MIB), &ops);
    }
}

#[test]
fn every_edge_size_matches_the_model_in_sequence() {
    // Every edge size allocated and freed in every config, deterministically.
    let edges = [0, 512, MIB, MIB + 512, 10 * MIB - 512, 10 * MIB, 20 * MIB, 33 * MIB, 64 * MIB];
    for max_split in [u64::MAX, 32 * MIB] {
        let cfg = PoolConfig { max_split_size: max_split, limit: 200 * MIB, ..PoolConfig::default() };
        let mut ops: Vec<Op> = edges.iter().map(|&e| Op::Alloc(e)).collect();
        ops.extend((0..edges.len()).map(|i| Op::Free(i * 7)));
        ops.extend(edges.iter().rev().map(|&e| Op::Alloc(e)));
        run(cfg, Some(150 * MIB), &ops);
    }
}
