//! CUDA IPC hooks, runtime and driver: handles of pooled blocks name the
//! block, not its segment (`intercept::ipc`).

#![allow(non_snake_case)]

use super::entry;
use crate::cuda::{cudaIpcMemHandle_t, CUdeviceptr, CUipcMemHandle, Status};
use crate::intercept::ipc::{self, Handle};
// The runtime's answers that cupool makes itself are its last error too.
use crate::intercept::as_last_error;
use crate::real;
use std::ffi::{c_uint, c_void};

// Both handle types are `struct { char reserved[64]; }`.
const _: () = assert!(std::mem::size_of::<CUipcMemHandle>() == 64);
const _: () = assert!(std::mem::size_of::<cudaIpcMemHandle_t>() == 64);

/// The bytes of `h`, one of the two 64-byte handle types.
fn bytes<T>(h: &T) -> &Handle {
    const { assert!(std::mem::size_of::<T>() == std::mem::size_of::<Handle>()) };
    // SAFETY: `T` is one of the two IPC handle types, both `struct { char reserved[64]; }` (sizes asserted
    // above and at compile time here): every byte of `h` is initialised, and `Handle` is a byte array
    // (alignment 1) of that size, borrowed for as long as `h`.
    unsafe { &*(h as *const T).cast::<Handle>() }
}

/// A handle of type `T`, one of the two 64-byte handle types, from its bytes.
fn from_bytes<T: Copy>(h: &Handle) -> T {
    const { assert!(std::mem::size_of::<T>() == std::mem::size_of::<Handle>()) };
    // SAFETY: `T` is one of the two IPC handle types (size checked at compile time), plain bytes for which
    // any value is valid; `h` holds exactly that many bytes, read unaligned.
    unsafe { std::ptr::read_unaligned(h.as_ptr().cast::<T>()) }
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) -> Status {
    ipc::export(dptr, handle.cast(), |base| real!(cuIpcGetMemHandle(handle, base)))
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> Status {
    open_into(pdptr, handle, false, |p, h| real!(cuIpcOpenMemHandle_v2(p, h, flags)))
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) -> Status {
    open_into(pdptr, handle, false, |p, h| real!(cuIpcOpenMemHandle(p, h, flags)))
}

/// An open through the driver or the runtime: `out` is where the caller
/// wants the address (a `CUdeviceptr` or a `void *`, both 64 bits), `real`
/// the real open writing there; `runtime`: the runtime's entry point.
unsafe fn open_into<H: Copy>(
    out: *mut u64,
    handle: H,
    runtime: bool,
    real: impl FnOnce(*mut u64, H) -> Status,
) -> Status {
    if out.is_null() {
        return real(out, handle);
    }
    let mut block = 0;
    let r = ipc::open(bytes(&handle), &mut block, runtime, |h| {
        let mut base = 0u64;
        (real(&mut base, from_bytes(h)), base)
    });
    if r == 0 {
        *out = block;
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> Status {
    ipc::close(dptr, |base| real!(cuIpcCloseMemHandle(base)))
}

#[no_mangle]
pub unsafe extern "C" fn cudaIpcGetMemHandle(handle: *mut cudaIpcMemHandle_t, dev_ptr: *mut c_void) -> Status {
    as_last_error(ipc::export(dev_ptr as u64, handle.cast(), |base| {
        real!(cudaIpcGetMemHandle(handle, base as *mut c_void))
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cudaIpcOpenMemHandle(
    dev_ptr: *mut *mut c_void,
    handle: cudaIpcMemHandle_t,
    flags: c_uint,
) -> Status {
    as_last_error(open_into(dev_ptr.cast::<u64>(), handle, true, |p, h| {
        real!(cudaIpcOpenMemHandle(p.cast(), h, flags))
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cudaIpcCloseMemHandle(dev_ptr: *mut c_void) -> Status {
    as_last_error(ipc::close(dev_ptr as u64, |base| real!(cudaIpcCloseMemHandle(base as *mut c_void))))
}

/// For `dlsym` and `cuGetProcAddress` substitution.
pub static DRIVER_TABLE: &[super::Entry] = &[
    entry!(cuIpcGetMemHandle),
    entry!(cuIpcOpenMemHandle_v2),
    entry!(cuIpcOpenMemHandle),
    entry!(cuIpcCloseMemHandle),
];

pub static RUNTIME_TABLE: &[super::Entry] =
    &[entry!(cudaIpcGetMemHandle), entry!(cudaIpcOpenMemHandle), entry!(cudaIpcCloseMemHandle)];
