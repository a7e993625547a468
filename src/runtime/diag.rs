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
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
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
