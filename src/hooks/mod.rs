//! The C ABI surface. Each hook is thin: guard, call the real function (or,
//! later, the pool), record, return CUDA's own result.

pub mod dlsym;
pub mod driver;
pub mod procaddr;
pub mod process;
pub mod runtime;

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

macro_rules! entry {
    ($f:ident, $slot:path) => {
        $crate::hooks::Entry::new($f as *const (), &$slot)
    };
}
pub(crate) use entry;
