//! A context dies (`cuCtxDestroy`, a device reset, or a reset the shim did
//! not see): its pool is retired and its allocations die with it.

use super::context;
use crate::cuda::{Status, SUCCESS};
use crate::observe;
use crate::pool;
use crate::runtime::{diag, guard::Guard};
use cupool_core::log::Api;

/// `cuCtxDestroy`: the context and everything it held die.
pub fn context_destroy(ctx: u64, real: impl FnOnce() -> Status) -> Status {
    let Some(_guard) = Guard::enter() else {
        return real();
    };
    let r = real();
    if r == SUCCESS {
        diag::shielded(|| context_died(Api::CuCtxDestroy, -1, ctx));
    }
    r
}

/// A reset of `device`'s primary context (`cudaDeviceReset`,
/// `cuDevicePrimaryCtxReset`): the context and everything it held die.
pub fn primary_reset(api: Api, device: impl FnOnce() -> i32, real: impl FnOnce() -> Status) -> Status {
    let Some(_guard) = Guard::enter() else {
        return real();
    };
    let device = device();
    let primary = diag::shielded(|| context::primary(device)).flatten();
    let r = real();
    if let (SUCCESS, Some(ctx)) = (r, primary) {
        diag::shielded(|| context_died(api, device, ctx));
    }
    r
}

/// Context `ctx` died, and with it its pool and everything it held.
fn context_died(api: Api, device: i32, ctx: u64) {
    retire_context(api, device, ctx, |p| p.ctx == ctx);
}

/// Handle `ctx` now names a new context (id `id`): the one it named before
/// died without a call cupool sees, which only the static runtime's
/// `cudaDeviceReset` does. Its pool and allocations die now, reported as
/// dying in that reset.
#[cold]
pub fn context_reborn(ctx: u64, id: u64) {
    // The new context has no segment yet: every heap of `ctx` is the dead one's.
    retire_context(Api::CudaDeviceReset, -1, ctx, |p| p.ctx == ctx && p.id != id);
    observe::remark("a context was destroyed and created again behind cupool's back (a static runtime's cudaDeviceReset): its pool was dropped when the new one was first used");
}

/// The memory of context `ctx` died at `api`: the tools hear first, the
/// pools that `dies` picks are retired, and its allocations die.
fn retire_context(api: Api, device: i32, ctx: u64, dies: impl Fn(&pool::ContextPool) -> bool) {
    pool::tools::context_died(ctx);
    pool::ipc::pages::forget_context(ctx);
    for (device, reserved) in pool::drop_context(dies) {
        observe::reserved_changed(device, -(reserved as i64));
    }
    observe::context_died(api, device, |a| a.ctx == ctx);
}
