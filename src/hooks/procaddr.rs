//! Handing out cupool's wrappers where the program asks the driver for entry
//! points. The real resolver runs first; its answer is replaced only when the
//! pointer it returned *is* a function cupool wraps, identified by address
//! (never by the requested name: the driver picks the ABI version, and a
//! wrapper must have exactly that ABI).

#![allow(non_snake_case)]

use super::Entry;
use crate::cuda::{Status, SUCCESS};
use crate::real;
use crate::runtime::diag;
use std::ffi::{c_char, c_int, c_void, CStr};

/// The wrapper for the real driver function at `real`, if cupool wraps it.
fn wrapper_for(real: usize) -> Option<*mut c_void> {
    if let Some(e) = super::driver_entries().find(|e| e.real.address() == Some(real)) {
        return Some(e.wrapper());
    }
    // Not an exported symbol's address: ask the dynamic linker what is there.
    // SAFETY: `Dl_info` is pointers and integers: all-zero (null pointers) is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `dladdr` only writes into `info`, a live local; `real` is looked up, never dereferenced.
    if unsafe { libc::dladdr(real as *const c_void, &mut info) } == 0
        || info.dli_saddr as usize != real
        || info.dli_sname.is_null()
    {
        return None;
    }
    // SAFETY: `dladdr` succeeded and `dli_sname` is non-null: the symbol's NUL-terminated name, kept by the
    // dynamic linker while its object is loaded (it holds a function the program is about to call).
    let name = unsafe { CStr::from_ptr(info.dli_sname) };
    let e = super::driver_entries().find(|e| e.real.name() == name)?;
    (e.real.learn(real) == real).then(|| e.wrapper())
}

/// Replaces `*pfn` by cupool's wrapper when it points at a wrapped function.
pub unsafe fn substitute(pfn: *mut *mut c_void) {
    if pfn.is_null() || (*pfn).is_null() {
        return;
    }
    if let Some(Some(w)) = diag::shielded(|| wrapper_for(*pfn as usize)) {
        *pfn = w;
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> Status {
    let r = real!(cuGetProcAddress(symbol, pfn, version, flags));
    if r == SUCCESS {
        substitute(pfn);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Status {
    let r = real!(cuGetProcAddress_v2(symbol, pfn, version, flags, status));
    if r == SUCCESS {
        substitute(pfn);
    }
    r
}

/// Looks `name` up in a table for `dlsym`: cupool's wrapper when the caller's
/// handle really resolves `name` to the function cupool wraps.
pub fn dlsym_substitute<'a>(
    mut table: impl Iterator<Item = &'a Entry>,
    handle: *mut c_void,
    name: &CStr,
) -> *mut c_void {
    let Some(e) = table.find(|e| e.real.name() == name) else {
        return std::ptr::null_mut();
    };
    // SAFETY: `handle` is the caller's own argument to `dlsym`, passed on as the real `dlsym` would receive
    // it; `name` is NUL-terminated.
    let found = unsafe { crate::cuda::resolve::dlsym(handle, name) } as usize;
    let wrapper = e.wrapper();
    if found == 0 || found == wrapper as usize {
        return std::ptr::null_mut(); // the real dlsym answers the same
    }
    if e.real.learn(found) == found {
        wrapper
    } else {
        std::ptr::null_mut() // a second copy of the library: leave it alone
    }
}
