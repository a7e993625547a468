//! Which CUDA context (and device) a call is made in, asked of the driver.

use super::call::AllocCall;
use crate::cuda::{CUcontext, CUdevice, SUCCESS};
use crate::real;

/// The context current on this thread; 0 when none.
#[inline]
pub fn current_only() -> u64 {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: the driver's `cuCtxGetCurrent` (prototype in `cuda/table.rs`) writes only into `ctx`, a live
    // local.
    if unsafe { real!(cuCtxGetCurrent(&mut ctx)) } == SUCCESS {
        ctx as u64
    } else {
        0
    }
}

/// The unique id of the context current on this thread: a handle may come
/// back for a new context (a primary context reset and started again keeps
/// its handle), an id never does. One driver call, the only one a pooled
/// allocation makes. `None` when there is no usable current context (none
/// yet, or a primary context reset and not yet started again), and when the
/// driver cannot say (before CUDA 12: then the pool stays off).
#[inline]
pub fn current_id() -> Option<u64> {
    let mut id = 0;
    // SAFETY: the driver's `cuCtxGetId` with a null context asks about the current one, and writes only into
    // `id`, a live local.
    let r = unsafe { real!(cuCtxGetId(std::ptr::null_mut(), &mut id)) };
    (r == SUCCESS && id != 0).then_some(id)
}

/// The context current on this thread and its device; (0, -1) when none.
pub fn current() -> (u64, i32) {
    let ctx = current_only();
    if ctx == 0 {
        return (0, -1);
    }
    let mut dev: CUdevice = -1;
    // SAFETY: the driver's `cuCtxGetDevice` writes only into `dev`, a live local.
    let r = unsafe { real!(cuCtxGetDevice(&mut dev)) };
    (ctx, if r == SUCCESS { dev } else { -1 })
}

/// The primary context of `device` if it is active (asked before a reset,
/// so that only its allocations are reported as dying with it).
pub fn primary(device: i32) -> Option<u64> {
    // SAFETY: the driver's calls write only into the live locals `flags`, `active` and `ctx`; the release
    // balances the retain just made, so the primary context's count is as it was.
    unsafe {
        let (mut flags, mut active) = (0u32, 0i32);
        let r = real!(cuDevicePrimaryCtxGetState(device, &mut flags, &mut active));
        if r == SUCCESS && active == 0 {
            return None; // retaining it would create it
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        if real!(cuDevicePrimaryCtxRetain(&mut ctx, device)) != SUCCESS {
            return None;
        }
        real!(cuDevicePrimaryCtxRelease_v2(device));
        Some(ctx as u64)
    }
}

/// The current context; for a runtime call, created first if need be,
/// exactly as the runtime call being made would. 0 when none.
pub fn ensure(call: AllocCall) -> u64 {
    let ctx = current_only();
    if ctx != 0 || !start(call) {
        return ctx;
    }
    current_only()
}

/// A runtime call with no usable context starts one first, as the real call
/// would (`cudaFree(NULL)`, the runtime's idiom; after a reset too); a driver
/// call does not. Returns whether it tried.
pub fn start(call: AllocCall) -> bool {
    if !super::call::is_runtime(call.api) {
        return false;
    }
    // SAFETY: `cudaFree(NULL)` frees nothing: it only makes the runtime start its context, as the program's
    // call is about to.
    unsafe { real!(cudaFree(std::ptr::null_mut())) };
    true
}
