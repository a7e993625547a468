//! The `limit` option as the program sees it in `cudaMemGetInfo`/`cuMemGetInfo`.

use crate::observe::counters;
use crate::pool;
use crate::runtime::options;

/// With a `limit`, the device looks that large: total is the cap, and free is
/// what the cap leaves after everything this process holds on the device
/// (memory the pool keeps cached counts as used, as in PyTorch's cache, so
/// free memory never rises because of cupool's caching).
///
/// # Safety
/// `free` and `total` are null or valid for writes.
pub unsafe fn apply(free: *mut usize, total: *mut usize) {
    let limit = options::get().limit;
    if limit == 0 || free.is_null() || total.is_null() {
        return;
    }
    let device = super::context::current().1;
    let (reserved, pooled_live) = pool::held_on(device);
    let used = reserved + counters::device_bytes(device).saturating_sub(pooled_live);
    *total = (*total).min(limit as usize);
    *free = (*free).min(limit.saturating_sub(used) as usize);
}
