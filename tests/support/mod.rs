//! Test support for integration tests (`mod support;`).
//!
//! Builds the fake CUDA driver (`libcuda.so.1`), the fake runtime
//! (`libcudart.so.13`) and the C test programs from `tests/fake/` with the
//! system C compiler, once per test binary, into
//! `target/fake-cuda/<hash of sources and recipe>/`, and runs programs with
//! or without the cupool shim preloaded.
//!
//! Programs (see the comment at the top of each `tests/fake/*.c`):
//! `prog_runtime` (shared fake cudart), `prog_runtime_static` (fake cudart
//! compiled in), `prog_dlopen` (+ `libplugin.so`), `prog_driver`,
//! `prog_getproc`, `prog_fork`, `prog_sleep`, `prog_nocuda`, `prog_threads`,
//! `prog_ipc` (legacy CUDA IPC between an exporting and an importing process).
#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// Every program built by [`fakes`].
pub const PROGRAMS: &[&str] = &[
    "prog_runtime",
    "prog_runtime_static",
    "prog_dlopen",
    "prog_driver",
    "prog_getproc",
    "prog_fork",
    "prog_sleep",
    "prog_nocuda",
    "prog_threads",
    "prog_ipc",
];

/// File (inside a run's log directory) where the fake driver appends its
/// per-process ground-truth counters.
pub const FAKE_STATS_FILE: &str = "fake-stats.txt";

/// The built fakes: one directory holding the libraries and the programs.
pub struct Fakes {
    dir: PathBuf,
}

impl Fakes {
    /// Directory with `libcuda.so.1`, `libcudart.so.13`, `libplugin.so` and
    /// the programs.
    pub fn lib_dir(&self) -> &Path {
        &self.dir
    }

    /// Path of a built program (one of [`PROGRAMS`]).
    pub fn prog(&self, name: &str) -> PathBuf {
        assert!(PROGRAMS.contains(&name), "unknown fake program {name:?}");
        self.dir.join(name)
    }

    pub fn libcuda(&self) -> PathBuf {
        self.dir.join("libcuda.so.1")
    }

    pub fn libcudart(&self) -> PathBuf {
        self.dir.join("libcudart.so.13")
    }

    pub fn libplugin(&self) -> PathBuf {
        self.dir.join("libplugin.so")
    }

    /// Environment that makes `dlopen("libcuda.so.1")` (from the shim, or
    /// from a program without an rpath) find the fake first, even where a
    /// real driver is installed. The programs themselves also carry
    /// `RUNPATH=$ORIGIN`.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut path = self.dir.display().to_string();
        if let Ok(old) = std::env::var("LD_LIBRARY_PATH") {
            if !old.is_empty() {
                path.push(':');
                path.push_str(&old);
            }
        }
        vec![("LD_LIBRARY_PATH".to_string(), path)]
    }
}

/// Builds everything on first use (per test binary) and returns the result.
/// Panics with the compiler's output when a build fails.
pub fn fakes() -> &'static Fakes {
    static FAKES: OnceLock<Fakes> = OnceLock::new();
    FAKES.get_or_init(build_fakes)
}

/// `target/<profile>/libcupool.so`, next to the `cupool` binary.
///
/// `cargo test` builds neither the cdylib nor the CLI (the `cupool-cli`
/// package) for these tests, so the first call in each test binary runs
/// `cargo build -p cupool -p cupool-cli` for the same profile and target
/// directory (cargo does not hold its build lock while tests run; concurrent
/// test binaries simply queue on it). Set `CUPOOL_TEST_SHIM=<path>` to use a
/// prebuilt shim instead and skip the build.
pub fn shim_path() -> PathBuf {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        if let Some(p) = std::env::var_os("CUPOOL_TEST_SHIM").filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
        build_products();
        let shim = profile_dir().join("libcupool.so");
        assert!(shim.exists(), "cargo build did not produce {}", shim.display());
        shim
    })
    .clone()
}

/// `target/<profile>/`: test binaries run from its `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test binary");
    exe.parent().and_then(Path::parent).expect("the test binary lies in target/<profile>/deps").to_path_buf()
}

/// Builds the shim and the CLI, once per test binary.
fn build_products() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let profile_dir = profile_dir();
        let target = profile_dir.parent().expect("profile dir has a parent");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev".to_string(),
            Some(name) => name.to_string(),
            None => panic!("cannot tell the cargo profile from {}", profile_dir.display()),
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(&cargo)
            .args(["build", "--quiet", "-p", "cupool", "-p", "cupool-cli", "--profile", &profile])
            .arg("--manifest-path")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .arg("--target-dir")
            .arg(target)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {cargo:?}: {e}"));
        assert!(
            out.status.success(),
            "cargo build -p cupool -p cupool-cli (into {}) failed:\n{}",
            profile_dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// The `cupool` CLI binary (package `cupool-cli`), built on first use like
/// the shim (see [`shim_path`]). Set `CUPOOL_TEST_CLI=<path>` to use a
/// prebuilt one instead.
pub fn cli() -> PathBuf {
    static CLI: OnceLock<PathBuf> = OnceLock::new();
    CLI.get_or_init(|| {
        if let Some(p) = std::env::var_os("CUPOOL_TEST_CLI").filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
        build_products();
        let cli = profile_dir().join("cupool");
        assert!(cli.exists(), "cargo build did not produce {}", cli.display());
        cli
    })
    .clone()
}

/// The cargo target directory (`target/`), derived from the test binary's location.
pub fn target_dir() -> PathBuf {
    profile_dir().parent().expect("target/<profile> has a parent").to_path_buf()
}

/// A Python with `requirements` installed: `CUPOOL_TEST_PYTHON` when set
/// (an interpreter that has them), else [`virtualenv`] in `target/<dir>/`,
/// never the system's packages. Without either the test fails with the reason.
pub fn python_with(dir: &str, requirements: &[&str]) -> PathBuf {
    if let Some(p) = std::env::var_os("CUPOOL_TEST_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    virtualenv(dir, &[], requirements, "or set CUPOOL_TEST_PYTHON")
}

/// The Python of a virtualenv in `target/<dir>/` with `requirements`
/// installed (`python3 -m venv`, then `pip install PIP_ARGS...` from PyPI
/// once; kept for later runs while the requirements stay the same). When
/// that cannot be done the test fails, saying so, and `hint`.
pub fn virtualenv(dir: &str, pip_args: &[&str], requirements: &[&str], hint: &str) -> PathBuf {
    let dir = target_dir().join(dir);
    let python = dir.join("bin").join("python");
    let ready = dir.join(".installed");
    let want = requirements.join("\n");
    // Tests of one binary run on parallel threads and may ask for the same
    // virtualenv at once: one builds it, the others wait and then find it.
    // The file lock does the same for test processes run side by side.
    static BUILDING: Mutex<()> = Mutex::new(());
    let _building = BUILDING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let lock_path = dir.with_extension("lock");
    let lock = fs::File::create(&lock_path).unwrap_or_else(|e| panic!("create {}: {e}", lock_path.display()));
    lock.lock().unwrap_or_else(|e| panic!("lock {}: {e}", lock_path.display()));
    if python.exists() && fs::read_to_string(&ready).is_ok_and(|have| have == want) {
        return python;
    }
    let _ = fs::remove_dir_all(&dir);
    let system = std::env::var("PYTHON").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into());
    run_ok(
        Command::new(system).args(["-m", "venv"]).arg(&dir),
        "python3 -m venv (on Debian: apt-get install python3-venv)",
    );
    run_ok(
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(pip_args)
            .args(requirements),
        &format!("pip install {} into {} (needs PyPI once; {hint})", requirements.join(" "), dir.display()),
    );
    fs::write(&ready, want).unwrap();
    python
}

/// A fresh, empty directory under `target/fake-cuda/scratch/` for one test.
pub fn scratch_dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let scratch = target_dir().join("fake-cuda").join("scratch");
    SWEPT.call_once(|| sweep_scratch(&scratch));
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = scratch.join(format!("{name}-{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

/// Removes the scratch directories of test processes that have exited more
/// than an hour ago (their names end in `-<pid>-<n>`): every run leaves its
/// logs there, and over many runs they filled a disk. A running test
/// binary's, and a recent failure's, stay.
fn sweep_scratch(scratch: &Path) {
    let Ok(entries) = fs::read_dir(scratch) else { return };
    let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok()) else { continue };
        let old = entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| t < an_hour_ago);
        if old && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// `CUPOOL_OPTIONS` value: `log_dir=<dir>` plus `:<extra>` when non-empty.
pub fn cupool_options(log_dir: &Path, extra_options: &str) -> String {
    let mut opts = format!("log_dir={}", log_dir.display());
    if !extra_options.is_empty() {
        opts.push(':');
        opts.push_str(extra_options);
    }
    opts
}

/// Command for `prog` with the shim preloaded, `CUPOOL_OPTIONS`, the fake
/// environment and `FAKE_CUDA_STATS=<log_dir>/fake-stats.txt`. Creates
/// `log_dir`. Use it directly to spawn (e.g. to kill `prog_sleep`).
pub fn preloaded_command(prog: &Path, args: &[&str], log_dir: &Path, extra_options: &str) -> Command {
    let mut cmd = plain_command(prog, args, log_dir);
    cmd.env("LD_PRELOAD", shim_path()).env("CUPOOL_OPTIONS", cupool_options(log_dir, extra_options));
    cmd
}

/// Command for `prog` without the shim (any inherited `LD_PRELOAD` and
/// `CUPOOL_OPTIONS` removed), with the fake environment and
/// `FAKE_CUDA_STATS` in `stats_dir` (created).
pub fn plain_command(prog: &Path, args: &[&str], stats_dir: &Path) -> Command {
    fs::create_dir_all(stats_dir).unwrap_or_else(|e| panic!("create {}: {e}", stats_dir.display()));
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("CUPOOL_OPTIONS")
        .envs(fakes().env())
        .env("FAKE_CUDA_STATS", stats_dir.join(FAKE_STATS_FILE))
        .stdin(Stdio::null());
    cmd
}

/// Runs `prog` with the shim preloaded (see [`preloaded_command`]).
pub fn run_preloaded(prog: &Path, args: &[&str], log_dir: &Path, extra_options: &str) -> Output {
    let mut cmd = preloaded_command(prog, args, log_dir, extra_options);
    cmd.output().unwrap_or_else(|e| panic!("run {}: {e}", prog.display()))
}

/// Runs `prog` without the shim (see [`plain_command`]).
pub fn run_plain(prog: &Path, args: &[&str], stats_dir: &Path) -> Output {
    let mut cmd = plain_command(prog, args, stats_dir);
    cmd.output().unwrap_or_else(|e| panic!("run {}: {e}", prog.display()))
}

/// Spawns a command with piped stdout and waits until it prints a line equal
/// to `marker` (e.g. `"ready"`). Returns the child and the lines read so far.
// The child is handed back to the caller, who waits for it.
#[allow(clippy::zombie_processes)]
pub fn spawn_until(mut cmd: Command, marker: &str) -> (Child, Vec<String>) {
    use std::io::BufRead;
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut reader = std::io::BufReader::new(stdout);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line).expect("read child stdout");
        if n == 0 {
            let status = child.wait();
            panic!("child exited ({status:?}) before printing {marker:?}; output: {lines:?}");
        }
        let line = line.trim_end().to_string();
        let done = line == marker;
        lines.push(line);
        if done {
            return (child, lines);
        }
    }
}

/// Lossy stdout of a finished program.
pub fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Parses the last `result: ok k=v ...` line of a program's stdout.
pub fn result_line(stdout: &str) -> Option<HashMap<String, u64>> {
    let line = stdout.lines().rev().find(|l| l.starts_with("result: "))?;
    let rest = line.strip_prefix("result: ok")?;
    Some(parse_kv(rest))
}

/// Value of a `key=<number>` line in a program's stdout (e.g. `child_pid`).
pub fn stdout_value(stdout: &str, key: &str) -> Option<u64> {
    let prefix = format!("{key}=");
    stdout.lines().find_map(|l| l.strip_prefix(prefix.as_str())).and_then(|v| v.trim().parse().ok())
}

fn parse_kv(s: &str) -> HashMap<String, u64> {
    s.split_whitespace()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Ground-truth lines written by the fake driver's destructor, one map per
/// process (`pid`, `allocs`, `frees`, `host_allocs`, `host_frees`,
/// `vmm_creates`, `vmm_releases`, `live`, `live_bytes`, `ipc_opens`,
/// `ipc_closes`). Empty when no
/// process wrote any (e.g. all were SIGKILLed).
pub fn fake_stats(dir: &Path) -> Vec<HashMap<String, u64>> {
    match fs::read_to_string(dir.join(FAKE_STATS_FILE)) {
        Ok(text) => text.lines().filter(|l| !l.trim().is_empty()).map(parse_kv).collect(),
        Err(_) => Vec::new(),
    }
}

/// The fake-stats line of one process.
pub fn fake_stats_for(dir: &Path, pid: u64) -> Option<HashMap<String, u64>> {
    fake_stats(dir).into_iter().find(|s| s.get("pid") == Some(&pid))
}

/// Reads every `cupool.<pid>.json` of the newest run in `dir` (see [`run_dir`]), sorted by pid.
///
/// Each log is read by `cupool_core::log::read_log`, the reader the CLI
/// uses (complete or cut short; a line it cannot read before the last one
/// makes the file unreadable, reported on stderr and left out), then turned
/// into JSON with `serde_json::to_value`. Each returned object gets test-side
/// annotations: `"_file"` (file name) and `"_partial"` (no end record).
pub fn read_logs(dir: &Path) -> Vec<Value> {
    let dir = &run_dir(dir);
    let mut files: Vec<(u64, PathBuf)> = match fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let pid = name.strip_prefix("cupool.")?.strip_suffix(".json")?.parse().ok()?;
                Some((pid, e.path()))
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
        .into_iter()
        .filter_map(|(_, path)| match cupool_core::log::read_log(&path) {
            Ok(log) => {
                let mut v = log_value(&log);
                v["_file"] = Value::String(path.file_name().unwrap().to_string_lossy().into_owned());
                Some(v)
            }
            Err(e) => {
                eprintln!("read_logs: {e}");
                None
            }
        })
        .collect()
}

/// Asks `ready` every 10 ms until it answers, for `limit` at most; `None`
/// when it never did.
pub fn poll_for<T>(limit: std::time::Duration, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(answer) = ready() {
            return Some(answer);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Waits (10 s at most) until the one log in `dir` holds at least `count`
/// events of kind `ev`: a writer that flushes every few milliseconds can
/// still be held off for longer on a loaded machine, so a test that must see
/// events flushed before it acts waits for them instead of sleeping a fixed
/// time. False if they never came: the caller stops what it started, then
/// fails.
#[must_use]
pub fn wait_for_flushed(dir: &Path, ev: &str, count: usize) -> bool {
    poll_for(std::time::Duration::from_secs(10), || {
        let logs = read_logs(dir);
        (logs.len() == 1 && events(&logs[0], ev).len() >= count).then_some(())
    })
    .is_some()
}

/// Parses the text of one cupool log (complete or partial) with the core's
/// reader; see [`read_logs`].
pub fn parse_log(text: &str) -> Option<Value> {
    match cupool_core::log::read_log_from(text.as_bytes(), "<text>") {
        Ok(log) => Some(log_value(&log)),
        Err(e) => {
            eprintln!("parse_log: {e}");
            None
        }
    }
}

/// A typed log as the JSON document it stands for, plus `"_partial"`.
fn log_value(log: &cupool_core::log::Log) -> Value {
    let mut v = serde_json::to_value(log).expect("a log serializes");
    v["_partial"] = Value::Bool(log.end.is_none());
    v
}

/// The log of process `pid`.
pub fn log_for_pid(logs: &[Value], pid: u64) -> Option<&Value> {
    logs.iter().find(|l| l["process"]["pid"].as_u64() == Some(pid))
}

/// Events of a log with `"ev" == ev`.
pub fn events<'a>(log: &'a Value, ev: &str) -> Vec<&'a Value> {
    log["events"].as_array().map(|a| a.iter().filter(|e| e["ev"] == ev).collect()).unwrap_or_default()
}

/// Allocations logged (in `seq` order) while an earlier allocation at the
/// same address has not been logged as freed yet: a block handed out twice.
pub fn allocs_at_a_live_address(log: &Value) -> Vec<String> {
    let mut by_seq: Vec<&Value> = events(log, "alloc").into_iter().chain(events(log, "free")).collect();
    by_seq.sort_by_key(|e| e["seq"].as_u64().expect("seq"));
    let address = |e: &Value| {
        let hex = e["ptr"].as_str().expect("ptr");
        u64::from_str_radix(hex.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("ptr {hex}"))
    };
    let mut live: HashMap<u64, &Value> = HashMap::new();
    let mut twice = Vec::new();
    for e in by_seq {
        if e["ev"] == "alloc" {
            if let Some(prev) = live.insert(address(e), e) {
                twice.push(format!("{e} while {prev} is live"));
            }
        } else {
            live.remove(&address(e));
        }
    }
    twice
}

// ---------------------------------------------------------------------------
// Building

/// One compiler invocation: output file name (in the build dir) and arguments.
struct Step {
    out: &'static str,
    args: Vec<String>,
}

fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("fake")
}

fn compiler() -> OsString {
    std::env::var_os("CC").filter(|c| !c.is_empty()).unwrap_or_else(|| "cc".into())
}

/// The build, in two phases: the libraries, then everything that links them.
fn recipe() -> (Vec<Step>, Vec<Step>) {
    let src = source_dir();
    let s = |f: &str| src.join(f).display().to_string();
    let common = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-fno-omit-frame-pointer"]
            .iter()
            .map(|x| x.to_string())
            .collect();
        v.push(format!("-I{}", src.display()));
        v.extend(extra.iter().map(|x| x.to_string()));
        v
    };
    // RUNPATH=$ORIGIN: the programs find the fake libraries next to them, and
    // their own dlopen calls (libcuda.so.1, libplugin.so) search there too.
    let rpath = "-Wl,-rpath,$ORIGIN";
    let cudart = "-l:libcudart.so.13";
    let step = |out: &'static str, mut args: Vec<String>, tail: &[&str]| {
        args.extend(tail.iter().map(|x| x.to_string()));
        Step { out, args }
    };

    let libs = vec![
        step(
            "libcuda.so.1",
            common(&["-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-soname,libcuda.so.1"]),
            &[&s("fake_cuda.c"), "-pthread"],
        ),
        step(
            "libcudart.so.13",
            common(&["-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-soname,libcudart.so.13", rpath]),
            &[&s("fake_cudart.c"), "-ldl", "-pthread"],
        ),
    ];
    let progs = vec![
        step("prog_runtime", common(&[]), &[&s("prog_runtime.c"), &s("workload.c"), "-L.", cudart, rpath]),
        step(
            "prog_runtime_static",
            common(&[]),
            &[&s("prog_runtime.c"), &s("workload.c"), &s("fake_cudart.c"), "-ldl", "-pthread", rpath],
        ),
        step(
            "libplugin.so",
            common(&["-shared", "-fPIC", "-fvisibility=hidden"]),
            &[&s("plugin.c"), &s("workload.c"), "-L.", cudart, rpath],
        ),
        step("prog_dlopen", common(&[]), &[&s("prog_dlopen.c"), "-ldl", rpath]),
        step("prog_driver", common(&[]), &[&s("prog_driver.c"), "-L.", "-l:libcuda.so.1", rpath]),
        step("prog_getproc", common(&[]), &[&s("prog_getproc.c"), "-ldl", rpath]),
        step("prog_fork", common(&[]), &[&s("prog_fork.c"), "-L.", cudart, rpath]),
        step("prog_sleep", common(&[]), &[&s("prog_sleep.c"), "-L.", cudart, rpath]),
        step("prog_nocuda", common(&[]), &[&s("prog_nocuda.c")]),
        step("prog_threads", common(&[]), &[&s("prog_threads.c"), "-L.", cudart, "-pthread", rpath]),
        step("prog_ipc", common(&[]), &[&s("prog_ipc.c"), "-L.", cudart, rpath]),
    ];
    (libs, progs)
}

/// FNV-1a, stable across Rust versions (unlike `DefaultHasher`).
fn fnv1a(hash: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *hash ^= u64::from(*b);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}

/// Hash of the recipe, the compiler name and every file in `tests/fake/`.
fn build_key(libs: &[Step], progs: &[Step]) -> String {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    fnv1a(&mut h, compiler().to_string_lossy().as_bytes());
    for st in libs.iter().chain(progs) {
        fnv1a(&mut h, st.out.as_bytes());
        for a in &st.args {
            fnv1a(&mut h, a.as_bytes());
            fnv1a(&mut h, b"\0");
        }
    }
    let mut files: Vec<PathBuf> = fs::read_dir(source_dir())
        .expect("read tests/fake")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    for f in files {
        fnv1a(&mut h, f.file_name().unwrap().to_string_lossy().as_bytes());
        fnv1a(&mut h, &fs::read(&f).expect("read fake source"));
    }
    format!("{h:016x}")
}

/// Runs the steps of one phase in parallel inside `dir`.
fn run_phase(dir: &Path, steps: &[Step]) {
    let children: Vec<_> = steps
        .iter()
        .map(|st| {
            let child = Command::new(compiler())
                .current_dir(dir)
                .arg("-o")
                .arg(st.out)
                .args(&st.args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run the C compiler {:?}: {e}", compiler()));
            (st, child)
        })
        .collect();
    let mut failures = String::new();
    for (st, child) in children {
        let out = child.wait_with_output().expect("wait for cc");
        if !out.status.success() {
            failures.push_str(&format!(
                "\n--- {} failed ({}): cc -o {} {}\n{}{}",
                st.out,
                out.status,
                st.out,
                st.args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "building the fake CUDA programs failed:{failures}");
}

const COMPLETE_MARKER: &str = ".complete";

fn build_fakes() -> Fakes {
    let (libs, progs) = recipe();
    let root = target_dir().join("fake-cuda");
    let final_dir = root.join(build_key(&libs, &progs));
    if final_dir.join(COMPLETE_MARKER).exists() {
        point_current_at(&root, &final_dir);
        return Fakes { dir: final_dir };
    }
    // Build in a private directory and rename it into place, so that test
    // binaries running in parallel never see a half-built directory.
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let tmp = root.join(format!("tmp-{}-{nanos}", std::process::id()));
    fs::create_dir_all(&tmp).unwrap_or_else(|e| panic!("create {}: {e}", tmp.display()));
    run_phase(&tmp, &libs);
    run_phase(&tmp, &progs);
    fs::write(tmp.join(COMPLETE_MARKER), b"").expect("write marker");
    if final_dir.exists() && !final_dir.join(COMPLETE_MARKER).exists() {
        // Left over from an interrupted run of an older version of this code.
        let _ = fs::remove_dir_all(&final_dir);
    }
    if let Err(e) = fs::rename(&tmp, &final_dir) {
        // Another test binary won the race; use its (identical) build.
        let _ = fs::remove_dir_all(&tmp);
        assert!(final_dir.join(COMPLETE_MARKER).exists(), "rename {} -> {}: {e}", tmp.display(), final_dir.display());
    }
    point_current_at(&root, &final_dir);
    Fakes { dir: final_dir }
}

/// `target/fake-cuda/current`: a link to the build of the sources the tests
/// ran with last, for the benchmark scripts. The directories are named by a
/// hash of their sources, and the newest of them may be another branch's
/// build (a stale fake driver once made two threads look slower than one).
fn point_current_at(root: &Path, dir: &Path) {
    let Some(name) = dir.file_name() else { return };
    let link = root.join(format!("current-{}", std::process::id()));
    let _ = fs::remove_file(&link);
    // Replaced in one step: a script never finds the link missing.
    if std::os::unix::fs::symlink(name, &link).is_ok() && fs::rename(&link, root.join("current")).is_err() {
        let _ = fs::remove_file(&link);
    }
}

// ---------------------------------------------------------------------------
// Checking logs

/// Checks one log (as returned by [`read_logs`] / [`parse_log`]) against the
/// log schema: `schema`/`version` (the version this build writes), `process.pid` equal to the pid in the file
/// name (when `_file` is set), `process.cmdline[0]` ending with `prog`, `seq`
/// unique, `t_ns` non-decreasing in `seq` order within each thread, every
/// event carrying the fields its `ev` requires (with known names for `ev`,
/// `api` and `kind`, and `0x…` hex pointers), and, for a complete log, a
/// well-formed `end` record. Returns every problem found, one per line.
pub fn validate_log(log: &Value, prog: &str) -> Result<(), String> {
    use cupool_core::log::{Api, EventKind, MemKind};
    let mut errs: Vec<String> = Vec::new();
    let name = log["_file"].as_str().unwrap_or("<log>").to_string();
    macro_rules! bad {
        ($($t:tt)*) => { errs.push(format!($($t)*)) };
    }
    if log["schema"] != "cupool-log" {
        bad!("schema is {}", log["schema"]);
    }
    if log["version"] != cupool_core::log::VERSION {
        bad!("version is {}", log["version"]);
    }
    let process = &log["process"];
    match process["pid"].as_u64() {
        None => bad!("process.pid missing: {process}"),
        Some(pid) => {
            if let Some(file) = log["_file"].as_str() {
                if file != format!("cupool.{pid}.json") {
                    bad!("process.pid {pid} does not match the file name {file}");
                }
            }
        }
    }
    match process["cmdline"].as_array().and_then(|a| a.first()) {
        Some(Value::String(arg0)) => {
            let base = Path::new(arg0).file_name().and_then(|n| n.to_str());
            if base != Some(prog) {
                bad!("process.cmdline[0] {arg0:?} is not the program {prog:?}");
            }
        }
        _ => bad!("process.cmdline missing or empty: {process}"),
    }
    if !log["options"].is_object() {
        bad!("options is not an object: {}", log["options"]);
    }

    let is_hex = |v: &Value| -> bool {
        v.as_str()
            .and_then(|s| s.strip_prefix("0x"))
            .is_some_and(|h| !h.is_empty() && u64::from_str_radix(h, 16).is_ok())
    };
    let is_u64 = |v: &Value| v.as_u64().is_some();
    let is_i64 = |v: &Value| v.as_i64().is_some();
    let api_ok = |v: &Value| v.as_str().and_then(Api::from_name).is_some_and(|a| a != Api::None);
    let kind_ok = |v: &Value| v.as_str().and_then(MemKind::from_name).is_some();
    let empty = Vec::new();
    let evs = match log["events"].as_array() {
        Some(a) => a,
        None => {
            bad!("events is not an array");
            &empty
        }
    };
    for (i, e) in evs.iter().enumerate() {
        let mut need = |field: &str, ok: &dyn Fn(&Value) -> bool| {
            if !ok(&e[field]) {
                errs.push(format!("event #{i} has no valid {field:?}: {e}"));
            }
        };
        need("seq", &is_u64);
        need("t_ns", &is_u64);
        need("tid", &is_u64);
        let Some(kind) = e["ev"].as_str().and_then(EventKind::from_name) else {
            bad!("event #{i} has an unknown ev: {e}");
            continue;
        };
        let mut need = |field: &str, ok: &dyn Fn(&Value) -> bool| {
            if !ok(&e[field]) {
                errs.push(format!("event #{i} ({kind:?}) has no valid {field:?}: {e}"));
            }
        };
        match kind {
            EventKind::Start => {}
            EventKind::Alloc | EventKind::Free | EventKind::Map | EventKind::Unmap => {
                need("api", &api_ok);
                need("kind", &kind_ok);
                need("ptr", &is_hex);
                need("size", &is_u64);
                need("device", &is_i64);
                if e.get("pooled").is_some() && (kind != EventKind::Alloc || e["pooled"] != true) {
                    bad!("event #{i} ({kind:?}) has \"pooled\" other than an alloc's true: {e}");
                }
            }
            EventKind::Reserve | EventKind::Release => {
                need("size", &|v: &Value| v.as_u64().is_some_and(|n| n > 0));
                need("device", &is_i64);
                if e.get("api").is_some() {
                    bad!("event #{i} ({kind:?}) names an API: {e}");
                }
            }
            EventKind::AllocFailed | EventKind::Oom => {
                need("api", &api_ok);
                need("kind", &kind_ok);
                need("size", &is_u64);
                need("device", &is_i64);
                need("result", &is_i64);
            }
            EventKind::InvalidFree => {
                need("api", &api_ok);
                need("ptr", &is_hex);
                need("device", &is_i64);
                need("result", &is_i64);
            }
            EventKind::Checkpoint => {
                need("api", &api_ok);
                need("device", &is_i64);
                need("leaked_bytes", &is_u64);
                need("leaked_count", &is_u64);
            }
            EventKind::PhaseBegin | EventKind::PhaseEnd => {
                need("api", &api_ok);
                need("name", &|v: &Value| v.is_string());
                need("device", &is_i64);
                need("live", &is_u64);
                need("reserved", &is_u64);
            }
        }
    }

    // seq: unique; t_ns: non-decreasing in seq order within each thread.
    let mut order: Vec<&Value> = evs.iter().filter(|e| e["seq"].is_u64()).collect();
    order.sort_by_key(|e| e["seq"].as_u64());
    for w in order.windows(2) {
        if w[0]["seq"] == w[1]["seq"] {
            bad!("seq {} appears twice: {} and {}", w[0]["seq"], w[0], w[1]);
        }
    }
    let mut last_t: HashMap<u64, (u64, &Value)> = HashMap::new();
    for e in &order {
        let (Some(tid), Some(t)) = (e["tid"].as_u64(), e["t_ns"].as_u64()) else {
            continue;
        };
        if let Some((prev, pe)) = last_t.get(&tid) {
            if t < *prev {
                bad!("t_ns goes backwards within tid {tid}: {pe} then {e}");
            }
        }
        last_t.insert(tid, (t, e));
    }

    // The end record of a complete log.
    if log["_partial"] == false || log.get("end").is_some() {
        let end = &log["end"];
        if !end.is_object() {
            bad!("complete log without an end record");
        } else {
            let how = end["exit"]["how"].as_str();
            if !matches!(how, Some("exit") | Some("signal")) {
                bad!("end.exit.how is {}", end["exit"]["how"]);
            }
            for (j, d) in end["devices"].as_array().unwrap_or(&empty).iter().enumerate() {
                for f in ["allocs", "frees", "failures", "current_bytes", "peak_bytes"] {
                    if !d[f].is_u64() {
                        bad!("end.devices[{j}].{f} missing: {d}");
                    }
                }
                if !d["device"].is_i64() {
                    bad!("end.devices[{j}].device missing: {d}");
                }
            }
            if !end["devices"].is_array() {
                bad!("end.devices is not an array");
            }
            if !end["host"].is_object() {
                bad!("end.host is not an object");
            }
            let leaks = end["leaks"].as_array();
            if leaks.is_none() {
                bad!("end.leaks is not an array");
            }
            for l in leaks.unwrap_or(&empty) {
                let ptr_ok = is_hex(&l["ptr"]) || is_hex(&l["handle"]);
                if !ptr_ok
                    || !l["size"].is_u64()
                    || !l["device"].is_i64()
                    || !kind_ok(&l["kind"])
                    || !api_ok(&l["api"])
                    || !l["at"].is_string()
                {
                    bad!("malformed leak: {l}");
                }
            }
            if !end["leak_summary"]["bytes"].is_u64() || !end["leak_summary"]["count"].is_u64() {
                bad!("end.leak_summary malformed: {}", end["leak_summary"]);
            }
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!("{name}:\n  {}", errs.join("\n  ")))
    }
}

/// Panics with every problem [`validate_log`] finds.
pub fn assert_valid_log(log: &Value, prog: &str) {
    if let Err(e) = validate_log(log, prog) {
        panic!("invalid cupool log: {e}");
    }
}

// ---------------------------------------------------------------------------
// The CLI

/// `cupool ARGS` with the fake environment, `FAKE_CUDA_STATS` in `stats_dir`
/// (created), and no inherited `LD_PRELOAD`, `CUPOOL_OPTIONS` or `CUPOOL_LIB`.
/// Builds the shim first; when the shim does not live beside the CLI (see
/// `CUPOOL_TEST_SHIM`), points `CUPOOL_LIB` at it.
pub fn cupool_command(args: &[&str], stats_dir: &Path) -> Command {
    let shim = shim_path();
    fs::create_dir_all(stats_dir).unwrap_or_else(|e| panic!("create {}: {e}", stats_dir.display()));
    let mut cmd = Command::new(cli());
    cmd.args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("CUPOOL_OPTIONS")
        .env_remove("CUPOOL_LIB")
        .envs(fakes().env())
        .env("FAKE_CUDA_STATS", stats_dir.join(FAKE_STATS_FILE))
        .stdin(Stdio::null());
    if shim != cli().with_file_name("libcupool.so") {
        cmd.env("CUPOOL_LIB", shim);
    }
    cmd
}

/// Runs `cupool ARGS` (see [`cupool_command`]).
pub fn run_cupool(args: &[&str], stats_dir: &Path) -> Output {
    cupool_command(args, stats_dir).output().unwrap_or_else(|e| panic!("run cupool {args:?}: {e}"))
}

/// Lossy stderr of a finished program.
pub fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Where the logs of the newest run in `dir` are: `dir/latest` when `cupool
/// run` or `cupool check` wrote into `dir` (a directory per run), else `dir`
/// itself (the shim run without the CLI writes into its `log_dir`).
pub fn run_dir(dir: &Path) -> PathBuf {
    let latest = dir.join("latest");
    if latest.is_dir() {
        latest
    } else {
        dir.to_owned()
    }
}

/// Names of the `cupool.*.json` files of the newest run in `dir` (see
/// [`run_dir`]; empty when `dir` is missing).
pub fn log_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(run_dir(dir))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("cupool.") && n.ends_with(".json"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

// ---------------------------------------------------------------------------
// Test-local C code

/// `tests/fake/`, for `-I` when compiling test-local programs against the
/// fake headers.
pub fn fake_source_dir() -> PathBuf {
    source_dir()
}

/// Compiles one test-local C source given as text (see [`compile_c_file`]).
pub fn compile_c(name: &str, source: &str, args: &[String]) -> PathBuf {
    let dir = scratch_dir(&format!("cc-src-{name}"));
    let src = dir.join(format!("{name}.c"));
    fs::write(&src, source).unwrap_or_else(|e| panic!("write {}: {e}", src.display()));
    compile_c_file(name, &src, args)
}

/// Compiles the test-local program `tests/fake/<file>` (see [`compile_c_file`]).
pub fn compile_fake_program(name: &str, file: &str, args: &[String]) -> PathBuf {
    compile_c_file(name, &source_dir().join(file), args)
}

/// Compiles one test-local C source file with the system compiler into a
/// fresh scratch directory and returns the output file, named `name` (the
/// program name its log records). `tests/fake/` is on the include path
/// (`check.h`, the fake API headers). `args` go after the source (e.g.
/// `-shared -fPIC`, or [`link_fake_cudart`]). Panics with the compiler's
/// output on failure.
pub fn compile_c_file(name: &str, source: &Path, args: &[String]) -> PathBuf {
    let dir = scratch_dir(&format!("cc-{name}"));
    let out = dir.join(name);
    let res = Command::new(compiler())
        .arg("-std=gnu11")
        .arg("-O1")
        .arg("-Wall")
        .arg("-Wextra")
        .arg(format!("-I{}", source_dir().display()))
        .arg("-o")
        .arg(&out)
        .arg(source)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {:?}: {e}", compiler()));
    assert!(
        res.status.success(),
        "compiling {name} failed:\n{}{}",
        String::from_utf8_lossy(&res.stdout),
        String::from_utf8_lossy(&res.stderr)
    );
    out
}

/// Linker arguments for a test-local program using the fake shared runtime.
pub fn link_fake_cudart() -> Vec<String> {
    let dir = fakes().lib_dir().display().to_string();
    vec![format!("-L{dir}"), "-l:libcudart.so.13".into(), format!("-Wl,-rpath,{dir}"), "-pthread".into()]
}

/// Linker arguments for a test-local program that calls the fake driver
/// (`libcuda.so.1`) by symbol, like `prog_driver`. Combine with
/// [`link_fake_cudart`] for a program that uses both APIs.
pub fn link_fake_cuda() -> Vec<String> {
    let dir = fakes().lib_dir().display().to_string();
    vec![format!("-L{dir}"), "-l:libcuda.so.1".into(), format!("-Wl,-rpath,{dir}"), "-pthread".into()]
}

/// Waits for `child` at most `limit`; kills it (SIGKILL) and panics when it
/// is still running then.
pub fn wait_with_timeout(child: &mut Child, limit: std::time::Duration) -> std::process::ExitStatus {
    poll_for(limit, || child.try_wait().expect("wait for child")).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("process {} still running after {limit:?}", child.id());
    })
}

/// Sends `sig` to process `pid`.
pub fn send_signal(pid: u32, sig: i32) {
    // SAFETY: `kill` takes integers; callers name processes the tests started.
    let r = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(r, 0, "kill({pid}, {sig}): {}", std::io::Error::last_os_error());
}

/// Runs `cmd` (stdin closed) and panics, with its output, unless it succeeds.
pub fn run_ok(cmd: &mut Command, what: &str) -> Output {
    let out = cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A path as the `&str` a command line takes.
pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The training loop of `tests/fake/check_loop.c` (shared fake runtime), built once.
pub fn check_loop() -> &'static Path {
    static PROG: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PROG.get_or_init(|| {
        let mut args = link_fake_cudart();
        args.push("-ldl".into());
        compile_fake_program("check_loop", "check_loop.c", &args)
    })
}

/// Compiles `tests/fake/<file>`, which uses the fake runtime (shared) and driver, as `name`.
pub fn compile_runtime_program(name: &str, file: &str) -> PathBuf {
    let mut args = link_fake_cudart();
    args.extend(link_fake_cuda());
    compile_fake_program(name, file, &args)
}

/// Compiles `tests/fake/<file>`, which uses the fake driver only, as `name`.
pub fn compile_driver_program(name: &str, file: &str) -> PathBuf {
    compile_fake_program(name, file, &link_fake_cuda())
}

/// The findings of `cupool check --json` output that fail the check (not suppressed).
pub fn failing_findings(doc: &Value) -> Vec<&Value> {
    doc["findings"]
        .as_array()
        .map(|a| a.iter().filter(|f| f.get("suppressed_by").is_none()).collect())
        .unwrap_or_default()
}

/// `file:line` of every frame of a finding, the file by its name alone.
pub fn finding_places(f: &Value) -> Vec<String> {
    f["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|fr| {
            let file = fr["file"].as_str().unwrap_or("?");
            format!("{}:{}", file.rsplit('/').next().unwrap(), fr["line"])
        })
        .collect()
}

/// `cupool check --log-dir DIR/logs --json DIR/findings.json FLAGS -- PROGRAM...`
/// in `dir`, with the Python stand-ins of `dir/stub` first on `PYTHONPATH`
/// and the fake runtime in `FAKE_CUDART`, and `configure` for the rest:
/// its output and its findings (`Null` when none were written).
pub fn check_python(
    dir: &Path,
    flags: &[&str],
    program: &[&str],
    configure: impl FnOnce(&mut Command),
) -> (Output, Value) {
    let (findings, logs) = (dir.join("findings.json"), dir.join("logs"));
    let mut args: Vec<&str> = vec!["check", "--log-dir", path_str(&logs), "--json", path_str(&findings)];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(program);
    let mut cmd = cupool_command(&args, &dir.join("stats"));
    cmd.current_dir(dir).env("PYTHONPATH", dir.join("stub")).env("FAKE_CUDART", fakes().libcudart());
    configure(&mut cmd);
    let out = cmd.output().expect("run cupool check");
    let doc = fs::read_to_string(&findings).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or(Value::Null);
    (out, doc)
}

/// How a run ended, for assertion messages: its status and what it printed.
pub fn show_run(out: &Output) -> String {
    format!("status {:?}\n{}{}", out.status.code(), stdout_of(out), stderr_of(out))
}

/// The `<stem>.*.json` files beside the logs of the newest run in `logs`, parsed.
pub fn sidecar_docs(logs: &Path, stem: &str) -> Vec<Value> {
    let prefix = format!("{stem}.");
    let mut names: Vec<PathBuf> =
        fs::read_dir(run_dir(logs)).map(|rd| rd.map(|e| e.unwrap().path()).collect()).unwrap_or_default();
    names.retain(|p| p.file_name().unwrap().to_string_lossy().starts_with(&prefix));
    names.sort();
    names.iter().map(|p| serde_json::from_str(&fs::read_to_string(p).unwrap()).expect("one JSON document")).collect()
}

/// The Python the tests run: `$PYTHON`, else `python3`.
pub fn python_program() -> String {
    std::env::var("PYTHON").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into())
}

/// The number (from 1) of the first line of `text` that holds `marker`.
pub fn line_of(text: &str, marker: &str) -> u64 {
    text.lines().position(|l| l.contains(marker)).expect("the marker is in the text") as u64 + 1
}
