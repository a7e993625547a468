//! cupool's own C API, for programs and the Python module (`python/cupool`)
//! that want figures from inside the run. A program not started under
//! cupool simply does not find these symbols (`dlsym` returns NULL).

use crate::intercept::phases;
use crate::intercept::stats::{self, MemoryStats};
use std::ffi::{c_char, c_int};

/// Bumped when a struct below changes incompatibly.
pub const API_VERSION: c_int = 1;

#[no_mangle]
pub extern "C" fn cupool_api_version() -> c_int {
    API_VERSION
}

/// Fills `out` (of `size` bytes, for compatibility with older callers) with
/// `device`'s figures. Returns 0, or -1 when `out` is NULL or too small.
///
/// # Safety
/// `out` is NULL or valid for writes of `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn cupool_memory_stats(device: c_int, out: *mut MemoryStats, size: usize) -> c_int {
    if out.is_null() || size < std::mem::size_of::<MemoryStats>() {
        return -1;
    }
    match stats::memory(device) {
        Some(s) => {
            *out = s;
            0
        }
        None => -1,
    }
}

/// Starts `device`'s peaks again from what is held now.
#[no_mangle]
pub extern "C" fn cupool_reset_peak_memory_stats(device: c_int) {
    stats::reset_peaks(device);
}

/// Begins a phase named `name` (nestable; ended by `cupool_phase_end`).
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cupool_phase_begin(name: *const c_char) {
    phases::begin(name);
}

/// Ends the innermost phase begun by `cupool_phase_begin`.
#[no_mangle]
pub extern "C" fn cupool_phase_end() {
    phases::end();
}

/// Marks the start of the part of the run named `name`; the part the
/// previous mark began ends here.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cupool_mark(name: *const c_char) {
    phases::mark(name);
}
