//! An allocation CUDA makes itself: the real call, within the `limit`, made
//! again when CUDA refused it and the pools gave back what they held.

use super::call::{allocation_record, is_runtime, AllocCall, Outcome};
use super::{capture, context, last_error, limit};
use crate::cuda::{Status, OUT_OF_MEMORY, SUCCESS};
use crate::observe::{self, Space};
use crate::runtime::{diag, guard::Guard, options};
use crate::{lifecycle, pool, real};
use cupool_core::log::MemKind;
use cupool_core::options::Mode;

/// An allocation CUDA makes itself.
#[inline]
pub fn allocation(call: AllocCall, mut real: impl FnMut() -> Outcome) -> Status {
    let Some(_guard) = Guard::enter() else {
        return real().0;
    };
    if call.kind == MemKind::Async && capture::into_graph(call.stream, call.api.as_str().ends_with("_ptsz")) {
        return real().0;
    }
    passthrough(call, real)
}

/// The real call for `call`, unless the cap refuses it; made again when CUDA
/// refused it and the pools gave memory back; the observers told.
pub fn passthrough(call: AllocCall, mut real: impl FnMut() -> Outcome) -> Status {
    if let Some(cap) = limit::cap().filter(|_| call.kind.is_device()) {
        if let Some(device) = diag::shielded(|| refused_by_cap(call, cap)).flatten() {
            lifecycle::recording();
            observe::alloc_failed(call.api, call.kind, device, call.request, OUT_OF_MEMORY);
            return last_error::runtime_error(call.api, OUT_OF_MEMORY);
        }
    }
    let may_retry =
        call.kind.is_device() && options::get().mode == Mode::Pool && last_error::no_error_pending(call.api);
    let (mut result, mut ptr, mut bytes) = real();
    if result == OUT_OF_MEMORY && may_retry && diag::shielded(|| gave_back_for(call)).unwrap_or(false) {
        (result, ptr, bytes) = real();
        if result == SUCCESS && is_runtime(call.api) {
            // The first attempt's error is still the thread's last one (a
            // success does not clear it), where without cupool the call
            // just succeeded: PyTorch checks `cudaGetLastError` after
            // every kernel launch.
            // SAFETY: `cudaGetLastError` takes no arguments.
            unsafe { real!(cudaGetLastError()) };
        }
    }
    diag::shielded(|| {
        lifecycle::recording(); // starts the clock before the first allocation is stamped
        let (ctx, dev) = context::current();
        let device = call.device.unwrap_or(dev);
        if result != SUCCESS {
            observe::alloc_failed(call.api, call.kind, device, bytes, result);
        } else if ptr != 0 {
            // A 0-byte request succeeds with a NULL pointer: nothing was allocated.
            observe::allocated(Space::of(call.kind), ptr, allocation_record(call, ctx, device, bytes, None));
        }
    });
    result
}

/// CUDA refused memory that the pool does not serve (stream-ordered, VMM,
/// managed, or anything while the pool stands aside): the pools give back
/// what they hold unused on that device, waiting for the GPU where freed
/// blocks still wait for it, so that memory the program freed is there for
/// the call again, as after a plain `cudaFree`. True: something went back;
/// make the call again. Not during a capture, which a wait would break.
#[cold]
fn gave_back_for(call: AllocCall) -> bool {
    if pool::any_capture() {
        return false;
    }
    let device = call.device.unwrap_or_else(|| context::current().1);
    if beyond_reach(call, device) {
        return false;
    }
    let released = pool::give_back_all_free(device, &mut observe::reserved_changed);
    if released > 0 {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            observe::remark(
                "CUDA refused memory the pool does not serve (stream-ordered, VMM or managed): the pools gave back \
                 what no block used, and the call was made again",
            )
        });
    }
    released > 0
}

/// Would `call` fail even with everything the pools hold on `device` given
/// back? Then it fails at once, as without cupool, instead of after a wait
/// for the GPU (a request past the device's memory). Asked of the current
/// context's device only; false when unsure.
fn beyond_reach(call: AllocCall, device: i32) -> bool {
    if context::current().1 != device {
        return false;
    }
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: the driver's `cuMemGetInfo_v2` writes only into `free` and `total`, live locals.
    if unsafe { real!(cuMemGetInfo_v2(&mut free, &mut total)) } != SUCCESS {
        return false;
    }
    call.request > (free as u64).saturating_add(pool::reserved_on(device))
}

/// The device, when `request` more bytes on it would pass the cap.
fn refused_by_cap(call: AllocCall, cap: u64) -> Option<i32> {
    let device = call.device.unwrap_or_else(|| current_device(call));
    limit::exceeded(cap, device, call.request).then_some(device)
}

fn current_device(call: AllocCall) -> i32 {
    context::ensure(call);
    context::current().1
}
