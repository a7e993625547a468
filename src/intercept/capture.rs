//! Stream capture. While a capture is under way anywhere in the process the
//! pool serves no allocation: the real call then does exactly what CUDA does
//! (a global-mode capture refuses `cudaMalloc` and is invalidated, a relaxed
//! one gets memory), and memory handed out during a capture may be touched by
//! the graph at any later launch, which no fence of the pool's can order.
//! A stream-ordered allocation captured into a graph is the graph's (made and
//! freed again at each launch), not the program's: it is not tracked.

use crate::cuda::{Status, SUCCESS};
use crate::pool;
use crate::runtime::diag;

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
