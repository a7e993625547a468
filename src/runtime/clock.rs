//! Time stamps: nanoseconds since the session started (event times) and the
//! wall clock (for people reading the log).
//!
//! Events are stamped in [`ticks`]: where the kernel keeps time with the
//! CPU's time-stamp counter, the counter itself (one instruction, where
//! `clock_gettime` takes twice as long: a fifth of a traced pair's cost),
//! turned into nanoseconds by the log's writer ([`TickScale`]); elsewhere
//! nanoseconds already.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

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
    // SAFETY: `clock_gettime` writes only into `ts`, a live local.
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

/// The time-stamp counter's line for [`pace_ns`]: a reading of the counter
/// and of CLOCK_MONOTONIC taken together, and nanoseconds per tick as a
/// 32.32 fixed-point number.
struct PaceLine {
    ticks: u64,
    ns: u64,
    ns_per_tick_fx32: u64,
}

/// The first pair of readings (None: the kernel does not keep time with the
/// counter), and the line measured from it once [`CALIBRATION_SPAN_NS`] passed.
static PACE_FROM: OnceLock<Option<(u64, u64)>> = OnceLock::new();
static PACE: OnceLock<PaceLine> = OnceLock::new();
/// The counter could not be measured: the clock serves.
static PACE_GAVE_UP: AtomicBool = AtomicBool::new(false);
/// The span the counter's rate is measured over: the readings' error (tens
/// of ns) is then a millionth of it.
const CALIBRATION_SPAN_NS: u64 = 50_000_000;

/// CLOCK_MONOTONIC in ns, for pacing work every few microseconds (fences,
/// barriers): from the time-stamp counter and its measured rate where the
/// kernel keeps time with it, once 50 ms passed since the first call; the
/// clock itself before that and elsewhere. Two clock reads per pooled pair
/// would be a sixth of a thread's time with several streams; the counter is
/// one instruction. Not a clock for the log: the rate is measured once.
#[inline]
pub fn pace_ns() -> u64 {
    match PACE.get() {
        Some(line) => {
            let ticks = rdtsc().saturating_sub(line.ticks);
            line.ns + ((u128::from(ticks) * u128::from(line.ns_per_tick_fx32)) >> 32) as u64
        }
        None => pace_ns_measuring(),
    }
}

#[cold]
fn pace_ns_measuring() -> u64 {
    let now = monotonic_ns();
    if PACE_GAVE_UP.load(Ordering::Relaxed) {
        return now;
    }
    if let Some((ticks0, ns0)) = *PACE_FROM.get_or_init(|| kernel_keeps_time_with_tsc().then(tsc_and_ns)) {
        if now.saturating_sub(ns0) >= CALIBRATION_SPAN_NS {
            let (ticks, ns) = tsc_and_ns();
            let fx = (ticks > ticks0 && ns > ns0)
                .then(|| (u128::from(ns - ns0) << 32) / u128::from(ticks - ticks0))
                .and_then(|fx| u64::try_from(fx).ok());
            match fx {
                Some(ns_per_tick_fx32) => {
                    let _ = PACE.set(PaceLine { ticks, ns, ns_per_tick_fx32 });
                }
                // A counter that went back or stood still: the clock from now on.
                None => PACE_GAVE_UP.store(true, Ordering::Relaxed),
            }
        }
    }
    now
}

/// Has `interval` ns passed since `last` (a [`pace_ns`] reading)? Also when
/// the counter reads earlier than `last` (a virtual machine moved to another
/// host, a resume): an interval too early costs a fence, one never over
/// would stop them.
#[inline]
pub fn at_least_since(last: u64, interval: u64) -> bool {
    pace_ns().checked_sub(last).is_none_or(|d| d >= interval)
}

/// Nanoseconds since the session started, to a few milliseconds: cheap
/// enough for every allocation (the ages of leaks are reported in ms).
#[inline]
pub fn now_coarse_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` writes only into `ts`, a live local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64).saturating_sub(T0_NS.load(Ordering::Relaxed))
}

pub fn start_unix_ms() -> u64 {
    START_UNIX_MS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacing_clock_follows_the_monotonic_clock_once_measured() {
        let mut last = pace_ns();
        std::thread::sleep(std::time::Duration::from_millis(60)); // past the span it measures over
        for _ in 0..10_000 {
            let before = monotonic_ns();
            let pace = pace_ns();
            let after = monotonic_ns();
            // The line through the counter is read between the two clock
            // readings, give or take its error (the readings' at the start,
            // microseconds at most).
            assert!(pace + 20_000 >= before && pace <= after + 20_000, "{before} <= {pace} <= {after}");
            // Where it took over from the clock it may start a few ns behind.
            assert!(pace + 1_000 >= last, "went back: {last} -> {pace}");
            last = pace;
        }
        // Where the kernel keeps time with the counter, the counter did it.
        assert_eq!(PACE.get().is_some(), kernel_keeps_time_with_tsc());
    }

    #[test]
    fn an_interval_has_passed_when_the_counter_reads_earlier_than_its_start() {
        let now = pace_ns();
        assert!(!at_least_since(now, 10_000_000_000), "ten seconds have not passed");
        assert!(at_least_since(now.saturating_sub(20_000_000_000), 10_000_000_000));
        // A reading from after a move to another host's counter: time passed.
        assert!(at_least_since(u64::MAX, 10_000_000_000));
    }
}
