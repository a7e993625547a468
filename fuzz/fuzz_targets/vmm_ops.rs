//! Drives a `VmmPool` with arbitrary operations (allocations, frees, GPU
//! work queued and completing, barriers, clock ticks, empty_cache):
//! `cargo fuzz run vmm_ops`.
//!
//! The simulated device panics on a page mapped twice, an address mapped
//! twice, an unmap of nothing and the release of a mapped page. After every
//! operation the target checks that every byte of every live block is still
//! mapped by the page handle it had when the block was allocated (no live
//! byte unmapped, stitching never moves live data), that live blocks never
//! overlap, that `block_pages` names exactly those pages, and that the
//! allocated and reserved figures agree with the blocks and the device.
//!
//! Input: 6 bytes of configuration, then 3-byte operations `[kind, a, b]`.

#![no_main]

use std::collections::BTreeMap;

use cupool_core::pool::testing::Fences;
use cupool_core::pool::Block;
use cupool_core::vmm::testing::SimulatedPages;
use cupool_core::vmm::{VmmConfig, VmmPool};
use libfuzzer_sys::fuzz_target;

const MIB: u64 = 1 << 20;

fn pick(b: u8, choices: &[u64]) -> u64 {
    choices[b as usize % choices.len()]
}

/// (page start, handle) of every page under `[addr, addr + size)`.
fn handles_under(pool: &VmmPool<SimulatedPages>, addr: u64, size: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut x = addr;
    while x < addr + size {
        let (start, handle) = pool.backend().handle_at(x).unwrap_or_else(|| panic!("live byte {x:#x} unmapped"));
        let page_size = pool.backend().pages()[&handle].0;
        out.push((start, handle));
        x = start + page_size;
    }
    out
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let (head, ops) = data.split_at(6);
    let small_page = pick(head[0], &[2 * MIB, 4 * MIB, 64 << 10]);
    let base = if head[5] & 1 == 0 { VmmConfig::default() } else { VmmConfig::pytorch_expandable() };
    let cfg = VmmConfig {
        small_max: pick(head[1], &[MIB, 512, 2 * MIB]),
        small_page,
        large_page: pick(head[2], &[small_page, 20 * MIB, 2 * MIB]),
        remap_idle: head[3] & 1 == 0,
        keep_free: pick(head[3] >> 1, &[0, 64 * MIB, u64::MAX, 4 * MIB]),
        window_ns: pick(head[3] >> 3, &[0, 5_000_000_000, 1_000_000]),
        limit: pick(head[4], &[u64::MAX, 64 * MIB, 200 * MIB]),
        wait_share: pick(head[4] >> 4, &[4, 1, 16]),
        cycle_regret_ns: [None, Some(1_000_000_000), Some(0)][(head[5] >> 3) as usize % 3],
        ..base
    };
    let capacity = [None, Some(48 * MIB), Some(160 * MIB)][head[5] as usize / 2 % 3];
    let mut pool = VmmPool::new(SimulatedPages::new().with_capacity(capacity), cfg);
    // Live blocks by address, with the pages under them when allocated.
    let mut live: BTreeMap<u64, (Block, Vec<(u64, u64)>)> = BTreeMap::new();
    for op in ops.chunks_exact(3) {
        let (a, b) = (op[1] as u64, op[2] as u64);
        match op[0] % 12 {
            0..=3 => {
                // Sizes from 0 to ~64 MiB, denser at the small end.
                let req = ((a << 8 | b) << (op[0] >> 4)) >> 3;
                if let Ok(blk) = pool.allocate(req) {
                    assert!(blk.size >= req.max(1) && blk.size.is_multiple_of(512));
                    let pages = handles_under(&pool, blk.addr, blk.size);
                    let named: Vec<(u64, u64)> =
                        pool.block_pages(blk.addr).expect("a live block").iter().map(|p| (p.addr, p.handle)).collect();
                    assert_eq!(named, pages, "block_pages of {:#x}", blk.addr);
                    assert!(live.insert(blk.addr, (blk, pages)).is_none(), "address handed out twice");
                }
            }
            4..=6 if !live.is_empty() => {
                let addr = *live.keys().nth((a << 8 | b) as usize % live.len()).unwrap();
                let (blk, _) = live.remove(&addr).unwrap();
                pool.free(blk.id);
                pool.free(blk.id); // a double free changes nothing
            }
            7 => drop(pool.empty_cache()),
            8 => {
                let dev = pool.backend_mut();
                match a % 5 {
                    0 => dev.fences = if b & 1 == 1 { Fences::AtQueued } else { Fences::Off },
                    1 => dev.launch(),
                    2 => dev.complete(b % 4),
                    3 => dev.barrier = b & 1 == 1,
                    _ => dev.capturing = b % 4 == 0,
                }
            }
            9 => pool.backend_mut().now += b * 100_000_000,
            _ => {}
        }
        // Live data stays where it was, on the same pages; blocks never overlap.
        let mut end = 0;
        for (addr, (blk, pages)) in &live {
            assert!(*addr >= end, "block {addr:#x} overlaps the one before it");
            end = addr + blk.size;
            assert_eq!(&handles_under(&pool, blk.addr, blk.size), pages, "live block {addr:#x} moved");
        }
        let s = pool.stats();
        assert_eq!(s.allocated_bytes.current, live.values().map(|(b, _)| b.size).sum::<u64>());
        assert_eq!(s.reserved_bytes.current, pool.backend().held(), "reserved bytes against the device");
        assert!(s.reserved_bytes.current <= pool.config().limit, "past the cap");
    }
    for (blk, _) in live.into_values() {
        pool.free(blk.id);
    }
    let dev = pool.backend_mut();
    dev.capturing = false;
    dev.complete_all();
    pool.empty_cache();
    assert_eq!(pool.stats().allocated_bytes.current, 0);
    assert_eq!(pool.stats().reserved_bytes.current, 0, "pages left after everything was freed and done");
    assert_eq!(pool.backend().held(), 0);
});
