//! `cupool report --html`: one self-contained page (no network, opens from
//! file://) with the memory of every process and device, one at a time (a
//! selector picks them): the timeline of allocated and reserved bytes with
//! the phases shaded and named and the largest sites as stacked bands
//! (zoom by drag or wheel; hovering names a band's site, or the allocation
//! nearest in time); a flame graph (icicle) of the bytes live by site at
//! the peak and at the end, Python and native frames as the text report
//! shows them, library frames folded, click to zoom; the pool at its peak
//! of reserved bytes, segment by segment, allocated against unused; the
//! leaks as `cupool check` judges them; then the phase groups, top sites,
//! out-of-memory refusals and notes.
//!
//! The page is `html.template.html` with its data as one inline JSON blob,
//! drawn from the same model as the other views (`super::live` aggregates
//! the pictures). The series are downsampled as the Perfetto export's
//! counters are ([`super::downsample`]): each run keeps its lowest and
//! highest point, so the plot's maximum is the peak.

use super::downsample;
use super::live::{self, Held, PoolAt, Use};
use crate::check::finding::{Finding, Findings};
use crate::sites::{self, Resolver, SitesReport};
use crate::summary::short_cmdline;
use cupool_core::model::{phase_groups, PhaseSpan, Process, Sample};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

/// Points of the allocated and reserved series, all devices and processes together (about).
pub const SERIES_POINTS: usize = 400_000;
/// Allocations kept for hovering, all devices and processes together (about).
pub const ALLOC_POINTS: usize = 100_000;
/// Phases drawn as bands per process; more are thinned evenly (the groups table has them all).
pub const PHASES: usize = 5_000;
/// Frames kept per site in the tables.
const FRAMES: usize = 8;
/// Frames kept per stack for the flame graph and hovering.
const STACK_FRAMES: usize = 64;
/// Sites as bands in the timeline, per device.
pub const BANDS: usize = 8;
/// Instants the bands keep over the run (each the highest of its stretch).
pub const BUCKETS: u64 = 2000;
/// Sites in a flame graph, per device and instant (the rest is one box).
const FLAME_SITES: usize = 20_000;
/// Segments in the pool's picture, per device.
const SEGMENTS: usize = 3000;
/// The least points one series keeps, whatever the budget.
const MIN_POINTS: usize = 1000;

const TEMPLATE: &str = include_str!("html.template.html");
/// Where the data goes in the template.
const SLOT: &str = "/*CUPOOL_DATA*/";

/// What one page holds.
#[derive(Default)]
pub struct Written {
    pub points: usize,
    pub points_seen: usize,
    pub bytes: u64,
}

/// `[t0, v0, t1, v1, ...]` with each time as the step from the one before (smaller text).
fn series(points: &[(u64, u64)]) -> Vec<u64> {
    let mut out = Vec::with_capacity(2 * points.len());
    let mut last = 0;
    for &(t, v) in points {
        out.push(t.saturating_sub(last));
        out.push(v);
        last = t;
    }
    out
}

#[derive(Serialize)]
struct Phase<'a> {
    name: &'a str,
    begin_ns: u64,
    end_ns: Option<u64>,
}

fn phases(spans: &[PhaseSpan]) -> Vec<Phase<'_>> {
    let step = spans.len().div_ceil(PHASES).max(1);
    spans.iter().step_by(step).map(|s| Phase { name: &s.name, begin_ns: s.begin_ns, end_ns: s.end_ns }).collect()
}

/// Frames as the text report writes them, innermost first.
fn frame_texts(frames: &[crate::sites::ShownFrame]) -> Vec<String> {
    frames.iter().take(FRAMES).enumerate().map(|(i, f)| f.text(i)).collect()
}

/// The frames of a process's sites, each text once: `texts` and whether
/// each is a library's (`lib`), and each stack as indices into them.
#[derive(Default)]
struct FrameTable {
    texts: Vec<String>,
    lib: Vec<u8>,
    index: HashMap<String, usize>,
    stacks: BTreeMap<u32, Vec<usize>>,
}

impl FrameTable {
    fn add(&mut self, id: u32, resolver: &mut Option<Resolver>, log: &cupool_core::log::Log) {
        if self.stacks.contains_key(&id) {
            return;
        }
        let r = resolver.get_or_insert_with(|| Resolver::new(log));
        let frames = r.frames(id);
        let mut ids = Vec::with_capacity(frames.len().min(STACK_FRAMES));
        for f in frames.iter().take(STACK_FRAMES) {
            // `#0 ` off: the same frame is the same text at any depth.
            let text = f.text(0).split_once(' ').map_or(String::new(), |(_, t)| t.to_string());
            let next = self.texts.len();
            let i = *self.index.entry(text.clone()).or_insert(next);
            if i == next {
                self.texts.push(text);
                self.lib.push(u8::from(sites::is_library(f)));
            }
            ids.push(i);
        }
        self.stacks.insert(id, ids);
    }
}

/// `[site, bytes, allocations, ...]` of one instant, `null` for no site.
fn held(h: &Held, table: &mut FrameTable, resolver: &mut Option<Resolver>, log: &cupool_core::log::Log) -> Value {
    let mut flat = Vec::with_capacity(3 * h.sites.len().min(FLAME_SITES));
    for &(stack, bytes, count) in h.sites.iter().take(FLAME_SITES) {
        if let Some(id) = stack {
            table.add(id, resolver, log);
        }
        flat.extend([json!(stack), json!(bytes), json!(count)]);
    }
    let shown: u64 = h.sites.iter().take(FLAME_SITES).map(|s| s.1).sum();
    json!({ "t_ns": h.t_ns, "bytes": h.bytes, "sites": flat, "sites_total": h.sites.len(), "rest_bytes": h.bytes - shown })
}

fn pool(p: &PoolAt) -> Value {
    let code = |u: Use| match u {
        Use::Free => 0,
        Use::Allocated => 1,
        Use::Pending => 2,
    };
    let segments: Vec<Value> = p
        .segments
        .iter()
        .map(|s| {
            let runs: Vec<u64> = s.runs.iter().flat_map(|&(size, u)| [size, code(u)]).collect();
            json!([s.size, u8::from(s.pooled), u8::from(s.small), runs])
        })
        .collect();
    json!({
        "t_ns": p.t_ns,
        "allocated": p.allocated,
        "reserved": p.reserved,
        "laid_out": p.laid_out,
        "pooled_not_laid_out": p.pooled_not_laid_out,
        "segments": segments,
        "left_out": [p.left_out.0, p.left_out.1, p.left_out.2],
    })
}

/// The data of one process.
fn process(p: &Process, sites: &SitesReport, per_series: usize, per_allocs: usize, w: &mut Written) -> Value {
    let log = &p.log;
    // Device allocations in order: (t, size, stack).
    let mut allocs: BTreeMap<i32, Vec<(u64, u64, Option<u32>)>> = BTreeMap::new();
    for a in p.allocations.iter().filter(|a| !a.is_host()) {
        allocs.entry(a.device).or_default().push((a.t_ns, a.size, a.stack));
    }
    let mut resolver = None;
    let mut table = FrameTable::default();
    let pictures = live::pictures(p, BANDS, BUCKETS, SEGMENTS);
    let mut devices = Vec::new();
    for (d, pic) in p.devices.iter().zip(&pictures) {
        debug_assert_eq!(d.device, pic.device);
        let mut one = |value: fn(&Sample) -> u64| {
            let pts: Vec<(u64, u64)> = d.samples.iter().map(|s| (s.t_ns, value(s))).collect();
            let kept = downsample(&pts, per_series, |p| p.1);
            w.points_seen += pts.len();
            w.points += kept.len();
            series(&kept)
        };
        let allocated = one(|s| s.allocated);
        let reserved = one(|s| s.reserved);
        let mine = allocs.remove(&d.device).unwrap_or_default();
        let kept = downsample(&mine, per_allocs, |a| a.1);
        let mut at = Vec::with_capacity(kept.len() * 3);
        let mut last = 0;
        for &(t, size, stack) in &kept {
            at.push(json!(t.saturating_sub(last)));
            at.push(json!(size));
            at.push(json!(stack));
            last = t;
            if let Some(id) = stack {
                table.add(id, &mut resolver, log);
            }
        }
        for &id in &pic.bands.sites {
            table.add(id, &mut resolver, log);
        }
        let bands_t: Vec<(u64, u64)> = pic.bands.t.iter().map(|&t| (t, 0)).collect();
        let bands_t: Vec<u64> = series(&bands_t).chunks(2).map(|c| c[0]).collect();
        devices.push(json!({
            "device": d.device,
            "allocs": d.allocs,
            "frees": d.frees,
            "failures": d.failures,
            "peak_allocated": d.peak_allocated,
            "peak_reserved": d.peak_reserved,
            "recorded_peak_reserved": d.recorded_peak_reserved,
            "allocated": allocated,
            "reserved": reserved,
            "alloc_events": at,
            "alloc_events_seen": mine.len(),
            "flame": {
                "peak": held(&pic.at_peak, &mut table, &mut resolver, log),
                "end": held(&pic.at_end, &mut table, &mut resolver, log),
            },
            "bands": {
                "sites": pic.bands.sites,
                "t": bands_t,
                "values": pic.bands.values,
                "other": pic.bands.other,
            },
            "pool": pic.pool.as_ref().map(pool),
        }));
    }
    let shown = |s: &crate::sites::ShownSite| {
        json!({
            "stack": s.figures.stack,
            "allocs": s.figures.allocs,
            "total_bytes": s.figures.total_bytes,
            "peak_bytes": s.figures.peak_bytes,
            "live_bytes": s.figures.live_bytes,
            "frames": frame_texts(&s.frames),
        })
    };
    let process = &log.header.process;
    let rank = process.rank.map(|r| format!(" (rank {r})")).unwrap_or_default();
    let notes: Vec<&String> = log.end.iter().flat_map(|e| &e.notes).chain(&p.problems).collect();
    json!({
        "title": format!("pid {}{rank}: {}", process.pid, short_cmdline(&process.cmdline, 80)),
        "pid": process.pid,
        "rank": process.rank,
        "mode": p.mode(),
        "complete": log.end.is_some(),
        "duration_ns": p.duration_ns,
        "reserved_from": p.reserved_from,
        "devices": devices,
        "phases": phases(&p.spans),
        "phases_total": p.spans.len(),
        "phase_groups": phase_groups(&p.spans),
        "sites": {
            "by_peak": sites.by_peak.iter().map(shown).collect::<Vec<_>>(),
            "by_count": sites.by_count.iter().map(shown).collect::<Vec<_>>(),
            "by_live": sites.by_live.iter().map(shown).collect::<Vec<_>>(),
        },
        "frames": table.texts,
        "frame_lib": table.lib,
        "stacks": table.stacks,
        "ooms": p.ooms,
        "checkpoints": p.checkpoints,
        "notes": notes,
        "rebuilt": p.rebuilt,
    })
}

fn finding(f: &Finding) -> Value {
    json!({
        "kind": f.kind,
        "bytes": f.bytes,
        "count": f.count,
        "what": f.what,
        "test": f.test,
        "growth": f.growth,
        "pids": f.processes.iter().map(|p| p.pid).collect::<Vec<_>>(),
        "frames": frame_texts(&f.frames),
    })
}

/// The page's data: every process, then the leak findings.
pub fn data(logs: &[(&Process, &SitesReport)], findings: &Findings, w: &mut Written) -> Value {
    data_within(logs, findings, SERIES_POINTS, ALLOC_POINTS, w)
}

/// The page's data with about `series_points` series points and `alloc_points` allocations in all.
fn data_within(
    logs: &[(&Process, &SitesReport)],
    findings: &Findings,
    series_points: usize,
    alloc_points: usize,
    w: &mut Written,
) -> Value {
    let n_devices: usize = logs.iter().map(|(p, _)| p.devices.len()).sum::<usize>().max(1);
    let per_series = (series_points / (2 * n_devices)).max(MIN_POINTS);
    let per_allocs = (alloc_points / n_devices).max(MIN_POINTS);
    let processes: Vec<Value> = logs.iter().map(|(p, sites)| process(p, sites, per_series, per_allocs, w)).collect();
    let shown: Vec<Value> = findings.findings.iter().filter(|f| f.suppressed_by.is_none()).map(finding).collect();
    let held: u64 = findings.suppressed.bytes;
    json!({
        "generator": "cupool report --html",
        "version": env!("CARGO_PKG_VERSION"),
        "processes": processes,
        "findings": shown,
        "held_by_caches": held,
    })
}

/// Writes the page of `logs` into `out`.
pub fn write(logs: &[(&Process, &SitesReport)], findings: &Findings, out: impl Write) -> io::Result<Written> {
    let mut w = Written::default();
    let data = data(logs, findings, &mut w);
    // `<` only occurs inside JSON strings, where `\u003c` reads the same:
    // no `</script>` can end the blob early.
    let text = serde_json::to_string(&data)?.replace('<', "\\u003c");
    let (head, tail) = TEMPLATE.split_once(SLOT).expect("the template has a data slot");
    let mut out = io::BufWriter::new(out);
    out.write_all(head.as_bytes())?;
    out.write_all(text.as_bytes())?;
    out.write_all(tail.as_bytes())?;
    out.flush()?;
    w.bytes = (head.len() + text.len() + tail.len()) as u64;
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_written_as_steps() {
        assert_eq!(series(&[(5, 1), (7, 3), (7, 2)]), vec![5, 1, 2, 3, 0, 2]);
    }

    /// A passthrough log of `n` allocations in a saw tooth, one of them a spike.
    fn saw_log(n: u64) -> Process {
        use cupool_core::log::{EventKind, Header, Log, Named, ProcessInfo};
        use cupool_core::options::{Mode, Options};
        let mut events = Vec::new();
        let mut push = |ev, ptr, size| {
            let mut e = cupool_core::log::EventRecord::new(events.len() as u64, 1000 * events.len() as u64, ev);
            e.api = Some(Named::from_name("cudaMalloc"));
            e.kind = Some(Named::from_name("device"));
            (e.device, e.ptr, e.size, e.tid, e.stack) = (Some(0), Some(ptr), Some(size), Some(1), Some(3));
            events.push(e);
        };
        for i in 0..n {
            let size = if i == n / 3 { 1 << 30 } else { 4096 * (i % 17 + 1) };
            push(EventKind::Alloc, 0x1000 + i, size);
            if i % 4 != 3 {
                push(EventKind::Free, 0x1000 + i, size);
            }
        }
        let header = Header {
            schema: cupool_core::log::SCHEMA.into(),
            version: cupool_core::log::VERSION,
            process: ProcessInfo {
                pid: 9,
                cmdline: vec!["prog".into(), "</script><script>alert(1)</script>".into()],
                ..Default::default()
            },
            options: Options { mode: Mode::Passthrough, ..Options::default() },
        };
        Process::new(Log { path: "cupool.9.json".into(), header, events, definitions: Vec::new(), end: None })
    }

    #[test]
    fn long_series_are_cut_down_with_the_peak_kept() {
        let view = saw_log(20_000);
        let sites = SitesReport::default();
        let mut w = Written::default();
        let data = data_within(&[(&view, &sites)], &Findings::default(), 4000, 1000, &mut w);
        let dev = &data["processes"][0]["devices"][0];
        let values = |key: &str| -> Vec<u64> {
            dev[key].as_array().unwrap().chunks(2).map(|c| c[1].as_u64().unwrap()).collect()
        };
        let allocated = values("allocated");
        assert!(allocated.len() <= 2001 && w.points < w.points_seen, "{} of {}", allocated.len(), w.points_seen);
        assert_eq!(allocated.iter().max(), Some(&view.devices[0].peak_allocated.bytes));
        assert!(view.devices[0].peak_allocated.bytes >= 1 << 30);
        assert_eq!(values("reserved").iter().max(), Some(&view.devices[0].peak_reserved.bytes));
        // Times as steps add up to the last sample's time.
        let t: u64 = dev["allocated"].as_array().unwrap().chunks(2).map(|c| c[0].as_u64().unwrap()).sum();
        assert_eq!(t, view.devices[0].samples.last().unwrap().t_ns);
        // Allocations for hovering: bounded, the spike among them.
        let allocs = dev["alloc_events"].as_array().unwrap();
        assert!(allocs.len() / 3 <= 1001, "{}", allocs.len() / 3);
        assert!(allocs.chunks(3).any(|a| a[1] == 1u64 << 30));
        // A name with `</script>` in it cannot end the data early.
        let mut page = Vec::new();
        write(&[(&view, &sites)], &Findings::default(), &mut page).unwrap();
        let page = String::from_utf8(page).unwrap();
        assert_eq!(page.matches("</script>").count(), 2, "the blob's end and the script's");
        assert!(page.contains("\\u003c/script>\\u003cscript>alert(1)"));
    }

    #[test]
    fn the_template_has_one_slot_and_nothing_from_outside() {
        assert_eq!(TEMPLATE.matches(SLOT).count(), 1);
        for bad in ["http://", "https://", " src=", "@import", "url("] {
            assert!(!TEMPLATE.contains(bad), "{bad}");
        }
    }
}
