//! Phases of the run, as the program names them: a stack of explicit phases
//! (`cupool_phase_begin`/`_end`, nestable) and the current mark
//! (`cupool_mark` ends the phase the previous mark began). Kept from the
//! first call on, but written only once recording runs: phases open when it
//! starts are written then, so a program that never touches CUDA memory
//! still writes nothing.

use super::{counters, timeline};
use crate::runtime::SESSION;
use crate::sink;
use cupool_core::log::{Api, EventKind};
use parking_lot::Mutex;

struct Phases {
    /// (name id, the call that began it), innermost last.
    stack: Vec<(u32, Api)>,
    mark: Option<u32>,
}

static PHASES: Mutex<Phases> = Mutex::new(Phases { stack: Vec::new(), mark: None });

/// Deeper nesting than this is a program that never ends its phases: the
/// excess is not tracked (its ends still pop what is there).
const MAX_DEPTH: usize = 1024;

pub fn begin(api: Api, name: &str) {
    let id = sink::intern(name);
    let mut p = PHASES.lock();
    if p.stack.len() < MAX_DEPTH {
        p.stack.push((id, api));
        write(EventKind::PhaseBegin, api, id);
    }
}

/// Ends the innermost explicit phase; `false` when none is open.
pub fn end(api: Api) -> bool {
    let mut p = PHASES.lock();
    match p.stack.pop() {
        Some((id, _)) => {
            write(EventKind::PhaseEnd, api, id);
            true
        }
        None => false,
    }
}

pub fn mark(api: Api, name: &str) {
    let id = sink::intern(name);
    let mut p = PHASES.lock();
    if let Some(previous) = p.mark.replace(id) {
        write(EventKind::PhaseEnd, api, previous);
    }
    write(EventKind::PhaseBegin, api, id);
}

/// Recording has just started: the phases already open begin now.
pub fn recording_started() {
    let p = PHASES.lock();
    if let Some(id) = p.mark {
        write(EventKind::PhaseBegin, Api::CupoolMark, id);
    }
    for &(id, api) in &p.stack {
        write(EventKind::PhaseBegin, api, id);
    }
}

/// One line per device that has seen activity, with what is held on it.
fn write(kind: EventKind, api: Api, id: u32) {
    if !SESSION.is_on() {
        return;
    }
    let mut any = false;
    for (device, c) in counters::devices() {
        any = true;
        timeline::phase(kind, api, id, device, c);
    }
    if !any {
        timeline::phase(kind, api, id, -1, counters::of(cupool_core::log::MemKind::Device, -1));
    }
}

pub fn lock_for_fork() {
    std::mem::forget(PHASES.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child. The
/// child is inside the same phases as its parent.
pub unsafe fn unlock_after_fork() {
    PHASES.force_unlock();
}
