//! The event stream: hooks push fixed-size events into per-thread-sharded
//! buffers (a short lock, no allocation in the steady state, no syscall); a
//! background thread formats them into the log file every `flush_ms`, so a
//! SIGKILL loses at most that much of the timeline.

use crate::{diag, guard, state};
use cupool_core::log::{self, Event, EventKind, EventLine};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

const SHARDS: usize = 16;
/// Events waiting per shard before new ones are dropped (and counted):
/// bounds memory if the disk cannot keep up.
const MAX_PENDING: usize = 1 << 20;

static BUFFERS: LazyLock<[Mutex<Vec<Event>>; SHARDS]> =
    LazyLock::new(|| std::array::from_fn(|_| Mutex::new(Vec::with_capacity(1024))));
static SEQ: AtomicU64 = AtomicU64::new(1);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// The open log; `None` until the first event and after the end is written.
pub struct LogFile {
    fd: i32,
    text: String,
    batch: Vec<Event>,
}
static LOG: Mutex<Option<LogFile>> = Mutex::new(None);

const LOG_NONE: u8 = 0;
const LOG_OPENING: u8 = 1;
const LOG_OPEN: u8 = 2;
const LOG_OFF: u8 = 3;
static LOG_STATE: AtomicU8 = AtomicU8::new(LOG_NONE);

/// Write end of the pipe that wakes the writer thread: a byte 0 means "flush",
/// a signal number means "finish the log, the process is dying of it".
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// The writer answers a finish request with a byte here.
static ACK_FD: AtomicI32 = AtomicI32::new(-1);
/// The writer thread's id: a synchronous fault in it cannot wait for itself.
static WRITER_TID: AtomicU32 = AtomicU32::new(0);

/// Records one event. The caller fills kind, api and payload; time, sequence
/// number and thread are stamped here.
#[inline]
pub fn record(e: Event) {
    record_stamped(e, None);
}

/// A place in the timeline taken before a call whose outcome is recorded after
/// it: a free is stamped before the memory can be handed out again, so no
/// other thread's allocation of the same address can precede it in `seq`.
#[derive(Clone, Copy)]
pub struct Stamp {
    seq: u64,
    t_ns: u64,
}

#[inline]
pub fn stamp() -> Stamp {
    state::recording();
    Stamp { seq: SEQ.fetch_add(1, Ordering::Relaxed), t_ns: state::now_ns() }
}

/// Records `e` at the place `stamp` reserved.
#[inline]
pub fn record_at(e: Event, stamp: Stamp) {
    record_stamped(e, Some(stamp));
}

#[inline]
fn record_stamped(mut e: Event, stamp: Option<Stamp>) {
    if !state::recording() {
        return;
    }
    let opts = state::options();
    if !opts.log
        || (!opts.trace && matches!(e.kind, EventKind::Alloc | EventKind::Free | EventKind::Map | EventKind::Unmap))
    {
        return;
    }
    if LOG_STATE.load(Ordering::Acquire) != LOG_OPEN && !open_log() {
        return;
    }
    e.tid = guard::tid();
    match stamp {
        Some(s) => (e.seq, e.t_ns) = (s.seq, s.t_ns),
        None => (e.t_ns, e.seq) = (state::now_ns(), SEQ.fetch_add(1, Ordering::Relaxed)),
    }
    let mut buf = BUFFERS[e.tid as usize % SHARDS].lock();
    if buf.len() >= MAX_PENDING {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    } else {
        buf.push(e);
    }
}

pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Creates `cupool.<pid>.json`, writes its header and starts the writer.
#[cold]
fn open_log() -> bool {
    match LOG_STATE.compare_exchange(LOG_NONE, LOG_OPENING, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(LOG_OPEN) => return true,
        Err(LOG_OFF) => return false,
        Err(_) => {
            while LOG_STATE.load(Ordering::Acquire) == LOG_OPENING {
                std::hint::spin_loop();
            }
            return LOG_STATE.load(Ordering::Acquire) == LOG_OPEN;
        }
    }
    let opened = diag::shielded(open_log_file).flatten();
    let Some(file) = opened else {
        LOG_STATE.store(LOG_OFF, Ordering::Release);
        return false;
    };
    *LOG.lock() = Some(file);
    start_writer();
    LOG_STATE.store(LOG_OPEN, Ordering::Release);
    true
}

fn open_log_file() -> Option<LogFile> {
    let opts = state::options();
    let dir = std::path::Path::new(&opts.log_dir);
    if let Err(e) = std::fs::create_dir_all(dir) {
        diag::error(&format!("cannot create log_dir {}: {e}; no log will be written", dir.display()));
        return None;
    }
    let pid = std::process::id();
    let mut fd = -1;
    let mut path = String::new();
    // A process that exec()s keeps its pid: never overwrite an earlier image's log.
    for n in 0..100 {
        path = if n == 0 {
            format!("{}/cupool.{pid}.json", dir.display())
        } else {
            format!("{}/cupool.{pid}.{n}.json", dir.display())
        };
        let c = std::ffi::CString::new(path.as_str()).ok()?;
        fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, 0o644) };
        if fd >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
            break;
        }
    }
    if fd < 0 {
        diag::error(&format!("cannot create {path}: {}; no log will be written", std::io::Error::last_os_error()));
        return None;
    }
    let mut text = String::with_capacity(1 << 16);
    log::write_header(&mut text, &crate::report::process_info(), opts);
    log::write_event(&mut text, &Event::new(EventKind::Start, log::Api::None), EventLine::First);
    write_all(fd, text.as_bytes());
    text.clear();
    diag::note(&format!("writing {path}"));
    Some(LogFile { fd, text, batch: Vec::with_capacity(1024) })
}

fn write_all(fd: i32, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return; // disk full or similar: the log is best effort, the program is not
        }
        bytes = &bytes[n as usize..];
    }
}

/// Moves every buffered event into the file. `patience` bounds the wait for a
/// shard lock: a thread stopped by a fatal signal may hold one forever.
fn drain_into(file: &mut LogFile, patience: Duration) {
    for shard in BUFFERS.iter() {
        if let Some(mut buf) = shard.try_lock_for(patience) {
            file.batch.append(&mut buf);
        }
    }
    if file.batch.is_empty() {
        return;
    }
    file.batch.sort_unstable_by_key(|e| e.seq);
    for e in &file.batch {
        log::write_event(&mut file.text, e, EventLine::Later);
    }
    file.batch.clear();
    write_all(file.fd, file.text.as_bytes());
    file.text.clear();
}

/// Writes what is buffered, then `tail` (the end record), and closes the file.
/// Returns false if there was no log to finish.
pub fn close_with(tail: impl FnOnce(&mut String)) -> bool {
    let Some(mut guard) = LOG.try_lock_for(Duration::from_secs(1)) else {
        return false;
    };
    let Some(mut file) = guard.take() else {
        return false;
    };
    drain_into(&mut file, Duration::from_millis(100));
    tail(&mut file.text);
    write_all(file.fd, file.text.as_bytes());
    unsafe { libc::close(file.fd) };
    true
}

/// True once a log file exists for this process.
pub fn log_open() -> bool {
    LOG_STATE.load(Ordering::Acquire) == LOG_OPEN
}

/// Opens the log if it is not yet, so that a process with leaks but no traced events still reports them.
pub fn ensure_open() -> bool {
    state::options().log && (log_open() || open_log())
}

fn start_writer() {
    let mut wake = [-1; 2];
    let mut ack = [-1; 2];
    unsafe {
        if libc::pipe2(wake.as_mut_ptr(), libc::O_CLOEXEC) != 0 || libc::pipe2(ack.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            diag::error("cannot create the writer's pipe; events will be written at exit only");
            return;
        }
    }
    WAKE_FD.store(wake[1], Ordering::Release);
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
    let spawned = std::thread::Builder::new().name("cupool-writer".into()).spawn(move || writer(wake_rd, ack_wr));
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut()) };
    if spawned.is_err() {
        diag::error("cannot start the writer thread; events will be written at exit only");
    }
}

fn writer(wake_rd: i32, ack_wr: i32) {
    WRITER_TID.store(crate::guard::tid(), Ordering::Release);
    let period = state::options().flush_ms as i32;
    loop {
        let mut pfd = libc::pollfd { fd: wake_rd, events: libc::POLLIN, revents: 0 };
        let ready = unsafe { libc::poll(&mut pfd, 1, period) };
        let mut byte = 0u8;
        if ready > 0 && unsafe { libc::read(wake_rd, (&mut byte as *mut u8).cast(), 1) } == 1 && byte != 0 {
            state::finish(crate::report::ExitInfo::Signal(byte as i32));
            unsafe { libc::write(ack_wr, (&byte as *const u8).cast(), 1) };
            return;
        }
        let mut guard = LOG.lock();
        match guard.as_mut() {
            Some(file) => drain_into(file, Duration::from_millis(10)),
            None => return, // finished
        }
    }
}

/// From a signal handler: has the writer finish the log, waiting at most
/// `timeout_ms`. Only async-signal-safe calls.
pub fn finish_from_signal(sig: i32, timeout_ms: i32) -> bool {
    let (wake, ack) = (WAKE_FD.load(Ordering::Acquire), ACK_FD.load(Ordering::Acquire));
    if wake < 0 || ack < 0 {
        return false;
    }
    if WRITER_TID.load(Ordering::Acquire) == unsafe { libc::syscall(libc::SYS_gettid) } as u32 {
        // Only a fault can land here (the writer blocks every other signal).
        state::finish(crate::report::ExitInfo::Signal(sig));
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

pub fn lock_all() {
    std::mem::forget(LOG.lock());
    for b in BUFFERS.iter() {
        std::mem::forget(b.lock());
    }
}

/// # Safety
/// Only after `lock_all`, in the same thread or its forked child.
pub unsafe fn unlock_all() {
    for b in BUFFERS.iter() {
        b.force_unlock();
    }
    LOG.force_unlock();
}

/// In a forked child: the parent's file, pipes and writer thread are not ours.
pub fn reset_in_child() {
    if let Some(file) = LOG.lock().take() {
        unsafe { libc::close(file.fd) };
        // The text buffer was the parent's, already written: dropping it is fine.
    }
    for fd in [WAKE_FD.swap(-1, Ordering::AcqRel), ACK_FD.swap(-1, Ordering::AcqRel)] {
        if fd >= 0 {
            unsafe { libc::close(fd) };
        }
    }
    for b in BUFFERS.iter() {
        b.lock().clear();
    }
    SEQ.store(1, Ordering::Relaxed);
    DROPPED.store(0, Ordering::Relaxed);
    WRITER_TID.store(0, Ordering::Release);
    LOG_STATE.store(LOG_NONE, Ordering::Release);
}
