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
            p = unsafe { dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) } as usize;
            if p != 0 {
                break;
            }
        }
        if p == 0 {
            // No versioned dlsym at all: a C library we do not know. Nothing
            // sane is left to do; abort loudly rather than recurse forever.
            crate::diag::fatal("cannot find the C library's dlsym");
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
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
    let mut h = unsafe { libc::dlopen(name, libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
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
    unsafe { libc::dl_iterate_phdr(Some(visit), path.as_mut_ptr().cast()) };
    if path[0] == 0 {
        return std::ptr::null_mut();
    }
    let h = unsafe { libc::dlopen(path.as_ptr().cast(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if !h.is_null() {
        HANDLE.store(h, Ordering::Release);
    }
    h
}

/// Where a slot's real function lives.
#[derive(Clone, Copy)]
pub enum Lib {
    Runtime,
    Driver,
    Libc,
}

/// A lazily resolved real function. 0 = not looked up yet; 1 = looked up and absent.
pub struct Slot {
    pub name: &'static CStr,
    lib: Lib,
    ptr: AtomicUsize,
}

const ABSENT: usize = 1;

impl Slot {
    pub const fn new(name: &'static CStr, lib: Lib) -> Slot {
        Slot { name, lib, ptr: AtomicUsize::new(0) }
    }

    /// The real function's address, or `None` if it cannot be found.
    #[inline]
    pub fn get(&self) -> Option<usize> {
        match self.ptr.load(Ordering::Acquire) {
            0 => self.resolve(),
            ABSENT => None,
            p => Some(p),
        }
    }

    #[cold]
    fn resolve(&self) -> Option<usize> {
        let p = unsafe {
            match self.lib {
                Lib::Driver => {
                    let h = libcuda();
                    if h.is_null() {
                        std::ptr::null_mut()
                    } else {
                        dlsym(h, self.name)
                    }
                }
                Lib::Runtime => {
                    let p = dlsym(libc::RTLD_NEXT, self.name);
                    if p.is_null() {
                        let h = local_cudart();
                        if h.is_null() {
                            return None; // not cached: the runtime may be loaded later
                        }
                        dlsym(h, self.name)
                    } else {
                        p
                    }
                }
                Lib::Libc => dlsym(libc::RTLD_NEXT, self.name),
            }
        } as usize;
        if p == 0 {
            // The driver or runtime may simply not be loaded yet; only a
            // lookup in a library that is there is final.
            let final_answer = match self.lib {
                Lib::Libc => true,
                Lib::Driver => !LIBCUDA.load(Ordering::Acquire).is_null(),
                Lib::Runtime => false,
            };
            if final_answer {
                self.ptr.store(ABSENT, Ordering::Release);
            }
            return None;
        }
        self.ptr.store(p, Ordering::Release);
        Some(p)
    }

    /// Records a real address learned elsewhere (from `cuGetProcAddress` or a
    /// caller's `dlsym`), unless one is known already. Returns the address in force.
    pub fn learn(&self, p: usize) -> usize {
        match self.ptr.compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => p,
            Err(ABSENT) => {
                self.ptr.store(p, Ordering::Release);
                p
            }
            Err(known) => known,
        }
    }
}

/// Calls the real function in `$slot` with the given signature, or evaluates
/// `$missing` if it cannot be found.
#[macro_export]
macro_rules! call_real {
    ($slot:expr, fn($($t:ty),* $(,)?) -> $r:ty, ($($a:expr),* $(,)?), $missing:expr $(,)?) => {
        match $slot.get() {
            Some(p) => {
                let f: unsafe extern "C" fn($($t),*) -> $r = std::mem::transmute(p);
                f($($a),*)
            }
            None => $missing,
        }
    };
}
