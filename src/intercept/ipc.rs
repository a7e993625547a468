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

use crate::cuda::{Status, SUCCESS};
use crate::pool;
use crate::runtime::{diag, guard::Guard};
use parking_lot::Mutex;
use std::collections::HashMap;

pub type Handle = [u8; 64];

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
    let Some(Some((segment, offset))) = diag::shielded(|| pool::export(ptr)) else {
        return real(ptr);
    };
    let r = real(segment);
    if r != SUCCESS || offset == 0 || handle.is_null() {
        return r;
    }
    if seal(&mut *handle, offset) {
        return SUCCESS;
    }
    // A driver whose handles use the bytes cupool marks: this block cannot
    // be named safely. CUDA's own error, never a wrong handle.
    diag::error("cannot export a pooled block through IPC with this driver's handle format");
    *handle = [0; 64];
    NOT_SUPPORTED
}

/// `cuIpcOpenMemHandle` and `cudaIpcOpenMemHandle`: `real(handle)` opens a
/// driver handle and returns (result, mapped base).
pub fn open(handle: &Handle, out: &mut u64, real: impl FnOnce(&Handle) -> (Status, u64)) -> Status {
    let Some((driver_handle, offset)) = unseal(handle) else {
        let (r, base) = real(handle);
        if r == SUCCESS {
            *out = base;
        }
        return r;
    };
    let (r, base) = real(&driver_handle);
    if r != SUCCESS {
        return r;
    }
    let block = base + offset;
    OPENED.lock().get_or_insert_with(HashMap::new).entry(block).or_insert((base, 0)).1 += 1;
    *out = block;
    SUCCESS
}

/// `cuIpcCloseMemHandle` and `cudaIpcCloseMemHandle`: a block opened from a
/// sealed handle closes its segment's mapping.
pub fn close(ptr: u64, real: impl FnOnce(u64) -> Status) -> Status {
    let base = {
        let mut opened = OPENED.lock();
        let table = opened.get_or_insert_with(HashMap::new);
        match table.get_mut(&ptr) {
            Some((base, count)) => {
                let base = *base;
                *count -= 1;
                if *count == 0 {
                    table.remove(&ptr);
                }
                Some(base)
            }
            None => None,
        }
    };
    real(base.unwrap_or(ptr))
}

/// Blocks opened from sealed handles: block address → (mapped segment base, opens).
static OPENED: Mutex<Option<HashMap<u64, (u64, u32)>>> = Mutex::new(None);

/// `CUDA_ERROR_NOT_SUPPORTED`.
const NOT_SUPPORTED: Status = 801;

const MARK: [u8; 2] = *b"cp";
const SEAL_VERSION: u8 = 1;
/// Offsets are kept in units of the pool's block alignment.
const OFFSET_SHIFT: u32 = 9;

/// Scrambles the driver's bytes so no driver accepts them.
fn scramble(h: &mut Handle) {
    for (i, b) in h[1..56].iter_mut().enumerate() {
        *b ^= 0xa5 ^ (i as u8).wrapping_mul(0x3b);
    }
}

fn checksum(h: &Handle) -> u8 {
    h[..59].iter().chain(&h[60..]).fold(0x5a, |acc: u8, &b| acc.rotate_left(3) ^ b)
}

fn seal(h: &mut Handle, offset: u64) -> bool {
    let units = offset >> OFFSET_SHIFT;
    if h[56..].iter().any(|&b| b != 0) || offset & ((1 << OFFSET_SHIFT) - 1) != 0 || units > u32::MAX as u64 {
        return false;
    }
    scramble(h);
    h[56..58].copy_from_slice(&MARK);
    h[58] = SEAL_VERSION;
    h[60..64].copy_from_slice(&(units as u32).to_le_bytes());
    h[59] = checksum(h);
    true
}

/// The driver's handle and the block's offset, when `h` was sealed by cupool.
fn unseal(h: &Handle) -> Option<(Handle, u64)> {
    if h[56..58] != MARK || h[58] != SEAL_VERSION || h[59] != checksum(h) {
        return None;
    }
    let units = u32::from_le_bytes([h[60], h[61], h[62], h[63]]);
    let mut driver = *h;
    driver[56..].fill(0);
    scramble(&mut driver);
    Some((driver, (units as u64) << OFFSET_SHIFT))
}

pub fn lock_for_fork() {
    std::mem::forget(OPENED.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    OPENED.force_unlock();
    if in_child {
        // CUDA mappings do not survive fork.
        *OPENED.lock() = None;
    }
}
