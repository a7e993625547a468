//! The C ABI surface. Each hook is thin: guard, call the real function (or,
//! later, the pool), record, return CUDA's own result.

pub mod dlsym;
pub mod driver;
pub mod procaddr;
pub mod process;
pub mod runtime;
pub mod work;

use crate::real::Slot;
use std::ffi::c_void;

/// A function cupool wraps: its exported wrapper and where the real one is.
pub struct Entry {
    wrapper: *const (),
    pub real: &'static Slot,
}

// The wrapper pointer is a code address, immutable and valid for the process.
unsafe impl Sync for Entry {}

impl Entry {
    pub const fn new(wrapper: *const (), real: &'static Slot) -> Entry {
        Entry { wrapper, real }
    }
    pub fn wrapper(&self) -> *mut c_void {
        self.wrapper as *mut c_void
    }
}

/// Every driver function cupool hands out a wrapper for.
pub fn driver_entries() -> impl Iterator<Item = &'static Entry> {
    driver::TABLE.iter().chain(work::TABLE.iter())
}

/// Declares lazily resolved real functions of one library: `slots! { Lib::Driver; NAME = c"symbol"; ... }`.
macro_rules! slots {
    ($lib:expr; $($slot:ident = $name:literal;)*) => {
        $(pub static $slot: $crate::real::Slot = $crate::real::Slot::new($name, $lib);)*
    };
}
pub(crate) use slots;

macro_rules! entry {
    ($f:ident, $slot:path) => {
        $crate::hooks::Entry::new($f as *const (), &$slot)
    };
}
pub(crate) use entry;

/// Pitch of pooled pitched allocations: rows start 512-byte aligned, the
/// texture pitch alignment of every GPU CUDA 13 supports.
pub fn pitch_for(width: usize) -> usize {
    width.div_ceil(512).max(1) * 512
}

/// With a `limit`, the device looks that large: total is the cap, and free is
/// what the cap leaves after everything this process holds on the device
/// (memory the pool keeps cached counts as used, as in PyTorch's cache, so
/// free memory never rises because of cupool's caching).
pub unsafe fn apply_limit(free: *mut usize, total: *mut usize) {
    let limit = crate::state::options().limit;
    if limit == 0 || free.is_null() || total.is_null() {
        return;
    }
    let (_, device) = crate::record::current_context();
    let used = crate::pool::held_bytes(device);
    *total = (*total).min(limit as usize);
    *free = (*free).min(limit.saturating_sub(used) as usize);
}
