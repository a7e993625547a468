//! `cupool check` and PyTorch's allocation history, on the CPU: a stand-in
//! `torch` package (below) with a caching allocator of its own that takes
//! its segments from the fake CUDA runtime through the shim and records its
//! tensors the way PyTorch's `_record_memory_history` does, exposing the
//! functions the recorder calls (`torch.cuda._lazy_call`,
//! `torch.cuda.memory._record_memory_history`, `_snapshot`,
//! `get_allocator_backend`). Through the carried `sitecustomize.py` and
//! `cupool.torch_history`, the real code path: a tensor kept per step is
//! found at the line that allocates it; a clean loop passes; the recorder
//! waits for CUDA to start; `torch_history=0`, PyTorch without its cache
//! and an existing `sitecustomize` of the environment behave as they should.
//! `cargo test --test torch_history`
mod support;

use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use support::*;

/// `torch/__init__.py`: `torch.empty(nbytes)` is a tensor from the cache.
const TORCH_INIT: &str = r#"
import sys
from . import cuda

__version__ = "0.0+stub"


class Tensor(object):
    __slots__ = ("addr", "size")

    def __init__(self, addr, size):
        self.addr, self.size = addr, size

    def __del__(self):
        try:
            cuda._free(self)
        except Exception:
            pass


def empty(nbytes):
    cuda._lazy_init()
    return cuda._alloc(nbytes, sys._getframe(1))


def __getattr__(name):
    # PyTorch's lazy submodules: `torch._inductor` is imported on first use.
    if name == "_inductor":
        import importlib

        return importlib.import_module("._inductor", __name__)
    raise AttributeError(name)
"#;

/// `torch/cuda/__init__.py`: lazy initialisation with queued calls, as
/// PyTorch has it, and a caching allocator with 64 KiB segments, which it
/// gives back at exit (PyTorch's are held to the end, and are known to
/// cupool's default suppressions by their module, which the stub has not).
const TORCH_CUDA: &str = r#"
import atexit
import ctypes
import os
import sys

from . import memory

_initialized = False
_queued_calls = []
SEGMENT = 64 * 1024
_blocks = {}
_segment = [0, 0]
_segments = []


def is_initialized():
    return _initialized


def _lazy_call(callable, **kwargs):
    if _initialized:
        callable()
    else:
        _queued_calls.append((callable, "traceback"))


def _lazy_init():
    global _initialized, _malloc
    if _initialized:
        return
    ctypes.CDLL(os.environ["FAKE_CUDART"], mode=os.RTLD_GLOBAL)
    _malloc = ctypes.CDLL(None).cudaMalloc
    _malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    _initialized = True
    atexit.register(_release)
    for call, _ in _queued_calls:
        call()


def _alloc(size, frame):
    import torch

    free = _blocks.get(size)
    if free:
        addr = free.pop()
    else:
        if _segment[0] + size > _segment[1]:
            p = ctypes.c_void_p()
            assert _malloc(ctypes.byref(p), SEGMENT) == 0
            _segment[:] = [p.value, p.value + SEGMENT]
            _segments.append(p.value)
            memory._record("segment_alloc", p.value, SEGMENT, None)
        addr = _segment[0]
        _segment[0] += size
    frames = []
    while frame is not None:
        frames.append({"filename": frame.f_code.co_filename, "line": frame.f_lineno, "name": frame.f_code.co_name})
        frame = frame.f_back
    memory._record("alloc", addr, size, frames)
    return torch.Tensor(addr, size)


def _release():
    free = ctypes.CDLL(None).cudaFree
    free.argtypes = [ctypes.c_void_p]
    for addr in _segments:
        free(addr)


def _free(t):
    memory._record("free_requested", t.addr, t.size, None)
    memory._record("free_completed", t.addr, t.size, None)
    _blocks.setdefault(t.size, []).append(t.addr)
"#;

/// `torch/cuda/memory.py`: the history, in the format of PyTorch's `_snapshot()`.
const TORCH_MEMORY: &str = r#"
import os
import sys
import time

_history = None
_traces = []


def get_allocator_backend():
    return "native"


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, **kwargs):
    global _history
    if not sys.modules["torch.cuda"]._initialized:
        raise RuntimeError("PyTorch would start CUDA here")
    _history = {"enabled": enabled, "context": context, "stacks": stacks, "max_entries": max_entries}
    with open(os.path.join(os.environ["STUB_OUT"], "history.%d" % os.getpid()), "w") as f:
        f.write(repr(sorted(_history.items())))


def _record(action, addr, size, frames):
    if _history is None:
        return
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time.time_ns() // 1000}
    if frames is not None:
        e["frames"] = frames
    _traces.append(e)
    del _traces[: max(0, len(_traces) - _history["max_entries"])]


def _snapshot(device=None, augment_with_fx_traces=False):
    # As PyTorch names frames: it asks whether inductor compiled any of them.
    with open(os.path.join(os.environ["STUB_OUT"], "snapshot-saw-inductor.%d" % os.getpid()), "w") as f:
        f.write(repr(hasattr(sys.modules["torch"], "_inductor")))
    cuda = sys.modules["torch.cuda"]
    segments = [{"device": 0, "address": a, "total_size": cuda.SEGMENT, "blocks": []} for a in cuda._segments]
    return {"segments": segments, "device_traces": [list(_traces)], "allocator_settings": {}}
"#;

/// The training loop: with `LEAK=1` every step's output is kept, with
/// `LEAK=later` until the loop ends. A step
/// takes 50 ms, as real ones take time: a loop over before the program ends
/// by more than its own span and a second is set-up to the check, and a
/// loop of 40 bare steps (a few milliseconds) was that whenever a busy host
/// took over a second to reach the stub's frees at exit.
const TRAIN: &str = r#"import os
import sys
import time

import torch

kept = []
for step in range(40):
    time.sleep(0.05)
    x = torch.empty(4096)
    out = torch.empty(16384)  # ALLOCATED
    if os.environ.get("LEAK") in ("1", "later"):
        kept.append(out)
    del x
if os.environ.get("LEAK") == "later":
    kept.clear()  # kept for the loop's end only
print("result: ok steps=40 kept=%d history=%s" % (len(kept), torch.cuda.memory._history is not None))
"#;

/// The line of `TRAIN` marked ALLOCATED.
fn planted_line() -> u64 {
    line_of(TRAIN, "# ALLOCATED")
}

/// A directory with the stand-in torch, the script and an output directory for the stub.
fn project(name: &str) -> PathBuf {
    let dir = scratch_dir(name);
    fs::create_dir_all(dir.join("stub/torch/cuda")).unwrap();
    fs::write(dir.join("stub/torch/__init__.py"), TORCH_INIT).unwrap();
    fs::write(dir.join("stub/torch/cuda/__init__.py"), TORCH_CUDA).unwrap();
    fs::write(dir.join("stub/torch/cuda/memory.py"), TORCH_MEMORY).unwrap();
    fs::create_dir_all(dir.join("stub/torch/_inductor")).unwrap();
    fs::write(dir.join("stub/torch/_inductor/__init__.py"), "").unwrap();
    fs::write(dir.join("train.py"), TRAIN).unwrap();
    fs::create_dir_all(dir.join("out")).unwrap();
    dir
}

/// `cupool check --json` of `python3 <script>` in `dir`, with `env` and `flags`.
fn check(dir: &Path, script: &str, flags: &[&str], env: &[(&str, &str)]) -> (Output, Value) {
    check_python(dir, flags, &[&python_program(), script], |cmd| {
        cmd.env("STUB_OUT", dir.join("out"))
            .env_remove("PYTORCH_NO_CUDA_MEMORY_CACHING")
            .env_remove("PYTORCH_CUDA_ALLOC_CONF")
            .env_remove("PYTORCH_ALLOC_CONF")
            .envs(env.iter().copied());
    })
}

/// The `cupool-torch.*.json` files in the run's own directory.
fn histories(dir: &Path) -> Vec<Value> {
    sidecar_docs(&dir.join("logs"), "cupool-torch")
}

#[test]
fn a_tensor_kept_per_step_is_found_at_its_line() {
    let dir = project("torch-leak");
    let (out, doc) = check(&dir, "train.py", &[], &[("LEAK", "1")]);
    assert_eq!(out.status.code(), Some(23), "{}", show_run(&out));
    assert_eq!(stdout_of(&out), "result: ok steps=40 kept=40 history=True\n", "the program's output is its own");
    let failing = failing_findings(&doc);
    assert_eq!(failing.len(), 1, "{}", show_run(&out));
    let f = failing[0];
    assert_eq!((f["kind"].as_str(), f["what"].as_str()), (Some("growth"), Some("PyTorch (tensor)")), "{f}");
    assert_eq!(finding_places(f), [format!("train.py:{}", planted_line())], "{f}");
    assert_eq!(f["growth"]["bytes_per_phase"], 16384, "{f}");
    assert_eq!(f["growth"]["phases_from"], "repetition", "{f}");
    assert!(f.get("freed_later").is_none(), "kept to the end: {f}");
    let err = stderr_of(&out);
    let frame = format!("    #0 <module> {}:{} [python]\n", dir.join("train.py").display(), planted_line());
    assert!(err.contains("Growing leak of 16384 byte(s) per phase") && err.contains(&frame), "{err}");
    assert!(!err.contains("PyTorch history:"), "the recorder is silent: {err}");
    // The history: one file of this process, the recorder's settings as asked.
    let h = histories(&dir);
    assert_eq!(h.len(), 1, "{}", show_run(&out));
    assert_eq!(
        (&h[0]["schema"], &h[0]["version"], &h[0]["complete"]),
        (&"cupool-torch".into(), &1.into(), &true.into())
    );
    assert_eq!(h[0]["max_entries"], 200000);
    let pid = h[0]["pid"].as_u64().unwrap();
    // cupool merge of the log directory reads the history beside the log.
    let merged = run_cupool(&["merge", dir.join("logs").to_str().unwrap()], &dir.join("stats"));
    assert_eq!(merged.status.code(), Some(23), "{}", show_run(&merged));
    assert!(stderr_of(&merged).contains(&frame), "{}", show_run(&merged));
    let asked = fs::read_to_string(dir.join("out").join(format!("history.{pid}"))).unwrap();
    assert_eq!(
        asked, "[('context', 'alloc'), ('enabled', 'all'), ('max_entries', 200000), ('stacks', 'python')]",
        "what _record_memory_history was asked"
    );
}

#[test]
fn tensors_kept_for_the_loops_end_are_growth_freed_later() {
    let dir = project("torch-later");
    let (out, doc) = check(&dir, "train.py", &[], &[("LEAK", "later")]);
    assert_eq!(out.status.code(), Some(23), "{}", show_run(&out));
    let failing = failing_findings(&doc);
    assert_eq!(failing.len(), 1, "{}", show_run(&out));
    let f = failing[0];
    assert_eq!((f["kind"].as_str(), f["what"].as_str()), (Some("growth"), Some("PyTorch (tensor)")), "{f}");
    assert_eq!(finding_places(f), [format!("train.py:{}", planted_line())], "{f}");
    assert_eq!(f["freed_later"], true, "{f}");
    assert!(stderr_of(&out).contains("\n  all of it was freed later, before the process ended"), "{}", show_run(&out));
}

#[test]
fn a_clean_loop_passes_with_the_cache_on() {
    let dir = project("torch-clean");
    let (out, doc) = check(&dir, "train.py", &[], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", show_run(&out));
    assert_eq!(stdout_of(&out), "result: ok steps=40 kept=0 history=True\n");
    assert!(failing_findings(&doc).is_empty(), "{}", show_run(&out));
    assert_eq!(histories(&dir).len(), 1);
}

#[test]
fn without_the_history_the_finding_is_where_the_cache_grew() {
    let dir = project("torch-off");
    let (out, doc) = check(&dir, "train.py", &["-o", "torch_history=0"], &[("LEAK", "1")]);
    assert_eq!(out.status.code(), Some(23), "{}", show_run(&out));
    assert_eq!(stdout_of(&out), "result: ok steps=40 kept=40 history=False\n", "not recorded");
    assert!(histories(&dir).is_empty());
    let failing = failing_findings(&doc);
    assert_eq!(failing.len(), 1, "{}", show_run(&out));
    assert_eq!(failing[0]["what"], "cudaMalloc (device)", "the segments, at the cache's cudaMalloc");
    assert!(finding_places(failing[0])[0].starts_with("__init__.py:"), "{}", failing[0]);
    // PyTorch without its cache sees every tensor itself: nothing recorded either.
    let dir = project("torch-nocache");
    let (out, _) = check(&dir, "train.py", &[], &[("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")]);
    assert_eq!(stdout_of(&out), "result: ok steps=40 kept=0 history=False\n", "{}", show_run(&out));
    // Nor when the program turns the cache off after it imported torch, before CUDA starts.
    let dir = project("torch-late");
    let late = "import os\nimport torch\nos.environ['PYTORCH_NO_CUDA_MEMORY_CACHING'] = '1'\nx = torch.empty(4096)\n\
                print('history:', torch.cuda.memory._history is not None)\n";
    fs::write(dir.join("late.py"), late).unwrap();
    let (out, _) = check(&dir, "late.py", &[], &[]);
    assert_eq!(stdout_of(&out), "history: False\n", "{}", show_run(&out));
    let dir = project("torch-async");
    let (out, _) = check(&dir, "train.py", &[], &[("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")]);
    assert_eq!(stdout_of(&out), "result: ok steps=40 kept=0 history=False\n", "{}", show_run(&out));
}

/// What the snapshot at exit saw of `torch._inductor`, per process.
fn snapshots_saw_inductor(dir: &Path) -> Vec<String> {
    let mut saw: Vec<String> = fs::read_dir(dir.join("out"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("snapshot-saw-inductor."))
        .map(|p| fs::read_to_string(p).unwrap())
        .collect();
    saw.sort();
    saw
}

#[test]
fn the_history_at_exit_imports_nothing_the_program_did_not() {
    let dir = project("torch-inductor");
    // The handler is registered before CUDA starts, so it runs after the history is written.
    let script = "import atexit, sys\nimport torch\n\
        atexit.register(lambda: print('at exit:', hasattr(torch, '_inductor'), 'torch._inductor' in sys.modules))\n\
        if len(sys.argv) > 1:\n    torch._inductor\n\
        kept = [torch.empty(4096) for _ in range(3)]\n\
        print('before exit:', 'torch._inductor' in sys.modules)\n";
    fs::write(dir.join("lazy.py"), script).unwrap();
    let (out, _) = check(&dir, "lazy.py", &[], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", show_run(&out));
    assert_eq!(stdout_of(&out), "before exit: False\nat exit: True True\n", "{}", show_run(&out));
    assert_eq!(histories(&dir).len(), 1, "{}", show_run(&out));
    assert_eq!(snapshots_saw_inductor(&dir), ["False"], "the snapshot did not import torch._inductor");

    // A program that uses inductor has its compiled frames named, as PyTorch does.
    fs::remove_dir_all(dir.join("out")).unwrap();
    fs::create_dir_all(dir.join("out")).unwrap();
    fs::write(dir.join("eager.py"), script.replace("sys.argv) > 1", "sys.argv) > 0")).unwrap();
    let (out, _) = check(&dir, "eager.py", &[], &[]);
    assert_eq!(stdout_of(&out), "before exit: True\nat exit: True True\n", "{}", show_run(&out));
    assert_eq!(snapshots_saw_inductor(&dir), ["True"]);
}

#[test]
fn recording_waits_for_cuda_to_start() {
    let dir = project("torch-nocuda");
    fs::write(dir.join("cpu.py"), "import torch\nprint('cuda started:', torch.cuda.is_initialized())\n").unwrap();
    let (out, _) = check(&dir, "cpu.py", &["-o", "verbosity=2"], &[]);
    assert_eq!(stdout_of(&out), "cuda started: False\n", "{}", show_run(&out));
    assert!(histories(&dir).is_empty());
    assert_eq!(fs::read_dir(dir.join("out")).unwrap().count(), 0, "_record_memory_history was not called");
}

#[test]
fn the_environments_own_sitecustomize_still_runs() {
    let dir = project("torch-sitecustomize");
    fs::create_dir_all(dir.join("site")).unwrap();
    fs::write(
        dir.join("site/sitecustomize.py"),
        "import sys\nprint('user sitecustomize ran as', __name__, 'torch' in sys.modules)\n",
    )
    .unwrap();
    let pythonpath = format!("{}:{}", dir.join("stub").display(), dir.join("site").display());
    for flags in [&[][..], &["-o", "torch_history=0"][..]] {
        let (out, doc) = check(&dir, "train.py", flags, &[("LEAK", "1"), ("PYTHONPATH", &pythonpath)]);
        assert_eq!(out.status.code(), Some(23), "{}", show_run(&out));
        let history = if flags.is_empty() { "True" } else { "False" };
        assert_eq!(
            stdout_of(&out),
            format!("user sitecustomize ran as sitecustomize False\nresult: ok steps=40 kept=40 history={history}\n"),
            "{}",
            show_run(&out)
        );
        let f = failing_findings(&doc);
        assert_eq!(f.len(), 1, "{}", show_run(&out));
    }
    // One that fails is reported by Python as before, and the program runs on.
    fs::write(dir.join("site/sitecustomize.py"), "raise ValueError('broken on purpose')\n").unwrap();
    let plain = std::process::Command::new(python_program())
        .current_dir(&dir)
        .args(["-c", "print('ran')"])
        .env("PYTHONPATH", &pythonpath)
        .output()
        .unwrap();
    let mut cmd = cupool_command(
        &["check", "--log-dir", dir.join("logs2").to_str().unwrap(), "--", &python_program(), "-c", "print('ran')"],
        &dir.join("stats"),
    );
    let under = cmd.current_dir(&dir).env("PYTHONPATH", &pythonpath).output().unwrap();
    assert_eq!(stdout_of(&under), stdout_of(&plain));
    let line = "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nValueError: broken on purpose\n";
    assert!(stderr_of(&plain).contains(line), "{}", stderr_of(&plain));
    assert!(stderr_of(&under).starts_with(line), "{}", stderr_of(&under));
}

/// `cupool._record.trim`, which the recorders cut stacks with: a
/// stack deeper than `python_depth` through libraries (a compiled model's)
/// keeps the program's own line last, read from the frames past the list
/// only when needed; a short one is kept whole.
#[test]
fn a_deep_stack_keeps_the_programs_line() {
    let code = r#"
from cupool._record import trim
lib = [("f%d" % i, "/v/lib/python3.12/site-packages/torch/x.py", i) for i in range(30)]
own = [("<module>", "/repo/train.py", 42), ("main", "/repo/run.py", 7)]
gen = [("call", "/tmp/torchinductor_root/ab/c.py", 3)]
print(trim(gen + lib + own, 16)[-1], len(trim(gen + lib + own, 16)))
print(trim(own + lib, 16)[-1])
print(trim(lib, 16)[-1], trim(lib[:5] + own, 16) == tuple(lib[:5] + own))
print(trim(lib[:16], 16, iter(own))[-1], trim(own[:1] + lib[:15], 16, iter(own))[-1][0])
"#;
    let python_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    let out =
        std::process::Command::new(python_program()).args(["-c", code]).env("PYTHONPATH", python_dir).output().unwrap();
    assert_eq!(
        stdout_of(&out),
        "('<module>', '/repo/train.py', 42) 16\n\
         ('f13', '/v/lib/python3.12/site-packages/torch/x.py', 13)\n\
         ('f15', '/v/lib/python3.12/site-packages/torch/x.py', 15) True\n\
         ('<module>', '/repo/train.py', 42) f14\n",
        "{}",
        stderr_of(&out)
    );
}
