//! The C ABI surface: functions exported under CUDA's (and libc's) names.
//! Each hook only decodes its arguments, calls `intercept`, and returns
//! CUDA's own result.

pub mod api;
pub mod capture;
pub mod dlsym;
pub mod driver;
pub mod ipc;
pub mod nvtx;
pub mod procaddr;
pub mod process;
pub mod runtime;
pub mod submit;

use crate::cuda::RealFunction;
use std::ffi::c_void;

/// A function cupool wraps: its exported wrapper and the real one behind it.
pub struct Entry {
    wrapper: *const (),
    pub real: &'static dyn RealFunction,
}

// SAFETY: `wrapper` is the address of one of cupool's exported functions: set once in a `const` table, never
// written, never read through; `real` is `Sync` already. Sharing an `Entry` shares two immutable addresses.
unsafe impl Sync for Entry {}

impl Entry {
    #[doc(hidden)]
    pub const fn new(wrapper: *const (), real: &'static dyn RealFunction) -> Entry {
        Entry { wrapper, real }
    }
    pub fn wrapper(&self) -> *mut c_void {
        self.wrapper as *mut c_void
    }
}

/// `entry!(cuMemAlloc_v2)`: the hook of that name and its real function. It
/// does not compile unless the hook's prototype is the table's.
macro_rules! entry {
    ($name:ident) => {
        $crate::hooks::Entry::new($name as $crate::cuda::sig::$name as *const (), &$crate::cuda::real::$name)
    };
}
pub(crate) use entry;

/// Defines an entry point and its per-thread-default-stream twin (`_ptsz`),
/// which share a prototype and differ only in what stream 0 means. In the
/// body, `$real` is the running twin's real function and `$per_thread` says
/// which twin runs.
macro_rules! twins {
    ($name:ident / $ptsz:ident ($($arg:ident : $ty:ty),* $(,)?) |$real:ident, $per_thread:ident| $body:block) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::cuda::Status {
            let ($real, $per_thread) = (&$crate::cuda::real::$name, false);
            $body
        }
        #[no_mangle]
        pub unsafe extern "C" fn $ptsz($($arg: $ty),*) -> $crate::cuda::Status {
            let ($real, $per_thread) = (&$crate::cuda::real::$ptsz, true);
            $body
        }
    };
}
pub(crate) use twins;

/// Pitch of pooled pitched allocations: rows start 512-byte aligned, the
/// texture pitch alignment of every GPU CUDA 13 supports.
pub fn pitch_for(width: usize) -> usize {
    width.div_ceil(512).max(1).saturating_mul(512)
}

/// The bytes a pooled pitched allocation of `rows` rows occupies; 0 (the
/// pool does not serve it, the real call judges it) when that overflows.
pub fn pitched_bytes(pitch: usize, rows: &[usize]) -> u64 {
    rows.iter().try_fold(pitch, |n, &r| n.checked_mul(r)).map_or(0, |n| n as u64)
}

/// Every driver function cupool hands out a wrapper for.
pub fn driver_entries() -> impl Iterator<Item = &'static Entry> {
    driver::TABLE.iter().chain(submit::TABLE.iter()).chain(ipc::DRIVER_TABLE.iter()).chain(capture::DRIVER_TABLE.iter())
}

/// Every runtime function a caller may look up with `dlsym`.
pub fn runtime_entries() -> impl Iterator<Item = &'static Entry> {
    runtime::TABLE
        .iter()
        .chain(ipc::RUNTIME_TABLE.iter())
        .chain(capture::RUNTIME_TABLE.iter())
        .chain(submit::RUNTIME_TABLE.iter())
}
