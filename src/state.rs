//! The shim's life cycle: lazily started on the first CUDA memory call (never
//! in a constructor), finished once at exit or on a fatal signal, and reset in
//! a forked child so the child writes its own log.

use cupool_core::options::{self, Options};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

const UNINIT: u8 = 0;
const STARTING: u8 = 1;
const ACTIVE: u8 = 2;
const FINISHED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static OPTIONS: OnceLock<Options> = OnceLock::new();
/// CLOCK_MONOTONIC at start, in ns; event times are relative to it.
static T0_NS: AtomicU64 = AtomicU64::new(0);
/// Wall clock at start, ms since the epoch.
static START_UNIX_MS: AtomicU64 = AtomicU64::new(0);
/// The pid the state belongs to: a `vfork` child shares our memory but must not touch it.
static PID: AtomicU32 = AtomicU32::new(0);

pub fn options() -> &'static Options {
    OPTIONS.get_or_init(|| {
        let spec = std::env::var("CUPOOL_OPTIONS").unwrap_or_default();
        let (opts, errors) = options::parse(&spec);
        crate::diag::VERBOSITY.store(opts.verbosity, Ordering::Relaxed);
        for e in errors {
            crate::diag::error(&format!("CUPOOL_OPTIONS: {e}"));
        }
        opts
    })
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Nanoseconds since the shim started.
#[inline]
pub fn now_ns() -> u64 {
    monotonic_ns().saturating_sub(T0_NS.load(Ordering::Relaxed))
}

pub fn start_unix_ms() -> u64 {
    START_UNIX_MS.load(Ordering::Relaxed)
}

/// True once started and until finished: events are recorded only then.
#[inline]
pub fn recording() -> bool {
    match STATE.load(Ordering::Acquire) {
        ACTIVE => true,
        UNINIT => start(),
        STARTING => wait_for_start(),
        _ => false,
    }
}

/// Another thread is starting: this thread's event is recorded once it is done.
#[cold]
fn wait_for_start() -> bool {
    while STATE.load(Ordering::Acquire) == STARTING {
        std::hint::spin_loop();
    }
    STATE.load(Ordering::Acquire) == ACTIVE
}

#[cold]
fn start() -> bool {
    if STATE.compare_exchange(UNINIT, STARTING, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return wait_for_start();
    }
    let opts = options();
    T0_NS.store(monotonic_ns(), Ordering::Relaxed);
    START_UNIX_MS.store(unix_ms(), Ordering::Relaxed);
    PID.store(std::process::id(), Ordering::Relaxed);
    static ONCE_PER_IMAGE: std::sync::Once = std::sync::Once::new();
    ONCE_PER_IMAGE.call_once(|| {
        crate::diag::quiet_panics();
        unsafe {
            libc::atexit(at_exit);
            libc::pthread_atfork(Some(crate::fork::prepare), Some(crate::fork::parent), Some(crate::fork::child));
        }
    });
    if opts.log {
        crate::signals::install();
    }
    STATE.store(ACTIVE, Ordering::Release);
    true
}

extern "C" fn at_exit() {
    finish(crate::report::ExitInfo::Exit(crate::hooks::process::exit_status()));
}

/// Writes the end of the log exactly once. Later CUDA calls still work; they are just not recorded.
pub fn finish(how: crate::report::ExitInfo) {
    if PID.load(Ordering::Relaxed) != std::process::id() {
        return; // a vfork child, or a forked child that never used CUDA itself
    }
    if STATE.compare_exchange(ACTIVE, FINISHED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        crate::diag::shielded(|| crate::report::write_end(how));
    }
}

/// In a forked child: forget the parent's run; the child starts its own on its first CUDA call.
pub fn reset_in_child() {
    STATE.store(UNINIT, Ordering::Release);
}
