//! Time stamps: nanoseconds since the session started (event times) and the
//! wall clock (for people reading the log).

use std::sync::atomic::{AtomicU64, Ordering};

/// CLOCK_MONOTONIC at session start, in ns.
static T0_NS: AtomicU64 = AtomicU64::new(0);
/// Wall clock at session start, ms since the epoch.
static START_UNIX_MS: AtomicU64 = AtomicU64::new(0);

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Starts the session's clock.
pub fn start() {
    T0_NS.store(monotonic_ns(), Ordering::Relaxed);
    START_UNIX_MS.store(unix_ms(), Ordering::Relaxed);
}

/// Nanoseconds since the session started.
#[inline]
pub fn now_ns() -> u64 {
    monotonic_ns().saturating_sub(T0_NS.load(Ordering::Relaxed))
}

/// Nanoseconds since the session started, to a few milliseconds: cheap
/// enough for every allocation (the ages of leaks are reported in ms).
#[inline]
pub fn now_coarse_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64).saturating_sub(T0_NS.load(Ordering::Relaxed))
}

pub fn start_unix_ms() -> u64 {
    START_UNIX_MS.load(Ordering::Relaxed)
}
