//! Drives a `Pool` with arbitrary operations and checks every internal
//! invariant after each one: `cargo fuzz run pool_ops`.
//!
//! Input: 8 bytes of configuration, then 3-byte operations `[kind, a, b]`.

#![no_main]

use std::collections::BTreeMap;

use cupool_core::pool::{Backend, Block, Pool, PoolConfig};
use libfuzzer_sys::fuzz_target;

const MIB: u64 = 1 << 20;

#[derive(Default)]
struct Dev {
    next: u64,
    cap: Option<u64>,
    used: u64,
    live: BTreeMap<u64, u64>,
    deferred: bool,
    tag: u64,
    done: u64,
    capture: bool,
}

impl Backend for Dev {
    fn allocate_segment(&mut self, size: u64) -> Option<u64> {
        assert!(size > 0 && size.is_multiple_of(2 * MIB));
        if self.cap.is_some_and(|c| self.used + size > c) {
            return None;
        }
        let addr = (1 << 40) + self.next;
        self.next += size;
        self.used += size;
        self.live.insert(addr, size);
        Some(addr)
    }
    fn release_segment(&mut self, addr: u64, size: u64) {
        assert_eq!(self.live.remove(&addr), Some(size));
        self.used -= size;
    }
    fn free_tag(&mut self) -> Option<u64> {
        self.deferred.then_some(self.tag)
    }
    fn is_complete(&mut self, tag: u64) -> bool {
        tag <= self.done
    }
    fn synchronize(&mut self) -> bool {
        if !self.capture {
            self.done = self.tag;
        }
        !self.capture
    }
}

fn pick(b: u8, choices: &[u64]) -> u64 {
    choices[b as usize % choices.len()]
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (head, ops) = data.split_at(8);
    let cfg = PoolConfig {
        small_max: pick(head[0], &[MIB, 256 << 10, 2 * MIB, 512]),
        small_segment: pick(head[1], &[2 * MIB, 4 * MIB]),
        large_segment: pick(head[2], &[20 * MIB, 8 * MIB, 2 * MIB]),
        large_segment_threshold: pick(head[3], &[10 * MIB, 4 * MIB, 0]),
        min_split_remainder_large: pick(head[4], &[MIB, 512, 64 << 10]),
        max_split_size: pick(head[5], &[u64::MAX, 32 * MIB, 21 * MIB]),
        limit: pick(head[6], &[u64::MAX, 64 * MIB, 200 * MIB, 0]),
    };
    let cap = [None, Some(48 * MIB), Some(128 * MIB)][head[7] as usize % 3];
    let mut pool = Pool::new(Dev { cap, ..Dev::default() }, cfg);
    let mut live: Vec<Block> = Vec::new();
    for op in ops.chunks_exact(3) {
        let (a, b) = (op[1] as u64, op[2] as u64);
        match op[0] % 10 {
            0..=3 => {
                // Sizes from 0 to ~64 MiB, denser at the small end.
                let req = ((a << 8 | b) << (op[0] >> 4)) >> 3;
                if let Ok(blk) = pool.allocate(req) {
                    assert!(blk.size >= req && blk.addr.is_multiple_of(512));
                    live.push(blk);
                }
            }
            4..=6 if !live.is_empty() => {
                let blk = live.swap_remove((a << 8 | b) as usize % live.len());
                pool.free(blk.id);
            }
            7 => match a % 4 {
                0 => drop(pool.empty_cache()),
                1 => drop(pool.trim_to(b * MIB)),
                2 => drop(pool.fragmentation()),
                _ => assert!(pool.lookup((1 << 40) + (b << 20)).is_none_or(|i| i.size > 0)),
            },
            8 => {
                let dev = pool.backend_mut();
                match a % 4 {
                    0 => dev.deferred = b & 1 == 1,
                    1 => dev.tag += 1,
                    2 => dev.done = dev.tag.min(dev.done + b % 4),
                    _ => dev.capture = b % 4 == 0,
                }
            }
            _ => {}
        }
        if let Err(e) = pool.check_invariants() {
            panic!("{e}");
        }
    }
    for blk in live {
        pool.free(blk.id);
    }
    let dev = pool.backend_mut();
    dev.capture = false;
    dev.done = dev.tag;
    pool.empty_cache();
    pool.check_invariants().unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 0);
    assert!(pool.backend().live.is_empty());
});
