//! The end record: per-device summary, pool statistics, incidents and the
//! leak report, assembled from the observers and the pools and handed to the
//! sink. Built from bookkeeping alone: by the time it runs the CUDA driver
//! may be shut down.

use crate::observe::{counters, incidents, live, Allocation, Space};
use crate::runtime::clock;
use crate::{pool, sink};
use cupool_core::log;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Clone, Copy, Debug)]
pub enum ExitInfo {
    /// Normal exit; the status when the program called `exit`.
    Exit(Option<i32>),
    Signal(i32),
}

/// Builds and writes the end record. Called once, by `lifecycle::finish`.
pub fn write(how: ExitInfo) {
    let now_ns = clock::now_ns();
    let (live, complete) = live::snapshot();
    let (checkpoint_leaks, ooms) = incidents::take();
    if !sink::is_open() && live.is_empty() && checkpoint_leaks.is_empty() {
        return; // nothing was traced and nothing leaked: write nothing at all
    }
    if !sink::ensure_open() {
        return;
    }
    let mut leaks: Vec<(u64, Value)> = checkpoint_leaks
        .iter()
        .map(|c| (c.allocation.size, leak_json(c.key, &c.allocation, c.at.as_str(), c.t_ns)))
        .collect();
    leaks.extend(live.iter().map(|(key, a)| (a.size, leak_json(*key, a, "exit", now_ns))));
    leaks.sort_by_key(|l| std::cmp::Reverse(l.0));
    let leak_bytes: u64 = leaks.iter().map(|(s, _)| s).sum();
    let devices: Vec<Value> = counters::devices().map(|(d, c)| counters_json(d, c)).collect();
    let end = json!({
        "end_unix_ms": clock::unix_ms(),
        "duration_ms": now_ns / 1_000_000,
        "exit": exit_json(how),
        "devices": devices,
        "host": counters_json(-1, counters::host()),
        "leak_summary": {"bytes": leak_bytes, "count": leaks.len()},
        "leaks": leaks.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
        "dropped_events": sink::dropped(),
        "pools": pool::records::all(),
        "ooms": ooms,
        "complete": complete,
    });
    sink::close_with(|out| {
        log::write_trailer_open(out);
        out.push_str(&end.to_string());
        out.push_str("}\n");
    });
}

fn counters_json(device: i32, c: &counters::Counters) -> Value {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    json!({
        "device": device,
        "allocs": get(&c.allocs),
        "frees": get(&c.frees),
        "failures": get(&c.failures),
        "current_bytes": get(&c.current_bytes),
        "peak_bytes": get(&c.peak_bytes),
        "current_count": get(&c.current_count),
        "peak_count": get(&c.peak_count),
    })
}

fn leak_json(key: u64, a: &Allocation, at: &str, now_ns: u64) -> Value {
    let mut v = json!({
        "ptr": format!("{key:#x}"),
        "size": a.size,
        "device": a.device,
        "kind": a.kind.as_str(),
        "api": a.api.as_str(),
        "age_ms": now_ns.saturating_sub(a.t_ns) / 1_000_000,
        "tid": a.tid,
        "at": at,
    });
    if a.stream != 0 {
        v["stream"] = json!(format!("{:#x}", a.stream));
    }
    if Space::of(a.kind) == Space::VmmHandle {
        v["handle"] = v["ptr"].take();
        v.as_object_mut().map(|o| o.remove("ptr"));
    }
    v
}

fn exit_json(how: ExitInfo) -> Value {
    match how {
        ExitInfo::Exit(status) => json!({"how": "exit", "status": status}),
        ExitInfo::Signal(sig) => json!({"how": "signal", "signal": sig, "name": signal_name(sig)}),
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
