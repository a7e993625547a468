//! Memory budgets, the other half of a CI memory gate: each test's and
//! each process's peak of device memory, compared with a test's own limit
//! (`@pytest.mark.cupool_limit_memory("512 MiB")`), with the job's
//! (`max_peak_bytes`) and with a previous run's (`--baseline FILE`, that
//! run's `--json`).
//!
//! A peak is read from the model, never from the program's counters: a
//! test's is the most its process had allocated while the test ran, above
//! what was allocated when it began; a process's is the most it had
//! allocated. Where a framework recorded its objects (PyTorch's tensors,
//! JAX's arrays), the peak is theirs: the cache or arena they are carved
//! from is not counted.

use super::finding::{Budget, Over, Peaks, ProcessPeak, ProcessRef, TestPeak};
use super::history::{self, History};
use super::per_test;
use cupool_core::model::Process;
use cupool_core::options::Options;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;

/// The peaks of the tests in the per-test files of `dir` whose processes are
/// among `processes`. Err: a line per file or limit that cannot be read.
pub fn test_peaks(processes: &[Process], histories: &[History], dir: &Path) -> Result<Vec<TestPeak>, String> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for path in per_test::results_files(dir) {
        let Ok(file) = per_test::read(&path) else { continue }; // the leak check names it
        let mine = per_test::processes_of(processes, dir, &file);
        // Where the test ran, as the framework's objects (when recorded) or the log saw it.
        let objects: Vec<(Process, usize)> = mine
            .iter()
            .flat_map(|&i| history::of(histories, &processes[i].log).map(move |h| (h.process(&processes[i]), i)))
            .collect();
        let logs = mine.iter().filter(|&&i| !objects.iter().any(|(_, j)| *j == i)).map(|&i| (&processes[i], i));
        let sources: Vec<(&Process, usize)> = objects.iter().map(|(o, i)| (o, *i)).chain(logs).collect();
        let mut spans: Vec<_> = sources.iter().map(|&(o, i)| (o, i, per_test::test_spans(o))).collect();
        for t in &file.tests {
            let phase = per_test::test_phase(&t.nodeid);
            let found = spans.iter_mut().find_map(|(o, i, by)| by.get_mut(&phase)?.pop_front().map(|s| (*o, *i, s)));
            let Some((o, i, span)) = found else { continue };
            let s = &o.spans[span];
            let bytes = o.peak_within(s.begin_ns, s.end_ns.unwrap_or(u64::MAX)).into_iter().map(|d| d.1).max();
            if let Some(limit) = &t.limit {
                if limit_bytes(limit).is_none() {
                    problems.push(format!(
                        "{}: test {}: cupool_limit_memory({limit:?}) is not a size (such as \"512 MiB\")",
                        path.display(),
                        t.nodeid
                    ));
                }
            }
            out.push(TestPeak {
                test: t.nodeid.clone(),
                bytes: bytes.unwrap_or(0),
                limit: t.limit.clone(),
                process: ProcessRef::of(&processes[i].log),
            });
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems.join("\n"))
    }
}

/// Each process's peak per device: its framework's objects' where it
/// recorded them, else what it allocated.
pub fn process_peaks(processes: &[Process], histories: &[History]) -> Vec<ProcessPeak> {
    let mut out = Vec::new();
    for p in processes {
        let process = ProcessRef::of(&p.log);
        let objects: Vec<Process> = history::of(histories, &p.log).map(|h| h.process(p)).collect();
        let mut by_device: HashMap<i32, u64> = HashMap::new();
        let sources: Vec<&Process> = if objects.is_empty() { vec![p] } else { objects.iter().collect() };
        for o in sources {
            for d in &o.devices {
                *by_device.entry(d.device).or_default() += d.peak_allocated.bytes;
            }
        }
        let mut devices: Vec<(i32, u64)> = by_device.into_iter().collect();
        devices.sort_unstable();
        for (device, bytes) in devices {
            let (cmdline, rank) = (process.cmdline.clone(), process.rank);
            out.push(ProcessPeak { process: process.clone(), cmdline, rank, device, bytes });
        }
    }
    out
}

/// A marker's limit: bytes as the options take them, with or without a
/// blank before the unit (`"512 MiB"`, as pytest-memray writes them).
pub fn limit_bytes(text: &str) -> Option<u64> {
    cupool_core::options::parse_bytes(&text.replace(' ', ""))
}

/// A previous run's peaks (its `--json`).
#[derive(Clone, Debug, Default)]
pub struct Baseline {
    pub peaks: Peaks,
}

/// Reads `--baseline FILE`: a `cupool check --json` document with `peaks`.
pub fn read_baseline(path: &Path) -> Result<Baseline, String> {
    #[derive(Deserialize)]
    struct Doc {
        schema: String,
        peaks: Option<Peaks>,
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read the baseline: {e}", path.display()))?;
    let doc: Doc = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a cupool check --json document ({e})", path.display()))?;
    if doc.schema != super::json::SCHEMA {
        return Err(format!("{}: not a cupool check --json document (schema {:?})", path.display(), doc.schema));
    }
    let peaks = doc.peaks.ok_or_else(|| {
        format!("{}: the document has no peaks (written by a cupool before baselines)", path.display())
    })?;
    Ok(Baseline { peaks })
}

/// What names a process's peak across runs (pids change from run to run):
/// command line, rank, device, and the how-manieth such process it is.
type ProcessKey = (String, Option<u32>, i32, usize);

fn process_keys(peaks: &[ProcessPeak]) -> Vec<(ProcessKey, u64)> {
    let mut seen: HashMap<(String, Option<u32>, i32), usize> = HashMap::new();
    peaks
        .iter()
        .map(|p| {
            let n = seen.entry((p.cmdline.clone(), p.rank, p.device)).or_default();
            *n += 1;
            ((p.cmdline.clone(), p.rank, p.device, *n), p.bytes)
        })
        .collect()
}

fn process_text(p: &ProcessPeak) -> String {
    format!("{}, device {}", super::text::process_text(&p.process), p.device)
}

/// The peaks over their budgets, in the order tests, then processes.
pub fn judge(peaks: &Peaks, opts: &Options, baseline: Option<&Baseline>) -> Vec<Over> {
    let mut out = Vec::new();
    let allowed = |base: u64| {
        let grown = base.saturating_add(base / 100 * u64::from(opts.baseline_growth));
        grown.max(base.saturating_add(opts.baseline_slack))
    };
    let base_tests: HashMap<&str, u64> =
        baseline.map(|b| b.peaks.tests.iter().map(|t| (t.test.as_str(), t.bytes)).collect()).unwrap_or_default();
    for t in &peaks.tests {
        if let Some(limit) = t.limit.as_deref().and_then(limit_bytes) {
            if t.bytes > limit {
                let (what, bytes) = (format!("test {}", t.test), t.bytes);
                out.push(Over { budget: Budget::TestLimit, what, bytes, allowed: limit, baseline: None });
            }
        }
        if let Some(&base) = base_tests.get(t.test.as_str()) {
            if t.bytes > allowed(base) {
                let (what, bytes) = (format!("test {}", t.test), t.bytes);
                out.push(Over { budget: Budget::Baseline, what, bytes, allowed: allowed(base), baseline: Some(base) });
            }
        }
    }
    let base_processes: HashMap<_, u64> =
        baseline.map(|b| process_keys(&b.peaks.processes).into_iter().collect()).unwrap_or_default();
    for (p, (key, bytes)) in peaks.processes.iter().zip(process_keys(&peaks.processes)) {
        if opts.max_peak_bytes > 0 && bytes > opts.max_peak_bytes {
            let allowed = opts.max_peak_bytes;
            out.push(Over { budget: Budget::MaxPeakBytes, what: process_text(p), bytes, allowed, baseline: None });
        }
        if let Some(&base) = base_processes.get(&key) {
            if bytes > allowed(base) {
                let what = process_text(p);
                out.push(Over { budget: Budget::Baseline, what, bytes, allowed: allowed(base), baseline: Some(base) });
            }
        }
    }
    out
}
