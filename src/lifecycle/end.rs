//! The end record: per-device summary, pool statistics, incidents and the
//! leak report, assembled from the observers and the pools and handed to the
//! sink. Built from bookkeeping alone: by the time it runs the CUDA driver
//! may be shut down.

use crate::observe::{self, counters, incidents, Allocation, Space};
use crate::runtime::clock;
use crate::{pool, sink};
use cupool_core::log::{self, DeviceCounters, End, ExitRecord, Leak, LeakSummary};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Clone, Copy, Debug)]
pub enum ExitInfo {
    /// Normal exit; the status when the program called `exit`.
    Exit(Option<i32>),
    Signal(i32),
}

/// Builds and writes the end record. Called once, by `lifecycle::finish`.
/// False when the process allocated nothing, so has no log.
pub fn write(how: ExitInfo) -> bool {
    let now_ns = clock::now_ns();
    let (live, complete) = observe::live_snapshot();
    observe::flush_batches();
    let (checkpoint_leaks, ooms) = incidents::take();
    // Open by now in a process that allocated: at its first event, or, with
    // the trace off, when its session started.
    if !sink::is_open() && live.is_empty() && checkpoint_leaks.is_empty() {
        return false; // nothing was allocated: write nothing at all
    }
    if !sink::ensure_open() {
        return true;
    }
    let mut leaks: Vec<Leak> =
        checkpoint_leaks.iter().map(|c| leak(c.key, &c.allocation, c.at.as_str(), c.t_ns)).collect();
    leaks.extend(live.iter().map(|(key, a)| leak(*key, a, "exit", now_ns)));
    leaks.sort_by_key(|l| std::cmp::Reverse(l.size));
    let end = End {
        end_unix_ms: clock::unix_ms(),
        duration_ms: now_ns / 1_000_000,
        exit: exit_record(how),
        devices: counters::devices().map(|(d, c)| device_counters(d, c)).collect(),
        host: device_counters(-1, counters::host()),
        leak_summary: LeakSummary { bytes: leaks.iter().map(|l| l.size).sum(), count: leaks.len() as u64 },
        leaks,
        dropped_events: sink::dropped(),
        pools: pool::records::all(),
        magazines: pool::records::magazines(),
        ooms,
        complete,
        notes: notes(),
    };
    // Events the last drain could not write are counted by then.
    sink::close_with(|out| {
        let end = End { dropped_events: sink::dropped(), ..end };
        log::write_end(out, &end)
    });
    true
}

fn notes() -> Vec<String> {
    let mut notes = crate::observe::sites::notes();
    notes.extend(incidents::remarks());
    let graph = incidents::graph_allocations();
    if graph > 0 {
        notes.push(format!(
            "{graph} stream-ordered allocation(s) were captured into CUDA graphs: the graphs own them, so they are not tracked"
        ));
    }
    notes
}

fn device_counters(device: i32, c: &counters::Counters) -> DeviceCounters {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    DeviceCounters {
        device,
        allocs: get(&c.allocs),
        frees: get(&c.frees),
        failures: get(&c.failures),
        current_bytes: get(&c.current_bytes),
        peak_bytes: get(&c.peak_bytes),
        current_count: get(&c.current_count),
        peak_count: get(&c.peak_count),
        reserved_bytes: get(&c.reserved_bytes),
        peak_reserved_bytes: get(&c.peak_reserved_bytes),
    }
}

/// `key` is a pointer, or a handle for VMM memory.
fn leak(key: u64, a: &Allocation, at: &str, now_ns: u64) -> Leak {
    let vmm = Space::of(a.kind) == Space::VmmHandle;
    Leak {
        ptr: (!vmm).then_some(key),
        handle: vmm.then_some(key),
        size: a.size,
        device: a.device,
        kind: a.kind.into(),
        api: a.api.into(),
        age_ms: now_ns.saturating_sub(a.t_ns) / 1_000_000,
        tid: a.tid,
        at: at.to_string(),
        stream: (a.stream != 0).then_some(a.stream),
        stack: (a.stack != 0).then_some(a.stack),
    }
}

fn exit_record(how: ExitInfo) -> ExitRecord {
    match how {
        ExitInfo::Exit(status) => ExitRecord::Exit { status },
        ExitInfo::Signal(sig) => ExitRecord::Signal { signal: sig, name: signal_name(sig).to_string() },
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGKILL => "SIGKILL",
        _ => "signal",
    }
}
