//! Phases named by the program through cupool's C API. They never start
//! recording by themselves (a program that touches no CUDA memory writes no
//! log); the phases open when recording starts are written then.

use crate::observe::phases;
use crate::runtime::diag;
use cupool_core::log::Api;
use std::ffi::{c_char, CStr};

/// The name behind a C string; NULL reads as "".
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
unsafe fn text(name: *const c_char) -> std::borrow::Cow<'static, str> {
    if name.is_null() {
        return "".into();
    }
    String::from_utf8_lossy(CStr::from_ptr(name).to_bytes()).into_owned().into()
}

/// # Safety
/// As `text`.
pub unsafe fn begin(name: *const c_char) {
    let name = text(name);
    diag::shielded(|| phases::begin(Api::CupoolPhaseBegin, &name));
}

pub fn end() {
    let ended = diag::shielded(|| phases::end(Api::CupoolPhaseEnd));
    if ended == Some(false) {
        diag::note("cupool_phase_end without an open phase: ignored");
    }
}

/// # Safety
/// As `text`.
pub unsafe fn mark(name: *const c_char) {
    let name = text(name);
    diag::shielded(|| phases::mark(Api::CupoolMark, &name));
}
