//! What the pools report: statistics for the end record, and the picture of
//! device memory when a request could not be served.

use super::registry::{self, ContextPool};
use super::streams::MULTI_STREAM;
use cupool_core::log::{self, PoolRecord};
use cupool_core::pool::{Fragmentation, Stat};
use std::sync::atomic::Ordering;

/// Every pool's statistics, live pools first.
pub fn all() -> Vec<PoolRecord> {
    let live = registry::all().into_iter().map(|p| (p, false));
    let retired = registry::retired().into_iter().map(|p| (p, true));
    live.chain(retired).filter_map(|(p, dead)| record(p, dead)).collect()
}

/// One pool's statistics. A retired pool's context died and took its
/// segments with it: its current figures are reported as 0.
fn record(p: &ContextPool, dead: bool) -> Option<PoolRecord> {
    let pool = p.pool.try_lock_for(std::time::Duration::from_millis(200))?;
    let s = pool.stats();
    let f = pool.fragmentation();
    let stat = |st: &Stat| log::Stat { current: if dead { 0 } else { st.current }, peak: st.peak };
    let ratio =
        if s.requested_bytes.peak == 0 { 1.0 } else { s.reserved_bytes.peak as f64 / s.requested_bytes.peak as f64 };
    Some(PoolRecord {
        device: p.device,
        context_destroyed: dead,
        allocated_bytes: stat(&s.allocated_bytes),
        requested_bytes: stat(&s.requested_bytes),
        reserved_bytes: stat(&s.reserved_bytes),
        active_bytes: stat(&s.active_bytes),
        inactive_split_bytes: stat(&s.inactive_split_bytes),
        segment: stat(&s.segment),
        num_device_alloc: s.num_device_alloc,
        num_device_free: s.num_device_free,
        num_alloc_retries: s.num_alloc_retries,
        num_ooms: s.num_ooms,
        num_syncs: s.num_syncs,
        num_waits: s.num_waits,
        largest_free_block: if dead { 0 } else { f.largest_free_block },
        multi_stream: MULTI_STREAM.load(Ordering::Relaxed),
        fences: pool.backend().counters,
        peak_reserved_over_peak_requested: ratio,
    })
}

/// The pool's state when a request failed: fragmentation and the largest live blocks.
pub fn at_oom(p: &ContextPool) -> (Fragmentation, Vec<u64>) {
    let pool = p.pool.lock();
    let mut largest: Vec<_> = pool.live_blocks().map(|b| b.requested).collect();
    largest.sort_unstable_by(|a, b| b.cmp(a));
    largest.truncate(10);
    (pool.fragmentation(), largest)
}
