//! JAX's live arrays under `cupool check` on the CPU: a real JAX (its CPU
//! backend; on a GPU the arrays are the same objects) in a program that
//! also allocates through the fake CUDA runtime, so that its process has a
//! cupool log. The carried `sitecustomize` hands `jax` to
//! `cupool.jax_history`, which samples the live arrays and writes
//! `cupool-jax.<pid>.json`; the check judges growth from the arrays and
//! names the line that made the ones kept. JAX comes from a virtualenv
//! this test makes in `target/jax-tools/` (pip, from PyPI, once), or
//! `CUPOOL_TEST_PYTHON`.
//! `cargo test --release --test jax_history`
mod support;

use serde_json::Value;
use std::fs;
use std::path::Path;
use std::process::Output;
use support::*;

const REQUIREMENTS: &[&str] = &["jax>=0.4,<1"];

/// A training-like loop of JAX arrays, one step a phase, that allocates
/// its staging buffer through CUDA (the fake runtime) once; with `LEAK`,
/// it keeps each step's output in a list.
const PROGRAM: &str = r#"
import ctypes, os, time
import jax, jax.numpy as jnp

ctypes.CDLL(os.environ["FAKE_CUDART"], mode=os.RTLD_GLOBAL)
_process = ctypes.CDLL(None)
_process.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
staging = ctypes.c_void_p()
assert _process.cudaMalloc(ctypes.byref(staging), 1 << 20) == 0
_process.cudaFree.argtypes = [ctypes.c_void_p]
mark = _process.cupool_mark
mark.argtypes = [ctypes.c_char_p]

kept = []
x = jnp.ones((128, 128))
for step in range(40):
    mark(b"step %d" % step)
    y = (x * step).sum()
    if os.environ.get("LEAK"):
        kept.append(x * step)  # KEPT
    time.sleep(0.02)
mark(b"done")
_process.cudaFree(staging)
"#;

/// `cupool check --json` of `python script` in `dir`, its logs in `dir/name`,
/// with `flags` and `env`: the output, its stderr and the growth findings.
fn check_jax(
    python: &Path,
    dir: &Path,
    script: &str,
    name: &str,
    flags: &[&str],
    env: &[(&str, &str)],
) -> (Output, String, Vec<Value>) {
    let (logs, json) = (dir.join(name), dir.join(format!("{name}.json")));
    let mut args = vec!["check", "--log-dir", path_str(&logs), "--json", path_str(&json)];
    args.extend_from_slice(flags);
    args.push("--");
    let mut cmd = cupool_command(&args, dir);
    cmd.arg(python).arg(script).current_dir(dir).env("FAKE_CUDART", fakes().libcudart()).envs(env.iter().copied());
    let out = cmd.output().expect("run cupool check");
    let err = stderr_of(&out);
    let doc: Value = serde_json::from_str(&fs::read_to_string(&json).unwrap()).unwrap();
    let growth = doc["findings"].as_array().unwrap().iter().filter(|f| f["kind"] == "growth").cloned().collect();
    (out, err, growth)
}

/// The frame a finding points the user at.
fn user_frame(finding: &Value) -> &Value {
    &finding["frames"][finding["user_frame"].as_u64().unwrap() as usize]
}

#[test]
fn arrays_kept_step_after_step_are_found_at_their_line_and_a_clean_loop_passes() {
    let python = python_with("jax-tools", REQUIREMENTS);
    let dir = scratch_dir("jax-history");
    fs::write(dir.join("prog.py"), PROGRAM).unwrap();
    let line = PROGRAM.lines().position(|l| l.contains("# KEPT")).unwrap() + 1;
    for leak in [true, false] {
        let name = if leak { "leak" } else { "clean" };
        let env: &[(&str, &str)] = if leak { &[("LEAK", "1")] } else { &[] };
        let (out, err, growth) = check_jax(&python, &dir, "prog.py", name, &["-o", "jax_history_ms=5"], env);
        let histories: Vec<String> = fs::read_dir(run_dir(&dir.join(name)))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        assert!(histories.iter().any(|n| n.starts_with("cupool-jax.")), "leak {leak}: {histories:?}\n{err}");
        if leak {
            assert_eq!(out.status.code(), Some(23), "{err}");
            assert_eq!(growth.len(), 1, "{err}");
            assert_eq!(growth[0]["what"], "JAX (array)", "{err}");
            let at = user_frame(&growth[0]);
            assert_eq!(
                (at["file"].as_str().unwrap().ends_with("prog.py"), at["line"].as_u64()),
                (true, Some(line as u64)),
                "{err}"
            );
        } else {
            assert_eq!(out.status.code(), Some(0), "{err}");
            assert!(growth.is_empty(), "{err}");
        }
    }
}

/// A loop far faster than the sampling (default period) that keeps an
/// array a step. Marked with `cupool.mark()`, the recorder samples at each
/// mark and the leak is found at its line; unmarked, the arrays are first
/// seen together, which set-up (a model's parameters) gives as well: the
/// check passes and says why it could not judge them.
const FAST: &str = r#"
import ctypes, os
import jax, jax.numpy as jnp
import cupool

ctypes.CDLL(os.environ["FAKE_CUDART"], mode=os.RTLD_GLOBAL)
_process = ctypes.CDLL(None)
_process.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
staging = ctypes.c_void_p()
assert _process.cudaMalloc(ctypes.byref(staging), 1 << 20) == 0
_process.cudaFree.argtypes = [ctypes.c_void_p]

params = [jnp.full((64, 64), float(i)) for i in range(30)]  # PARAMS
kept = []
x = jnp.ones((64, 64))
for step in range(30):
    if os.environ.get("MARK"):
        cupool.mark("step %d" % step)
    x = x * 0.5 + params[step]
    kept.append(x + 1.0)  # KEPT
x.block_until_ready()
_process.cudaFree(staging)
"#;

#[test]
fn a_loop_faster_than_the_sampling_is_judged_at_its_marks_and_never_guessed() {
    let python = python_with("jax-tools", REQUIREMENTS);
    let dir = scratch_dir("jax-fast");
    fs::write(dir.join("fast.py"), FAST).unwrap();
    let line = FAST.lines().position(|l| l.contains("# KEPT")).unwrap() + 1;
    for marked in [true, false] {
        let name = if marked { "marked" } else { "unmarked" };
        let env: &[(&str, &str)] = if marked { &[("MARK", "1")] } else { &[] };
        let (out, err, growth) = check_jax(&python, &dir, "fast.py", name, &[], env);
        if marked {
            assert_eq!(out.status.code(), Some(23), "{err}");
            assert_eq!(growth.len(), 1, "{err}");
            assert_eq!(user_frame(&growth[0])["line"].as_u64(), Some(line as u64), "{err}");
        } else {
            assert_eq!(out.status.code(), Some(0), "{err}");
            assert!(growth.is_empty(), "{err}");
            assert!(err.contains("in one sample") && err.contains("cupool.mark()"), "{err}");
        }
    }
}

/// A record bounded by `jax_history`: a clean loop's record wraps in a ring
/// of 20 events, says so, and the check passes and names the option.
#[test]
fn the_record_keeps_its_last_events_in_bounded_memory() {
    let python = python_with("jax-tools", REQUIREMENTS);
    let dir = scratch_dir("jax-ring");
    fs::write(dir.join("prog.py"), PROGRAM).unwrap();
    let flags = ["-o", "jax_history_ms=5", "-o", "jax_history=20"];
    let (out, err, growth) = check_jax(&python, &dir, "prog.py", "ring", &flags, &[]);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(growth.is_empty(), "{err}");
    let records = sidecar_docs(&dir.join("ring"), "cupool-jax");
    assert_eq!(records.len(), 1, "{err}");
    let device = &records[0]["devices"][0];
    assert_eq!((&records[0]["max_entries"], &device["full"]), (&20.into(), &true.into()), "{}", records[0]);
    assert_eq!(device["events"].as_array().unwrap().len(), 20);
    assert!(err.contains("JAX's record kept only its last 20 events per device (jax_history)"), "{err}");
}
