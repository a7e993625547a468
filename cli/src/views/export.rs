//! `cupool export`: logs into files other tools open: Chrome trace JSON for
//! ui.perfetto.dev (`perfetto`), PyTorch's memory snapshot pickle for
//! pytorch.org/memory_viz (`memviz`).
//!
//! An output is checked writable before anything is read, written to a
//! temporary file beside it and renamed into place when complete: a failed
//! export never leaves half a file, nor clobbers the one that was there.

use super::load::{load, Loaded};
use super::progress::Progress;
use clap::Args;
use cupool_core::log::Log;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit status when an output cannot be written (sysexits' EX_CANTCREAT).
pub const EXIT_CANNOT_WRITE: u8 = 73;

const WHO: &str = "cupool export";

#[derive(Args)]
#[command(group(clap::ArgGroup::new("format").required(true).multiple(true).args(["perfetto", "memory_viz"])))]
pub struct ExportArgs {
    /// Write Chrome trace JSON for ui.perfetto.dev into FILE: counters of allocated, reserved
    /// and mapped bytes per process and device, the phases as slices, OOMs, checkpoints and notes
    /// as instant events.
    #[arg(long, value_name = "FILE")]
    perfetto: Option<PathBuf>,
    /// Write a PyTorch memory snapshot (pickle) for pytorch.org/memory_viz into FILE: segments,
    /// blocks with their allocation sites, and each device's trace. With several processes, one
    /// file per process: FILE's name with .<pid> before its extension.
    #[arg(long = "memory-viz", value_name = "FILE")]
    memory_viz: Option<PathBuf>,
    /// Counter points kept in the Perfetto trace, all tracks together (about; at least 1000, and
    /// each track keeps 1000 or more); a track with more is downsampled, keeping the highest and
    /// lowest point of each stretch.
    #[arg(long, value_name = "N", default_value_t = 1_000_000, value_parser = max_points)]
    max_points: usize,
    /// Log files (cupool.<pid>.json, also .json.gz) or directories; a directory stands for every
    /// cupool log in it and in its subdirectories (one per rank or machine), and a log directory
    /// of runs for its newest run. None: the newest run in ./cupool-logs.
    #[arg(value_name = "PATHS")]
    pub paths: Vec<PathBuf>,
}

/// `--max-points`: no fewer than a track keeps anyway.
fn max_points(s: &str) -> Result<usize, String> {
    let least = super::perfetto::MIN_POINTS;
    match s.parse::<usize>() {
        Ok(n) if n < least => Err(format!("at least {least}: each counter track keeps {least} points or more")),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// A file being written: a temporary beside `path`, renamed into place by `commit`.
pub(super) struct Output {
    path: PathBuf,
    tmp: PathBuf,
}

impl Output {
    /// Opens the temporary file, or says why `path` cannot be written.
    pub(super) fn create(path: &Path) -> Result<(Output, File), String> {
        if path.is_dir() {
            return Err(format!("{}: is a directory, not a file to write into", path.display()));
        }
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        match File::create(&tmp) {
            Ok(f) => Ok((Output { path: path.to_owned(), tmp }, f)),
            Err(e) => Err(format!("{}: cannot write there: {e}", path.display())),
        }
    }

    pub(super) fn commit(self) -> Result<(), String> {
        std::fs::rename(&self.tmp, &self.path).map_err(|e| {
            let _ = std::fs::remove_file(&self.tmp);
            format!("{}: cannot write there: {e}", self.path.display())
        })
    }

    pub(super) fn abandon(self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// `OUT.pickle` -> `OUT.<pid>.pickle` (`.<pid>.<n>` when a pid repeats).
fn per_process(path: &Path, log: &Log, taken: &mut Vec<PathBuf>) -> PathBuf {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let ext = path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    let pid = log.header.process.pid;
    let mut name = format!("{stem}.{pid}{ext}");
    let mut n = 1;
    while taken.iter().any(|t| t.file_name().is_some_and(|f| f.to_string_lossy() == name)) {
        name = format!("{stem}.{pid}.{n}{ext}");
        n += 1;
    }
    let out = path.with_file_name(name);
    taken.push(out.clone());
    out
}

pub fn run(args: ExportArgs) -> ExitCode {
    // Outputs first: a long read is not wasted on a path that cannot be written.
    let mut probe = Vec::new();
    for path in args.perfetto.iter().chain(&args.memory_viz) {
        match Output::create(path) {
            Ok((out, _)) => probe.push(out),
            Err(e) => {
                eprintln!("{WHO}: {e}; nothing was exported");
                for o in probe {
                    o.abandon();
                }
                return ExitCode::from(EXIT_CANNOT_WRITE);
            }
        }
    }
    for o in probe {
        o.abandon();
    }
    let mut progress = Progress::new("reading logs", 0);
    let Loaded { processes, problems } = load(&args.paths, &mut progress);
    let mut status = Loaded { processes: Vec::new(), problems }.report_problems(WHO);
    if processes.is_empty() {
        eprintln!("{WHO}: no log could be read, so nothing was exported");
        return ExitCode::from(super::super::summary::EXIT_BAD_INPUT);
    }
    let mut failed = |e: String| {
        eprintln!("{WHO}: {e}");
        status = EXIT_CANNOT_WRITE;
    };
    if let Some(path) = &args.perfetto {
        progress.stage("writing the trace", 1);
        let result = Output::create(path).and_then(|(out, file)| {
            match super::perfetto::write(&processes, args.max_points, file) {
                Ok(w) => out.commit().map(|_| w),
                Err(e) => {
                    out.abandon();
                    Err(format!("{}: cannot write there: {e}", path.display()))
                }
            }
        });
        progress.set(1);
        match result {
            Ok(w) => {
                let sampled = super::downsampled_note(w.counter_points, w.counter_points_seen);
                eprintln!(
                    "{WHO}: {}: {} event(s), {} counter point(s){sampled}, {} process(es); open it in ui.perfetto.dev",
                    path.display(),
                    w.events,
                    w.counter_points,
                    processes.len()
                );
            }
            Err(e) => failed(e),
        }
    }
    if let Some(path) = &args.memory_viz {
        let mut taken = Vec::new();
        progress.stage("writing snapshots", processes.len() as u64);
        for (i, p) in processes.iter().enumerate() {
            let log = &p.log;
            let target = if processes.len() == 1 { path.clone() } else { per_process(path, log, &mut taken) };
            let result = Output::create(&target).and_then(|(out, file)| match super::memviz::write(p, file) {
                Ok(w) => out.commit().map(|_| w),
                Err(e) => {
                    out.abandon();
                    Err(format!("{}: cannot write there: {e}", target.display()))
                }
            });
            progress.set(i as u64 + 1);
            match result {
                Ok(w) => {
                    let addresses = if w.at_real_addresses {
                        ""
                    } else {
                        " (the rebuilt pool differs from the log: blocks at the replay's addresses)"
                    };
                    eprintln!(
                        "{WHO}: {}: pid {}, {} segment(s), {} trace entries{addresses}; open it in pytorch.org/memory_viz",
                        target.display(),
                        log.header.process.pid,
                        w.segments,
                        w.entries
                    );
                }
                Err(e) => failed(e),
            }
        }
    }
    progress.finish();
    ExitCode::from(status)
}
