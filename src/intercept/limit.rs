//! The `limit` option: one cap on the device memory this process holds
//! through cupool, the same in every mode. Requests past it fail with CUDA's
//! out-of-memory error, and `cudaMemGetInfo` shows a device of that size.

use crate::observe::counters;
use crate::runtime::options;

/// The cap in bytes; `None` when there is none.
#[inline]
pub fn cap() -> Option<u64> {
    Some(options::get().limit).filter(|&l| l != 0)
}

/// Bytes this process holds on `device`: the pools' reserved segments plus
/// live allocations made outside the pools (lock-free: the counters keep it).
fn held(device: i32) -> u64 {
    counters::reserved_bytes(device)
}

/// Would `bytes` more on `device` go past the cap?
pub fn exceeded(cap: u64, device: i32, bytes: u64) -> bool {
    device >= 0 && held(device).saturating_add(bytes) > cap
}

/// What a pool of `device` that reserves `own` bytes may reserve in all: the
/// cap less what the process holds on the device outside that pool.
pub fn pool_cap(cap: u64, device: i32, own: u64) -> u64 {
    cap.saturating_sub(held(device).saturating_sub(own))
}

/// With a cap, the device looks that large: total is the cap, and free is
/// what the cap leaves after everything this process holds on the device
/// (memory the pool keeps cached counts as used, as in PyTorch's cache, so
/// free memory never rises because of cupool's caching).
///
/// # Safety
/// `free` and `total` are null or valid for writes.
pub unsafe fn apply(free: *mut usize, total: *mut usize) {
    let Some(cap) = cap() else { return };
    if free.is_null() || total.is_null() {
        return;
    }
    let used = held(super::context::current().1);
    *total = (*total).min(cap as usize);
    *free = (*free).min(cap.saturating_sub(used) as usize);
}
