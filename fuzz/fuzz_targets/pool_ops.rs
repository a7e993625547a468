//! Drives a `Pool` with arbitrary operations and checks every internal
//! invariant after each one: `cargo fuzz run pool_ops`.
//!
//! Input: 8 bytes of configuration, then 3-byte operations `[kind, a, b]`.

#![no_main]

use cupool_core::pool::testing::{Fences, SimulatedDevice, BASE_ADDR};
use cupool_core::pool::{Block, GiveBack, Pool, PoolConfig};
use libfuzzer_sys::fuzz_target;

const MIB: u64 = 1 << 20;

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
        // The high bits of the limit byte, unused by `pick` above.
        release_before_grow: head[6] & 0x80 != 0,
        wait_share: pick(head[6] >> 4, &[4, 1, 16, 256]),
        give_back: [GiveBack::Never, GiveBack::Always, GiveBack::Auto { regret_ns: 1_000 }][head[7] as usize / 3 % 3],
    };
    let cap = [None, Some(48 * MIB), Some(128 * MIB)][head[7] as usize % 3];
    let mut pool = Pool::new(SimulatedDevice::new().with_capacity(cap), cfg);
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
                _ => assert!(pool.lookup(BASE_ADDR + (b << 20)).is_none_or(|i| i.size > 0)),
            },
            8 => {
                let dev = pool.backend_mut();
                match a % 4 {
                    0 => dev.fences = if b & 1 == 1 { Fences::AtQueued } else { Fences::Off },
                    1 => dev.launch(),
                    2 => dev.complete(b % 4),
                    _ => dev.capturing = b % 4 == 0,
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
    dev.capturing = false;
    dev.complete_all();
    pool.empty_cache();
    pool.check_invariants().unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 0);
    assert!(pool.backend().live_segments().is_empty());
});
