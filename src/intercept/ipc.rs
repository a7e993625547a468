//! CUDA IPC of pooled blocks, so that another process never maps the wrong
//! memory.
//!
//! The driver's handle names a whole driver allocation, and a pooled block
//! lies somewhere inside one of the pool's segments: the handle of a block
//! is byte-identical to its segment's, and opening it maps the segment's
//! start (measured on an H100). So, on export:
//! - a block at the start of its segment gets the driver's handle as it is:
//!   any receiver maps the segment, whose start is the block;
//! - a block further in gets a *sealed* handle: the driver's bytes 1..55
//!   scrambled (a driver refuses it with `CUDA_ERROR_INVALID_VALUE`, as it
//!   refuses any handle of arbitrary bytes), and cupool's mark, a checksum and
//!   the block's offset in bytes 56..63, where the driver's own handles hold
//!   zeros. A receiver under cupool unseals it, opens the segment and returns
//!   the block; a receiver not under cupool gets CUDA's error from its open
//!   call, never the segment's start.
//!
//! An exported block is never handed out again by the pool (another process
//! may read it through its handle until its own close; CUDA keeps freed
//! exported memory alive the same way).

use crate::cuda::{Status, INVALID_CONTEXT, INVALID_VALUE, SUCCESS};
use crate::pool;
pub use crate::pool::ipc::Handle;
use crate::pool::ipc::{Closed, Mapping, Sealed};
use crate::runtime::{diag, guard::Guard};

/// `CUDA_ERROR_NOT_SUPPORTED`.
const NOT_SUPPORTED: Status = 801;

/// `cuIpcGetMemHandle` and `cudaIpcGetMemHandle`: `real(base)` asks the
/// driver (or runtime) to write the handle of the allocation at `base` to
/// `handle`.
///
/// # Safety
/// `handle` is what the caller passed: NULL or valid for writes.
pub unsafe fn export(ptr: u64, handle: *mut Handle, real: impl FnOnce(u64) -> Status) -> Status {
    let Some(_guard) = Guard::enter() else {
        return real(ptr);
    };
    let block = match diag::shielded(|| super::queries::find_as_the_program_sees_it(ptr).0) {
        Some(pool::Found::Block(block)) => block,
        // Freed memory inside a live segment: the driver would hand out the
        // segment's handle; CUDA refuses freed memory.
        Some(pool::Found::Freed) => return INVALID_VALUE,
        _ => return real(ptr),
    };
    if block.vmm {
        return export_pages(&block, handle);
    }
    let offset = block.addr - block.segment;
    let r = real(block.segment);
    if r != SUCCESS || handle.is_null() {
        return r;
    }
    if offset == 0 || pool::ipc::seal(&mut *handle, offset) {
        diag::shielded(|| pool::exported(&block));
        return SUCCESS;
    }
    // A driver whose handles use the bytes cupool marks: this block cannot
    // be named safely. CUDA's own error, never a wrong handle.
    diag::error("cannot export a pooled block through IPC with this driver's handle format");
    *handle = [0; 64];
    NOT_SUPPORTED
}

/// A block on VMM pages, which legacy IPC cannot name: its pages are
/// published to this process's broker, and the handle is a sealed ticket
/// for them (`pool::ipc`).
unsafe fn export_pages(block: &pool::PooledBlock, handle: *mut Handle) -> Status {
    if handle.is_null() {
        return INVALID_VALUE;
    }
    let published = diag::shielded(|| pool::publish_pages(block)).unwrap_or(Err(INVALID_VALUE));
    match published {
        Ok(ticket) => {
            *handle = pool::ipc::seal_pages(ticket);
            diag::shielded(|| pool::exported(block));
            SUCCESS
        }
        Err(r) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                crate::observe::remark(&format!(
                    "backing=vmm: a pooled block exported through CUDA IPC could not be shared (its pages have no \
                     shareable handle, error {r}): the export failed with that error (backing=segments shares \
                     through legacy handles)"
                ))
            });
            r
        }
    }
}

/// `cuIpcOpenMemHandle` and `cudaIpcOpenMemHandle`: `real(handle)` opens a
/// driver handle and returns (result, mapped base); `runtime`: the call came
/// through the runtime, which makes its context current first.
pub fn open(handle: &Handle, out: &mut u64, runtime: bool, real: impl FnOnce(&Handle) -> (Status, u64)) -> Status {
    let (driver_handle, offset) = match pool::ipc::unseal(handle) {
        None => {
            let (r, base) = real(handle);
            if r == SUCCESS {
                *out = base;
            }
            return r;
        }
        Some(Sealed::Pages(ticket)) => {
            if runtime {
                // What the runtime's own open would do first: initialize
                // and make its device's context current (cudaFree(NULL)).
                // SAFETY: `cudaFree(NULL)` frees nothing: it only makes the runtime start its context, as its
                // own open would.
                let r = unsafe { crate::real!(cudaFree(std::ptr::null_mut())) };
                if r != SUCCESS {
                    return r;
                }
            }
            return open_pages(ticket, out);
        }
        Some(Sealed::Segment { driver, offset }) => (driver, offset),
    };
    let (r, base) = real(&driver_handle);
    if r != SUCCESS {
        return r;
    }
    // A handle cupool did not seal that happens to pass the check must not
    // point past what was mapped.
    if !mapping_holds(base, offset) {
        close_mapping(base);
        return INVALID_VALUE;
    }
    *out = base + offset;
    diag::shielded(|| pool::ipc::opened(*out, Mapping::Segment { base }));
    SUCCESS
}

/// A block on another process's VMM pages: mapped here from its pages'
/// shareable handles, once per process however often it is opened.
fn open_pages(ticket: pool::ipc::Ticket, out: &mut u64) -> Status {
    if diag::shielded(|| pool::ipc::broker::is_own(&ticket)) == Some(true) {
        // CUDA refuses to open a process's own handle.
        return INVALID_CONTEXT;
    }
    let ctx = match pool::ipc::pages::current_context() {
        Ok(ctx) => ctx,
        Err(r) => return r,
    };
    // Opened before in this context (each context maps it once, for its device).
    if let Some(block) = diag::shielded(|| pool::ipc::reopen(ticket, ctx)).flatten() {
        if pool::ipc::pages::still_mapped(block) {
            *out = block;
            return SUCCESS;
        }
        diag::shielded(|| pool::ipc::forget_opened(block));
    }
    match diag::shielded(|| pool::ipc::pages::import(ticket)).unwrap_or(Err(INVALID_VALUE)) {
        Ok((block, mapping)) => {
            *out = block;
            diag::shielded(|| pool::ipc::opened(block, Mapping::Pages(mapping)));
            SUCCESS
        }
        Err(r) => r,
    }
}

/// `cuIpcCloseMemHandle` and `cudaIpcCloseMemHandle`: a block opened from a
/// sealed handle closes its segment's mapping.
pub fn close(ptr: u64, real: impl FnOnce(u64) -> Status) -> Status {
    match diag::shielded(|| pool::ipc::opened_at(ptr)).flatten() {
        None => real(ptr),
        Some(Mapping::Segment { base }) => {
            let r = real(base);
            if r == SUCCESS {
                diag::shielded(|| pool::ipc::closed(ptr));
            }
            r
        }
        Some(Mapping::Pages(_)) => match diag::shielded(|| pool::ipc::closed(ptr)) {
            // Closed meanwhile by another thread: as closing an unopened pointer.
            None | Some(Closed::NotOpen) => INVALID_VALUE,
            Some(Closed::LastClose(Mapping::Pages(last))) => {
                diag::shielded(|| pool::ipc::pages::unmap(&last));
                SUCCESS
            }
            Some(_) => SUCCESS,
        },
    }
}

/// Is `offset` inside the mapping at `base`? (When the driver cannot say,
/// the mapping is taken as the handle describes it.)
fn mapping_holds(base: u64, offset: u64) -> bool {
    let (mut start, mut size) = (0u64, 0usize);
    // SAFETY: the driver's `cuMemGetAddressRange_v2` writes only into `start` and `size`, live locals.
    let r = unsafe { crate::real!(cuMemGetAddressRange_v2(&mut start, &mut size, base)) };
    r != SUCCESS || offset < size as u64
}

fn close_mapping(base: u64) {
    // SAFETY: `base` is the mapping the real open just made for this call (its caller returns without it):
    // closed once.
    unsafe { crate::real!(cuIpcCloseMemHandle(base)) };
}
