//! The shim's life cycle: started lazily on the first CUDA memory call
//! (never in a constructor), finished once at exit or on a fatal signal, and
//! reset in a forked child so the child writes its own log. The one module
//! that knows every part of the shim: it starts them, forks them and ends them.

mod end;
mod fork;
mod signals;

pub use end::ExitInfo;

use crate::runtime::{clock, diag, options, SESSION};
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};

/// The pid the session belongs to: a `vfork` child shares our memory but must not touch it.
static PID: AtomicU32 = AtomicU32::new(0);

const UNKNOWN_STATUS: i64 = i64::MIN;
static EXIT_STATUS: AtomicI64 = AtomicI64::new(UNKNOWN_STATUS);

/// True once started and until finished: events are recorded only then.
/// The first call starts the session.
#[inline]
pub fn recording() -> bool {
    SESSION.is_on() || start_recording()
}

#[cold]
fn start_recording() -> bool {
    let on = SESSION.ensure_on(start);
    if on {
        // Only once the session is on can events be recorded; the first
        // caller here writes the phases already open.
        diag::shielded(crate::observe::phases::recording_started);
    }
    on
}

#[cold]
fn start() -> bool {
    let opts = options::get();
    clock::start();
    PID.store(std::process::id(), Ordering::Relaxed);
    static ONCE_PER_IMAGE: std::sync::Once = std::sync::Once::new();
    ONCE_PER_IMAGE.call_once(|| {
        diag::quiet_panics();
        crate::sink::set_finish_on_signal(finish_on_signal);
        // SAFETY: `at_exit` (for `exit` and `quick_exit`) and the fork handlers are `extern "C"`
        // functions of this library, which stays loaded for the whole process (preloaded); `Once`
        // registers them once per loaded image.
        unsafe {
            libc::atexit(at_exit);
            at_quick_exit(at_exit);
            libc::pthread_atfork(Some(fork::prepare), Some(fork::parent), Some(fork::child));
        }
    });
    // Looked up here, in the process itself: its `vfork` children's `exec`
    // then calls it without a lookup of their own (`hooks::process`).
    let _ = crate::cuda::real::execve.get();
    if opts.log {
        signals::install();
        if !opts.trace {
            // With the trace off no event opens the log of a clean process,
            // and a fatal signal's end record is written by a running writer.
            crate::sink::ensure_open();
        }
        if opts.stack_depth > 0 {
            // The module table, built once here rather than by the first
            // allocation's capture (which would get no frames while it is built).
            crate::observe::sites::start();
        }
    }
    true
}

/// The program's exit status as it leaves (`main`'s return or `exit`'s argument).
pub fn note_exit_status(status: i32) {
    note_ran_without_cuda();
    EXIT_STATUS.store(status as i64, Ordering::Relaxed);
    settle_magazines();
    if crate::pool::tools::attached() {
        release_for_tools();
    }
}

/// Blocks kept in threads' magazines go back to their pools while the
/// driver still runs, so that the end record's pool figures are the
/// program's. Only while recording: a program that never used CUDA memory
/// has no pool (in the unit tests, magazines hold blocks of made-up pools).
fn settle_magazines() {
    if !SESSION.is_on() {
        return;
    }
    let Some(_guard) = crate::runtime::guard::Guard::enter() else { return };
    diag::shielded(|| crate::pool::settle(false, &mut crate::observe::reserved_changed));
}

/// Before the runtime's exit handlers destroy the context (where a memory
/// tool checks for leaks), the pool gives back the segments it only caches.
#[cold]
fn release_for_tools() {
    let Some(_guard) = crate::runtime::guard::Guard::enter() else { return };
    diag::shielded(|| {
        for (device, bytes) in crate::pool::release_idle_for_tools() {
            crate::observe::reserved_changed(device, -(bytes as i64));
        }
    });
}

fn exit_status() -> Option<i32> {
    match EXIT_STATUS.load(Ordering::Relaxed) {
        UNKNOWN_STATUS => None,
        s => Some(s as i32),
    }
}

extern "C" {
    /// glibc's (C11); the `libc` crate declares it for other targets only.
    fn at_quick_exit(handler: extern "C" fn()) -> std::ffi::c_int;
}

extern "C" fn at_exit() {
    finish(ExitInfo::Exit(exit_status()));
}

/// On the writer thread: the process dies of `sig`, or `exec`s with the
/// trace off.
fn finish_on_signal(sig: i32) {
    if sig == i32::from(crate::sink::EXEC) {
        settle_magazines();
        finish(ExitInfo::Exit(None));
    } else {
        finish(ExitInfo::Signal(sig));
    }
}

/// Appends this process's pid to `<log_dir>/cupool-ran.<run_id>`, once per
/// process, when it leaves without having used CUDA memory (a process that
/// did has its log). A few system calls at exit; nothing before.
fn note_ran_without_cuda() {
    if !SESSION.was_started() {
        note_ran_without_memory();
    }
}

/// [`note_ran_without_cuda`] for a process whose CUDA calls allocated
/// nothing (its session started, but it has no log to show for it).
fn note_ran_without_memory() {
    static NOTED_BY: AtomicU32 = AtomicU32::new(0);
    let pid = std::process::id();
    if NOTED_BY.swap(pid, Ordering::Relaxed) == pid {
        return;
    }
    diag::shielded(|| {
        let opts = options::get();
        if opts.run_id.is_empty() || !opts.log {
            return;
        }
        let dir = std::path::Path::new(&opts.log_dir);
        let _ = std::fs::create_dir_all(dir);
        let path = dir.join(cupool_core::log::ran_without_cuda_file(&opts.run_id));
        // One short append per process: atomic with O_APPEND, whatever else writes there.
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = std::io::Write::write_all(&mut f, format!("{pid}\n").as_bytes());
        }
    });
}

/// Before `exec` replaces the process: the writer writes the events queued
/// so far and leaves the log without its end, as the call may fail and the
/// program go on; with the trace off the end record is the log's only
/// account of what is live, so the writer finishes the log as `exit` would.
/// Only asks the writer (`exec` may be called from a signal handler). Not
/// in a `vfork` child (it shares the parent's memory) nor in a forked child
/// that never used CUDA.
pub fn before_exec() {
    if in_session_process() {
        crate::sink::before_exec(EXEC_TIMEOUT_MS);
    }
}

/// Is a CUDA session of this very process on (not its parent's, seen from
/// a `vfork` child)?
pub fn in_session_process() -> bool {
    SESSION.is_on() && PID.load(Ordering::Relaxed) == std::process::id()
}

/// How long an `exec` waits for the writer.
const EXEC_TIMEOUT_MS: i32 = 2000;

/// Writes the end of the log exactly once. Later CUDA calls still work; they are just not recorded.
pub fn finish(how: ExitInfo) {
    note_ran_without_cuda();
    if PID.load(Ordering::Relaxed) != std::process::id() {
        return; // a vfork child, or a forked child that never used CUDA itself
    }
    if SESSION.finish() && diag::shielded(|| end::write(how)) == Some(false) {
        note_ran_without_memory();
    }
}
