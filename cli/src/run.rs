//! `cupool run -- CMD ARGS...`

use crate::summary;
use clap::Args;
use cupool_core::options::{self, Options};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};

/// How a program is launched: what `cupool run` and `cupool check` share.
#[derive(Args)]
pub struct LaunchArgs {
    /// The log directory; created if missing, and it must be writable. Each run writes its logs
    /// (one cupool.<pid>.json per process) into a directory of its own in it, run-<UTC time>-<pid>,
    /// and the link DIR/latest names the newest. Default: ./cupool-logs.
    #[arg(long, value_name = "DIR")]
    log_dir: Option<PathBuf>,
    /// pool | passthrough.
    #[arg(long)]
    mode: Option<String>,
    /// Keep only failures, checkpoints and the leak report, not every alloc/free.
    #[arg(long)]
    no_trace: bool,
    /// Per-device byte cap, e.g. 16g.
    #[arg(long)]
    limit: Option<String>,
    /// Any other option as key=value, the value taken as it is (see below); may be repeated.
    #[arg(short = 'o', long = "option", value_name = "KEY=VALUE")]
    options: Vec<String>,
    /// Say which libcupool.so is preloaded and where it was found.
    #[arg(short, long)]
    verbose: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    launch: LaunchArgs,
    /// Print no summary at the end.
    #[arg(short, long)]
    quiet: bool,
}

/// `cupool run`'s own exit statuses; otherwise it exits with the program's.
pub mod exit {
    /// A bad flag, option or value (also clap's status for its own usage errors).
    pub const USAGE: u8 = 2;
    /// The log directory cannot be created or written.
    pub const LOG_DIR: u8 = 123;
    /// cupool itself failed: no libcupool.so, or waiting for the program failed.
    pub const CUPOOL: u8 = 125;
    /// The program was found but could not be started.
    pub const CANNOT_RUN: u8 = 126;
    /// The program was not found.
    pub const NOT_FOUND: u8 = 127;
}

pub fn options_help() -> String {
    let mut s = String::from(
        "Options travel to the shim in CUPOOL_OPTIONS=key=value:key=value; a value with ':' is quoted, \
         as in log_dir='/tmp/a:b'. cupool run starts from the CUPOOL_OPTIONS it inherits, then applies \
         -o, then the flags:\n",
    );
    let rows = cupool_core::options::OPTION_HELP.iter().map(|&(key, default, what)| match key {
        // What cupool run does with it, not the shim's own default.
        "log_dir" => (key, "./cupool-logs", LOG_DIR_HELP),
        _ => (key, default, what),
    });
    s.push_str(&option_table(rows));
    s.push_str(
        "\nEvery option is checked before the program starts. Exit status: the program's own \
         (128 + N when signal N killed it); 2 for a bad flag or option, 123 when the log directory \
         cannot be created or written, 125 when cupool itself fails, 126 when the program cannot be \
         run, 127 when it is not found.\n",
    );
    s
}

/// `log_dir` as `cupool run` uses it.
const LOG_DIR_HELP: &str = "the log directory: each run writes its logs into a directory of its own in it, \
    run-<UTC time>-<pid>, and DIR/latest names the newest (the shim run without the CLI writes into log_dir \
    itself, default .)";

/// The widest a help line gets before its text wraps.
const HELP_WIDTH: usize = 100;

/// `key  default D  what` rows with their columns aligned to the longest key
/// and default, the text wrapped under itself.
pub fn option_table<'a>(rows: impl Iterator<Item = (&'a str, &'a str, &'a str)>) -> String {
    let rows: Vec<_> = rows.collect();
    let key_w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let default_w = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
    let indent = 2 + key_w + 1 + "default ".len() + default_w + 1;
    let mut s = String::new();
    for (key, default, what) in rows {
        let mut line = format!("  {key:<key_w$} default {default:<default_w$} ");
        for word in what.split_whitespace() {
            if line.len() > indent && line.len() + word.len() > HELP_WIDTH {
                s.push_str(line.trim_end());
                s.push('\n');
                line = " ".repeat(indent);
            }
            line.push_str(word);
            line.push(' ');
        }
        s.push_str(line.trim_end());
        s.push('\n');
    }
    s
}

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: `kill` takes integers and is async-signal-safe, as a signal handler needs.
        unsafe { libc::kill(pid, sig) };
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_owned()
    } else {
        std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_owned())
    }
}

/// The options the program gets: the inherited `CUPOOL_OPTIONS`, then `-o`, then the flags;
/// or every problem found, one line each.
fn options_of(args: &LaunchArgs, inherited: Option<&str>, run_id: &str) -> Result<Options, Vec<String>> {
    let mut opts = Options::default();
    let mut errors = Vec::new();
    // An inherited `log_dir` is the user's choice as much as `-o log_dir=` is.
    let mut log_dir_option = false;
    if let Some(spec) = inherited {
        errors.extend(options::parse_into(&mut opts, spec).into_iter().map(|e| format!("CUPOOL_OPTIONS: {e}")));
        log_dir_option = options::entries(spec).iter().any(|e| e.as_ref().is_ok_and(|(key, _)| key == "log_dir"));
    }
    for entry in &args.options {
        let Some((key, value)) = entry.split_once('=') else {
            errors.push(format!("-o {entry}: expected key=value, such as -o flush_ms=50"));
            continue;
        };
        let key = key.trim();
        if key == "run_id" {
            errors.push(format!("-o {entry}: run_id is set by cupool run itself (it finds the run's logs by it)"));
            continue;
        }
        log_dir_option |= key == "log_dir";
        if let Err(e) = options::set(&mut opts, key, value) {
            errors.push(format!("-o {entry}: {e}"));
        }
    }
    for (flag, key, value) in [("--mode", "mode", &args.mode), ("--limit", "limit", &args.limit)] {
        if let Some(value) = value {
            if let Err(e) = options::set(&mut opts, key, value) {
                errors.push(format!("{flag}: {e}"));
            }
        }
    }
    if args.no_trace {
        opts.trace = false;
    }
    let log_dir = match &args.log_dir {
        Some(dir) if dir.as_os_str().is_empty() => {
            errors.push("--log-dir: no directory given".into());
            PathBuf::new()
        }
        Some(dir) => absolute(dir),
        None if log_dir_option => absolute(Path::new(&opts.log_dir)),
        None => absolute(Path::new("cupool-logs")),
    };
    match log_dir.to_str() {
        Some(dir) => opts.log_dir = dir.to_string(),
        None => errors
            .push(format!("--log-dir {}: the path is not UTF-8, which CUPOOL_OPTIONS cannot carry", log_dir.display())),
    }
    opts.run_id = run_id.to_string();
    if errors.is_empty() {
        Ok(opts)
    } else {
        Err(errors)
    }
}

/// Makes sure the shim can write its logs into `dir`: creates it if missing
/// (true when it did) and writes a file into it.
fn prepare_log_dir(dir: &Path) -> Result<bool, String> {
    let existed = dir.is_dir();
    if !existed {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create log directory {}: {e}", dir.display()))?;
    }
    let probe = dir.join(format!(".cupool-write-check.{}", std::process::id()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(!existed)
        }
        Err(e) => {
            if !existed {
                let _ = std::fs::remove_dir(dir);
            }
            Err(format!("cannot write into log directory {}: {e}", dir.display()))
        }
    }
}

/// A program run to its end under the shim.
pub struct Launched {
    /// Its exit status, 128 + N when signal N killed it.
    pub code: i32,
    /// The run's own directory (`opts.log_dir`), under the log directory.
    pub log_dir: PathBuf,
    /// What the program got; `opts.run_id` tags every log of this run.
    pub opts: Options,
    /// Just before the program started: a log file older than this is not this run's.
    pub started: std::time::SystemTime,
    /// Processes that ran with the shim loaded and never used CUDA memory
    /// (those that did wrote logs): with no log and none of these, the shim
    /// was never loaded.
    pub ran_without_cuda: usize,
}

impl Launched {
    /// Whether the shim was loaded in any process of the run.
    pub fn shim_loaded(&self, logs: usize) -> bool {
        logs > 0 || self.ran_without_cuda > 0
    }
}

/// The line said when the shim was loaded in no process of the program.
pub const NOT_LOADED: &str = "the shim was not loaded in any process of the program (a statically linked \
    program, or one that drops LD_PRELOAD from its environment)";

/// How long the run waits for processes of its own that outlive the
/// program (a child left running in the background): a log ends when its
/// process does, and one read before that has no end, or is not yet written.
const STRAGGLERS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits, up to [`STRAGGLERS_WAIT`], for the program's descendants that
/// outlived it: as the run's subreaper ([`adopt_orphans`]), this process
/// inherits them, and reaps them here.
fn wait_for_stragglers(who: &str) {
    // Whether some still run, once those that ended are reaped.
    let reap = || loop {
        match wait_any(libc::WNOHANG) {
            Ok((0, _)) => return true,
            Ok(_) => continue,
            Err(_) => return false, // none left (ECHILD)
        }
    };
    if !reap() {
        return;
    }
    eprintln!(
        "{who}: waiting up to {} s for processes of the run still running after the program",
        STRAGGLERS_WAIT.as_secs()
    );
    let deadline = std::time::Instant::now() + STRAGGLERS_WAIT;
    while std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        if !reap() {
            return;
        }
    }
    eprintln!("{who}: processes of the run still run; their logs are read as they stand");
}

/// `waitpid(-1, options)`, again when a signal interrupts it: the child
/// reaped and its raw status (pid 0 under `WNOHANG`: none has ended yet).
fn wait_any(options: libc::c_int) -> std::io::Result<(libc::pid_t, libc::c_int)> {
    loop {
        let mut raw = 0;
        // SAFETY: `waitpid` writes one `int` into `raw`, a live local.
        let pid = unsafe { libc::waitpid(-1, &mut raw, options) };
        if pid >= 0 {
            return Ok((pid, raw));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Makes this process the subreaper of the program's descendants: one the
/// program leaves running is reparented here rather than to init, so the
/// run can wait for it ([`wait_for_stragglers`]).
fn adopt_orphans() {
    // SAFETY: `prctl` with `PR_SET_CHILD_SUBREAPER` takes integers only and changes only this process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

/// How many processes left the pid file of `ran_without_cuda_file` in
/// `log_dir` (read, then removed: it served this run alone).
fn ran_without_cuda(log_dir: &Path, run_id: &str) -> usize {
    let path = log_dir.join(cupool_core::log::ran_without_cuda_file(run_id));
    let n = std::fs::read_to_string(&path).map(|t| t.lines().filter(|l| !l.trim().is_empty()).count()).unwrap_or(0);
    let _ = std::fs::remove_file(&path);
    n
}

/// The options the program gets (see `options_of`), with a fresh `run_id`;
/// or a line on stderr for each problem, prefixed by `who` (`cupool run`),
/// and [`exit::USAGE`].
pub fn options(args: &LaunchArgs, who: &str) -> Result<Options, ExitCode> {
    let run_id = format!("{:x}-{:x}", std::process::id(), cupool_core_time_ns());
    let inherited = std::env::var("CUPOOL_OPTIONS").ok();
    options_of(args, inherited.as_deref(), &run_id).map_err(|errors| {
        for e in errors {
            eprintln!("{who}: {e}");
        }
        ExitCode::from(exit::USAGE)
    })
}

/// Runs the program with the shim preloaded, `opts` in `CUPOOL_OPTIONS` and
/// `env` added to its environment, and waits for it. Nothing is started when
/// the shim or the log directory is missing; the error is the exit status to return.
pub fn launch(args: &LaunchArgs, mut opts: Options, who: &str, env: &[(String, String)]) -> Result<Launched, ExitCode> {
    let shim = match crate::shim::locate() {
        Ok(s) => {
            if args.verbose {
                eprintln!("cupool: preloading {} ({})", s.path.display(), s.origin);
            }
            s.path
        }
        Err(e) => {
            eprintln!("cupool: {e}");
            return Err(ExitCode::from(exit::CUPOOL));
        }
    };
    let root = PathBuf::from(&opts.log_dir);
    let mut log_dir = root.clone();
    let created = if opts.log {
        let run = prepare_log_dir(&root).and_then(|created| match crate::runs::create(&root) {
            Ok(dir) => Ok((created, dir)),
            Err(e) => {
                if created {
                    let _ = std::fs::remove_dir(&root);
                }
                Err(format!("cannot create a run directory in log directory {}: {e}", root.display()))
            }
        });
        match run {
            Ok((created, dir)) => {
                log_dir = dir;
                created
            }
            Err(e) => {
                eprintln!("{who}: {e}; nothing was run");
                return Err(ExitCode::from(exit::LOG_DIR));
            }
        }
    } else {
        false
    };
    // Checked UTF-8 with the log directory: the run's name is ASCII.
    opts.log_dir = log_dir.to_string_lossy().into_owned();
    // Leaves no empty directory behind: not the run's when nothing was logged, nor the log directory made for it.
    let tidy = || {
        if opts.log {
            crate::runs::finish(&root, &log_dir);
        }
        if created {
            let _ = std::fs::remove_dir(&root);
        }
    };
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(existing) if !existing.trim().is_empty() => {
            format!("{existing}:{}", absolute(&shim).display())
        }
        _ => absolute(&shim).display().to_string(),
    };

    adopt_orphans();
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]).env("LD_PRELOAD", preload).env("CUPOOL_OPTIONS", options::format(&opts));
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    // The shim is also the program's NVTX tool (its ranges become phases),
    // unless another tool already is.
    if opts.nvtx && std::env::var_os("NVTX_INJECTION64_PATH").is_none_or(|p| p.is_empty()) {
        cmd.env("NVTX_INJECTION64_PATH", absolute(&shim));
    } else if opts.nvtx && args.verbose {
        eprintln!("cupool: NVTX_INJECTION64_PATH is set already: NVTX ranges go to that tool, not into the log");
    }
    // SAFETY: `signal` is given a constant disposition or `forward`, an `extern "C" fn(c_int)` handler that
    // makes only async-signal-safe calls. The `pre_exec` closure runs in the child between `fork` and `exec`,
    // where only async-signal-safe calls may be made: `signal`, `sigemptyset` and `pthread_sigmask` are, and
    // it allocates nothing (`none` is zeroed on the stack).
    unsafe {
        // The terminal's ^C reaches the child directly; cupool waits and reports.
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, forward as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGHUP, forward as extern "C" fn(libc::c_int) as libc::sighandler_t);
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
    // A SIGTERM that arrives before the child's pid is known must wait, not be lost.
    // SAFETY: `sigset_t` is plain data: all-zero is a valid (empty) set.
    let mut forwarded: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `sigemptyset`, `sigaddset` and `pthread_sigmask` only read and write `forwarded`, a live local.
    unsafe {
        libc::sigemptyset(&mut forwarded);
        libc::sigaddset(&mut forwarded, libc::SIGTERM);
        libc::sigaddset(&mut forwarded, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &forwarded, std::ptr::null_mut());
    }
    let started = std::time::SystemTime::now();
    let spawned = cmd.spawn();
    if let Ok(c) = &spawned {
        CHILD.store(c.id() as i32, Ordering::Relaxed);
    }
    // SAFETY: `pthread_sigmask` reads `forwarded`, a live local, and writes nothing (null).
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &forwarded, std::ptr::null_mut()) };
    let child = match spawned {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cupool: cannot run {}: {e}", args.command[0]);
            tidy();
            return Err(ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_RUN
            }));
        }
    };
    // As the subreaper, orphans the program leaves behind while it runs are
    // reaped as they end, as init would (none is left a zombie for the run).
    let main = child.id() as libc::pid_t;
    let status = loop {
        match wait_any(0) {
            Ok((pid, raw)) if pid == main => break std::process::ExitStatus::from_raw(raw),
            Ok(_) => continue,
            Err(e) => {
                eprintln!("cupool: waiting for the child failed: {e}");
                return Err(ExitCode::from(exit::CUPOOL));
            }
        }
    };
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    wait_for_stragglers(who);
    // Read before the run's directory is tidied: the file may be all it holds.
    let ran_without_cuda = ran_without_cuda(&log_dir, &opts.run_id);
    tidy();
    Ok(Launched { code, log_dir, opts, started, ran_without_cuda })
}

/// `known_caches` adds a line to the summary about memory that known caches
/// held at exit (the check's rules, given by the caller: the check runs
/// programs through this module, not the other way round).
pub fn run(args: RunArgs, known_caches: fn(&[cupool_core::model::Process]) -> Option<String>) -> ExitCode {
    let launched = options(&args.launch, "cupool run").and_then(|opts| launch(&args.launch, opts, "cupool run", &[]));
    let l = match launched {
        Ok(l) => l,
        Err(code) => return code,
    };
    if !args.quiet {
        if l.opts.log {
            let logs = summary::logs_of_run(&l.log_dir, &l.opts.run_id);
            summary::print_text(&logs, Some(&l.log_dir), &mut std::io::stderr());
            if !l.shim_loaded(logs.len()) {
                eprintln!("cupool: {NOT_LOADED}");
            }
            if let Some(line) = known_caches(&logs) {
                eprintln!("{line}");
            }
        } else {
            eprintln!("cupool: log=0, so no logs were written and there is nothing to summarise");
        }
    }
    ExitCode::from(l.code as u8)
}

fn cupool_core_time_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}
