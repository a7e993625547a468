//! `cupool replay --pages-at-peak`: the VMM pool's pages at the moment its
//! reserved bytes peaked, with the blocks on each: where a trace's
//! fragmentation sits (pages that blocks use in part, idle pages held).

use super::{shim_vmm, through, Timed};
use crate::units::human_bytes;
use cupool_core::vmm::testing::SimulatedPages;
use cupool_core::vmm::VmmPool;

const MIB: f64 = (1u64 << 20) as f64;

/// A block's size, in bytes as well where that is not a multiple of 64 KiB:
/// a block of whole pages and a few bytes reads as such.
fn size(bytes: u64) -> String {
    if bytes.is_multiple_of(64 << 10) {
        human_bytes(bytes)
    } else {
        format!("{} ({bytes} B)", human_bytes(bytes))
    }
}

/// The VMM pool with the shim's settings after `ops[..=at]`, its GPU
/// `lag_ns` behind the trace (0: keeping up).
fn pool_after(ops: &[Timed], at: usize, lag_ns: u64) -> VmmPool<SimulatedPages> {
    let mut pool = shim_vmm();
    through(&ops[..(at + 1).min(ops.len())], &mut pool, lag_ns);
    pool
}

/// A summary line of the pages after operation `peak_at` (0-based) of
/// `ops`, then a line for each page that blocks use in part or not at all,
/// by address, naming the blocks on it (their sizes as the pool rounded
/// them, and where each starts against the page's start).
pub(super) fn at_peak(ops: &[Timed], peak_at: usize, lag_ns: u64) -> Vec<String> {
    let pool = pool_after(ops, peak_at, lag_ns);
    let mut blocks: Vec<(u64, u64)> = pool.live_blocks().map(|b| (b.addr, b.size)).collect();
    blocks.sort_unstable();
    let mut pages: Vec<_> = pool.pages().collect();
    pages.sort_by_key(|p| p.addr);
    let (mut whole, mut partly, mut idle, mut unused, mut mapped) = (0, 0, 0, 0u64, 0u64);
    let mut lines = Vec::new();
    for p in &pages {
        let end = p.addr + p.size;
        mapped += p.size;
        // Blocks do not overlap: their ends rise with their starts.
        let first = blocks.partition_point(|&(a, s)| a + s <= p.addr);
        let on: Vec<(u64, u64)> = blocks[first..].iter().take_while(|&&(a, _)| a < end).copied().collect();
        let used: u64 = on.iter().map(|&(a, s)| (a + s).min(end) - a.max(p.addr)).sum();
        if on.is_empty() {
            idle += 1;
            unused += p.size;
            lines.push(format!("  page {:#x}: idle", p.addr));
        } else if used == p.size {
            whole += 1;
        } else {
            partly += 1;
            unused += p.size - used;
            let names: Vec<String> = on
                .iter()
                .map(|&(a, s)| format!("{} at {:+.2} MiB", size(s), (a as f64 - p.addr as f64) / MIB))
                .collect();
            lines.push(format!(
                "  page {:#x}: {} of {} used, by {}",
                p.addr,
                human_bytes(used),
                human_bytes(p.size),
                names.join(", ")
            ));
        }
    }
    let reserved = pool.stats().reserved_bytes.current;
    let unmapped = reserved.saturating_sub(mapped);
    let mut summary = format!(
        "  after operation {} of {}, where reserved bytes peaked ({}): pages mapped {} ({whole} wholly used, \
         {partly} partly used, {idle} idle), unused in them {}",
        peak_at + 1,
        ops.len(),
        human_bytes(reserved),
        pages.len(),
        human_bytes(unused)
    );
    if unmapped > 0 {
        summary.push_str(&format!("; {} held unmapped", human_bytes(unmapped)));
    }
    lines.insert(0, summary);
    lines
}
