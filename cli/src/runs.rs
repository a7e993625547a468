//! One directory per run. `cupool run` and `cupool check` write each run's
//! logs into a directory of its own under the log directory,
//! `run-<UTC start time>-<pid>`, and point the symbolic link `latest` beside
//! it at the newest run. `cupool report`, `export` and `merge` read the
//! newest run when given no path, and a log directory given that holds runs
//! stands for its newest run: reading several runs together means naming
//! them (`cupool report cupool-logs/run-*`).

use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The link to the newest run, in the log directory.
pub const LATEST: &str = "latest";
/// How every run directory's name begins.
const PREFIX: &str = "run-";
/// The log directory when neither a flag nor an option names one.
pub const DEFAULT_ROOT: &str = "cupool-logs";

/// `YYYYMMDDTHHMMSSZ` for `t` (UTC), so that names sort as the runs started.
fn utc_stamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn is_run_name(name: &str) -> bool {
    name.starts_with(PREFIX)
}

/// Makes a new run directory under `root` (which exists) and points `latest` at it.
pub fn create(root: &Path) -> io::Result<PathBuf> {
    let base = format!("{PREFIX}{}-{}", utc_stamp(SystemTime::now()), std::process::id());
    for n in 0u32.. {
        let name = if n == 0 { base.clone() } else { format!("{base}.{n}") };
        let dir = root.join(&name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                point_latest(root, &name);
                return Ok(dir);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("a free name comes first")
}

/// Points `root/latest` at `name`, replacing the link at once. A `latest`
/// that is not a link (the user's own file) stays as it is.
fn point_latest(root: &Path, name: &str) {
    let link = root.join(LATEST);
    if std::fs::symlink_metadata(&link).is_ok_and(|m| !m.file_type().is_symlink()) {
        return;
    }
    let tmp = root.join(format!(".{LATEST}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    if std::os::unix::fs::symlink(name, &tmp).is_ok() && std::fs::rename(&tmp, &link).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// After the run: a run directory left empty (no process logged anything)
/// is removed, and `latest`, if it named it, names the newest run left.
pub fn finish(root: &Path, dir: &Path) {
    if std::fs::remove_dir(dir).is_err() {
        return; // it holds logs
    }
    let link = root.join(LATEST);
    let named_it = std::fs::read_link(&link).is_ok_and(|t| Some(t.as_os_str()) == dir.file_name());
    if named_it {
        match runs_in(root).pop() {
            Some(newest) => point_latest(root, &newest.file_name().unwrap_or_default().to_string_lossy()),
            None => {
                let _ = std::fs::remove_file(&link);
            }
        }
    }
}

/// The run directories in `root`, oldest first (their names start with the
/// time the run started).
pub fn runs_in(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else { return Vec::new() };
    let mut runs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(is_run_name) && e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    runs.sort();
    runs
}

/// The newest run in `root`: the one `latest` names, else the last one
/// started; `None` when `root` holds no run.
pub fn newest(root: &Path) -> Option<PathBuf> {
    let runs = runs_in(root);
    let linked = std::fs::read_link(root.join(LATEST)).ok().map(|t| root.join(t));
    match linked {
        Some(l) if runs.contains(&l) => Some(l),
        _ => runs.last().cloned(),
    }
}

/// The log directory `cupool run` writes into when told none: the
/// `log_dir` of an inherited `CUPOOL_OPTIONS` (inside a run, that run's own
/// directory), else `./cupool-logs`.
pub fn default_root() -> PathBuf {
    let inherited = std::env::var("CUPOOL_OPTIONS").ok().and_then(|spec| {
        cupool_core::options::entries(&spec)
            .into_iter()
            .filter_map(Result::ok)
            .filter(|(key, value)| key == "log_dir" && !value.is_empty())
            .map(|(_, value)| PathBuf::from(value))
            .next_back()
    });
    inherited.unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT))
}

/// What `cupool report`, `export` and `merge` read for the paths given:
/// with none, the newest run of the default log directory; a directory that
/// holds runs stands for its newest run (a note says so when it left others
/// out). Anything else is read as it is. `Err` (said on stderr after `who`)
/// when no path was given and there is no run to read.
pub fn resolve(paths: Vec<PathBuf>, who: &str) -> Result<Vec<PathBuf>, ()> {
    if paths.is_empty() {
        let root = default_root();
        return match newest(&root) {
            Some(run) => {
                eprintln!("{who}: reading the newest run, {}", run.display());
                Ok(vec![run])
            }
            None if has_logs(&root) => Ok(vec![root]), // a log directory from before runs had their own
            None => {
                eprintln!(
                    "{who}: no path given, and {} holds no run to read (cupool run and cupool check write \
                     each run's logs there); name log files or directories",
                    root.display()
                );
                Err(())
            }
        };
    }
    Ok(paths.into_iter().map(|p| newest_in(p, who)).collect())
}

/// `path` itself, or the newest run when it is a log directory holding runs.
fn newest_in(path: PathBuf, who: &str) -> PathBuf {
    let Some(run) = newest(&path) else { return path };
    let others = runs_in(&path).len() - 1;
    let loose = has_logs(&path);
    if others > 0 || loose {
        let mut left = Vec::new();
        if others > 0 {
            left.push(format!("{others} older run(s)"));
        }
        if loose {
            left.push("the logs directly in it".to_string());
        }
        eprintln!(
            "{who}: {}: reading its newest run, {}; left out: {} (name run directories to read several \
             together, such as {}/run-*)",
            path.display(),
            run.display(),
            left.join(" and "),
            path.display()
        );
    }
    run
}

/// Whether `dir` holds cupool logs itself.
fn has_logs(dir: &Path) -> bool {
    crate::summary::files_in(dir, crate::summary::is_log_name).is_ok_and(|f| !f.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stamps_are_utc_and_sort_as_time_does() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "19700101T000000Z");
        assert_eq!(utc_stamp(UNIX_EPOCH + Duration::from_secs(951_782_400)), "20000229T000000Z");
        assert_eq!(utc_stamp(UNIX_EPOCH + Duration::from_secs(1_796_688_000 + 3_723)), "20261208T010203Z");
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cupool-runs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn latest_names_the_newest_run_and_an_empty_run_leaves_no_trace() {
        let root = scratch("latest");
        let first = create(&root).unwrap();
        std::fs::write(first.join("cupool.1.json"), "").unwrap();
        let second = create(&root).unwrap();
        assert_ne!(first, second);
        assert_eq!(newest(&root), Some(second.clone()));
        assert_eq!(std::fs::read_link(root.join(LATEST)).unwrap(), second.file_name().unwrap());
        // Nothing logged: the directory goes, and latest names the run before.
        finish(&root, &second);
        assert!(!second.exists());
        assert_eq!(newest(&root), Some(first.clone()));
        assert_eq!(std::fs::read_link(root.join(LATEST)).unwrap(), first.file_name().unwrap());
        finish(&root, &first); // holds a log: stays
        assert!(first.exists());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_directory_of_runs_stands_for_its_newest_and_other_paths_for_themselves() {
        let root = scratch("resolve");
        let older = root.join("run-20260101T000000Z-1");
        let newer = root.join("run-20260102T000000Z-1");
        std::fs::create_dir_all(&older).unwrap();
        std::fs::create_dir_all(&newer).unwrap();
        let file = root.join("cupool.7.json");
        let got = resolve(vec![root.clone(), older.clone(), file.clone()], "test").unwrap();
        assert_eq!(got, vec![newer, older, file]);
        let _ = std::fs::remove_dir_all(&root);
    }
}
