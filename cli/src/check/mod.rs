//! `cupool check -- CMD ARGS...`: runs CMD (and every process it starts)
//! under the shim, then reads the run's logs and reports leaks, LeakSanitizer
//! style; `cupool merge DIR...` does the same for logs gathered elsewhere.
//!
//! Three kinds of leak, each with its own rule: exit leaks (still allocated
//! when their context died or the process ended), growth leaks (sites whose
//! live bytes keep growing phase after phase, see `growth`), test leaks (left
//! live by one test, from the pytest plugin, see `per_test`). Everything is
//! judged in `examine` into one `Findings`, which every output is written from.

pub mod budget;
mod examine;
pub mod finding;
mod growth;
mod history;
mod inputs;
mod python;
mod site;
mod suppress;
mod text;

pub mod github;
pub mod json;
pub mod per_test;
pub mod sarif;

#[cfg(test)]
mod testlog;
#[cfg(test)]
mod tests;

use crate::run::{self, LaunchArgs};
use clap::Args;
use cupool_core::model::Process;
use cupool_core::options::{self, Options};
use finding::Findings;
pub use history::is_history_name;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use suppress::Suppressions;

/// Exit statuses of `cupool check` and `cupool merge` beside the program's
/// own and `exitcode`.
pub mod exit {
    /// cupool could not check: the shim was loaded in no process, a log of
    /// the run cannot be read (truncated, corrupt), a suppressions file or
    /// report path that cannot be used, a report that could not be written.
    /// sysexits' EX_NOINPUT: apart from LeakSanitizer's 23, from GNU
    /// `timeout`'s 124 to 127, and from the shells' 126, 127 and 128 + N.
    pub const COULD_NOT_CHECK: u8 = 66;
}

/// What `check` and `merge` report into.
#[derive(Args)]
pub struct ReportArgs {
    /// Suppressions (LeakSanitizer syntax: leak:PATTERN lines) to add to the defaults; may be
    /// repeated.
    #[arg(long, value_name = "FILE")]
    suppressions: Vec<PathBuf>,
    /// Also write the findings as JSON into FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Also write the findings as SARIF 2.1.0 (for code scanning) into FILE.
    #[arg(long, value_name = "FILE")]
    sarif: Option<PathBuf>,
    /// A previous run's --json FILE: each test's and process's peak of device memory is compared with
    /// its own there, and a peak more than baseline_growth percent (and baseline_slack bytes) above it
    /// fails the job.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
}

#[derive(Args)]
pub struct CheckArgs {
    #[command(flatten)]
    launch: LaunchArgs,
    #[command(flatten)]
    report: ReportArgs,
}

#[derive(Args)]
pub struct MergeArgs {
    #[command(flatten)]
    report: ReportArgs,
    /// A check option as key=value (exitcode, max_leak_bytes, fail_on, growth_phases); may be
    /// repeated.
    #[arg(short = 'o', long = "option", value_name = "KEY=VALUE")]
    options: Vec<String>,
    /// Directories of logs (every cupool.*.json and .json.gz in them, with the per-test files
    /// beside them) or log files; a log directory of runs stands for its newest run. None: the
    /// newest run in ./cupool-logs.
    #[arg(value_name = "PATHS")]
    pub paths: Vec<PathBuf>,
}

/// The options that are the check's, not the shim's.
const CHECK_OPTIONS: [&str; 7] =
    ["exitcode", "max_leak_bytes", "fail_on", "growth_phases", "max_peak_bytes", "baseline_growth", "baseline_slack"];
/// The options of `cupool check` that concern how the program is run (not `merge`'s).
const RUN_CHECK_OPTIONS: [&str; 4] = ["torch_history", "jax_history_ms", "jax_history", "cupy_history"];

/// The end of `check --help` (`merge --help` when not `run`).
pub fn help(run: bool) -> String {
    let mut s = String::from("Options of the check (-o key=value, or in CUPOOL_OPTIONS):\n");
    let shown = |key: &str| CHECK_OPTIONS.contains(&key) || (run && RUN_CHECK_OPTIONS.contains(&key));
    let rows = options::OPTION_HELP.iter().filter(|o| shown(o.0)).map(|&(key, default, what)| {
        (key, default, what.trim_start_matches("cupool check/merge: ").trim_start_matches("cupool check: "))
    });
    s.push_str(&run::option_table(rows));
    if run {
        s.push_str("The shim's own options (-o mode=pool, ...) are those of cupool run --help.\n");
        s.push_str("\nExit status: the program's own when it failed (128 + N when signal N killed it); else ");
    } else {
        s.push_str("\nExit status: ");
    }
    s.push_str(&format!(
        "`exitcode` (23) when leaks of the kinds fail_on names, not suppressed, add up to more than \
         max_leak_bytes; else 0. {} when cupool could not check (a log that cannot be read, truncated \
         or corrupt; a suppressions file or report path that cannot be used; a report that could not \
         be written{}); 2 for a bad flag or option{}.\n",
        exit::COULD_NOT_CHECK,
        if run {
            "; the shim loaded in no process of the program. A program whose processes ran under cupool \
             but used no CUDA memory passes, and the check says so"
        } else {
            "; a path that does not exist or holds no logs"
        },
        if run {
            ", 123 when the log directory cannot be written, 125, 126 and 127 as in cupool run; \
             nothing is run when a check before the run fails"
        } else {
            ""
        }
    ));
    s
}

/// The suppressions, the baseline and the report paths, checked before anything runs.
struct Reporting {
    suppressions: Suppressions,
    baseline: Option<budget::Baseline>,
    json: Option<PathBuf>,
    sarif: Option<PathBuf>,
}

impl Reporting {
    fn new(args: &ReportArgs) -> Result<Reporting, String> {
        let suppressions = Suppressions::load(&args.suppressions)?;
        let baseline = args.baseline.as_deref().map(budget::read_baseline).transpose()?;
        if let (Some(a), Some(b)) = (&args.json, &args.sarif) {
            if a == b {
                return Err(format!("{}: --json and --sarif name the same file", a.display()));
            }
        }
        for path in args.json.iter().chain(&args.sarif) {
            writable(path)?;
        }
        Ok(Reporting { suppressions, baseline, json: args.json.clone(), sarif: args.sarif.clone() })
    }

    /// `f` with the peaks of `processes` (and of the tests in `dirs`) judged
    /// against their budgets; a line of `f.notes` for what cannot be read.
    fn budgets(
        &self,
        mut f: Findings,
        processes: &[Process],
        histories: &[history::History],
        dirs: &[&Path],
        opts: &Options,
    ) -> Findings {
        f.peaks.processes = budget::process_peaks(processes, histories);
        for dir in dirs {
            match budget::test_peaks(processes, histories, dir) {
                Ok(tests) => f.peaks.tests.extend(tests),
                Err(e) => f.notes.push(e),
            }
        }
        f.budgets = budget::judge(&f.peaks, opts, self.baseline.as_ref());
        f.judged(opts)
    }

    /// The text report on stderr, then the files and GitHub's annotations;
    /// false when a report file could not be written (each failure named).
    fn write(&self, who: &str, f: &Findings) -> bool {
        let _ = text::write(f, &mut std::io::stderr().lock());
        let mut ok = true;
        type Writer = fn(&Findings, &Path) -> std::io::Result<()>;
        let files: [(&Option<PathBuf>, Writer); 2] = [(&self.json, json::write), (&self.sarif, sarif::write)];
        for (path, write) in files {
            if let Some(path) = path {
                if let Err(e) = write(f, path) {
                    eprintln!("{who}: {}: cannot write the report: {e}", path.display());
                    ok = false;
                }
            }
        }
        if std::env::var("GITHUB_ACTIONS").as_deref() == Ok("true") {
            let summary = std::env::var_os("GITHUB_STEP_SUMMARY").filter(|s| !s.is_empty()).map(PathBuf::from);
            if let Err(e) = github::report(f, &mut std::io::stdout().lock(), summary.as_deref()) {
                eprintln!("{who}: note: GitHub annotations or step summary not written: {e}");
            }
        }
        ok
    }
}

/// That a report can be written at `path`, tried without leaving a file behind.
fn writable(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err(format!("{}: is a directory, not a file to write the report into", path.display()));
    }
    let existed = path.exists();
    match std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(path) {
        Ok(_) => {
            if !existed {
                let _ = std::fs::remove_file(path);
            }
            Ok(())
        }
        Err(e) => Err(format!("{}: cannot write the report there: {e}", path.display())),
    }
}

/// The exit status: the program's when it failed; "could not check" when
/// nothing could be, or a report is missing; `exitcode` when the leaks fail
/// the job; else 0.
fn status(program: Option<i32>, checked: bool, written: bool, f: &Findings, opts: &Options) -> u8 {
    match program {
        Some(code) if code != 0 => code as u8,
        _ if !checked || !written => exit::COULD_NOT_CHECK,
        _ if f.verdict.fails => opts.exitcode,
        _ => 0,
    }
}

const CHECK: &str = "cupool check";

pub fn check(args: CheckArgs) -> ExitCode {
    let opts = match run::options(&args.launch, CHECK) {
        Ok(o) => o,
        Err(code) => return code,
    };
    if !opts.log {
        eprintln!("{CHECK}: log=0 writes no log, and the check reads the logs; nothing was run");
        return ExitCode::from(run::exit::USAGE);
    }
    let reporting = match Reporting::new(&args.report) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{CHECK}: {e}; nothing was run");
            return ExitCode::from(exit::COULD_NOT_CHECK);
        }
    };
    let env = python::environment(
        opts.torch_history > 0 || (opts.jax_history_ms > 0 && opts.jax_history > 0) || opts.cupy_history > 0,
    )
    .unwrap_or_else(|e| {
        eprintln!(
            "{CHECK}: note: the Python package cannot be set up ({e}); test leaks are not checked, nor growth \
             inside PyTorch's cache, JAX's arena or CuPy's pool by object"
        );
        Vec::new()
    });
    let launched = match run::launch(&args.launch, opts, CHECK, &env) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let mut read = inputs::run_logs(&launched.log_dir, &launched.opts.run_id, launched.started);
    let tests = per_test::findings(&read.processes, &read.histories, &launched.log_dir).unwrap_or_else(|e| {
        read.notes.push(e);
        Vec::new()
    });
    let loaded = launched.shim_loaded(read.processes.len() + read.unreadable);
    let checked = loaded && read.unreadable == 0;
    let findings =
        examine::examine(&read.processes, &read.histories, tests, &reporting.suppressions, &launched.opts, read.notes);
    let findings = reporting.budgets(findings, &read.processes, &read.histories, &[&launched.log_dir], &launched.opts);
    let written = reporting.write(CHECK, &findings);
    if !read.processes.is_empty() {
        eprintln!("{CHECK}: logs in {}", launched.log_dir.display());
    }
    if launched.code != 0 {
        eprintln!("{CHECK}: the program failed (exit status {}): that is the status of the check", launched.code);
    } else if !loaded {
        eprintln!("{CHECK}: {}: nothing was checked", run::NOT_LOADED);
    } else if read.unreadable > 0 {
        eprintln!(
            "{CHECK}: {} log(s) of this run could not be read (named above): what they hold was not checked",
            read.unreadable
        );
    } else if read.processes.is_empty() {
        eprintln!(
            "{CHECK}: {} process(es) ran under cupool and none used CUDA memory, so there was nothing to check",
            launched.ran_without_cuda
        );
    }
    ExitCode::from(status(Some(launched.code), checked, written, &findings, &launched.opts))
}

/// The leak findings of `processes` (read by `cupool report`) by the rules
/// of `cupool merge`: the default suppressions, the check's options from an
/// inherited `CUPOOL_OPTIONS`, the per-test files beside each log. The notes
/// say what could not be used.
pub fn findings_of(processes: &[Process]) -> Findings {
    let mut notes = Vec::new();
    let opts = merge_options(&[]).unwrap_or_else(|errors| {
        notes.extend(errors.into_iter().map(|e| format!("{e}; the check's defaults are used")));
        Options::default()
    });
    let mut tests = Vec::new();
    let mut histories = Vec::new();
    let mut dirs: Vec<&Path> = processes.iter().filter_map(|p| p.log.path.parent()).collect();
    dirs.sort();
    dirs.dedup();
    // The per-test files and framework histories of a directory name the pids of the logs beside them.
    for dir in &dirs {
        for file in history::files(dir) {
            match history::read(&file) {
                Ok(h) => histories.push(h),
                Err(e) => notes.push(e),
            }
        }
    }
    for dir in dirs {
        match per_test::findings(processes, &histories, dir) {
            Ok(found) => tests.extend(found),
            Err(e) => notes.push(e),
        }
    }
    let supp = Suppressions::load(&[]).unwrap_or_default();
    examine::examine(processes, &histories, tests, &supp, &opts, notes)
}

/// The line `cupool run`'s summary ends with when known caches (PyTorch's,
/// NCCL's, ...) held memory at exit: the list above it calls that "not
/// freed", which a new user would take for leaks.
pub fn known_caches_line(processes: &[Process]) -> Option<String> {
    let (bytes, allocations, names) = examine::held_by_known_caches(processes)?;
    Some(format!(
        "    of which {} in {allocations} allocation(s) held by known caches ({}): not leaks, and {CHECK} leaves \
         them out",
        crate::units::human_bytes(bytes),
        names.join(", ")
    ))
}

const MERGE: &str = "cupool merge";

/// The inherited `CUPOOL_OPTIONS` (a run's, so any option), then `-o`, which
/// may name only the check's own options.
fn merge_options(entries: &[String]) -> Result<Options, Vec<String>> {
    let mut opts = Options::default();
    let mut errors = Vec::new();
    if let Ok(spec) = std::env::var("CUPOOL_OPTIONS") {
        errors.extend(options::parse_into(&mut opts, &spec).into_iter().map(|e| format!("CUPOOL_OPTIONS: {e}")));
    }
    for entry in entries {
        let Some((key, value)) = entry.split_once('=') else {
            errors.push(format!("-o {entry}: expected key=value, such as -o max_leak_bytes=1m"));
            continue;
        };
        let key = key.trim();
        if !CHECK_OPTIONS.contains(&key) {
            errors.push(format!("-o {entry}: {MERGE} takes only the check's options ({})", CHECK_OPTIONS.join(", ")));
        } else if let Err(e) = options::set(&mut opts, key, value) {
            errors.push(format!("-o {entry}: {e}"));
        }
    }
    if errors.is_empty() {
        Ok(opts)
    } else {
        Err(errors)
    }
}

pub fn merge(args: MergeArgs) -> ExitCode {
    let opts = match merge_options(&args.options) {
        Ok(o) => o,
        Err(errors) => {
            for e in errors {
                eprintln!("{MERGE}: {e}");
            }
            return ExitCode::from(run::exit::USAGE);
        }
    };
    let reporting = match Reporting::new(&args.report) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{MERGE}: {e}");
            return ExitCode::from(exit::COULD_NOT_CHECK);
        }
    };
    let mut read = inputs::Read::default();
    let mut bad_path = false;
    for path in &args.paths {
        match inputs::logs_at(path) {
            Ok(here) => read.extend(here),
            Err(e) => {
                eprintln!("{MERGE}: {e}");
                bad_path = true;
            }
        }
    }
    let mut read = read.finish();
    let mut tests = Vec::new();
    // Per-test files are matched to the logs beside them.
    for path in args.paths.iter().filter(|p| p.is_dir()) {
        match per_test::findings(&read.processes, &read.histories, path) {
            Ok(found) => tests.extend(found),
            Err(e) => read.notes.push(e),
        }
    }
    let checked = !read.processes.is_empty() && !bad_path && read.unreadable == 0;
    let findings =
        examine::examine(&read.processes, &read.histories, tests, &reporting.suppressions, &opts, read.notes);
    let dirs: Vec<&Path> = args.paths.iter().filter(|p| p.is_dir()).map(PathBuf::as_path).collect();
    let findings = reporting.budgets(findings, &read.processes, &read.histories, &dirs, &opts);
    let written = reporting.write(MERGE, &findings);
    if read.unreadable > 0 {
        eprintln!(
            "{MERGE}: {} log(s) could not be read (named above): what they hold was not checked",
            read.unreadable
        );
    } else if read.processes.is_empty() {
        eprintln!("{MERGE}: no log could be read, so nothing was checked");
    }
    ExitCode::from(status(None, checked, written, &findings, &opts))
}
