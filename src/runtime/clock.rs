//! Time stamps: nanoseconds since the session started (event times) and the
//! wall clock (for people reading the log).
//!
//! Events are stamped in [`ticks`]: where the kernel keeps time with the
//! CPU's time-stamp counter, the counter itself (one instruction, where
//! `clock_gettime` takes twice as long: a fifth of a traced pair's cost),
//! turned into nanoseconds by the log's writer ([`TickScale`]); elsewhere
//! nanoseconds already.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// CLOCK_MONOTONIC at session start, in ns.
static T0_NS: AtomicU64 = AtomicU64::new(0);
/// The time-stamp counter at session start; meaningful when [`TSC`] is on.
static T0_TICKS: AtomicU64 = AtomicU64::new(0);
/// Ticks are time-stamp counter readings (else nanoseconds since the start).
static TSC: AtomicBool = AtomicBool::new(false);
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
    let tsc = kernel_keeps_time_with_tsc();
    let (ticks, ns) = if tsc { tsc_and_ns() } else { (0, monotonic_ns()) };
    T0_NS.store(ns, Ordering::Relaxed);
    T0_TICKS.store(ticks, Ordering::Relaxed);
    TSC.store(tsc, Ordering::Relaxed);
    START_UNIX_MS.store(unix_ms(), Ordering::Relaxed);
}

/// The kernel chose the time-stamp counter as its clock source: it found it
/// invariant and in step on every CPU (else it would have marked it unstable
/// and chosen another), so readings on different CPUs compare.
fn kernel_keeps_time_with_tsc() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .is_ok_and(|source| source.trim() == "tsc")
}

#[inline]
fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads a register; `TSC` is only on where the kernel uses it.
    return unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// A counter reading and CLOCK_MONOTONIC (ns) taken together: the counter
/// is read on both sides of the clock and the middle kept.
fn tsc_and_ns() -> (u64, u64) {
    let before = rdtsc();
    let ns = monotonic_ns();
    let after = rdtsc();
    (before + (after.wrapping_sub(before)) / 2, ns)
}

/// An event's time stamp, in the unit the writer turns into nanoseconds
/// since the start ([`TickScale`]).
#[inline]
pub fn ticks() -> u64 {
    if TSC.load(Ordering::Relaxed) {
        rdtsc()
    } else {
        now_ns()
    }
}

/// Turns [`ticks`] into nanoseconds since the start: between two points at
/// which both the counter and the clock were read, by a straight line, so
/// times follow CLOCK_MONOTONIC wherever it drifts from the counter's
/// nominal rate and never jump. The writer takes a point after each batch
/// of events it collects, so that every event of the batch lies before it.
pub struct TickScale {
    /// The last point: (ticks, ns since the start).
    last: (u64, u64),
    /// Nanoseconds per tick over the last span long enough to measure.
    rate: f64,
}

/// Spans shorter than this (in ticks, about 30 µs) keep the previous rate:
/// the two readings of a point are some 20 ns apart.
const MIN_SPAN_TICKS: u64 = 100_000;

impl TickScale {
    /// From the session's start.
    pub fn new() -> TickScale {
        TickScale { last: (T0_TICKS.load(Ordering::Relaxed), 0), rate: 0.0 }
    }

    /// Takes a point now; the conversion for ticks read before it.
    pub fn advance(&mut self) -> impl Fn(u64) -> u64 {
        let tsc = TSC.load(Ordering::Relaxed);
        let from = self.last;
        if tsc {
            let (ticks, ns) = tsc_and_ns();
            let to = (ticks, ns.saturating_sub(T0_NS.load(Ordering::Relaxed)));
            let span = to.0.wrapping_sub(from.0);
            if (span as i64) >= MIN_SPAN_TICKS as i64 || self.rate == 0.0 {
                self.rate = if span as i64 > 0 { to.1.saturating_sub(from.1) as f64 / span as f64 } else { 0.0 };
                self.last = to;
            }
        }
        let rate = self.rate;
        move |ticks| {
            if !tsc {
                return ticks;
            }
            let since = ticks.wrapping_sub(from.0) as i64 as f64 * rate;
            (from.1 as f64 + since).max(0.0) as u64
        }
    }
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
