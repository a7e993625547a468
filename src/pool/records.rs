//! What the pools report: statistics for the end record, and the picture of
//! device memory when a request could not be served.

use super::handle::ContextPool;
use super::registry;
use super::streams::MULTI_STREAM;
use cupool_core::log::PoolRecord;
use cupool_core::pool::Fragmentation;
use std::sync::atomic::Ordering;

/// Every pool's statistics, live pools first.
pub fn all() -> Vec<PoolRecord> {
    let live = registry::all().into_iter().map(|p| (p, false));
    let retired = registry::retired().into_iter().map(|p| (p, true));
    live.chain(retired).filter_map(|(p, dead)| record(p, dead)).collect()
}

/// One pool's statistics. A retired pool's context died and took its
/// memory with it: its current figures are reported as 0.
fn record(p: &ContextPool, dead: bool) -> Option<PoolRecord> {
    let pool = p.pool.try_lock_for(std::time::Duration::from_millis(200))?;
    let multi_stream = MULTI_STREAM.load(Ordering::Acquire);
    let record = pool.record(p.device, dead, multi_stream, super::streams::multi_stream_because());
    Some(PoolRecord {
        lock_waits: p.waits.count.load(Ordering::Relaxed),
        lock_wait_ns: p.waits.ns.load(Ordering::Relaxed),
        ..record
    })
}

/// What threads' magazines did, if any thread started one.
pub fn magazines() -> Option<cupool_core::log::MagazineRecord> {
    super::magazine::record()
}

/// The pool's state when a request failed (`Engine::at_oom`).
pub fn at_oom(p: &ContextPool) -> (Fragmentation, Vec<u64>, u64) {
    p.pool.lock().at_oom()
}
