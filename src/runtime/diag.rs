//! cupool's own messages on stderr: one line each, written with `write(2)` so
//! they work in any state the host process is in.

use std::sync::atomic::{AtomicU8, Ordering};

/// 0 silent, 1 errors, 2 notes. Set from the options once they are parsed.
pub static VERBOSITY: AtomicU8 = AtomicU8::new(1);

fn write_line(prefix: &str, msg: &str) {
    let mut line = String::with_capacity(prefix.len() + msg.len() + 10);
    line.push_str("cupool: ");
    line.push_str(prefix);
    line.push_str(msg);
    line.push('\n');
    // SAFETY: `write` reads `line.len()` bytes from `line`, alive for the call.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// Remarks for the end record's notes: what cupool did differently from
/// usual and why (each said once). Kept here, below the pool and the
/// observers, so that either may make one.
const MAX_REMARKS: usize = 32;
static REMARKS: parking_lot::Mutex<Vec<String>> = parking_lot::Mutex::new(Vec::new());

/// Says `text` as a note and keeps it for the end record, once.
pub fn remark(text: &str) {
    let mut remarks = REMARKS.lock();
    if remarks.len() < MAX_REMARKS && !remarks.iter().any(|r| r == text) {
        note(text);
        remarks.push(text.to_string());
    }
}

pub fn remarks() -> Vec<String> {
    REMARKS.try_lock().map(|r| r.clone()).unwrap_or_default()
}

pub fn lock_remarks_for_fork() {
    std::mem::forget(REMARKS.lock());
}

/// # Safety
/// Only after `lock_remarks_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_remarks_after_fork(in_child: bool) {
    REMARKS.force_unlock();
    if in_child {
        REMARKS.lock().clear();
    }
}

pub fn error(msg: &str) {
    if VERBOSITY.load(Ordering::Relaxed) >= 1 {
        write_line("", msg);
    }
}

pub fn note(msg: &str) {
    if VERBOSITY.load(Ordering::Relaxed) >= 2 {
        write_line("", msg);
    }
}

/// An internal failure the shim cannot step around.
pub fn fatal(msg: &str) -> ! {
    write_line("fatal: ", msg);
    // SAFETY: `abort` takes no arguments.
    unsafe { libc::abort() }
}

/// Runs `f`, turning a panic into an error line and `None`, so that no panic
/// ever unwinds into the host program and the caller can pass the call through.
#[inline]
pub fn shielded<T>(f: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(_) => {
            error("internal error; passing this call through to CUDA");
            None
        }
    }
}

/// Keeps Rust's default panic message (with its multi-line backtrace hint) off
/// the host's stderr: `shielded` reports the failure in one line instead.
pub fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        if VERBOSITY.load(Ordering::Relaxed) >= 2 {
            write_line("panic: ", &info.to_string().replace('\n', " "));
        }
    }));
}
