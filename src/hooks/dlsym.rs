//! `dlsym` interposition. The CUDA runtime, static or shared, finds the driver
//! with `dlsym(libcuda, "cuGetProcAddress_v2")`; a handle-specific lookup
//! ignores LD_PRELOAD, so this is the door cupool must stand in.
//!
//! The exported `dlsym` is a few instructions of assembly: it asks cupool
//! whether the name is one it wraps, and otherwise *tail-jumps* to the C
//! library's `dlsym`. A tail jump keeps the caller's return address, which
//! glibc uses to resolve `RTLD_NEXT` and `RTLD_DEFAULT` relative to the
//! calling object; an ordinary call would make every such lookup relative to
//! cupool instead (and send LLVM's OpenMP into a loop).

use std::ffi::{c_char, c_void, CStr};

/// Returns cupool's wrapper for `name`, or null to let the real `dlsym` answer.
extern "C" fn lookup(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    crate::cuda::resolve::dlsym_fn(); // the trampoline jumps through it next
    if name.is_null() || handle == libc::RTLD_NEXT {
        return std::ptr::null_mut();
    }
    // Cheap reject first: this runs for every symbol Python imports.
    // SAFETY: `name` is non-null and, as `dlsym`'s contract requires, a NUL-terminated string. `&&` reads the
    // second byte only when the first is `c`, not the terminator, so both reads are inside the string.
    let cu = unsafe { *name as u8 == b'c' && *name.add(1) as u8 == b'u' };
    if !cu {
        return std::ptr::null_mut();
    }
    crate::runtime::diag::shielded(|| {
        // SAFETY: `name` is non-null and NUL-terminated (`dlsym`'s contract), alive for this call.
        let name = unsafe { CStr::from_ptr(name) };
        if name.to_bytes().starts_with(b"cuda") {
            super::procaddr::dlsym_substitute(super::runtime_entries(), handle, name)
        } else {
            super::procaddr::dlsym_substitute(super::driver_entries(), handle, name)
        }
    })
    .unwrap_or(std::ptr::null_mut())
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {lookup}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "jmp qword ptr [rip + {real}]",
        "2:",
        "ret",
        lookup = sym lookup,
        real = sym crate::cuda::resolve::REAL_DLSYM,
    )
}
