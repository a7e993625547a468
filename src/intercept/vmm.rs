//! The program's own VMM calls: a handle released, a range mapped or unmapped.

use super::free::release;
use crate::cuda::{Status, SUCCESS};
use crate::lifecycle;
use crate::observe::{self, Space};
use crate::runtime::diag;
use cupool_core::log::{Api, EventKind};

/// `cuMemRelease` of a VMM handle.
#[inline]
pub fn release_handle(api: Api, handle: u64, real: impl FnOnce() -> Status) -> Status {
    release(api, Space::VmmHandle, handle, real)
}

/// A VMM map or unmap that happened.
pub fn mapping(kind: EventKind, api: Api, ptr: u64, size: u64, handle: u64, result: Status) {
    if result != SUCCESS || crate::runtime::guard::inside() {
        return;
    }
    diag::shielded(|| {
        lifecycle::recording();
        observe::mapping(kind, api, ptr, size, handle)
    });
}
