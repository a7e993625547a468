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
/// is read on both sides of the clock and the middle kept, from the closest
/// of three tries (a thread preempted between the reads would skew one).
fn tsc_and_ns() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..3 {
        let before = rdtsc();
        let ns = monotonic_ns();
        let after = rdtsc();
        let gap = after.wrapping_sub(before);
        if gap < best.0 {
            best = (gap, before + gap / 2, ns);
        }
    }
    (best.1, best.2)
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

/// Turns [`ticks`] into nanoseconds since the start: one line through
/// points at which both the counter and the clock were read, so that times
/// follow CLOCK_MONOTONIC wherever it drifts from the counter's nominal
/// rate, never jump, and do not run backwards. The writer takes a point
/// after each batch of events it collects, so that every event of the batch
/// lies before it and is found between two points, never extrapolated past
/// the last (a slope taken over a short span would be wrong there, and the
/// next point would then give the same ticks other times); an event pushed
/// late (its thread preempted between stamping and queueing) lands in a
/// later batch and is still converted on the segment its ticks lie in. Only
/// a point read within the clock's reading error of the last one (two drains
/// microseconds apart) is left out, and its batch extrapolated.
pub struct TickScale {
    /// (ticks, ns since the start), both increasing; the oldest are dropped.
    points: std::collections::VecDeque<(u64, u64)>,
}

/// Points kept: a second or more of history for late events (the writer
/// drains at most about once a millisecond).
const MAX_POINTS: usize = 1024;

impl TickScale {
    /// From the session's start.
    pub fn new() -> TickScale {
        TickScale { points: std::collections::VecDeque::from([(T0_TICKS.load(Ordering::Relaxed), 0)]) }
    }

    /// Takes a point now, for the events collected before.
    pub fn advance(&mut self) {
        if !TSC.load(Ordering::Relaxed) {
            return;
        }
        let (ticks, ns) = tsc_and_ns();
        let ns = ns.saturating_sub(T0_NS.load(Ordering::Relaxed));
        let &(last_ticks, last_ns) = self.points.back().unwrap_or(&(0, 0));
        if ticks > last_ticks && ns > last_ns {
            if self.points.len() == MAX_POINTS {
                self.points.pop_front();
            }
            self.points.push_back((ticks, ns));
        }
    }

    /// Nanoseconds since the start at `ticks` (a [`ticks`] reading).
    pub fn to_ns(&self, ticks: u64) -> u64 {
        if !TSC.load(Ordering::Relaxed) {
            return ticks;
        }
        // The segment that holds `ticks`; the first or last one extended
        // beyond the ends.
        let n = self.points.len();
        if n < 2 {
            return 0;
        }
        // Nearly every event lies on the last segment: no search for those.
        let at = if ticks >= self.points[n - 2].0 {
            n - 1
        } else {
            self.points.partition_point(|&(t, _)| t <= ticks).clamp(1, n - 1)
        };
        let ((t0, ns0), (t1, ns1)) = (self.points[at - 1], self.points[at]);
        let rate = (ns1 - ns0) as f64 / (t1 - t0) as f64;
        let ns = ns0 as f64 + ticks.wrapping_sub(t0) as i64 as f64 * rate;
        ns.max(0.0) as u64
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
