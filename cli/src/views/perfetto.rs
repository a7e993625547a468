//! `cupool export --perfetto`: Chrome trace JSON, which ui.perfetto.dev (and
//! chrome://tracing) opens. Per process (named by pid, rank and command line):
//! counter tracks `device N allocated`, `device N reserved` and, with VMM
//! mappings, `device N mapped` (bytes); the program's phases as slices, one
//! track per kind (`cupool_mark`, `cupool_phase`, NVTX push/pop on the thread
//! that pushed), as B/E pairs where they nest and async slices where they do
//! not (NVTX start/end ranges always); instant events for out-of-memory
//! refusals (with the pool's snapshot), context checkpoints and the notes of
//! the end record. Processes share one clock: their start times.
//!
//! Counter tracks with more points than their share of `max_points` are
//! downsampled ([`super::downsample`]): each run of points keeps its
//! lowest and highest, so every peak survives.

use super::downsample;
use crate::summary::short_cmdline;
use cupool_core::model::{Family, PhaseSpan, Process, Sample};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::io::{self, Write};

/// Synthetic thread ids of the phase tracks that are not a thread's own:
/// 32-bit (as trace viewers read them), above any Linux pid_max (2^22).
const MARK_TID: u64 = 0xffff_ff00;
const PHASE_TID: u64 = 0xffff_ff01;
/// Added to the pid of a process whose pid another process of the trace has
/// (logs of several machines), staying within 32 bits.
const PID_STEP: u64 = 1 << 24;
/// The least points a counter track keeps, whatever the budget.
pub(super) const MIN_POINTS: usize = 1000;

#[derive(Serialize)]
struct Event<'a> {
    name: &'a str,
    ph: &'static str,
    ts: f64,
    pid: u64,
    tid: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    #[serde(skip_serializing_if = "Value::is_null")]
    args: Value,
}

/// A counter track of a device: its key, its figure, whether it is written.
type Series = (&'static str, fn(&Sample) -> u64, bool);

/// What one export wrote.
#[derive(Default)]
pub struct Written {
    pub events: usize,
    pub counter_points: usize,
    /// Counter points before downsampling.
    pub counter_points_seen: usize,
}

struct Writer<W: Write> {
    out: W,
    first: bool,
    written: Written,
}

impl<W: Write> Writer<W> {
    fn event(&mut self, e: &Event) -> io::Result<()> {
        self.out.write_all(if self.first { b"\n" } else { b",\n" })?;
        self.first = false;
        serde_json::to_writer(&mut self.out, e)?;
        self.written.events += 1;
        Ok(())
    }
}

/// Microseconds on the shared clock: the process's start, then `t_ns` into it.
fn clock(origin_ms: u64, start_ms: u64, t_ns: u64) -> f64 {
    let us = (start_ms.saturating_sub(origin_ms) as f64) * 1000.0 + t_ns as f64 / 1000.0;
    (us * 1000.0).round() / 1000.0
}

/// The phases of one track as slices: `(span, nests)`, in the order a
/// properly nested B/E stream needs them (by begin, outer first).
fn nesting(spans: &[&PhaseSpan], end_of_log: u64) -> Vec<(usize, bool)> {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    let end = |i: usize| spans[i].end_ns.unwrap_or(end_of_log);
    order.sort_by_key(|&i| (spans[i].begin_ns, std::cmp::Reverse(end(i)), i));
    let mut stack: Vec<usize> = Vec::new();
    let mut out = Vec::new();
    for i in order {
        while stack.last().is_some_and(|&top| end(top) <= spans[i].begin_ns) {
            stack.pop();
        }
        let nests = stack.last().is_none_or(|&top| end(i) <= end(top));
        if nests {
            stack.push(i);
        }
        out.push((i, nests));
    }
    out
}

/// Writes the trace of `processes` into `out`; counter tracks keep about
/// `max_points` points in all.
pub fn write(processes: &[Process], max_points: usize, out: impl Write) -> io::Result<Written> {
    let mut w = Writer { out: io::BufWriter::new(out), first: true, written: Written::default() };
    w.out.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
    let origin = processes.iter().map(|p| p.log.header.process.start_unix_ms).min().unwrap_or(0);
    let tracks: usize =
        processes.iter().flat_map(|p| &p.devices).map(|d| if d.peak_mapped.bytes > 0 { 3 } else { 2 }).sum();
    let per_track = (max_points / tracks.max(1)).max(MIN_POINTS);
    let mut pids = HashSet::new();
    let mut async_id = 0u64;
    for view in processes {
        let process = &view.log.header.process;
        // Logs of several machines may share a pid.
        let mut pid = u64::from(process.pid);
        while !pids.insert(pid) {
            pid += PID_STEP;
        }
        let start = process.start_unix_ms;
        let ts = |t_ns: u64| clock(origin, start, t_ns);
        let rank = process.rank.map(|r| format!(" (rank {r})")).unwrap_or_default();
        let title = format!("pid {}{rank}: {}", process.pid, short_cmdline(&process.cmdline, 60));
        let meta = |name: &'static str, tid: u64, args: Value| Event {
            name,
            ph: "M",
            ts: 0.0,
            pid,
            tid,
            cat: None,
            id: None,
            s: None,
            args,
        };
        w.event(&meta("process_name", 0, json!({ "name": title })))?;
        w.event(&meta("process_sort_index", 0, json!({ "sort_index": process.rank.unwrap_or(u32::MAX) })))?;

        for d in &view.devices {
            let device = if d.device < 0 { "device ?".to_string() } else { format!("device {}", d.device) };
            let series: [Series; 3] = [
                ("allocated", |s| s.allocated, true),
                ("reserved", |s| s.reserved, true),
                ("mapped", |s| s.mapped, d.peak_mapped.bytes > 0),
            ];
            for (key, value, wanted) in series {
                if !wanted {
                    continue;
                }
                // The series' own changes (a sample may change another figure only).
                let mut points: Vec<(u64, u64)> = Vec::with_capacity(d.samples.len() + 1);
                points.push((0, 0));
                for s in &d.samples {
                    let v = value(s);
                    if points.last().is_none_or(|p| p.1 != v) {
                        points.push((s.t_ns, v));
                    }
                }
                w.written.counter_points_seen += points.len();
                for (t, v) in downsample(&points, per_track, |p| p.1) {
                    w.written.counter_points += 1;
                    w.event(&Event {
                        name: &device,
                        ph: "C",
                        ts: ts(t),
                        pid,
                        tid: 0,
                        cat: Some("memory"),
                        id: None,
                        s: None,
                        args: json!({ key: v }),
                    })?;
                }
            }
        }

        // Phases: one track per kind; NVTX push/pop on the thread's own track.
        let mut track_names: Vec<(u64, &str)> = Vec::new();
        let mut by_track: Vec<(u64, Vec<&PhaseSpan>)> = Vec::new();
        for span in &view.spans {
            let tid = match span.family {
                Family::Mark => MARK_TID,
                Family::Phase => PHASE_TID,
                Family::NvtxPush => u64::from(span.tid),
                Family::NvtxRange => {
                    async_id += 1;
                    write_async(&mut w, span, pid, async_id, "nvtx", &ts, view.duration_ns)?;
                    continue;
                }
            };
            match by_track.iter_mut().find(|(t, _)| *t == tid) {
                Some((_, v)) => v.push(span),
                None => by_track.push((tid, vec![span])),
            }
        }
        for (tid, spans) in &by_track {
            match *tid {
                MARK_TID => track_names.push((MARK_TID, "cupool_mark")),
                PHASE_TID => track_names.push((PHASE_TID, "cupool_phase")),
                _ => {}
            }
            let order = nesting(spans, view.duration_ns);
            // B on the way in, E on the way out, in one pass that keeps them nested.
            let mut open: Vec<usize> = Vec::new();
            let end = |i: usize| spans[i].end_ns.unwrap_or(view.duration_ns);
            let close = |w: &mut Writer<_>, i: usize| -> io::Result<()> {
                w.event(&Event {
                    name: &spans[i].name,
                    ph: "E",
                    ts: ts(end(i)),
                    pid,
                    tid: *tid,
                    cat: Some("phase"),
                    id: None,
                    s: None,
                    args: Value::Null,
                })
            };
            for (i, nests) in order {
                let span = spans[i];
                if !nests {
                    async_id += 1;
                    write_async(&mut w, span, pid, async_id, "phase", &ts, view.duration_ns)?;
                    continue;
                }
                while let Some(&top) = open.last() {
                    if end(top) <= span.begin_ns {
                        open.pop();
                        close(&mut w, top)?;
                    } else {
                        break;
                    }
                }
                w.event(&Event {
                    name: &span.name,
                    ph: "B",
                    ts: ts(span.begin_ns),
                    pid,
                    tid: *tid,
                    cat: Some("phase"),
                    id: None,
                    s: None,
                    args: phase_args(span),
                })?;
                open.push(i);
            }
            while let Some(top) = open.pop() {
                close(&mut w, top)?;
            }
        }
        for (tid, name) in track_names {
            w.event(&meta("thread_name", tid, json!({ "name": name })))?;
        }

        // Instants: out of memory, checkpoints, notes.
        for o in &view.ooms {
            let mut args = json!({ "device": o.device, "requested": o.requested, "api": o.api });
            if let Some(s) = &o.snapshot {
                args["snapshot"] = serde_json::to_value(s).unwrap_or(Value::Null);
            }
            instant(&mut w, "out of memory", "oom", ts(o.t_ns), pid, args)?;
        }
        for c in &view.checkpoints {
            let args = json!({ "device": c.device, "api": c.api, "leaked_bytes": c.leaked_bytes, "leaked_count": c.leaked_count });
            instant(&mut w, &format!("{} destroyed a context", c.api), "checkpoint", ts(c.t_ns), pid, args)?;
        }
        for n in view.log.end.iter().flat_map(|e| &e.notes).chain(&view.problems) {
            instant(&mut w, "note", "note", ts(view.duration_ns), pid, json!({ "note": n }))?;
        }
    }
    w.out.write_all(b"\n],\"otherData\":{\"generator\":\"cupool export\",\"version\":\"")?;
    w.out.write_all(env!("CARGO_PKG_VERSION").as_bytes())?;
    w.out.write_all(b"\"}}\n")?;
    w.out.flush()?;
    Ok(w.written)
}

/// A phase's figures on each device, for the slice's details.
fn phase_args(span: &PhaseSpan) -> Value {
    let devices: Vec<Value> = span
        .devices
        .iter()
        .map(|d| {
            json!({
                "device": d.device,
                "peak_allocated": d.peak_allocated,
                "peak_reserved": d.peak_reserved,
                "allocated_begin": d.allocated_begin,
                "allocated_end": d.allocated_end,
                "growth": d.growth(),
            })
        })
        .collect();
    json!({ "devices": devices, "open_at_end": span.end_ns.is_none() })
}

fn write_async<W: Write>(
    w: &mut Writer<W>,
    span: &PhaseSpan,
    pid: u64,
    id: u64,
    cat: &'static str,
    ts: &dyn Fn(u64) -> f64,
    end_of_log: u64,
) -> io::Result<()> {
    let e = |ph: &'static str, t: u64, args: Value| Event {
        name: &span.name,
        ph,
        ts: ts(t),
        pid,
        tid: u64::from(span.tid),
        cat: Some(cat),
        id: Some(id),
        s: None,
        args,
    };
    w.event(&e("b", span.begin_ns, phase_args(span)))?;
    w.event(&e("e", span.end_ns.unwrap_or(end_of_log), Value::Null))
}

fn instant<W: Write>(
    w: &mut Writer<W>,
    name: &str,
    cat: &'static str,
    ts: f64,
    pid: u64,
    args: Value,
) -> io::Result<()> {
    w.event(&Event { name, ph: "i", ts, pid, tid: 0, cat: Some(cat), id: None, s: Some("p"), args })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(name: &str, begin: u64, end: Option<u64>) -> PhaseSpan {
        PhaseSpan {
            name: name.into(),
            family: Family::Phase,
            tid: 1,
            begin_ns: begin,
            end_ns: end,
            begin: None,
            end: None,
            parent: None,
            devices: Vec::new(),
        }
    }

    #[test]
    fn slices_that_cross_go_async() {
        let spans = [
            span("outer", 0, Some(100)),
            span("inner", 10, Some(20)),
            span("cross", 50, Some(150)),
            span("open", 120, None),
        ];
        let refs: Vec<&PhaseSpan> = spans.iter().collect();
        let order = nesting(&refs, 200);
        assert_eq!(order, vec![(0, true), (1, true), (2, false), (3, true)]);
    }
}
