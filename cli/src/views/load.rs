//! The logs that `cupool report` and `cupool export` read: files named
//! directly, or every cupool log in a directory and its subdirectories (one
//! directory per rank or per machine, as they were gathered), plain or
//! gzipped. A file that cannot be read is one line naming it and why; the
//! others are read all the same.

use super::progress::Progress;
use crate::summary::{is_log_name, EXIT_BAD_INPUT};
use cupool_core::log::{read_log_with_progress, ReadError, ReadErrorKind};
use cupool_core::model::{self, Process};
use std::path::{Path, PathBuf};

/// What was read, and one line for each thing that could not be.
#[derive(Default)]
pub struct Loaded {
    /// Ranks first in rank order, then the other processes as they started.
    pub processes: Vec<Process>,
    pub problems: Vec<String>,
}

impl Loaded {
    /// `EXIT_BAD_INPUT` when something could not be read, else 0; each problem printed after `who: `.
    pub fn report_problems(&self, who: &str) -> u8 {
        for p in &self.problems {
            eprintln!("{who}: {p}");
        }
        if self.problems.is_empty() {
            0
        } else {
            EXIT_BAD_INPUT
        }
    }
}

/// Subdirectories followed below a directory given.
const MAX_DEPTH: usize = 4;

/// The log files under `dir` (and its subdirectories), sorted.
fn logs_under(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for path in entries {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.is_dir() {
            if depth < MAX_DEPTH {
                // A subdirectory that cannot be listed holds nothing we can read.
                let _ = logs_under(&path, depth + 1, out);
            }
        } else if path.file_name().and_then(|n| n.to_str()).is_some_and(is_log_name) && path.is_file() {
            out.push(path);
        }
    }
    Ok(())
}

/// The files `path` stands for, or why it stands for none.
fn files_of(path: &Path) -> Result<Vec<PathBuf>, String> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]); // reading it says what is wrong with it
    }
    let mut files = Vec::new();
    logs_under(path, 0, &mut files).map_err(|e| format!("{}: cannot list the directory: {e}", path.display()))?;
    if files.is_empty() {
        return Err(format!(
            "{}: no cupool logs in this directory or below it (cupool.<pid>.json or .json.gz)",
            path.display()
        ));
    }
    Ok(files)
}

/// A note for a file that is not a cupool log but a trace `cupool replay` reads.
fn hint_for(e: &ReadError) -> &'static str {
    if !matches!(e.kind, ReadErrorKind::NotALog(_)) {
        return "";
    }
    let csv = std::fs::read(&e.path)
        .ok()
        .and_then(|b| cupool_core::log::maybe_gunzip(b).ok())
        .is_some_and(|b| b.starts_with(b"Thread,"));
    if csv {
        " (it is an RMM logging CSV: cupool replay reads those)"
    } else {
        ""
    }
}

/// Reads every log `paths` name into its model, telling `progress` the bytes read.
pub fn load(paths: &[PathBuf], progress: &mut Progress) -> Loaded {
    let mut loaded = Loaded::default();
    let mut files = Vec::new();
    for p in paths {
        match files_of(p) {
            Ok(f) => files.extend(f),
            Err(e) => loaded.problems.push(e),
        }
    }
    let sizes: Vec<u64> = files.iter().map(|f| std::fs::metadata(f).map_or(0, |m| m.len())).collect();
    progress.stage("reading logs", sizes.iter().sum());
    let mut logs = Vec::new();
    let mut before = 0u64;
    for (f, size) in files.iter().zip(&sizes) {
        let read = std::fs::File::open(f)
            .map_err(|e| ReadError { path: f.clone(), line: None, kind: ReadErrorKind::Io(e) })
            .and_then(|file| {
                read_log_with_progress(file, f, &mut |done, total| {
                    progress.set(before + size * done / total.max(1));
                })
            });
        before += size;
        progress.set(before);
        match read {
            Ok(log) => logs.push(log),
            Err(e) => loaded.problems.push(format!("{e}{}", hint_for(&e))),
        }
    }
    loaded.processes = model::processes(logs);
    loaded
}
