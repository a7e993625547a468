//! `cupool report`: what each process did with device memory, in the spirit of
//! `torch.cuda.memory_summary` and `heaptrack_print`. First the one-screen
//! summary `cupool run` prints; then per process: peaks of allocated, reserved
//! and mapped memory per device with when and in which phase, the sizes
//! allocated, reserved against allocated over time, the phases' peaks and
//! growth, out-of-memory refusals with the pool's snapshot, checkpoints and
//! notes, and the top allocation sites; last, the leaks as `cupool check`
//! judges them. `--json` gives the same per process (docs/report.md);
//! `--html` writes it as one page with plots (`super::html`).

use super::export::{Output, EXIT_CANNOT_WRITE};
use super::load::{load, Loaded};
use super::progress::Progress;
use crate::check::finding::{Finding, Findings, LeakKind};
use crate::sites::{self, SitesReport};
use crate::summary::short_cmdline;
use crate::units::human_bytes;
use cupool_core::model::{
    phase_groups, CheckpointView, DeviceSeries, OomView, Peak, PhaseGroup, PhaseSpan, Process, Rebuilt, ReservedFrom,
    Sample, SizeBucket, Summary,
};
use cupool_core::options::Mode;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Points of the reserved-against-allocated table (and of its JSON).
const FRAGMENTATION_POINTS: usize = 12;
/// Phase groups shown per process in the text.
const PHASE_GROUPS: usize = 10;
/// The widest bar of the size histogram.
const BAR: usize = 28;

/// Reserved against allocated bytes at one moment.
#[derive(Clone, Debug, Serialize)]
pub struct FragmentationPoint {
    pub t_ns: u64,
    pub allocated: u64,
    pub reserved: u64,
}

/// One device's reserved memory against its allocated memory over the run.
#[derive(Clone, Debug, Serialize)]
pub struct Fragmentation {
    pub device: i32,
    /// The figures at evenly spaced moments of the run (the first at its start, the last at its end).
    pub points: Vec<FragmentationPoint>,
    /// The most bytes reserved but not allocated at one moment, when, and in which phase.
    pub most_unused: Peak,
}

/// One process's memory over the run, as `cupool report --json` writes it.
#[derive(Serialize)]
struct Memory<'a> {
    pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    rank: Option<u32>,
    start_unix_ms: u64,
    duration_ns: u64,
    mode: Mode,
    devices: &'a [DeviceSeries],
    host: &'a DeviceSeries,
    reserved_from: ReservedFrom,
    phases: &'a [PhaseSpan],
    sizes: &'a [SizeBucket],
    ooms: &'a [OomView],
    checkpoints: &'a [CheckpointView],
    notes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rebuilt: &'a Option<Rebuilt>,
}

impl<'a> Memory<'a> {
    fn of(p: &'a Process) -> Memory<'a> {
        let process = &p.log.header.process;
        Memory {
            pid: process.pid,
            rank: process.rank,
            start_unix_ms: process.start_unix_ms,
            duration_ns: p.duration_ns,
            mode: p.mode(),
            devices: &p.devices,
            host: &p.host,
            reserved_from: p.reserved_from,
            phases: &p.spans,
            sizes: &p.sizes,
            ooms: &p.ooms,
            checkpoints: &p.checkpoints,
            notes: notes(p),
            rebuilt: &p.rebuilt,
        }
    }
}

/// The end record's notes, then what the model could not use.
fn notes(p: &Process) -> Vec<String> {
    let end = p.log.end.as_ref().map_or(&[][..], |e| &e.notes[..]);
    end.iter().chain(&p.problems).cloned().collect()
}

/// One entry of `cupool report --json`: one log.
#[derive(Serialize)]
struct LogReport<'a> {
    #[serde(flatten)]
    summary: Summary,
    path: String,
    sites: SitesReport,
    memory: Memory<'a>,
    fragmentation: Vec<Fragmentation>,
    phase_groups: Vec<PhaseGroup>,
    /// The leak findings of `cupool check` that name this process.
    findings: Vec<&'a Finding>,
}

/// The figures of a device at `t` (the last change at or before it).
fn at(samples: &[Sample], t: u64) -> Sample {
    let i = samples.partition_point(|s| s.t_ns <= t);
    if i == 0 {
        Sample { t_ns: t, ..Default::default() }
    } else {
        Sample { t_ns: t, ..samples[i - 1] }
    }
}

pub fn fragmentation(p: &Process, d: &DeviceSeries) -> Fragmentation {
    let n = FRAGMENTATION_POINTS as u64;
    let points = (0..n)
        .map(|i| {
            let s = at(&d.samples, p.duration_ns * i / (n - 1));
            FragmentationPoint { t_ns: s.t_ns, allocated: s.allocated, reserved: s.reserved }
        })
        .collect();
    let mut most_unused = Peak::default();
    let mut best: Option<&Sample> = None;
    for s in &d.samples {
        let unused = s.reserved.saturating_sub(s.allocated);
        if unused > best.map_or(0, |b| b.reserved.saturating_sub(b.allocated)) {
            best = Some(s);
        }
    }
    if let Some(s) = best {
        most_unused = Peak { bytes: s.reserved - s.allocated, t_ns: s.t_ns, phase: phase_at(&p.spans, s.t_ns) };
    }
    Fragmentation { device: d.device, points, most_unused }
}

/// The innermost phase open at `t` (the latest begun that had not ended).
fn phase_at(phases: &[PhaseSpan], t: u64) -> Option<String> {
    phases.iter().rev().find(|s| s.begin_ns <= t && s.end_ns.is_none_or(|e| e >= t)).map(|s| s.name.clone())
}

fn seconds(t_ns: u64) -> String {
    format!("{:.3} s", t_ns as f64 / 1e9)
}

fn signed_bytes(n: i64) -> String {
    let sign = if n < 0 { "-" } else { "+" };
    format!("{sign}{}", human_bytes(n.unsigned_abs()))
}

/// `text` cut to `width` characters (an ellipsis marks the cut).
fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut s: String = text.chars().take(width.saturating_sub(3)).collect();
    s.push_str("...");
    s
}

fn device_name(device: i32) -> String {
    if device < 0 {
        "device ?".into()
    } else {
        format!("device {device}")
    }
}

fn process_title(p: &Process) -> String {
    let process = &p.log.header.process;
    let rank = process.rank.map(|r| format!(" (rank {r})")).unwrap_or_default();
    let mode = match p.mode() {
        Mode::Pool => "pool mode",
        Mode::Passthrough => "passthrough",
    };
    format!(
        "pid {}{rank}: {}  [{mode}, {} long]",
        process.pid,
        short_cmdline(&process.cmdline, 50),
        seconds(p.duration_ns)
    )
}

fn peak_line(out: &mut dyn Write, label: &str, what: &str, peak: &Peak, extra: &str) {
    let when = if peak.bytes == 0 { "-".to_string() } else { seconds(peak.t_ns) };
    let phase = if peak.bytes == 0 { String::new() } else { cut(peak.phase.as_deref().unwrap_or("-"), 28) };
    let line = format!("  {label:<10} {what:<10} {:>11}  {when:>12}  {phase:<28}{extra}", human_bytes(peak.bytes));
    let _ = writeln!(out, "{}", line.trim_end());
}

fn print_process(p: &Process, sites: &SitesReport, out: &mut dyn Write) {
    let _ = writeln!(out);
    let _ = writeln!(out, "== {} ==", process_title(p));
    let devices: Vec<&DeviceSeries> = p.devices.iter().filter(|d| d.allocs > 0 || d.failures > 0).collect();
    if devices.is_empty() {
        let _ = writeln!(out, "  no device memory in the timeline (logged with trace=0, or none allocated)");
    } else {
        let _ = writeln!(out, "Peaks{:<17} {:>11}  {:>12}  in phase", "", "bytes", "at");
        for d in &devices {
            let name = device_name(d.device);
            peak_line(out, &name, "allocated", &d.peak_allocated, "");
            if p.reserved_from == ReservedFrom::NotRecorded {
                let r = d.recorded_peak_reserved.map_or("?".to_string(), human_bytes);
                let _ = writeln!(
                    out,
                    "  {:<10} {:<10} {r:>11}  (the end record's; not recorded over time)",
                    "", "reserved"
                );
            } else {
                let recorded = match d.recorded_peak_reserved {
                    Some(r) if r != d.peak_reserved.bytes => format!(" (end record: {})", human_bytes(r)),
                    _ => String::new(),
                };
                peak_line(out, "", "reserved", &d.peak_reserved, &recorded);
            }
            if d.peak_mapped.bytes > 0 {
                peak_line(out, "", "mapped", &d.peak_mapped, "");
            }
        }
        if p.reserved_from == ReservedFrom::NotRecorded {
            let version = p.log.header.version;
            let _ = writeln!(
                out,
                "  reserved: this log (version {version}) does not record the VMM pool's pages over time; \
                 the figures below count only what CUDA handed out directly"
            );
        }
        if let Some(r) = &p.rebuilt {
            let verdict = if r.misplaced == 0 {
                "every block where the program had it".to_string()
            } else {
                format!("{} of {} blocks elsewhere than the program had them", r.misplaced, r.placed + r.misplaced)
            };
            let _ = writeln!(out, "  reserved: the pool's segments rebuilt from the log, {verdict}");
        }
    }
    print_sizes(p, out);
    for d in &devices {
        print_fragmentation(p, d, out);
    }
    print_phases(p, out);
    print_ooms(p, out);
    for c in &p.checkpoints {
        let _ = writeln!(
            out,
            "Checkpoint at {}: {} destroyed a context on {} holding {} in {} allocation(s)",
            seconds(c.t_ns),
            c.api,
            device_name(c.device),
            human_bytes(c.leaked_bytes),
            c.leaked_count
        );
    }
    for n in notes(p) {
        let _ = writeln!(out, "Note: {n}");
    }
    if !sites.by_peak.is_empty() {
        sites::print_text(p.log.header.process.pid, sites, out);
    }
}

fn print_sizes(p: &Process, out: &mut dyn Write) {
    if p.sizes.is_empty() {
        return;
    }
    let _ = writeln!(out, "Allocation sizes (device memory):");
    let _ = writeln!(out, "  {:<22} {:>9}  {:>11}  # by count", "size", "count", "bytes");
    let most = p.sizes.iter().map(|b| b.count).max().unwrap_or(1).max(1);
    for b in &p.sizes {
        let range =
            if b.low == 0 { "0 B".to_string() } else { format!("{} - {}", human_bytes(b.low), human_bytes(2 * b.low)) };
        let width = ((b.count * BAR as u64).div_ceil(most)) as usize;
        let _ = writeln!(out, "  {range:<22} {:>9}  {:>11}  {}", b.count, human_bytes(b.bytes), "#".repeat(width));
    }
}

fn print_fragmentation(p: &Process, d: &DeviceSeries, out: &mut dyn Write) {
    let f = fragmentation(p, d);
    let _ = writeln!(out, "Reserved against allocated, {}:", device_name(d.device));
    let _ = writeln!(out, "  {:>12} {:>11} {:>11} {:>11}", "time", "allocated", "reserved", "unused");
    let mut last = None;
    for (i, p) in f.points.iter().enumerate() {
        // A row like the one before says nothing new (the last row always shows).
        if last == Some((p.allocated, p.reserved)) && i + 1 < f.points.len() {
            continue;
        }
        last = Some((p.allocated, p.reserved));
        let unused = p.reserved.saturating_sub(p.allocated);
        let share = if p.reserved == 0 {
            String::new()
        } else {
            format!(" ({:.0}%)", 100.0 * unused as f64 / p.reserved as f64)
        };
        let _ = writeln!(
            out,
            "  {:>12} {:>11} {:>11} {:>11}{share}",
            seconds(p.t_ns),
            human_bytes(p.allocated),
            human_bytes(p.reserved),
            human_bytes(unused)
        );
    }
    if f.most_unused.bytes > 0 {
        let _ = writeln!(
            out,
            "  most reserved but unused: {} at {}{}",
            human_bytes(f.most_unused.bytes),
            seconds(f.most_unused.t_ns),
            f.most_unused.phase.as_deref().map(|p| format!(" in {}", cut(p, 40))).unwrap_or_default()
        );
    }
}

fn print_phases(p: &Process, out: &mut dyn Write) {
    let groups = phase_groups(&p.spans);
    if groups.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "Phases{:<22} {:>5} {:>11}  {:<16} {:>11} {:>11}",
        "", "count", "peak", "(in)", "growth", "largest"
    );
    for g in groups.iter().take(PHASE_GROUPS) {
        let name = if p.devices.len() > 1 { format!("{} [{}]", g.name, g.device) } else { g.name.clone() };
        let _ = writeln!(
            out,
            "  {:<26} {:>5} {:>11}  {:<16} {:>11} {:>11}",
            cut(&name, 26),
            g.count,
            human_bytes(g.peak_allocated),
            cut(&g.peak_in, 16),
            signed_bytes(g.growth),
            signed_bytes(g.max_growth)
        );
    }
    if groups.len() > PHASE_GROUPS {
        let _ = writeln!(out, "  ... and {} more (--json lists every phase)", groups.len() - PHASE_GROUPS);
    }
}

fn print_ooms(p: &Process, out: &mut dyn Write) {
    for o in &p.ooms {
        let phase = o.phase.as_deref().map(|p| format!(" in {}", cut(p, 30))).unwrap_or_default();
        let api = if o.api.is_empty() { String::new() } else { format!("{} of ", o.api) };
        let _ = writeln!(
            out,
            "Out of memory at {}{phase}: {api}{} on {}",
            seconds(o.t_ns),
            human_bytes(o.requested),
            device_name(o.device)
        );
        if let Some(s) = &o.snapshot {
            let _ = writeln!(
                out,
                "  the pool held {} reserved, {} allocated, {} free (largest free block {})",
                human_bytes(s.reserved),
                human_bytes(s.allocated),
                human_bytes(s.free_in_pool),
                human_bytes(s.largest_free_block)
            );
            if s.address_reserved > 0 {
                let _ = writeln!(out, "  in {} of reserved addresses (VMM pages)", human_bytes(s.address_reserved));
            }
            if !s.largest_live.is_empty() {
                let live: Vec<String> = s.largest_live.iter().map(|b| human_bytes(*b)).collect();
                let _ = writeln!(out, "  largest live: {}", cut(&live.join(", "), 84));
            }
        }
    }
}

fn print_findings(f: &Findings, out: &mut dyn Write) {
    let shown: Vec<&Finding> = f.findings.iter().filter(|x| x.suppressed_by.is_none()).collect();
    let held: u64 = f.suppressed.bytes;
    let _ = writeln!(out);
    if shown.is_empty() {
        let _ = write!(out, "Leaks (as cupool check judges them): none");
        if held > 0 {
            let _ = write!(out, "; {} held at exit by known caches", human_bytes(held));
        }
        let _ = writeln!(out);
        return;
    }
    let _ = writeln!(
        out,
        "Leaks (as cupool check judges them; cupool check -- CMD or cupool merge DIR for the full report):"
    );
    for x in shown {
        let what = match (x.kind, &x.growth) {
            (LeakKind::Growth, Some(g)) => format!(
                "growth  {} per phase over {} phases, {} live",
                human_bytes(g.bytes_per_phase),
                g.phases,
                human_bytes(x.bytes)
            ),
            (LeakKind::Test, _) => format!(
                "test    {} in {} allocation(s) in {}",
                human_bytes(x.bytes),
                x.count,
                x.test.as_deref().unwrap_or("?")
            ),
            _ => format!("exit    {} in {} allocation(s)", human_bytes(x.bytes), x.count),
        };
        let pids: Vec<String> = x.processes.iter().take(4).map(|p| p.pid.to_string()).collect();
        let more = if x.processes.len() > 4 { format!(" +{}", x.processes.len() - 4) } else { String::new() };
        let _ = writeln!(out, "  {}  (pid {}{more})", cut(&what, 80), pids.join(", "));
        let frame = x.frames.first();
        let place = match frame {
            Some(f) => f.text(0).trim_start_matches("#0 ").to_string(),
            None => x.what.clone(),
        };
        let _ = writeln!(out, "    at {}", cut(&place, 92));
    }
    if held > 0 {
        let _ = writeln!(out, "  and {} held at exit by known caches (not leaks)", human_bytes(held));
    }
}

/// `cupool report PATHS`: exit status 0, or 2 when a path could not be read
/// (the others are reported all the same).
pub fn run(paths: &[PathBuf], as_json: bool, html: Option<&Path>, n_sites: usize) -> ExitCode {
    // The page's path first: a long read is not wasted on a path that cannot be written.
    if let Some(path) = html {
        match Output::create(path) {
            Ok((out, _)) => out.abandon(),
            Err(e) => {
                eprintln!("cupool report: {e}; nothing was written");
                return ExitCode::from(EXIT_CANNOT_WRITE);
            }
        }
    }
    let mut progress = Progress::new("reading logs", 0);
    let Loaded { processes, problems } = load(paths, &mut progress);
    let status = Loaded { processes: Vec::new(), problems }.report_problems("cupool report");
    if html.is_some() && processes.is_empty() {
        eprintln!("cupool report: no log could be read, so no page was written");
        return ExitCode::from(status);
    }
    progress.stage("summarising", processes.len() as u64);
    let mut site_reports = Vec::with_capacity(processes.len());
    for (i, p) in processes.iter().enumerate() {
        site_reports.push(sites::report(p, n_sites));
        progress.set(i as u64 + 1);
    }
    progress.stage("judging leaks", 1);
    let findings = if processes.is_empty() { Findings::default() } else { crate::check::findings_of(&processes) };
    if let Some(path) = html {
        progress.stage("writing the page", 1);
        let pages: Vec<_> = processes.iter().zip(&site_reports).collect();
        let result = Output::create(path).and_then(|(out, file)| match super::html::write(&pages, &findings, file) {
            Ok(w) => out.commit().map(|_| w),
            Err(e) => {
                out.abandon();
                Err(format!("{}: cannot write there: {e}", path.display()))
            }
        });
        progress.finish();
        return match result {
            Ok(w) => {
                let sampled = super::downsampled_note(w.points, w.points_seen);
                eprintln!(
                    "cupool report: {}: {} process(es), {} point(s){sampled}, {}; open it in a browser",
                    path.display(),
                    processes.len(),
                    w.points,
                    human_bytes(w.bytes)
                );
                ExitCode::from(status)
            }
            Err(e) => {
                eprintln!("cupool report: {e}");
                ExitCode::from(EXIT_CANNOT_WRITE)
            }
        };
    }
    progress.finish();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if as_json {
        let entries: Vec<LogReport> = processes
            .iter()
            .zip(site_reports)
            .map(|(p, sites)| LogReport {
                summary: p.summary(),
                path: p.log.path.display().to_string(),
                sites,
                memory: Memory::of(p),
                fragmentation: p.devices.iter().map(|d| fragmentation(p, d)).collect(),
                phase_groups: phase_groups(&p.spans),
                findings: findings
                    .findings
                    .iter()
                    .filter(|f| f.processes.iter().any(|r| r.pid == p.log.header.process.pid))
                    .collect(),
            })
            .collect();
        let _ = serde_json::to_writer(&mut out, &entries);
        let _ = writeln!(out);
    } else if !processes.is_empty() {
        crate::summary::print_text(&processes, None, &mut out);
        for (p, sites) in processes.iter().zip(&site_reports) {
            print_process(p, sites, &mut out);
        }
        print_findings(&findings, &mut out);
    }
    let _ = out.flush();
    ExitCode::from(status)
}
