//! Memory queries answered as the program would see them without the pool:
//! free memory (through the `limit`), and what a pointer is.

use super::{context, limit};
use crate::cuda::{Status, SUCCESS};
use crate::observe::{self, Allocation, Space};
use crate::pool;
use crate::runtime::{diag, guard::Guard, options};
use cupool_core::options::Mode;

/// `cudaMemGetInfo`/`cuMemGetInfo`: the real answer, seen through the `limit`.
/// Applied once, at the outermost call (the runtime's calls the driver's).
///
/// # Safety
/// `free` and `total` are null or valid for writes.
pub unsafe fn mem_info(free: *mut usize, total: *mut usize, real: impl FnOnce() -> Status) -> Status {
    let Some(_guard) = Guard::enter() else {
        return real();
    };
    // A program that measures free memory sees what it would see without
    // cupool: cached segments that are wholly free go back first (what is
    // free inside partly used segments still counts as used). Not during a
    // stream capture, which a `cuMemFree` could break.
    if options::get().mode == Mode::Pool && !pool::any_capture() {
        diag::shielded(|| {
            pool::settle(false, &mut observe::reserved_changed);
            for (device, released) in pool::give_back_free_segments(context::current().1) {
                observe::reserved_changed(device, -(released as i64));
            }
        });
    }
    let r = real();
    if r == SUCCESS {
        diag::shielded(|| limit::apply(free, total));
    }
    r
}

/// What a pointer is to the pools: pooled blocks answer pointer queries as
/// the allocations they are to the program.
pub enum PooledPointer {
    /// Inside a live pooled block: its (start, size, buffer id), and for a
    /// block on VMM pages whether cupool can export it through IPC (the
    /// driver's answer for a segment's block stands).
    Block(u64, u64, u64, Option<bool>),
    /// Inside a pool segment but in no live block: freed, as far as the
    /// program can tell, and CUDA would not know it.
    Freed,
    NotPooled,
}

/// What `ptr` is to the pools, with the program's allocation there when it
/// lies in a block. A block the pool counts as allocated that the program
/// does not hold sits in a thread's magazine (freed, or never handed out):
/// the magazines give their blocks back, and the pools are asked again.
pub fn find_as_the_program_sees_it(ptr: u64) -> (pool::Found, Option<Allocation>) {
    let ask = || {
        let found = pool::find(ptr);
        let live = match &found {
            pool::Found::Block(b) => observe::live_at(Space::Pointer, b.addr),
            _ => None,
        };
        (found, live)
    };
    match ask() {
        // Not during a capture: a segment going back could break it.
        (pool::Found::Block(_), None) if !pool::any_capture() => {
            let _guard = Guard::enter(); // the pools may call CUDA: not through the hooks
            pool::settle(false, &mut observe::reserved_changed);
            ask()
        }
        found => found,
    }
}

pub fn pooled_pointer(ptr: u64) -> PooledPointer {
    if crate::runtime::guard::inside() {
        // cupool's own calls (and the runtime's under a hook) get the driver's answers.
        return PooledPointer::NotPooled;
    }
    let found = diag::shielded(|| match find_as_the_program_sees_it(ptr) {
        (pool::Found::Block(b), live) => {
            // The size the program asked for: a magazine's block was taken for its size class.
            let id = live.and_then(|a| a.pooled).map_or(0, |p| p.buffer_id);
            let size = live.map_or(b.size, |a| a.size);
            PooledPointer::Block(b.addr, size, id, b.vmm.then_some(b.shareable))
        }
        (pool::Found::Freed, _) => PooledPointer::Freed,
        (pool::Found::Outside, _) => PooledPointer::NotPooled,
    });
    found.unwrap_or(PooledPointer::NotPooled)
}
