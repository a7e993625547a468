//! The writer thread: drains queued events into the log every `flush_ms`,
//! so a SIGKILL loses at most that much of the timeline, and sooner when
//! many wait ([`nudge`]); and finishes the log for a process dying of a
//! signal (the handler itself may not take locks).

use super::file::LOG;
use super::wake;
use crate::runtime::fds::KeptFd;
use crate::runtime::{diag, guard, options};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The writer answers a finish request with a byte here (it is woken
/// through `wake`'s pipe).
static ACK: KeptFd = KeptFd::new();
/// The writer's ends of the two pipes: it polls the wake pipe and answers
/// on the acknowledgement pipe. Statics so that a forked child closes them.
static WAKE_RD: KeptFd = KeptFd::new();
static ACK_WR: KeptFd = KeptFd::new();

/// The writer thread's id: a synchronous fault in it cannot wait for itself.
static WRITER_TID: AtomicU32 = AtomicU32::new(0);

/// What finishes the log when the process dies of a signal (or, with the
/// trace off, `exec`s: [`EXEC`]); handed in by the lifecycle, which owns
/// finishing.
pub type FinishOnSignal = fn(i32);

/// Asked through the wake pipe by a thread about to `exec` (no signal has
/// this number): with the trace on the writer writes what is queued and
/// goes on, as the call may fail; with it off it finishes the log.
pub const EXEC: u8 = 0xff;

pub fn start(finish: FinishOnSignal) {
    let mut wake = [-1; 2];
    let mut ack = [-1; 2];
    // SAFETY: `pipe2` writes two descriptors into each two-element array, both live locals.
    unsafe {
        // Non-blocking: a thread that wakes the writer never waits for it,
        // and the writer never waits in a read.
        if libc::pipe2(wake.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) != 0
            || libc::pipe2(ack.as_mut_ptr(), libc::O_CLOEXEC) != 0
        {
            diag::error("cannot create the writer's pipe; events will be written at exit only");
            return;
        }
    }
    wake::keep_fd(wake[1]);
    ACK.keep(ack[0]);
    WAKE_RD.keep(wake[0]);
    ACK_WR.keep(ack[1]);
    // The writer must never run a signal handler (the handler waits for the
    // writer): it is born with every signal blocked, not blocking them itself
    // a moment too late.
    // SAFETY: `sigset_t` is plain data: all-zero is a valid (empty) set.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `sigset_t` is plain data: all-zero is a valid (empty) set.
    let mut previous: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `sigfillset` and `pthread_sigmask` only read and write the two live local sets.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut previous);
    }
    let spawned = std::thread::Builder::new().name("cupool-writer".into()).spawn(move || run(finish));
    // SAFETY: `pthread_sigmask` reads `previous`, the mask saved above, and writes nothing (null).
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut()) };
    if spawned.is_err() {
        diag::error("cannot start the writer thread; events will be written at exit only");
    }
}

fn run(finish: FinishOnSignal) {
    WRITER_TID.store(guard::tid(), Ordering::Release);
    let period = options::get().flush_ms as i32;
    loop {
        // A pipe whose number the program took is not read: the writer then
        // only sleeps its period (`poll` skips a negative descriptor).
        let rd = WAKE_RD.get().unwrap_or(-1);
        let mut pfd = libc::pollfd { fd: rd, events: libc::POLLIN, revents: 0 };
        wake::dozing(true);
        // SAFETY: `poll` reads and writes one `pollfd`, `pfd`, a live local; `rd` is the pipe's read end,
        // owned by this thread, or -1.
        let ready = unsafe { libc::poll(&mut pfd, 1, period) };
        wake::dozing(false);
        let mut byte = 0u8;
        // Asked again: the number may have changed hands while `poll` waited.
        let still = ready > 0 && WAKE_RD.get() == Some(rd);
        // SAFETY: `read` writes at most one byte into `byte`, a live local; `rd` is the pipe's read end (checked
        // just now), owned by this thread, non-blocking.
        let asked = still && unsafe { libc::read(rd, (&mut byte as *mut u8).cast(), 1) } == 1 && byte != 0;
        // A traced `exec` asks only for what is queued, the period's own work.
        if asked && !(byte == EXEC && options::get().trace) {
            finish(byte as i32);
            acknowledge(byte);
            return;
        }
        let open = match LOG.lock().as_mut() {
            Some(file) => {
                file.drain(Duration::from_millis(10));
                true
            }
            None => false, // finished
        };
        if asked {
            acknowledge(byte);
        }
        if !open {
            return;
        }
    }
}

fn acknowledge(byte: u8) {
    if let Some(wr) = ACK_WR.get() {
        // SAFETY: `write` reads one byte from `byte`, a live local; `wr` is the acknowledgement
        // pipe's write end, owned by this thread.
        unsafe { libc::write(wr, (&byte as *const u8).cast(), 1) };
    }
}

/// From a signal handler: has the writer finish the log, waiting at most
/// `timeout_ms`. Only async-signal-safe calls. False when there is no writer
/// to ask; `finish` then runs here if this is the writer thread itself.
pub fn finish_from_signal(sig: i32, timeout_ms: i32, finish: FinishOnSignal) -> bool {
    // SAFETY: `gettid` takes no arguments and cannot fail.
    if WRITER_TID.load(Ordering::Acquire) == unsafe { libc::syscall(libc::SYS_gettid) } as u32 {
        // Only a fault can land here (the writer blocks every other signal).
        finish(sig);
        return true;
    }
    ask(sig as u8, timeout_ms)
}

/// Before `exec` (which may run in a signal handler): has the writer do
/// what [`EXEC`] asks, waiting at most `timeout_ms`. Only async-signal-safe
/// calls.
pub fn before_exec(timeout_ms: i32) -> bool {
    ask(EXEC, timeout_ms)
}

fn ask(byte: u8, timeout_ms: i32) -> bool {
    let (Some(wake), Some(ack)) = (wake::fd(), ACK.get()) else {
        return false;
    };
    // SAFETY: `write` reads one byte from `byte`, `poll` one `pollfd` and `read` writes one byte into
    // `answer`, all live locals; the descriptors are the writer's pipes (checked above to be), which stay
    // open while the writer runs, and `read` follows a `poll` that found a byte to read.
    unsafe {
        if libc::write(wake, (&byte as *const u8).cast(), 1) != 1 {
            return false;
        }
        let mut pfd = libc::pollfd { fd: ack, events: libc::POLLIN, revents: 0 };
        if libc::poll(&mut pfd, 1, timeout_ms) <= 0 {
            return false;
        }
        // Taken, so that a later request (an `exec` that failed) waits for its own answer.
        let mut answer = 0u8;
        libc::read(ack, (&mut answer as *mut u8).cast(), 1) == 1
    }
}

/// In a forked child: the parent's pipes and writer thread are not ours.
pub fn forget_in_child() {
    wake::close_fd();
    for kept in [&ACK, &WAKE_RD, &ACK_WR] {
        kept.close();
    }
    WRITER_TID.store(0, Ordering::Release);
}
