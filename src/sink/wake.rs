//! The writer's doorbell: the write end of the pipe it polls, and whether
//! it sleeps. A leaf, so that the queue (`buffers`) can ring it without
//! importing the writer, which imports the queue through the log file.

use crate::runtime::fds::KeptFd;
use std::sync::atomic::{AtomicBool, Ordering};

/// Write end of the pipe that wakes the writer: a byte 0 means "flush", a
/// signal number means "finish the log, the process is dying of it".
static WAKE: KeptFd = KeptFd::new();
/// The writer sleeps until the next period and no one has woken it since.
static DOZING: AtomicBool = AtomicBool::new(false);

/// Keeps `fd`, the pipe's write end (moved out of the program's way).
pub fn keep_fd(fd: i32) {
    WAKE.keep(fd);
}

/// None when there is no writer to wake (or the program took its pipe's number).
pub fn fd() -> Option<i32> {
    WAKE.get()
}

/// Forgets the pipe and closes it (a forked child's is its parent's).
pub fn close_fd() {
    WAKE.close();
}

/// The writer is about to sleep a period (true) or has woken (false).
pub fn dozing(asleep: bool) {
    DOZING.store(asleep, Ordering::Release);
}

/// Wakes the writer before its period is up, if it sleeps: many events
/// wait, and a fast program would fill the bounded buffers meanwhile and
/// lose some. One `fstat` and one `write` per wake-up, none while the writer
/// is busy.
pub fn nudge() {
    if DOZING.swap(false, Ordering::AcqRel) {
        if let Some(fd) = fd() {
            let flush = 0u8;
            // SAFETY: one byte from a live local to the writer's pipe (`fd` checked it is); a full pipe
            // (O_NONBLOCK) refuses it.
            unsafe { libc::write(fd, (&flush as *const u8).cast(), 1) };
        }
    }
}
