//! The wheel: builds it with maturin (`pyproject.toml`, as README.md does),
//! installs it into a fresh virtualenv, and runs what it installed: the
//! `cupool` command (which carries the shim and the traces) and the Python
//! module `cupool` inside a program run under it.
//!
//! maturin: `$CUPOOL_MATURIN`, else `maturin` on PATH, else this test makes
//! its own virtualenv in `target/wheel-tools/` (`python3 -m venv`, then
//! `pip install maturin` from PyPI; kept for later runs). When none of that
//! can be had, the test FAILS with the reason: it never passes without having
//! built and tried the wheel.
//! `cargo test --release --test wheel`
mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use support::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python3() -> String {
    std::env::var("PYTHON").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into())
}

/// A virtualenv at `dir`, made with `python3 -m venv`.
fn venv(dir: &Path) -> PathBuf {
    let _ = fs::remove_dir_all(dir);
    run_ok(
        Command::new(python3()).args(["-m", "venv"]).arg(dir),
        "python3 -m venv (on Debian: apt-get install python3-venv)",
    );
    dir.join("bin")
}

fn maturin() -> PathBuf {
    if let Some(p) = std::env::var_os("CUPOOL_MATURIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let on_path = Command::new("maturin").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if on_path.is_ok_and(|s| s.success()) {
        return PathBuf::from("maturin");
    }
    let tools = target_dir().join("wheel-tools");
    let bin = tools.join("bin").join("maturin");
    let ready = tools.join(".maturin-installed");
    if ready.exists() && bin.exists() {
        return bin;
    }
    let vbin = venv(&tools);
    run_ok(
        Command::new(vbin.join("pip")).args(["install", "--quiet", "--disable-pip-version-check", "maturin>=1.5,<2"]),
        "pip install maturin (needs PyPI; or put maturin on PATH, or set CUPOOL_MATURIN)",
    );
    fs::write(&ready, b"").unwrap();
    bin
}

/// `maturin build` for this test's cargo profile, sharing `target/`.
fn build_wheel(out_dir: &Path) -> PathBuf {
    // The test binary lies in target/<profile dir>/deps/.
    let exe = std::env::current_exe().unwrap();
    let profile = match exe.ancestors().nth(2).and_then(|d| d.file_name()).and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(name) => name.to_string(),
        None => "release".to_string(),
    };
    run_ok(
        Command::new(maturin())
            .current_dir(root())
            .args(["build", "--quiet", "--profile", &profile, "--target-dir"])
            .arg(target_dir())
            .arg("--out")
            .arg(out_dir)
            .env_remove("CUPOOL_NO_EMBED"),
        "maturin build",
    );
    let wheels: Vec<PathBuf> = fs::read_dir(out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    assert_eq!(wheels.len(), 1, "one wheel in {}: {wheels:?}", out_dir.display());
    wheels[0].clone()
}

/// A command from the virtualenv, with the fake CUDA environment, a private
/// cache and nothing of cupool's inherited.
fn venv_command(exe: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.current_dir(dir)
        .env_remove("LD_PRELOAD")
        .env_remove("CUPOOL_OPTIONS")
        .env_remove("CUPOOL_LIB")
        .env_remove("CUPOOL_TRACES")
        .env_remove("PYTHONPATH")
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .envs(fakes().env())
        .env("FAKE_CUDA_STATS", dir.join(FAKE_STATS_FILE));
    cmd
}

/// Runs under `cupool run`: allocates through the fake CUDA runtime with
/// ctypes and prints what the module `cupool` reports.
const UNDER_CUPOOL: &str = r#"
import ctypes, sys, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import cupool
    rt = ctypes.CDLL(sys.argv[1])
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    MIB = 1 << 20
    def malloc(n):
        p = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(p), n) == 0
        return p
    print("available=%d" % cupool.available())
    print("api_version=%d" % cupool.api_version())
    before = cupool.memory_stats()
    print("before=%d" % before["allocated_bytes.all.current"])
    a = malloc(MIB)
    s = cupool.memory_stats()
    print("allocated=%d" % s["allocated_bytes.all.current"])
    print("allocations=%d" % s["allocation.all.current"])
    print("reserved_ok=%d" % (cupool.memory_reserved() >= MIB))
    reports = []
    @cupool.track_peak(report=reports.append)
    def work():
        b = malloc(4 * MIB)
        rt.cudaFree(b)
        return "done"
    with cupool.phase("epoch 3"):
        print("work=%s" % work())
    print("last_peak=%d" % work.last_peak)
    print("reported=%d" % reports[0].peak_bytes)
    print("report_names_work=%d" % ("work" in str(reports[0])))
    print("max_allocated=%d" % cupool.max_memory_allocated())
    cupool.mark("done")
    rt.cudaFree(a)
    print("after_free=%d" % cupool.memory_allocated())
    try:
        cupool.memory_stats(device=-1)
        print("bad_device=accepted")
    except ValueError:
        print("bad_device=ValueError")
print("warnings=%d" % len(caught))
"#;

/// Runs without cupool: everything is a zero-returning no-op, one warning.
const OUTSIDE: &str = r#"
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import cupool
    print("available=%d" % cupool.available())
    total = sum(cupool.memory_stats().values()) + cupool.max_memory_allocated() + cupool.memory_reserved()
    cupool.reset_peak_memory_stats()
    @cupool.track_peak
    def f():
        return 7
    with cupool.phase("p"):
        print("f=%d" % f())
    print("total=%d" % total)
    print("stats_keys=%d" % len(cupool.memory_stats()))
print("warnings=%d" % len(caught))
print("names_cupool_run=%d" % all("cupool run" in str(w.message) for w in caught))
"#;

#[test]
fn the_wheel_installs_a_working_cupool_and_python_module() {
    let dir = scratch_dir("wheel");
    let wheel = build_wheel(&dir.join("dist"));
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with(concat!("cupool-", env!("CARGO_PKG_VERSION"), "-")), "{name}");

    // A fresh virtualenv; the wheel needs nothing from PyPI.
    let bin = venv(&dir.join("venv"));
    run_ok(
        Command::new(bin.join("pip"))
            .args(["install", "--quiet", "--no-index", "--disable-pip-version-check"])
            .arg(&wheel),
        "pip install the wheel",
    );
    let cupool = bin.join("cupool");
    assert!(cupool.is_file(), "the wheel installs {}", cupool.display());

    let out = run_ok(venv_command(&cupool, &dir).arg("--version"), "cupool --version");
    assert!(stdout_of(&out).contains(env!("CARGO_PKG_VERSION")), "{}", stdout_of(&out));
    let out = run_ok(venv_command(&bin.join("python"), &dir).args(["-m", "cupool", "--version"]), "python -m cupool");
    assert!(stdout_of(&out).contains(env!("CARGO_PKG_VERSION")), "{}", stdout_of(&out));

    // The bundled traces travel in the binary.
    let out = run_ok(venv_command(&cupool, &dir).arg("replay"), "cupool replay");
    let stdout = stdout_of(&out);
    for trace in ["cupy.json.gz", "gpt2.json.gz", "resnet18.json.gz", "torch-transformer.json.gz"] {
        assert!(stdout.lines().any(|l| l.starts_with(trace)), "{trace} missing:\n{stdout}");
    }

    // So does the shim: a fake CUDA program under it writes its log.
    let logs = dir.join("logs");
    let prog = fakes().prog("prog_runtime");
    let out = run_ok(
        venv_command(&cupool, &dir).args(["run", "-v", "-q", "--log-dir"]).arg(&logs).arg("--").arg(&prog),
        "cupool run prog_runtime",
    );
    assert!(stderr_of(&out).contains("embedded in cupool, cached"), "{}", stderr_of(&out));
    assert!(dir.join("cache").join("cupool").is_dir());
    let written = read_logs(&logs);
    assert_eq!(written.len(), 1, "{:?}", log_files(&logs));
    assert_valid_log(&written[0], "prog_runtime");

    // The Python module under cupool.
    let script = dir.join("under.py");
    fs::write(&script, UNDER_CUPOOL).unwrap();
    let pylogs = dir.join("pylogs");
    let out = run_ok(
        venv_command(&cupool, &dir)
            .args(["run", "-q", "--log-dir"])
            .arg(&pylogs)
            .arg("--")
            .arg(bin.join("python"))
            .arg(&script)
            .arg(fakes().libcudart()),
        "python under cupool run",
    );
    let stdout = stdout_of(&out);
    const MIB: u64 = 1 << 20;
    let v = |k: &str| stdout_value(&stdout, k).unwrap_or_else(|| panic!("no {k}= in:\n{stdout}{}", stderr_of(&out)));
    assert_eq!((v("available"), v("api_version")), (1, 1), "{stdout}");
    assert_eq!((v("before"), v("allocated"), v("allocations"), v("reserved_ok")), (0, MIB, 1, 1), "{stdout}");
    // 1 MiB live when the peaks were reset, plus 4 MiB inside work().
    assert_eq!((v("last_peak"), v("reported"), v("max_allocated")), (5 * MIB, 5 * MIB, 5 * MIB), "{stdout}");
    assert_eq!((v("report_names_work"), v("after_free"), v("warnings")), (1, 0, 0), "{stdout}");
    assert!(stdout.contains("work=done") && stdout.contains("bad_device=ValueError"), "{stdout}");
    let pylog = read_logs(&pylogs);
    assert_eq!(pylog.len(), 1, "{:?}", log_files(&pylogs));
    assert_eq!(events(&pylog[0], "alloc").len(), 2, "the two cudaMalloc calls: {}", pylog[0]["events"]);

    // The Python module outside cupool: no-ops, zeros, one warning.
    let script = dir.join("outside.py");
    fs::write(&script, OUTSIDE).unwrap();
    let out = run_ok(venv_command(&bin.join("python"), &dir).arg(&script), "python outside cupool");
    let stdout = stdout_of(&out);
    let v = |k: &str| stdout_value(&stdout, k).unwrap_or_else(|| panic!("no {k}= in:\n{stdout}"));
    assert_eq!((v("available"), v("f"), v("total"), v("stats_keys")), (0, 7, 0, 9), "{stdout}");
    assert_eq!((v("warnings"), v("names_cupool_run")), (1, 1), "{stdout}");
}

/// Each of the module's entry points, outside cupool: the one warning points
/// at the program's line that called it, not at cupool's own file (nor at
/// contextlib's, for `with cupool.phase(...)`).
const WARNING_SITES: &str = r#"
import sys, warnings
import cupool
def with_phase():
    with cupool.phase("p"):  # line 4
        pass
@cupool.track_peak
def tracked():
    return 1
calls = [
    ("memory_stats", lambda: cupool.memory_stats(), 10),
    ("memory_allocated", lambda: cupool.memory_allocated(), 11),
    ("reset_peak_memory_stats", lambda: cupool.reset_peak_memory_stats(), 12),
    ("api_version", lambda: cupool.api_version(), 13),
    ("mark", lambda: cupool.mark("m"), 14),
    ("phase_begin", lambda: cupool.phase_begin("p"), 15),
    ("phase", with_phase, 4),
    ("track_peak", tracked, 23),
]
for name, call, line in calls:
    cupool._warned = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()  # line 23
    where = [(w.filename == __file__, w.lineno) for w in caught]
    print("%s %s" % (name, "ok" if where == [(True, line)] else "points at %r" % [(w.filename, w.lineno) for w in caught]))
"#;

#[test]
fn module_warnings_point_at_the_callers_line() {
    let dir = scratch_dir("wheel-warnings");
    let script = dir.join("sites.py");
    fs::write(&script, WARNING_SITES.trim_start_matches('\n')).unwrap();
    let out = run_ok(
        Command::new(python3()).arg(&script).env("PYTHONPATH", root().join("python")).env_remove("LD_PRELOAD"),
        "python3 sites.py",
    );
    let stdout = stdout_of(&out);
    assert_eq!(stdout.lines().count(), 8, "{stdout}{}", stderr_of(&out));
    for line in stdout.lines() {
        assert!(line.ends_with(" ok"), "{line}\n{stdout}");
    }
}
