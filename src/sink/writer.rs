//! The writer thread: drains queued events into the log every `flush_ms`,
//! so a SIGKILL loses at most that much of the timeline, and sooner when
//! many wait ([`nudge`]); and finishes the log for a process dying of a
//! signal (the handler itself may not take locks).

use super::file::LOG;
use super::wake;
use crate::runtime::{diag, guard, options};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::Duration;

/// The writer answers a finish request with a byte here (it is woken
/// through `wake`'s pipe).
static ACK_FD: AtomicI32 = AtomicI32::new(-1);

/// The writer thread's id: a synchronous fault in it cannot wait for itself.
static WRITER_TID: AtomicU32 = AtomicU32::new(0);

/// What finishes the log when the process dies of a signal; handed in by
/// the lifecycle, which owns finishing.
pub type FinishOnSignal = fn(i32);

pub fn start(finish: FinishOnSignal) {
    let mut wake = [-1; 2];
    let mut ack = [-1; 2];
    unsafe {
        // Non-blocking writes: a thread that wakes the writer never waits for it.
        if libc::pipe2(wake.as_mut_ptr(), libc::O_CLOEXEC) != 0
            || libc::fcntl(wake[1], libc::F_SETFL, libc::O_NONBLOCK) != 0
            || libc::pipe2(ack.as_mut_ptr(), libc::O_CLOEXEC) != 0
        {
            diag::error("cannot create the writer's pipe; events will be written at exit only");
            return;
        }
    }
    wake::set_fd(wake[1]);
    ACK_FD.store(ack[0], Ordering::Release);
    let (wake_rd, ack_wr) = (wake[0], ack[1]);
    // The writer must never run a signal handler (the handler waits for the
    // writer): it is born with every signal blocked, not blocking them itself
    // a moment too late.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut previous: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut previous);
    }
    let spawned = std::thread::Builder::new().name("cupool-writer".into()).spawn(move || run(wake_rd, ack_wr, finish));
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut()) };
    if spawned.is_err() {
        diag::error("cannot start the writer thread; events will be written at exit only");
    }
}

fn run(wake_rd: i32, ack_wr: i32, finish: FinishOnSignal) {
    WRITER_TID.store(guard::tid(), Ordering::Release);
    let period = options::get().flush_ms as i32;
    loop {
        let mut pfd = libc::pollfd { fd: wake_rd, events: libc::POLLIN, revents: 0 };
        wake::dozing(true);
        let ready = unsafe { libc::poll(&mut pfd, 1, period) };
        wake::dozing(false);
        let mut byte = 0u8;
        if ready > 0 && unsafe { libc::read(wake_rd, (&mut byte as *mut u8).cast(), 1) } == 1 && byte != 0 {
            finish(byte as i32);
            unsafe { libc::write(ack_wr, (&byte as *const u8).cast(), 1) };
            return;
        }
        match LOG.lock().as_mut() {
            Some(file) => file.drain(Duration::from_millis(10)),
            None => return, // finished
        }
    }
}

/// From a signal handler: has the writer finish the log, waiting at most
/// `timeout_ms`. Only async-signal-safe calls. False when there is no writer
/// to ask; `finish` then runs here if this is the writer thread itself.
pub fn finish_from_signal(sig: i32, timeout_ms: i32, finish: FinishOnSignal) -> bool {
    let (wake, ack) = (wake::fd(), ACK_FD.load(Ordering::Acquire));
    if wake < 0 || ack < 0 {
        return false;
    }
    if WRITER_TID.load(Ordering::Acquire) == unsafe { libc::syscall(libc::SYS_gettid) } as u32 {
        // Only a fault can land here (the writer blocks every other signal).
        finish(sig);
        return true;
    }
    let byte = sig as u8;
    unsafe {
        if libc::write(wake, (&byte as *const u8).cast(), 1) != 1 {
            return false;
        }
        let mut pfd = libc::pollfd { fd: ack, events: libc::POLLIN, revents: 0 };
        libc::poll(&mut pfd, 1, timeout_ms) > 0
    }
}

/// In a forked child: the parent's pipes and writer thread are not ours.
pub fn forget_in_child() {
    for fd in [wake::take_fd(), ACK_FD.swap(-1, Ordering::AcqRel)] {
        if fd >= 0 {
            unsafe { libc::close(fd) };
        }
    }
    WRITER_TID.store(0, Ordering::Release);
}
