//! The writer's doorbell: the write end of the pipe it polls, and whether
//! it sleeps. A leaf, so that the queue (`buffers`) can ring it without
//! importing the writer, which imports the queue through the log file.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Write end of the pipe that wakes the writer: a byte 0 means "flush", a
/// signal number means "finish the log, the process is dying of it".
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// The writer sleeps until the next period and no one has woken it since.
static DOZING: AtomicBool = AtomicBool::new(false);

pub fn set_fd(fd: i32) {
    WAKE_FD.store(fd, Ordering::Release);
}

/// -1 when there is no writer to wake.
pub fn fd() -> i32 {
    WAKE_FD.load(Ordering::Acquire)
}

/// Forgets the pipe (a forked child's is its parent's) and hands it back to close.
pub fn take_fd() -> i32 {
    WAKE_FD.swap(-1, Ordering::AcqRel)
}

/// The writer is about to sleep a period (true) or has woken (false).
pub fn dozing(asleep: bool) {
    DOZING.store(asleep, Ordering::Release);
}

/// Wakes the writer before its period is up, if it sleeps: many events
/// wait, and a fast program would fill the bounded buffers meanwhile and
/// lose some. One `write` per wake-up, none while the writer is busy.
pub fn nudge() {
    if DOZING.swap(false, Ordering::AcqRel) {
        let fd = fd();
        if fd >= 0 {
            let flush = 0u8;
            // SAFETY: one byte from a live local; a full pipe (O_NONBLOCK) refuses it.
            unsafe { libc::write(fd, (&flush as *const u8).cast(), 1) };
        }
    }
}
