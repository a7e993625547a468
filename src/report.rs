//! The end of the log: per-device summary and the leak report. Written from
//! bookkeeping alone: by the time it runs the CUDA driver may be shut down.

use crate::tracker::{self, Live, Space};
use crate::{events, state};
use cupool_core::log::{self, DeviceCounters, End, ExitRecord, Leak, LeakSummary, OomRecord, PoolRecord, ProcessInfo};
use parking_lot::Mutex;
use std::sync::atomic::Ordering;

#[derive(Clone, Copy, Debug)]
pub enum ExitInfo {
    /// Normal exit; the status when the program called `exit`.
    Exit(Option<i32>),
    Signal(i32),
}

/// Leaks found at context destruction, kept until the end record.
struct CheckpointLeak {
    key: u64,
    live: Live,
    at: log::Api,
    t_ns: u64,
}
const MAX_CHECKPOINT_LEAKS: usize = 100_000;
static CHECKPOINT_LEAKS: Mutex<Vec<CheckpointLeak>> = Mutex::new(Vec::new());

/// A context (or every context of a device) died: whatever it still held was leaked.
pub fn checkpoint(at: log::Api, device: i32, died: Vec<(u64, Live)>) {
    if died.is_empty() {
        return; // a context that died clean is no news
    }
    let bytes = died.iter().map(|(_, l)| l.size).sum();
    let mut e = log::Event::new(log::EventKind::Checkpoint, at);
    e.device = device;
    e.size = bytes;
    e.aux = died.len() as u64;
    events::record(e);
    let t_ns = state::now_ns();
    let mut kept = CHECKPOINT_LEAKS.lock();
    for (key, live) in died {
        if kept.len() < MAX_CHECKPOINT_LEAKS {
            kept.push(CheckpointLeak { key, live, at, t_ns });
        }
    }
}

/// OOM snapshots kept for the end record (the first few are the telling ones).
const MAX_OOMS: usize = 16;
static OOMS: Mutex<Vec<OomRecord>> = Mutex::new(Vec::new());

/// The pool could not serve `bytes` even after releasing its cache: record
/// what the device memory looked like, for the end record.
pub fn out_of_memory(api: log::Api, pool: &crate::pool::ContextPool, bytes: u64) {
    let mut e = log::Event::new(log::EventKind::Oom, api);
    e.device = pool.device;
    e.size = bytes;
    e.result = 2;
    events::record(e);
    let mut ooms = OOMS.lock();
    if ooms.len() >= MAX_OOMS {
        return;
    }
    let p = pool.pool.lock();
    let mut largest: Vec<_> = p.live_blocks().map(|b| b.requested).collect();
    largest.sort_unstable_by(|a, b| b.cmp(a));
    largest.truncate(10);
    let f = p.fragmentation();
    ooms.push(OomRecord {
        t_ns: state::now_ns(),
        device: pool.device,
        requested: bytes,
        reserved: f.reserved,
        allocated: f.allocated,
        free_in_pool: f.free_bytes,
        largest_free_block: f.largest_free_block,
        largest_live: largest,
    });
}

fn pools_json() -> Vec<PoolRecord> {
    let live = crate::pool::all().into_iter().map(|p| (p, false));
    let retired = crate::pool::retired().into_iter().map(|p| (p, true));
    live.chain(retired).filter_map(|(p, dead)| pool_json(p, dead)).collect()
}

/// One pool's statistics. A retired pool's context died and took its
/// segments with it: its current figures are reported as 0.
fn pool_json(p: &crate::pool::ContextPool, dead: bool) -> Option<PoolRecord> {
    let pool = p.pool.try_lock_for(std::time::Duration::from_millis(200))?;
    let s = pool.stats();
    let f = pool.fragmentation();
    let stat = |st: &cupool_core::pool::Stat| log::Stat { current: if dead { 0 } else { st.current }, peak: st.peak };
    let ratio =
        if s.requested_bytes.peak == 0 { 1.0 } else { s.reserved_bytes.peak as f64 / s.requested_bytes.peak as f64 };
    let c = pool.backend().counters;
    Some(PoolRecord {
        device: p.device,
        context_destroyed: dead,
        allocated_bytes: stat(&s.allocated_bytes),
        requested_bytes: stat(&s.requested_bytes),
        reserved_bytes: stat(&s.reserved_bytes),
        active_bytes: stat(&s.active_bytes),
        inactive_split_bytes: stat(&s.inactive_split_bytes),
        segment: stat(&s.segment),
        num_device_alloc: s.num_device_alloc,
        num_device_free: s.num_device_free,
        num_alloc_retries: s.num_alloc_retries,
        num_ooms: s.num_ooms,
        num_syncs: s.num_syncs,
        num_waits: s.num_waits,
        largest_free_block: if dead { 0 } else { f.largest_free_block },
        multi_stream: crate::pool::MULTI_STREAM.load(std::sync::atomic::Ordering::Relaxed),
        fences: log::FenceCounters {
            recorded: c.recorded,
            completed: c.completed,
            skipped_for_capture: c.skipped_for_capture,
            record_errors: c.record_errors,
            gpu_barriers: c.gpu_barriers,
            waits: c.waits,
            syncs: c.syncs,
        },
        peak_reserved_over_peak_requested: ratio,
    })
}

pub fn lock_for_fork() {
    std::mem::forget(CHECKPOINT_LEAKS.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    CHECKPOINT_LEAKS.force_unlock();
    if in_child {
        CHECKPOINT_LEAKS.lock().clear();
    }
}

pub fn process_info() -> ProcessInfo {
    let cmdline: Vec<String> = std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
        })
        .unwrap_or_default();
    let exe = std::fs::read_link("/proc/self/exe").map(|p| p.display().to_string()).unwrap_or_default();
    ProcessInfo {
        pid: std::process::id(),
        ppid: unsafe { libc::getppid() } as u32,
        cmdline,
        exe,
        start_unix_ms: state::start_unix_ms(),
    }
}

fn counters_json(device: i32, c: &tracker::Counters) -> DeviceCounters {
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    DeviceCounters {
        device,
        allocs: get(&c.allocs),
        frees: get(&c.frees),
        failures: get(&c.failures),
        current_bytes: get(&c.current_bytes),
        peak_bytes: get(&c.peak_bytes),
        current_count: get(&c.current_count),
        peak_count: get(&c.peak_count),
    }
}

fn leak_json(key: u64, live: &Live, at: &str, now_ns: u64) -> Leak {
    let vmm = Space::of(live.kind) == Space::VmmHandle;
    Leak {
        ptr: (!vmm).then_some(key),
        handle: vmm.then_some(key),
        size: live.size,
        device: live.device,
        kind: live.kind.into(),
        api: live.api.into(),
        age_ms: now_ns.saturating_sub(live.t_ns) / 1_000_000,
        tid: live.tid,
        at: at.to_string(),
        stream: (live.stream != 0).then_some(live.stream),
    }
}

fn exit_json(how: ExitInfo) -> ExitRecord {
    match how {
        ExitInfo::Exit(status) => ExitRecord::Exit { status },
        ExitInfo::Signal(sig) => ExitRecord::Signal { signal: sig, name: signal_name(sig).to_string() },
    }
}

pub fn signal_name(sig: i32) -> &'static str {
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

/// Builds and writes the end record. Called once, by `state::finish`.
pub fn write_end(how: ExitInfo) {
    let now_ns = state::now_ns();
    let (live, complete) = tracker::snapshot();
    let checkpoint_leaks = std::mem::take(&mut *CHECKPOINT_LEAKS.lock());
    if !events::log_open() && live.is_empty() && checkpoint_leaks.is_empty() {
        return; // nothing was traced and nothing leaked: write nothing at all
    }
    if !events::ensure_open() {
        return;
    }
    let mut leaks: Vec<(u64, Leak)> =
        checkpoint_leaks.iter().map(|c| (c.live.size, leak_json(c.key, &c.live, c.at.as_str(), c.t_ns))).collect();
    leaks.extend(live.iter().map(|(key, l)| (l.size, leak_json(*key, l, "exit", now_ns))));
    leaks.sort_by_key(|l| std::cmp::Reverse(l.0));
    let leak_bytes: u64 = leaks.iter().map(|(s, _)| s).sum();
    let devices: Vec<DeviceCounters> = tracker::device_counters().map(|(d, c)| counters_json(d, c)).collect();
    let end = End {
        end_unix_ms: state::unix_ms(),
        duration_ms: now_ns / 1_000_000,
        exit: exit_json(how),
        devices,
        host: counters_json(-1, tracker::host_counters()),
        leak_summary: LeakSummary { bytes: leak_bytes, count: leaks.len() as u64 },
        leaks: leaks.into_iter().map(|(_, v)| v).collect(),
        dropped_events: events::dropped(),
        pools: pools_json(),
        ooms: std::mem::take(&mut *OOMS.lock()),
        complete,
    };
    events::close_with(|out| log::write_end(out, &end));
}
