//! Stream capture. While a capture is under way anywhere in the process the
//! pool serves no allocation: the real call then does exactly what CUDA does
//! (a global-mode capture refuses `cudaMalloc` and is invalidated, a relaxed
//! one gets memory), and memory handed out during a capture may be touched by
//! the graph at any later launch, which no fence of the pool's can order.
//! A stream-ordered allocation captured into a graph is the graph's (made and
//! freed again at each launch), not the program's: it is not tracked.

use super::call::is_runtime;
use super::context;
use super::last_error::no_error_pending;
use crate::cuda::{Status, CAPTURE_ERRORS, INVALID_CONTEXT, SUCCESS};
use crate::runtime::diag;
use crate::{pool, real};
use cupool_core::log::Api;

pub fn begin(stream: u64, per_thread: bool, real: impl FnOnce() -> Status) -> Status {
    let r = real();
    if r == SUCCESS {
        diag::shielded(|| pool::capture_begun(stream, per_thread));
    }
    r
}

pub fn end(stream: u64, per_thread: bool, real: impl FnOnce() -> Status) -> Status {
    let r = real();
    // An invalidated capture ends too (with an error); a stream that was not
    // capturing is not in the list.
    diag::shielded(|| {
        pool::capture_ended(stream, per_thread);
        // IPC blocks closed during the captures go now, as they went plainly at their close.
        pool::ipc::pages::unmap_parked();
    });
    r
}

/// Is this stream-ordered allocation being captured into a graph?
#[inline]
pub fn into_graph(stream: u64, per_thread: bool) -> bool {
    if !pool::any_capture() {
        return false;
    }
    let captured = diag::shielded(|| pool::is_capturing(stream, per_thread)).unwrap_or(false);
    if captured {
        crate::observe::incidents::graph_allocation();
    }
    captured
}

/// During a stream capture a pooled free must fail exactly where `cuMemFree`
/// would, and break the capture as it would. The driver refuses `cuMemAlloc`
/// by the same rule (an unsafe call under a global-mode capture, even one
/// already invalidated, or under this thread's own thread-local one; allowed
/// under a relaxed capture or another thread's thread-local one), so a small
/// allocation asks it. A synchronisation would not do: it fails while any
/// stream of the context is capturing, in every mode, and breaks that
/// capture, where `cuMemFree` succeeds and leaves it whole (measured on an
/// H200, `scripts/gpu/graph.cu`; numba-cuda's suite met it). For a runtime
/// call the runtime's own `cudaMalloc` asks, so that a refusal is the
/// thread's last error too, as `cudaFree`'s would be. `pool` served the block.
#[inline]
pub fn refused_free(api: Api, pool: pool::PoolHandle) -> Option<Status> {
    if !pool::any_capture() {
        return None;
    }
    capture_probe(api, pool)
}

/// The probe itself, out of the free's way.
#[cold]
#[inline(never)]
fn capture_probe(api: Api, pool: pool::PoolHandle) -> Option<Status> {
    // Only with no error unread: the probe's own failure would replace it.
    let r = if is_runtime(api) && no_error_pending(api) {
        runtime_probe()
    } else {
        let r = driver_probe();
        // `cuMemFree` needs no current context, and from a thread without
        // one it is refused under a global capture of the block's context
        // (H200, `scripts/gpu/graph.cu` no-context-free), where the probe
        // would only answer that there is no context.
        if r == INVALID_CONTEXT && context::current_only() == 0 {
            pool::in_context_of(pool, driver_probe).unwrap_or(r)
        } else {
            r
        }
    };
    CAPTURE_ERRORS.contains(&r).then_some(r)
}

/// A one-byte `cudaMalloc`, freed at once; a refusal other than a
/// capture's is taken back from the thread's last error.
fn runtime_probe() -> Status {
    let mut probe = std::ptr::null_mut();
    // SAFETY: the runtime's `cudaMalloc` (prototype in `cuda/table.rs`) writes only into `probe`, a live
    // local.
    let r = unsafe { real!(cudaMalloc(&mut probe, 1)) };
    if r == SUCCESS {
        // SAFETY: frees the one byte the runtime just allocated, once.
        unsafe { real!(cudaFree(probe)) };
    } else if !CAPTURE_ERRORS.contains(&r) {
        // SAFETY: `cudaGetLastError` takes no arguments.
        unsafe { real!(cudaGetLastError()) }; // a full device: the free goes ahead, as plainly
    }
    r
}

/// A one-byte `cuMemAlloc` in the current context, freed at once.
fn driver_probe() -> Status {
    let mut probe = 0;
    // SAFETY: the driver's `cuMemAlloc_v2` writes only into `probe`, a live local.
    let r = unsafe { real!(cuMemAlloc_v2(&mut probe, 1)) };
    if r == SUCCESS {
        // SAFETY: frees the one byte the driver just allocated, once.
        unsafe { real!(cuMemFree_v2(probe)) };
    }
    r
}
