//! Streams created and destroyed, GPU work queued, contexts bound: what the
//! pools' fences must know to keep reuse safe.

use super::context;
use crate::observe;
use crate::pool;
use crate::runtime::diag;

/// A stream was created in the current context.
pub fn stream_created(stream: u64) {
    diag::shielded(|| pool::stream_created(context::current().0, stream));
}

pub fn stream_destroyed(stream: u64) {
    diag::shielded(|| pool::stream_destroyed(stream));
}

/// The calling thread made a context current. With the runtime linked
/// statically, another thread's kernels run on streams cupool never sees
/// (`--default-stream per-thread`), and binding a context is the one sign of
/// that thread: once one shows while pooled allocations come only through
/// the driver API and no launch is visible, freed blocks wait for fences.
pub fn context_bound() {
    if crate::runtime::guard::inside() {
        // A shared runtime binding beneath one of cupool's runtime hooks
        // (cupool's own bindings call the driver directly, never this).
        return;
    }
    if pool::context_bound(crate::runtime::guard::tid() as u64) {
        observe::remark(BOUND_THREAD);
    }
}

pub const DRIVER_THREADS: &str = "pooled allocations through the driver API from several threads (a static runtime's \
    launches are invisible, so their kernels may run side by side on per-thread default streams): freed blocks wait for \
    fences";
pub const BOUND_THREAD: &str = "a second thread made a context current where no kernel launch is visible (a static \
    runtime, whose launches on per-thread default streams no hook sees): freed blocks wait for fences";

/// What a hook that queues GPU work queued.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// A kernel: a program whose kernel launches are seen has none unseen.
    Launch,
    /// Anything else (copies, memsets, host functions, graphs, memory operations).
    Other,
}

/// GPU work was queued on `stream` (`per_thread_api`: through a `_ptsz`
/// entry point, where stream 0 is the calling thread's default stream).
#[inline]
pub fn work_queued(stream: u64, per_thread_api: bool, work: Work) {
    if work == Work::Launch {
        pool::launch_seen();
    }
    pool::note_work(stream, per_thread_api);
}
