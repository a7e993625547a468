//! Phases of the run, as the program names them: a stack of explicit phases
//! (`cupool_phase_begin`/`_end`, nestable) and the current mark
//! (`cupool_mark` ends the phase the previous mark began). Kept from the
//! first call on, but written only once recording runs: phases open when it
//! starts are written then, so a program that never touches CUDA memory
//! still writes nothing.
//!
//! NVTX ranges are phases too, with NVTX's rules: push/pop ranges nest per
//! thread, start/end ranges are matched by id. An NVTX range begun before
//! recording started is not written (nor is its end).

use super::{counters, timeline};
use crate::runtime::diag;
use crate::runtime::SESSION;
use crate::sink;
use cupool_core::log::{Api, EventKind};
use cupool_core::model::operation_phase;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

struct Phases {
    /// (name id, the call that began it), innermost last.
    stack: Vec<(u32, Api)>,
    mark: Option<u32>,
    /// Whether the phases open when recording started have been written:
    /// edges are written only from then on, so none is written twice and
    /// no end comes without its begin.
    written: bool,
}

static PHASES: Mutex<Phases> = Mutex::new(Phases { stack: Vec::new(), mark: None, written: false });

/// Deeper nesting than this is a program that never ends its phases: the
/// excess is not tracked (its ends still pop what is there).
const MAX_DEPTH: usize = 1024;

pub fn begin(api: Api, name: &str) {
    let id = sink::intern(name);
    let mut p = PHASES.lock();
    if p.stack.len() < MAX_DEPTH {
        p.stack.push((id, api));
        if p.written {
            write(EventKind::PhaseBegin, api, id);
        }
    }
}

/// Ends the innermost explicit phase; `false` when none is open.
pub fn end(api: Api) -> bool {
    let mut p = PHASES.lock();
    match p.stack.pop() {
        Some((id, _)) => {
            if p.written {
                write(EventKind::PhaseEnd, api, id);
            }
            true
        }
        None => false,
    }
}

pub fn mark(api: Api, name: &str) {
    let id = sink::intern(name);
    let mut p = PHASES.lock();
    let previous = p.mark.replace(id);
    if p.written {
        if let Some(previous) = previous {
            write(EventKind::PhaseEnd, api, previous);
        }
        write(EventKind::PhaseBegin, api, id);
    }
}

thread_local! {
    /// This thread's NVTX push/pop ranges: (domain, its name's id if its begin was written).
    static THREAD_RANGES: RefCell<Vec<(usize, Option<u32>)>> = const { RefCell::new(Vec::new()) };
}

/// NVTX start/end ranges by id: their name's id if their begin was written.
static STARTED: Mutex<Option<HashMap<u64, Option<u32>>>> = Mutex::new(None);
static NEXT_RANGE_ID: AtomicU64 = AtomicU64::new(1);

/// Whether the end record's notes say that operations' ranges were not written.
static OPERATIONS_SAID: AtomicBool = AtomicBool::new(false);

/// Whether an NVTX range of this name is written: not one of a compiled
/// program's operations (XLA's `Thunk:#…#`, see `operation_phase`), two
/// events for every operation run, which never name the program's phases.
/// Said once in the end record.
fn written_as_phase(name: &str) -> bool {
    if !operation_phase(name) {
        return true;
    }
    if !OPERATIONS_SAID.load(Ordering::Relaxed) && !OPERATIONS_SAID.swap(true, Ordering::Relaxed) {
        diag::remark(
            "XLA's NVTX ranges of the operations it runs (Thunk:#...#) were not written: they are a compiled \
             program's operations, not the program's phases",
        );
    }
    false
}

/// Begins an NVTX range named `name`: the name's id when its begin is
/// written (while recording, and see `written_as_phase`), for its end.
fn begin_range(api: Api, name: &str) -> Option<u32> {
    if !(written_as_phase(name) && SESSION.is_on()) {
        return None;
    }
    let id = sink::intern(name);
    write(EventKind::PhaseBegin, api, id);
    Some(id)
}

/// An NVTX push on this thread in `domain` (0: the default domain); returns
/// the range's depth in that domain (0 outermost), as NVTX does.
pub fn push_thread(api: Api, domain: usize, name: &str) -> i32 {
    let begun = begin_range(api, name);
    THREAD_RANGES.with(|r| {
        let mut r = r.borrow_mut();
        r.push((domain, begun));
        r.iter().filter(|e| e.0 == domain).count() as i32 - 1
    })
}

/// An NVTX pop on this thread in `domain`; returns the depth it leaves, or
/// -1 when no range of that domain was open (as NVTX does).
pub fn pop_thread(api: Api, domain: usize) -> i32 {
    THREAD_RANGES.with(|r| {
        let mut r = r.borrow_mut();
        let Some(i) = r.iter().rposition(|e| e.0 == domain) else { return -1 };
        if let (_, Some(id)) = r.remove(i) {
            write(EventKind::PhaseEnd, api, id);
        }
        r.iter().filter(|e| e.0 == domain).count() as i32
    })
}

/// An NVTX start range; returns its id (never 0).
pub fn start_range(api: Api, name: &str) -> u64 {
    let id = NEXT_RANGE_ID.fetch_add(1, Ordering::Relaxed);
    let begun = begin_range(api, name);
    STARTED.lock().get_or_insert_with(HashMap::new).insert(id, begun);
    id
}

pub fn end_range(api: Api, id: u64) {
    let started = STARTED.lock().as_mut().and_then(|m| m.remove(&id));
    if let Some(Some(name)) = started {
        write(EventKind::PhaseEnd, api, name);
    }
}

/// Recording has just started: the phases already open begin now (once).
pub fn recording_started() {
    let mut p = PHASES.lock();
    if p.written || !SESSION.is_on() {
        return;
    }
    p.written = true;
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
    super::flush_batches();
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
    std::mem::forget(STARTED.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child. The
/// child is inside the same phases and NVTX ranges as its parent.
pub unsafe fn unlock_after_fork(in_child: bool) {
    STARTED.force_unlock();
    PHASES.force_unlock();
    if in_child {
        // The child starts a session of its own: its open phases are written
        // then, and its end record says what it left out.
        PHASES.lock().written = false;
        OPERATIONS_SAID.store(false, Ordering::Relaxed);
        // NVTX ranges open at the fork began in the parent's log: to the
        // child they are ranges begun before its recording, ends unwritten.
        let _ = THREAD_RANGES.try_with(|ranges| {
            if let Ok(mut ranges) = ranges.try_borrow_mut() {
                ranges.iter_mut().for_each(|range| range.1 = None);
            }
        });
        if let Some(started) = STARTED.lock().as_mut() {
            started.values_mut().for_each(|begun| *begun = None);
        }
    }
}
