//! Incidents kept for the end record: allocations that died with their
//! context (checkpoint leaks) and what memory looked like at an out-of-memory.

use super::allocation::Allocation;
use crate::runtime::clock;
use cupool_core::log::{Api, OomRecord};
use cupool_core::pool::Fragmentation;
use parking_lot::Mutex;

/// An allocation still live when its context was destroyed.
pub struct CheckpointLeak {
    pub key: u64,
    pub allocation: Allocation,
    /// The call that destroyed the context.
    pub at: Api,
    pub t_ns: u64,
}

const MAX_CHECKPOINT_LEAKS: usize = 100_000;
static CHECKPOINT_LEAKS: Mutex<Vec<CheckpointLeak>> = Mutex::new(Vec::new());

pub use crate::runtime::diag::{remark, remarks};

/// Stream-ordered allocations captured into graphs (the graphs own them).
static GRAPH_ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn graph_allocation() {
    GRAPH_ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

pub fn graph_allocations() -> u64 {
    GRAPH_ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed)
}

/// OOM snapshots (the first few are the telling ones).
const MAX_OOMS: usize = 16;
static OOMS: Mutex<Vec<OomRecord>> = Mutex::new(Vec::new());

pub fn checkpoint(at: Api, died: &[(u64, Allocation)]) {
    let t_ns = clock::now_ns();
    let mut kept = CHECKPOINT_LEAKS.lock();
    for &(key, allocation) in died {
        if kept.len() < MAX_CHECKPOINT_LEAKS {
            kept.push(CheckpointLeak { key, allocation, at, t_ns });
        }
    }
}

/// `snapshot` is taken only while there is room to keep it.
pub fn out_of_memory(device: i32, bytes: u64, snapshot: impl FnOnce() -> (Fragmentation, Vec<u64>, u64)) {
    let mut ooms = OOMS.lock();
    if ooms.len() >= MAX_OOMS {
        return;
    }
    let (f, largest, address_reserved) = snapshot();
    ooms.push(OomRecord {
        t_ns: clock::now_ns(),
        device,
        requested: bytes,
        reserved: f.reserved,
        allocated: f.allocated,
        free_in_pool: f.free_bytes,
        largest_free_block: f.largest_free_block,
        largest_live: largest,
        address_reserved,
    });
}

/// Hands over everything kept, for the end record.
pub fn take() -> (Vec<CheckpointLeak>, Vec<OomRecord>) {
    (std::mem::take(&mut *CHECKPOINT_LEAKS.lock()), std::mem::take(&mut *OOMS.lock()))
}

pub fn lock_for_fork() {
    std::mem::forget(CHECKPOINT_LEAKS.lock());
    std::mem::forget(OOMS.lock());
    crate::runtime::diag::lock_remarks_for_fork();
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    CHECKPOINT_LEAKS.force_unlock();
    OOMS.force_unlock();
    crate::runtime::diag::unlock_remarks_after_fork(in_child);
    if in_child {
        CHECKPOINT_LEAKS.lock().clear();
        OOMS.lock().clear();
    }
}
