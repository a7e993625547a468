//! The CUDA side of sharing VMM blocks: an exporter turns page handles into
//! POSIX file descriptors; a receiver imports them, maps them behind a
//! range of its own and grants its device access, as `cuIpcOpenMemHandle`
//! would map a legacy allocation.

use super::broker;
use super::Ticket;
use crate::cuda::{CUmemAccessDesc, CUmemGenericAllocationHandle, Status, SUCCESS};
use crate::pool::fence::InContext;
use crate::real;
use cudarc::driver::sys::{CUmemAccess_flags, CUmemAllocationHandleType, CUmemLocation, CUmemLocationType};
use parking_lot::Mutex;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

const POSIX_FD: libc::c_int = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 as libc::c_int;

/// A descriptor of the physical page `handle`; only pages created shareable
/// (`pool/pages.rs`) have one.
pub fn export_fd(handle: u64) -> Result<OwnedFd, Status> {
    let mut fd: libc::c_int = -1;
    // SAFETY: the driver's `cuMemExportToShareableHandle` writes one `int` descriptor into `fd`, a live
    // local, for a POSIX descriptor handle type; `handle` is a page handle of a pool.
    let r = unsafe { real!(cuMemExportToShareableHandle((&mut fd as *mut libc::c_int).cast(), handle, POSIX_FD, 0)) };
    if r != SUCCESS {
        return Err(r);
    }
    // SAFETY: the call succeeded: `fd` is a new descriptor the driver opened for this call, owned by nothing
    // else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A block opened from a pages seal: the receiver's own range and pages.
#[derive(Clone, Debug)]
pub struct Imported {
    pub ticket: Ticket,
    ctx: u64,
    base: u64,
    span: u64,
    /// (address, size, handle) of each page mapped.
    pages: Vec<(u64, u64, CUmemGenericAllocationHandle)>,
}

impl Imported {
    /// The context it is mapped in.
    pub fn ctx(&self) -> u64 {
        self.ctx
    }
}

/// The current context, or CUDA's error for its absence.
pub fn current_context() -> Result<u64, Status> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: the driver's `cuCtxGetCurrent` writes only into `ctx`, a live local.
    let r = unsafe { real!(cuCtxGetCurrent(&mut ctx)) };
    if r != SUCCESS {
        return Err(r);
    }
    if ctx.is_null() {
        return Err(crate::cuda::INVALID_CONTEXT);
    }
    Ok(ctx as u64)
}

/// Is `ptr` still mapped (not gone with a destroyed context)?
pub fn still_mapped(ptr: u64) -> bool {
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: the driver's `cuMemGetAddressRange_v2` writes only into `base` and `size`, live locals; `ptr`
    // is taken by value.
    unsafe { real!(cuMemGetAddressRange_v2(&mut base, &mut size, ptr)) == SUCCESS }
}

/// Maps the block of `ticket` in the current context; returns its address.
pub fn import(ticket: Ticket) -> Result<(u64, Imported), Status> {
    unmap_parked();
    let ctx = current_context()?;
    let mut device = 0;
    // SAFETY: the driver's `cuCtxGetDevice` writes only into `device`, a live local.
    let r = unsafe { real!(cuCtxGetDevice(&mut device)) };
    if r != SUCCESS {
        return Err(r);
    }
    let mut m = Imported { ticket, ctx, base: 0, span: 0, pages: Vec::new() };
    let mut handles = Vec::new();
    let fetched = broker::fetch(ticket, |fd: RawFd, size| {
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: the driver's `cuMemImportFromShareableHandle` writes into `h`, a live local; for a POSIX
        // descriptor handle type the "pointer" argument carries the descriptor itself, `fd`, open until this
        // callback returns (`broker::fetch`).
        let r = unsafe { real!(cuMemImportFromShareableHandle(&mut h, fd as usize as *mut _, POSIX_FD)) };
        if r != SUCCESS {
            return Err(r);
        }
        handles.push((h, size));
        Ok(())
    });
    let offset = match fetched {
        Ok(offset) => offset,
        Err(r) => {
            release(&handles);
            return Err(r);
        }
    };
    let span: u64 = handles.iter().map(|&(_, size)| size).sum();
    let align = handles.first().map_or(0, |&(_, size)| size);
    // SAFETY: the driver's `cuMemAddressReserve` writes the range's address into `m.base`, a live field.
    let r = unsafe { real!(cuMemAddressReserve(&mut m.base, span as usize, align as usize, 0, 0)) };
    if r != SUCCESS {
        release(&handles);
        return Err(r);
    }
    m.span = span;
    let mut at = m.base;
    for &(h, size) in &handles {
        // SAFETY: the driver's `cuMemMap` of page `h` (just imported) at `at`, inside the range reserved
        // above (`span` is the sum of the pages' sizes).
        let r = unsafe { real!(cuMemMap(at, size as usize, 0, h, 0)) };
        if r != SUCCESS {
            let mapped = m.pages.len();
            release(&handles[mapped..]);
            unmap(&m);
            return Err(r);
        }
        m.pages.push((at, size, h));
        at += size;
    }
    let access = CUmemAccessDesc {
        location: CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device },
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the driver's `cuMemSetAccess` reads one `CUmemAccessDesc` from `access`, a live local, for the
    // range reserved and mapped above.
    let r = unsafe { real!(cuMemSetAccess(m.base, span as usize, &access, 1)) };
    if r != SUCCESS {
        unmap(&m);
        return Err(r);
    }
    Ok((m.base + offset, m))
}

fn release(handles: &[(CUmemGenericAllocationHandle, u64)]) {
    for &(h, _) in handles {
        // SAFETY: the driver's `cuMemRelease` of a handle imported by this call and not released yet.
        unsafe { real!(cuMemRelease(h)) };
    }
}

/// Blocks closed during a stream capture, unmapped when the captures have
/// ended (or at the next close or open made outside one): the wait for the
/// receiver's work that comes first would break the capture (a
/// synchronisation fails under every capture mode), and an unmap without it
/// could take pages from under a queued kernel.
static PARKED: Mutex<Vec<Imported>> = Mutex::new(Vec::new());

/// The last close of an imported block: unmapped once the receiver's work
/// on it is done (an unmap does not wait for queued kernels), its pages
/// released, its range freed; during a capture, parked until after it.
pub fn unmap(m: &Imported) {
    if crate::pool::any_capture() {
        PARKED.lock().push(m.clone());
        return;
    }
    unmap_parked();
    unmap_now(m);
}

/// Unmaps the blocks closed during a capture, once none is under way.
pub fn unmap_parked() {
    if crate::pool::any_capture() {
        return;
    }
    let parked = std::mem::take(&mut *PARKED.lock()); // not held through the unmaps
    for m in parked {
        unmap_now(&m);
    }
}

/// Context `ctx` died, and its mappings with it: a handle it leaves may name
/// a new context, whose memory an unmap of the old addresses would take.
pub fn forget_context(ctx: u64) {
    PARKED.lock().retain(|m| m.ctx != ctx);
}

pub fn lock_for_fork() {
    std::mem::forget(PARKED.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    PARKED.force_unlock();
    if in_child {
        PARKED.lock().clear(); // CUDA mappings do not survive fork
    }
}

fn unmap_now(m: &Imported) {
    let Some(_current) = InContext::enter(m.ctx) else {
        // The context died, and the mapping with it.
        return;
    };
    // SAFETY: the driver's `cuCtxSynchronize` takes no arguments; the mapping's context is current
    // (`_current`).
    unsafe { real!(cuCtxSynchronize()) };
    for &(at, size, h) in &m.pages {
        // SAFETY: the driver's `cuMemUnmap`/`cuMemRelease` of pages this mapping mapped and holds
        // (`m.pages`), each released once: the mapping is dropped after this.
        unsafe {
            real!(cuMemUnmap(at, size as usize));
            real!(cuMemRelease(h));
        }
    }
    if m.span > 0 {
        // SAFETY: the driver's `cuMemAddressFree` of the range this mapping reserved (`span > 0`), once.
        unsafe { real!(cuMemAddressFree(m.base, m.span as usize)) };
    }
}
