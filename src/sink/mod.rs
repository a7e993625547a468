//! The sink: the log file of this process. Events are queued without a
//! syscall (`buffers`), written by a background thread (`writer`) into
//! `cupool.<pid>.json` (`file`), which is created on the first event, and
//! closed with the end record the lifecycle hands over.

mod buffers;
mod definitions;
mod file;
mod strings;
mod wake;
mod writer;

pub use buffers::{dropped, Stamp};
pub use definitions::define;
pub use strings::{intern, text_of};
pub use writer::{FinishOnSignal, EXEC};

use crate::runtime::{diag, options, switch::Switch, SESSION};
use cupool_core::log::{Event, EventKind};
use file::{LogFile, LOG};
use std::sync::OnceLock;
use std::time::Duration;

/// Whether the log file exists: created on first use, never twice, and not
/// again after a failure to create it.
static OPENED: Switch = Switch::new();
static FINISH_ON_SIGNAL: OnceLock<FinishOnSignal> = OnceLock::new();

/// Hands the sink what finishes the log when the process dies of a signal.
pub fn set_finish_on_signal(finish: FinishOnSignal) {
    let _ = FINISH_ON_SIGNAL.set(finish);
}

/// Records one event now. The caller fills kind, api and payload; time,
/// sequence number and thread are stamped here.
#[inline]
pub fn record(e: Event) {
    record_at(e, None);
}

/// Records `e` at the place `at` reserved (now when `None`).
#[inline]
pub fn record_at(e: Event, at: Option<Stamp>) {
    if recorded(e.kind) && OPENED.ensure_on(open) {
        buffers::push(e, at);
    }
}

/// A place in the timeline, taken now for an event of `kind` recorded
/// later; `None` when such an event would not be recorded (no clock read).
#[inline]
pub fn stamp_for(kind: EventKind) -> Option<Stamp> {
    recorded(kind).then(buffers::stamp)
}

/// Would an event of `kind` be written now? (A caller may skip building it.)
#[inline]
pub fn recorded(kind: EventKind) -> bool {
    let opts = options::get();
    let traced_only = matches!(
        kind,
        EventKind::Alloc
            | EventKind::Free
            | EventKind::Map
            | EventKind::Unmap
            | EventKind::Reserve
            | EventKind::Release
    );
    // The option first: with the trace off, the hot path's events stop here.
    (opts.trace || !traced_only) && opts.log && SESSION.is_on()
}

#[cold]
fn open() -> bool {
    let Some(file) = diag::shielded(LogFile::create).flatten() else { return false };
    *LOG.lock() = Some(file);
    writer::start(*FINISH_ON_SIGNAL.get().unwrap_or(&((|_| {}) as FinishOnSignal)));
    true
}

/// True once a log file exists for this process.
pub fn is_open() -> bool {
    OPENED.is_on()
}

/// Opens the log if it is not yet, so that a process with leaks but no
/// traced events still reports them.
pub fn ensure_open() -> bool {
    options::get().log && OPENED.ensure_on(open)
}

/// Writes what is queued, then `tail` (the end record), and closes the file.
/// False if there was no log to finish.
pub fn close_with(tail: impl FnOnce(&mut String)) -> bool {
    let Some(mut log) = LOG.try_lock_for(Duration::from_secs(1)) else { return false };
    let Some(file) = log.take() else { return false };
    file.close_with(tail);
    true
}

/// From a signal handler: has the writer finish the log, waiting at most `timeout_ms`.
pub fn finish_from_signal(sig: i32, timeout_ms: i32) -> bool {
    match FINISH_ON_SIGNAL.get() {
        Some(&finish) => writer::finish_from_signal(sig, timeout_ms, finish),
        None => false,
    }
}

/// Before `exec` replaces the process: has the writer write what is queued
/// (with the trace off, finish the log), waiting at most `timeout_ms`.
/// Async-signal-safe, as `exec` is.
pub fn before_exec(timeout_ms: i32) -> bool {
    writer::before_exec(timeout_ms)
}

pub fn lock_for_fork() {
    std::mem::forget(LOG.lock());
    buffers::lock_for_fork();
    definitions::lock_for_fork();
    strings::lock_for_fork();
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    strings::unlock_after_fork();
    definitions::unlock_after_fork(in_child);
    buffers::unlock_after_fork(in_child);
    LOG.force_unlock();
    if in_child {
        // The parent's file, pipes and writer thread are not ours.
        if let Some(file) = LOG.lock().take() {
            file.abandon();
        }
        writer::forget_in_child();
        OPENED.reset();
    }
}
