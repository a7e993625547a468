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
unsafe fn text<'a>(name: *const c_char) -> std::borrow::Cow<'a, str> {
    if name.is_null() {
        return "".into();
    }
    String::from_utf8_lossy(CStr::from_ptr(name).to_bytes())
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

/// The message of an NVTX range, as the program gave it.
pub enum Message<'a> {
    Text(std::borrow::Cow<'a, str>),
    /// A handle from `nvtxDomainRegisterString*`: see `register`.
    Registered(usize),
    None,
}

impl Message<'_> {
    fn text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Message::Text(t) => t.clone(),
            Message::Registered(h) => {
                let name = h.checked_sub(1).and_then(|id| crate::sink::text_of(id as u32));
                name.map_or("".into(), Into::into)
            }
            Message::None => "".into(),
        }
    }
}

/// `nvtxDomainRegisterString*`: a handle that names `text` (never null).
pub fn register(text: &str) -> usize {
    diag::shielded(|| crate::sink::intern(text) as usize + 1).unwrap_or(1)
}

/// An NVTX push in `domain` (0: the default domain).
pub fn nvtx_push(api: Api, domain: usize, message: Message) -> i32 {
    if !crate::runtime::options::get().nvtx {
        return 0;
    }
    let name = message.text();
    diag::shielded(|| phases::push_thread(api, domain, &name)).unwrap_or(-1)
}

pub fn nvtx_pop(api: Api, domain: usize) -> i32 {
    if !crate::runtime::options::get().nvtx {
        return 0;
    }
    diag::shielded(|| phases::pop_thread(api, domain)).unwrap_or(-1)
}

pub fn nvtx_start(api: Api, message: Message) -> u64 {
    if !crate::runtime::options::get().nvtx {
        return 0;
    }
    let name = message.text();
    diag::shielded(|| phases::start_range(api, &name)).unwrap_or(0)
}

pub fn nvtx_end(api: Api, id: u64) {
    if id != 0 {
        diag::shielded(|| phases::end_range(api, id));
    }
}
