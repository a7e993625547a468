//! The logs a check reads: those of one run (`cupool check`), or every log
//! in the directories given (`cupool merge`), with the PyTorch histories
//! beside them (`torch`). A file that cannot be read is a note naming it
//! and why, not the end of the check.

use super::history::{self, History};
use crate::summary::{files_in, is_log_name, logs_named_by};
use cupool_core::log::{read_log, Log};
use cupool_core::model::{self, Process};
use std::path::Path;
use std::time::SystemTime;

/// What was read, and a line for each file that could not be.
#[derive(Default)]
pub struct Read {
    /// Ranks first in rank order, then the other processes as they started.
    pub processes: Vec<Process>,
    /// The logs read, until `finish` makes them processes.
    logs: Vec<Log>,
    /// PyTorch's allocation histories of processes of these logs (or of a directory given).
    pub histories: Vec<History>,
    pub notes: Vec<String>,
    /// Files that looked like logs of the check but could not be read.
    pub unreadable: usize,
}

impl Read {
    fn take(&mut self, path: &Path, keep: impl Fn(&Log) -> bool) {
        match read_log(path) {
            Ok(log) if keep(&log) => self.logs.push(log),
            Ok(_) => {}
            Err(e) => {
                self.notes.push(format!("{e}; not checked"));
                self.unreadable += 1;
            }
        }
    }

    /// The histories in `dir` whose files `wanted` names and that `keep` accepts.
    fn take_histories(&mut self, dir: &Path, wanted: impl Fn(&Path) -> bool, keep: impl Fn(&History) -> bool) {
        for path in history::files(dir).into_iter().filter(|p| wanted(p)) {
            match history::read(&path) {
                Ok(h) if keep(&h) => self.histories.push(h),
                Ok(_) => {}
                Err(e) => self.notes.push(format!("{e}; growth inside PyTorch's cache judged from its segments")),
            }
        }
    }

    pub fn extend(&mut self, other: Read) {
        self.logs.extend(other.logs);
        self.histories.extend(other.histories);
        self.notes.extend(other.notes);
        self.unreadable += other.unreadable;
    }

    /// The logs read, made into their processes.
    pub fn finish(mut self) -> Read {
        self.processes = model::processes(std::mem::take(&mut self.logs));
        self
    }
}

/// The logs in `dir` tagged `run_id`. Of the files that cannot be read,
/// only those written since `since` may be this run's, so only they are named.
pub fn run_logs(dir: &Path, run_id: &str, since: SystemTime) -> Read {
    // File times come from a coarser clock than `since`: a file written just
    // after it may look a few milliseconds older.
    let since = since.checked_sub(std::time::Duration::from_secs(1)).unwrap_or(since);
    let recent = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).is_ok_and(|t| t >= since);
    let mut read = Read::default();
    for path in files_in(dir, is_log_name).unwrap_or_default() {
        // The shim writes its log while the process runs: an older file is
        // another run's, and is not even read (a log directory keeps them all).
        if !recent(&path) {
            continue;
        }
        read.take(&path, |log| log.header.options.run_id == run_id);
    }
    read.take_histories(dir, recent, |h| h.run_id == run_id);
    read.finish()
}

/// Every log at `path`: a log file, or the logs in a directory (call
/// `finish` once everything is read). `Err` when there is nothing to read
/// there at all.
pub fn logs_at(path: &Path) -> Result<Read, String> {
    if !path.exists() {
        return Err(crate::summary::not_found(path));
    }
    let mut read = Read::default();
    for f in logs_named_by(path)? {
        read.take(&f, |_| true);
    }
    if path.is_dir() {
        read.take_histories(path, |_| true, |_| true);
    }
    Ok(read)
}
