//! `cupool check` and CuPy's arrays, on the CPU: a stand-in `cupy` package
//! (below) with a memory pool of its own that takes its chunks from the
//! fake CUDA runtime through the shim, and the allocator functions the
//! recorder uses, as CuPy has them (`cupy.cuda.memory.get_allocator`,
//! `set_allocator`, `UnownedMemory`, `MemoryPointer`). Through the carried
//! `sitecustomize.py` and `cupool.cupy_history`, the real code path: an
//! array kept per step is found at the line that makes it, where the pool
//! grew at another; a clean loop passes; `cupy_history=0`, a program
//! that sets its own allocator and a CuPy the recorder cannot wrap leave
//! the log to judge alone.
//! `cargo test --test cupy_history`
mod support;

use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use support::*;

/// `cupy/__init__.py`: `cupy.empty(nbytes)` is an array from the current
/// allocator, the pool's unless the program set another (as CuPy's
/// `__init__` sets its default pool's).
const CUPY_INIT: &str = r#"
from . import cuda

__version__ = "0.0+stub"


class ndarray(object):
    __slots__ = ("data", "nbytes")

    def __init__(self, nbytes):
        self.nbytes = nbytes
        self.data = cuda.memory.get_allocator()(nbytes)


def empty(nbytes):
    return ndarray(nbytes)


cuda.set_allocator(cuda.memory.MemoryPool().malloc)
"#;

/// `cupy/fft/_cache.py`: a plan cache of 32 entries (CuPy's keeps 16 by
/// default) made at the first FFT, which empties itself in a weakref
/// finalizer at exit, as CuPy's does.
const CUPY_FFT_CACHE: &str = r#"
import weakref


class _Node(object):
    def __init__(self, key, plan=None):
        self.key, self.plan = key, plan


def _clear(nodes):
    for n in nodes.values():
        n.plan = None
    nodes.clear()


class PlanCache(object):
    def __init__(self, size):
        self.size, self.nodes = size, {}
        weakref.finalize(self, _clear, self.nodes)

    def add(self, key, plan):
        self.nodes[key] = _Node(key, plan)
        for old in sorted(self.nodes)[: -self.size]:
            self.nodes.pop(old).plan = None


_caches = []


def get_plan_cache():
    if not _caches:
        _caches.append(PlanCache(32))
    return _caches[0]
"#;

const CUPY_CUDA: &str = r#"
from . import cufft, memory
from .memory import get_allocator, set_allocator
"#;

/// `cupy/cuda/cufft.py`: a plan takes its work area from the allocator
/// when it is made and holds it, as CuPy's do.
const CUPY_CUFFT: &str = r#"
from . import memory


class Plan1d(object):
    def __init__(self, nx):
        self.nx = nx
        self.work_area = memory.get_allocator()(8 * nx)
"#;

/// `cupy/cuda/memory.py`: a pool that bump-allocates in 64 KiB chunks from
/// the fake runtime and keeps freed blocks by size, and the direct
/// allocator `set_allocator(None)` restores.
const CUPY_MEMORY: &str = r#"
import ctypes
import os

CHUNK = 64 * 1024
_lib = []


def _runtime():
    if not _lib:
        ctypes.CDLL(os.environ["FAKE_CUDART"], mode=os.RTLD_GLOBAL)
        process = ctypes.CDLL(None)
        process.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        process.cudaFree.argtypes = [ctypes.c_void_p]
        _lib.append(process)
    return _lib[0]


def _device_malloc(size):
    p = ctypes.c_void_p()
    assert _runtime().cudaMalloc(ctypes.byref(p), size) == 0
    return p.value


class UnownedMemory(object):
    def __init__(self, ptr, size, owner, device_id=-1):
        if os.environ.get("BROKEN") == "1":
            raise TypeError("a CuPy whose UnownedMemory takes other arguments")
        self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id


class MemoryPointer(object):
    def __init__(self, mem, offset):
        self.mem, self.ptr, self.device_id = mem, mem.ptr + offset, mem.device_id


class Memory(object):
    def __init__(self, size):
        self.ptr, self.size, self.device_id = _device_malloc(size), size, 0

    def __del__(self):
        try:
            _runtime().cudaFree(self.ptr)
        except Exception:
            pass


class PooledMemory(object):
    def __init__(self, pool, ptr, size):
        self.pool, self.ptr, self.size, self.device_id = pool, ptr, size, 0

    def __del__(self):
        self.pool.free.setdefault(self.size, []).append(self.ptr)


class MemoryPool(object):
    def __init__(self):
        self.free, self.chunk = {}, [0, 0]

    def malloc(self, size):
        size = (size + 511) // 512 * 512
        kept = self.free.get(size)
        if kept:
            ptr = kept.pop()
        else:
            if self.chunk[0] + size > self.chunk[1]:
                base = _device_malloc(max(CHUNK, size))
                self.chunk[:] = [base, base + max(CHUNK, size)]
            ptr = self.chunk[0]
            self.chunk[0] += size
        return MemoryPointer(PooledMemory(self, ptr, size), 0)


def _malloc(size):
    return MemoryPointer(Memory(size), 0)


_current = [_malloc]


def get_allocator():
    return _current[0]


def set_allocator(allocator=None):
    _current[0] = _malloc if allocator is None else allocator
"#;

/// The loop: a temporary of one of four sizes comes first, so that the pool
/// also grows at its line; with `LEAK=1` every step's output is kept; with
/// `FFT=1` the plan cache gets a new plan every step, with `FFT=kept` the
/// program keeps one itself. With `OWN=1` the program turns the pool off
/// after importing CuPy, as scripts do with `cupy.cuda.set_allocator(None)`.
/// With `DEEP=1` both arrays come from the same call chain of a library
/// (`deeplib`), deeper than a small `python_depth`. A step takes 50 ms, as
/// real ones do.
const TRAIN: &str = r#"import os
import time

import cupy

if os.environ.get("OWN") == "1":
    cupy.cuda.set_allocator(None)
kept, plans = [], {}
for step in range(40):
    time.sleep(0.05)
    if os.environ.get("FFT") == "1":
        # A new FFT length every step: the plan cache fills.
        import cupy.fft

        cupy.fft.get_plan_cache().add(step, cupy.cuda.cufft.Plan1d(1024 + step))
    if os.environ.get("FFT") == "kept":
        plans[step] = cupy.cuda.cufft.Plan1d(1024 + step)  # PLAN
    if os.environ.get("DEEP") == "1":
        import deeplib

        x = deeplib.nest(6, 4096 + 512 * (step % 4))
        out = deeplib.nest(6, 16384)  # DEEP
    else:
        x = cupy.empty(4096 + 512 * (step % 4))
        out = cupy.empty(16384)  # ALLOCATED
    if os.environ.get("LEAK") == "1":
        kept.append(out)
    del x
mem = out.data.mem
print("result: ok steps=40 kept=%d memory=%s pool=%s" % (len(kept), type(mem).__name__, hasattr(mem, "pool")))
"#;

/// The line of `TRAIN` marked ALLOCATED.
fn planted_line() -> u64 {
    line_of(TRAIN, "# ALLOCATED")
}

/// A directory with the stand-in cupy and the script.
fn project(name: &str) -> PathBuf {
    let dir = scratch_dir(name);
    stand_in(&dir.join("stub"));
    fs::write(dir.join("train.py"), TRAIN).unwrap();
    dir
}

/// The stand-in cupy in `root`.
fn stand_in(root: &Path) {
    fs::create_dir_all(root.join("cupy/cuda")).unwrap();
    fs::write(root.join("cupy/__init__.py"), CUPY_INIT).unwrap();
    fs::write(root.join("cupy/cuda/__init__.py"), CUPY_CUDA).unwrap();
    fs::write(root.join("cupy/cuda/memory.py"), CUPY_MEMORY).unwrap();
    fs::write(root.join("cupy/cuda/cufft.py"), CUPY_CUFFT).unwrap();
    fs::create_dir_all(root.join("cupy/fft")).unwrap();
    fs::write(root.join("cupy/fft/__init__.py"), "from ._cache import get_plan_cache\n").unwrap();
    fs::write(root.join("cupy/fft/_cache.py"), CUPY_FFT_CACHE).unwrap();
}

/// `cupool check --json` of `python3 train.py` in `dir`, with `env` and `flags`.
fn check(dir: &Path, flags: &[&str], env: &[(&str, &str)]) -> (Output, Value) {
    check_python(dir, flags, &[&python_program(), "train.py"], |cmd| {
        cmd.envs(env.iter().copied());
    })
}

/// The `cupool-cupy.*.json` files in the run's own directory.
fn histories(dir: &Path) -> Vec<Value> {
    sidecar_docs(&dir.join("logs"), "cupool-cupy")
}

#[test]
fn an_array_kept_per_step_is_found_at_its_line() {
    let dir = project("cupy-leak");
    let (out, doc) = check(&dir, &[], &[("LEAK", "1")]);
    assert_eq!(out.status.code(), Some(23), "{}", show_run(&out));
    assert_eq!(
        stdout_of(&out),
        "result: ok steps=40 kept=40 memory=RecordedMemory pool=True\n",
        "the program's output"
    );
    let failing = failing_findings(&doc);
    assert_eq!(failing.len(), 1, "{}", show_run(&out));
    let f = failing[0];
    assert_eq!((f["kind"].as_str(), f["what"].as_str()), (Some("growth"), Some("CuPy (array)")), "{f}");
    // The stand-in's own Python frames first (CuPy's are as real), then the program's line.
    assert_eq!(finding_places(f).last(), Some(&format!("train.py:{}", planted_line())), "{f}");
    assert_eq!(f["growth"]["bytes_per_phase"], 16384, "{f}");
    let err = stderr_of(&out);
    let frame = format!(" <module> {}:{} [python]\n", dir.join("train.py").display(), planted_line());
    assert!(err.contains(&frame), "{err}");
    assert!(!err.contains("CuPy history:"), "the recorder is silent: {err}");
    let h = histories(&dir);
    assert_eq!(h.len(), 1, "{}", show_run(&out));
    assert_eq!(
        (&h[0]["schema"], &h[0]["version"], &h[0]["complete"]),
        (&"cupool-cupy".into(), &1.into(), &true.into())
    );
    // Every array made, and every one let go of, at its own address.
    let events = h[0]["devices"][0]["events"].as_array().unwrap();
    let count = |action: &str| events.iter().filter(|e| e[0] == action).count();
    assert_eq!((count("alloc"), count("free_requested")), (80, 40), "{}", h[0]);
    // cupool merge of the log directory reads the record beside the log.
    let merged = run_cupool(&["merge", path_str(&dir.join("logs"))], &dir.join("stats"));
    assert_eq!(merged.status.code(), Some(23), "{}", show_run(&merged));
    assert!(stderr_of(&merged).contains(&frame), "{}", show_run(&merged));
}

#[test]
fn a_clean_loop_passes_with_the_pool_on() {
    let dir = project("cupy-clean");
    let (out, doc) = check(&dir, &[], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", show_run(&out));
    assert_eq!(stdout_of(&out), "result: ok steps=40 kept=0 memory=RecordedMemory pool=True\n");
    assert!(failing_findings(&doc).is_empty(), "{}", show_run(&out));
    assert_eq!(histories(&dir).len(), 1);
}

#[test]
fn without_the_record_the_log_is_judged_alone() {
    // Not recorded: the pool's chunks, at whichever line made the pool grow.
    let dir = project("cupy-off");
    let (out, doc) = check(&dir, &["-o", "cupy_history=0"], &[("LEAK", "1")]);
    assert_eq!(stdout_of(&out), "result: ok steps=40 kept=40 memory=PooledMemory pool=True\n", "{}", show_run(&out));
    assert!(histories(&dir).is_empty());
    assert_eq!(out.status.code(), Some(23), "{}", show_run(&out));
    let failing = failing_findings(&doc);
    assert_eq!(failing[0]["what"], "cudaMalloc (device)", "{}", show_run(&out));
    // The program sets its own allocator after the record began: the record
    // is not written, and the log, every array's own cudaMalloc now, finds
    // the kept ones at their line.
    let dir = project("cupy-own");
    let (out, doc) = check(&dir, &[], &[("LEAK", "1"), ("OWN", "1")]);
    assert_eq!(stdout_of(&out), "result: ok steps=40 kept=40 memory=Memory pool=False\n", "{}", show_run(&out));
    assert!(histories(&dir).is_empty());
    assert_eq!(out.status.code(), Some(23), "{}", show_run(&out));
    let failing = failing_findings(&doc);
    assert_eq!(failing.len(), 1, "{}", show_run(&out));
    assert_eq!(failing[0]["what"], "cudaMalloc (device)", "{}", show_run(&out));
    assert!(finding_places(failing[0]).contains(&format!("train.py:{}", planted_line())), "{}", failing[0]);
}

#[test]
fn a_cupy_the_recorder_cannot_wrap_is_left_as_it_is() {
    // Every allocation fails to be wrapped: the program gets the pool's
    // memory as without the recorder, nothing is written, and the clean
    // loop passes (its arrays' frees, never seen, must not look kept).
    let dir = project("cupy-broken");
    let (out, doc) = check(&dir, &["-o", "verbosity=2"], &[("BROKEN", "1")]);
    assert_eq!(stdout_of(&out), "result: ok steps=40 kept=0 memory=PooledMemory pool=True\n", "{}", show_run(&out));
    assert_eq!(out.status.code(), Some(0), "{}", show_run(&out));
    assert!(failing_findings(&doc).is_empty(), "{}", show_run(&out));
    assert!(histories(&dir).is_empty());
    assert!(
        stderr_of(&out).contains("CuPy history: an allocation could not be recorded (TypeError("),
        "{}",
        show_run(&out)
    );
}

#[test]
fn work_areas_of_fft_plans_held_at_exit_are_a_cache_not_growth() {
    // A new FFT length every step fills a plan cache of 32, each plan with
    // its work area from the allocator: the record marks the 32 the cache
    // still holds at exit `cached` (the cache empties itself at exit, after
    // the record looked), and the clean loop passes.
    let dir = project("cupy-fft");
    let (out, doc) = check(&dir, &[], &[("FFT", "1")]);
    assert_eq!(out.status.code(), Some(0), "{}", show_run(&out));
    assert!(failing_findings(&doc).is_empty(), "{}", show_run(&out));
    let h = histories(&dir);
    let events = h[0]["devices"][0]["events"].as_array().unwrap();
    assert_eq!(events.iter().filter(|e| e[0] == "cached").count(), 32, "{}", h[0]);
}

#[test]
fn fft_plans_the_program_keeps_are_its_own() {
    // Plans kept by the program, not by CuPy's cache: a growth leak at the
    // line that makes them.
    let dir = project("cupy-plans");
    let (out, doc) = check(&dir, &[], &[("FFT", "kept")]);
    assert_eq!(out.status.code(), Some(23), "{}", show_run(&out));
    let failing = failing_findings(&doc);
    assert_eq!(failing.len(), 1, "{}", show_run(&out));
    let line = line_of(TRAIN, "# PLAN");
    assert_eq!(finding_places(failing[0]).last(), Some(&format!("train.py:{line}")), "{}", failing[0]);
}

#[test]
fn the_record_keeps_its_last_events_in_bounded_memory() {
    // 160 events of a clean loop in a ring of 50: the record says it wrapped,
    // the check says it judged the last 50, and the loop passes.
    let dir = project("cupy-ring");
    let (out, doc) = check(&dir, &["-o", "cupy_history=50"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", show_run(&out));
    assert!(failing_findings(&doc).is_empty(), "{}", show_run(&out));
    let h = histories(&dir);
    assert_eq!((&h[0]["max_entries"], &h[0]["devices"][0]["full"]), (&50.into(), &true.into()), "{}", h[0]);
    assert_eq!(h[0]["devices"][0]["events"].as_array().unwrap().len(), 50);
    let note = "CuPy's record kept only its last 50 events per device (cupy_history)";
    assert!(stderr_of(&out).contains(note), "{}", show_run(&out));
}

#[test]
fn stacks_alike_through_libraries_are_told_apart_by_the_program_past_them() {
    // Both arrays of a step come through the same library frames, deeper
    // than python_depth, from two lines of the program: each is named by its
    // own line, however the recorder keeps the stacks it has seen.
    let dir = project("cupy-deep");
    let lib = dir.join("lib/site-packages");
    stand_in(&lib);
    fs::write(
        lib.join("deeplib.py"),
        "import cupy\n\n\ndef nest(k, n):\n    return nest(k - 1, n) if k else cupy.empty(n)\n",
    )
    .unwrap();
    let (out, doc) = check_python(&dir, &["-o", "python_depth=4"], &[&python_program(), "train.py"], |cmd| {
        cmd.envs([("LEAK", "1"), ("DEEP", "1")]).env("PYTHONPATH", &lib);
    });
    assert_eq!(out.status.code(), Some(23), "{}", show_run(&out));
    let failing = failing_findings(&doc);
    assert_eq!(failing.len(), 1, "{}", show_run(&out));
    let deep = format!("train.py:{}", line_of(TRAIN, "# DEEP"));
    assert_eq!(finding_places(failing[0]).last(), Some(&deep), "{}", failing[0]);
    assert_eq!(failing[0]["growth"]["bytes_per_phase"], 16384, "{}", failing[0]);
}
