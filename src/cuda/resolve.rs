//! Finding the real functions behind the ones cupool exports.
//!
//! Three sources, in order of trust:
//! - `dlsym` itself comes from `dlvsym(RTLD_NEXT, ..)`: the public `dlsym` is
//!   cupool's own once the shim is loaded.
//! - Driver functions come from `libcuda.so.1` by exact versioned name.
//! - Runtime functions come from the next object in the global scope, or,
//!   when `libcudart` was loaded `RTLD_LOCAL` (Python extension modules),
//!   from whichever loaded object is named `libcudart.so*`: `RTLD_NEXT`
//!   cannot see into a local scope.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

extern "C" {
    fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void;
}

/// Read by the `dlsym` trampoline in `hooks::dlsym`, which tail-jumps through it.
/// Not exported: the trampoline addresses it PC-relative.
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// The C library's `dlsym`.
#[inline]
pub fn dlsym_fn() -> DlsymFn {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p == 0 {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: `dlvsym` with the `RTLD_NEXT` pseudo-handle and two NUL-terminated literals.
            p = unsafe { dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) } as usize;
            if p != 0 {
                break;
            }
        }
        if p == 0 {
            // No versioned dlsym at all: a C library we do not know. Nothing
            // sane is left to do; abort loudly rather than recurse forever.
            crate::runtime::diag::fatal("cannot find the C library's dlsym");
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: `p` is non-zero and is the C library's `dlsym`, found by its versioned name: its prototype is
    // `DlsymFn`.
    unsafe { std::mem::transmute::<usize, DlsymFn>(p) }
}

/// `dlsym` that bypasses cupool's own.
#[inline]
pub unsafe fn dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    dlsym_fn()(handle, name.as_ptr())
}

static LIBCUDA: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// A handle on the driver, loading it if the program has not yet.
pub fn libcuda() -> *mut c_void {
    let h = LIBCUDA.load(Ordering::Acquire);
    if !h.is_null() {
        return h;
    }
    let name = c"libcuda.so.1".as_ptr();
    // SAFETY: `name` is a NUL-terminated literal; with `RTLD_NOLOAD` nothing is loaded.
    let mut h = unsafe { libc::dlopen(name, libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        // SAFETY: `name` is a NUL-terminated literal. Loading the driver runs its initialisers, as the
        // program's own first CUDA call would.
        h = unsafe { libc::dlopen(name, libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_NODELETE) };
    }
    if !h.is_null() {
        LIBCUDA.store(h, Ordering::Release);
    }
    h
}

/// The loaded CUDA runtime when it is not in the global scope.
fn local_cudart() -> *mut c_void {
    static HANDLE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let h = HANDLE.load(Ordering::Acquire);
    if !h.is_null() {
        return h;
    }
    let mut path = [0u8; 4096];
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        let name = (*info).dlpi_name;
        if name.is_null() {
            return 0;
        }
        let bytes = CStr::from_ptr(name).to_bytes();
        let file = bytes.rsplit(|&b| b == b'/').next().unwrap_or(bytes);
        if file.starts_with(b"libcudart.so") && bytes.len() < 4095 {
            let out = data as *mut u8;
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), out, bytes.len());
            *out.add(bytes.len()) = 0;
            return 1;
        }
        0
    }
    // SAFETY: `visit` writes into `path` only a name shorter than its 4096 bytes, plus a NUL, and `path`
    // lives across the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), path.as_mut_ptr().cast()) };
    if path[0] == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `path` holds a NUL-terminated name (`visit`); with `RTLD_NOLOAD` nothing is loaded.
    let h = unsafe { libc::dlopen(path.as_ptr().cast(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if !h.is_null() {
        HANDLE.store(h, Ordering::Release);
    }
    h
}

/// Where a real function lives.
#[derive(Clone, Copy)]
pub enum Lib {
    Runtime,
    Driver,
    Libc,
}

/// The outcome of looking a real function up.
pub enum Lookup {
    Found(usize),
    /// Not there, and never will be: remember that.
    Absent,
    /// Not there yet: the driver or runtime may simply not be loaded yet.
    NotYet,
}

pub fn lookup(name: &CStr, lib: Lib) -> Lookup {
    // SAFETY: `dlsym` gets the `RTLD_NEXT` pseudo-handle or a handle checked non-null that the dynamic linker
    // returned, and a NUL-terminated name.
    let p = unsafe {
        match lib {
            Lib::Driver => {
                let h = libcuda();
                if h.is_null() {
                    std::ptr::null_mut()
                } else {
                    dlsym(h, name)
                }
            }
            Lib::Runtime => {
                let p = dlsym(libc::RTLD_NEXT, name);
                if p.is_null() {
                    let h = local_cudart();
                    if h.is_null() {
                        return Lookup::NotYet;
                    }
                    dlsym(h, name)
                } else {
                    p
                }
            }
            Lib::Libc => dlsym(libc::RTLD_NEXT, name),
        }
    } as usize;
    if p != 0 {
        return Lookup::Found(p);
    }
    // Only a lookup in a library that is there is final.
    let final_answer = match lib {
        Lib::Libc => true,
        Lib::Driver => !LIBCUDA.load(Ordering::Acquire).is_null(),
        Lib::Runtime => false,
    };
    if final_answer {
        Lookup::Absent
    } else {
        Lookup::NotYet
    }
}
