//! The pytest plugin (`python/cupool/pytest_plugin.py`) on the CPU: a small
//! pytest suite whose tests allocate through the fake CUDA runtime (loaded
//! with ctypes; `ctypes.CDLL(None).cudaMalloc` is the preloaded shim's hook),
//! run under the shim by `LD_PRELOAD` + `CUPOOL_OPTIONS`, the way `cupool
//! check` runs it (`PYTEST_PLUGINS=cupool.pytest_plugin`, the package on
//! `PYTHONPATH`); one case goes through `cupool check` itself.
//!
//! pytest and pytest-xdist come from a virtualenv this test makes in
//! `target/pytest-tools/` (`python3 -m venv`, then `pip install` from PyPI;
//! kept for later runs), never from the system. `CUPOOL_TEST_PYTHON=<python>`
//! names an interpreter that has both instead. Without either the test fails
//! with the reason.
//! `cargo test --release --test pytest_plugin`
mod support;

use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;
use support::*;

const MIB: u64 = 1 << 20;
const REQUIREMENTS: &[&str] = &["pytest>=7,<10", "pytest-xdist>=3,<4"];

/// A Python with pytest and pytest-xdist (see the module's documentation).
fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| python_with("pytest-tools", REQUIREMENTS)).clone()
}

/// Allocations through the fake runtime, and fixtures of every scope.
const CONFTEST: &str = r#"
import ctypes, os
import pytest

ctypes.CDLL(os.environ["FAKE_CUDART"], mode=os.RTLD_GLOBAL)
_process = ctypes.CDLL(None)  # the first definition: the shim's hooks
_malloc = _process.cudaMalloc
_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
_free = _process.cudaFree
_free.argtypes = [ctypes.c_void_p]
MIB = 1 << 20
KEEP = []


class Buf:
    """Device memory, freed when the object goes."""

    def __init__(self, n):
        self.p = ctypes.c_void_p()
        assert _malloc(ctypes.byref(self.p), n) == 0

    def __del__(self):
        _free(self.p)


@pytest.fixture(scope="session")
def model():
    yield Buf(8 * MIB)


@pytest.fixture(scope="module")
def table():
    return Buf(MIB)


@pytest.fixture
def scratch():
    yield Buf(64 * 1024)
"#;

const TESTS: &str = r#"
import pytest
from conftest import Buf, KEEP, MIB


def test_first_uses_the_session_fixture(model, scratch):
    Buf(4096)


def test_leak(model):
    KEEP.append(Buf(3 * MIB))


@pytest.mark.cupool_no_leak_check
def test_opted_out():
    KEEP.append(Buf(5 * MIB))


def test_module_fixture(table):
    pass


def test_garbage_cycle():
    a, b = Buf(MIB), Buf(1)
    a.other, b.other = b, a


def test_fails_holding_memory():
    held = Buf(MIB)
    assert held is None


def test_no_cuda():
    assert 1 + 1 == 2


def test_zz_last_leaks_and_tears_down(model, table):
    KEEP.append(Buf(2 * MIB))
"#;

/// (nodeid suffix, leaked bytes, leaked count, outcome) of every checked test.
const EXPECTED: &[(&str, u64, u64, &str)] = &[
    ("test_first_uses_the_session_fixture", 0, 0, "passed"),
    ("test_leak", 3 * MIB, 1, "passed"),
    ("test_module_fixture", 0, 0, "passed"),
    ("test_garbage_cycle", 0, 0, "passed"),
    ("test_fails_holding_memory", 0, 0, "failed"),
    ("test_no_cuda", 0, 0, "passed"),
    // Its fixtures' teardown frees 9 MiB inside it: left out, not netted against its leak.
    ("test_zz_last_leaks_and_tears_down", 2 * MIB, 1, "passed"),
];

/// A suite in a fresh directory.
fn suite(name: &str) -> PathBuf {
    let dir = scratch_dir(name);
    fs::write(dir.join("conftest.py"), CONFTEST).unwrap();
    fs::write(dir.join("test_suite.py"), TESTS).unwrap();
    dir
}

/// pytest in `dir`, under the shim when `log_options` is given.
fn pytest(dir: &Path, log_options: Option<&str>, plugins_env: bool, args: &[&str]) -> Output {
    let python = python();
    let mut cmd = match log_options {
        Some(opts) => {
            let mut c = preloaded_command(&python, &[], &dir.join("stats"), "");
            c.env("CUPOOL_OPTIONS", opts);
            c
        }
        None => plain_command(&python, &[], &dir.join("stats")),
    };
    cmd.current_dir(dir)
        // The suite's own directory, not the repository's pyproject.toml above it.
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", "."])
        .args(args)
        .env("PYTHONPATH", Path::new(env!("CARGO_MANIFEST_DIR")).join("python"))
        .env("FAKE_CUDART", fakes().libcudart())
        .env_remove("PYTEST_ADDOPTS")
        .env_remove("PYTEST_PLUGINS");
    if plugins_env {
        cmd.env("PYTEST_PLUGINS", "cupool.pytest_plugin");
    }
    cmd.output().expect("run pytest")
}

/// `cupool check --json` of pytest in `dir` (the check loads the plugin), with
/// `extra` options, its logs in `dir/logs-<name>`: the output, the JSON
/// document and its path, `dir/<name>.json`.
fn check_pytest(dir: &Path, name: &str, extra: &[&str]) -> (Output, Value, PathBuf) {
    let (json, logs) = (dir.join(format!("{name}.json")), dir.join(format!("logs-{name}")));
    let mut args = vec!["check", "--log-dir", path_str(&logs), "--json", path_str(&json)];
    args.extend_from_slice(extra);
    args.push("--");
    let out = cupool_command(&args, &dir.join("stats"))
        .args([python().to_str().unwrap(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", "."])
        .current_dir(dir)
        .env("FAKE_CUDART", fakes().libcudart())
        .env_remove("PYTEST_ADDOPTS")
        .env_remove("PYTEST_PLUGINS")
        .output()
        .expect("run cupool check");
    let doc = fs::read_to_string(&json).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or(Value::Null);
    (out, doc, json)
}

/// The suite fails exactly one test, on purpose.
fn assert_one_failure(out: &Output) {
    let text = stdout_of(out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr_of(out));
    assert!(text.contains("1 failed, 7 passed"), "{text}\n{}", stderr_of(out));
}

/// Every `cupool-tests.*.json` in `dir`.
fn results(dir: &Path) -> Vec<Value> {
    let mut names: Vec<PathBuf> =
        fs::read_dir(dir).map(|rd| rd.map(|e| e.unwrap().path()).collect()).unwrap_or_default();
    names.retain(|p| p.file_name().unwrap().to_string_lossy().starts_with("cupool-tests."));
    names.sort();
    names.iter().map(|p| serde_json::from_str(&fs::read_to_string(p).unwrap()).expect("one JSON document")).collect()
}

/// nodeid -> record, over `files`; each test once.
fn by_test(files: &[Value]) -> BTreeMap<String, Value> {
    let mut m = BTreeMap::new();
    for f in files {
        assert_eq!((&f["schema"], &f["version"], &f["complete"]), (&"cupool-tests".into(), &1.into(), &true.into()));
        for t in f["tests"].as_array().unwrap() {
            let id = t["nodeid"].as_str().unwrap().to_string();
            assert!(m.insert(id.clone(), t.clone()).is_none(), "{id} recorded twice");
        }
    }
    m
}

fn assert_expected(tests: &BTreeMap<String, Value>) {
    let ids: Vec<&str> = tests.keys().map(|k| k.strip_prefix("test_suite.py::").unwrap()).collect();
    let mut want: Vec<&str> = EXPECTED.iter().map(|e| e.0).collect();
    want.sort();
    assert_eq!(ids, want, "every test but the opted-out one");
    for &(name, bytes, count, outcome) in EXPECTED {
        let t = &tests[&format!("test_suite.py::{name}")];
        assert_eq!(t["leaked_bytes"], bytes, "{name}: {t}");
        assert_eq!(t["leaked_count"], count, "{name}: {t}");
        assert_eq!(t["outcome"], outcome, "{name}: {t}");
        assert_eq!(t["measured_by"], "cupool", "{name}: {t}");
        let devices = t["devices"].as_object().unwrap();
        if bytes == 0 {
            assert!(devices.is_empty(), "{name}: {t}");
        } else {
            assert_eq!(t["devices"]["0"]["leaked_bytes"], bytes, "{name}: {t}");
            assert_eq!(devices.len(), 1, "{name}: {t}");
        }
    }
}

/// The `name`s of the `ev` phase events of `log`, in order, one per edge.
fn phase_names(log: &Value, ev: &str) -> Vec<String> {
    let mut names: Vec<String> = events(log, ev).iter().map(|e| e["name"].as_str().unwrap().to_string()).collect();
    names.dedup();
    names
}

#[test]
fn the_leaking_tests_are_named_with_their_bytes_and_the_others_are_clean() {
    let dir = suite("pytest-plugin");
    let logs = dir.join("logs");
    let out = pytest(&dir, Some(&cupool_options(&logs, "run_id=r1")), true, &[]);
    assert_one_failure(&out);

    let files = results(&logs);
    assert_eq!(files.len(), 1, "{:?}", fs::read_dir(&logs).unwrap().collect::<Vec<_>>());
    let f = &files[0];
    assert_eq!((&f["worker"], &f["run_id"]), (&Value::Null, &"r1".into()));
    let tests = by_test(&files);
    assert_expected(&tests);

    // docs/log-schema.md lists exactly the fields written.
    assert_eq!(keys(f), documented_fields("cupool-tests"));
    let leak = &tests["test_suite.py::test_leak"];
    assert_eq!(keys(leak), documented_fields("cupool-tests.tests[]"));
    assert_eq!(keys(&leak["devices"]["0"]), documented_fields("cupool-tests.tests[].devices{}"));

    // The log of the same process brackets each test, and the wider-scoped
    // fixtures' setup and teardown inside them.
    let logs = read_logs(&logs);
    assert_eq!(logs.len(), 1);
    assert_eq!(logs[0]["process"]["pid"], f["pid"]);
    let begun = phase_names(&logs[0], "phase_begin");
    assert!(begun.contains(&"test:test_suite.py::test_leak".to_string()), "{begun:?}");
    assert!(begun.contains(&"test:test_suite.py::test_opted_out".to_string()), "{begun:?}");
    let session: Vec<&String> = begun.iter().filter(|n| *n == "fixture:session:model").collect();
    assert_eq!(session.len(), 2, "its setup and its teardown: {begun:?}");
    // test_leak's 3 MiB allocation lies inside its phase.
    let mut inside = false;
    let mut found = false;
    let mut all: Vec<&Value> = logs[0]["events"].as_array().unwrap().iter().collect();
    all.sort_by_key(|e| e["seq"].as_u64());
    for e in all {
        match (e["ev"].as_str(), e["name"].as_str()) {
            (Some("phase_begin"), Some("test:test_suite.py::test_leak")) => inside = true,
            (Some("phase_end"), Some("test:test_suite.py::test_leak")) => inside = false,
            (Some("alloc"), _) if e["size"] == 3 * MIB => found = inside,
            _ => {}
        }
    }
    assert!(found, "the leaked allocation is inside test_leak's phase");
}

/// The fields docs/log-schema.md lists under the heading `## `{path}`...`.
fn documented_fields(path: &str) -> Vec<String> {
    let doc = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/log-schema.md")).unwrap();
    let heading = format!("## `{path}`");
    let body = doc.split("\n").skip_while(|l| !l.starts_with(&heading) || l[heading.len()..].starts_with('.'));
    let mut fields: Vec<String> = body
        .skip(1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| l.split('|').nth(1).unwrap().trim().trim_matches('`').to_string())
        .collect();
    assert!(!fields.is_empty(), "no table under {heading}");
    fields.sort();
    fields
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

#[test]
fn under_xdist_each_worker_writes_its_own_file() {
    let dir = suite("pytest-plugin-xdist");
    let logs = dir.join("logs");
    // `-p cupool` names the package; the plugin is the same.
    let out = pytest(&dir, Some(&cupool_options(&logs, "")), false, &["-p", "cupool", "-n", "2"]);
    assert_one_failure(&out);
    let files = results(&logs);
    assert_eq!(files.len(), 2, "one per worker, none for the controller");
    let workers: Vec<&str> = files.iter().map(|f| f["worker"].as_str().unwrap()).collect();
    assert!(workers.iter().all(|w| *w == "gw0" || *w == "gw1") && workers[0] != workers[1], "{workers:?}");
    let pids: Vec<u64> = read_logs(&logs).iter().map(|l| l["process"]["pid"].as_u64().unwrap()).collect();
    for f in &files {
        assert!(pids.contains(&f["pid"].as_u64().unwrap()), "a log for pid {} among {pids:?}", f["pid"]);
    }
    assert_expected(&by_test(&files));
}

#[test]
fn named_twice_it_checks_once_and_reads_quoted_options_as_the_shim_does() {
    let dir = suite("pytest-plugin-twice");
    // A `:` in the directory needs quotes in CUPOOL_OPTIONS.
    let logs = dir.join("logs:quoted");
    let opts = format!("verbosity=1 : log_dir='{}'", logs.display());
    let out = pytest(&dir, Some(&opts), true, &["-p", "cupool"]);
    assert_one_failure(&out);
    let files = results(&logs);
    assert_eq!(files.len(), 1);
    assert_expected(&by_test(&files));
}

#[test]
fn outside_cupool_the_plugin_does_nothing() {
    let dir = suite("pytest-plugin-outside");
    let logs = dir.join("logs");
    // No preload: cupool.available() is false. Warnings are errors, so the
    // module's "not under cupool" warning would fail the run.
    let python = python();
    let out = plain_command(&python, &[], &dir.join("stats"))
        .current_dir(&dir)
        .args(["-W", "error", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", ".", "-p", "cupool"])
        .env("PYTHONPATH", Path::new(env!("CARGO_MANIFEST_DIR")).join("python"))
        .env("FAKE_CUDART", fakes().libcudart())
        .env("CUPOOL_OPTIONS", cupool_options(&logs, ""))
        .env("PYTEST_PLUGINS", "cupool.pytest_plugin")
        .env_remove("PYTEST_ADDOPTS")
        .output()
        .unwrap();
    assert_one_failure(&out);
    assert!(!logs.exists(), "nothing written: {:?}", fs::read_dir(&logs).map(|d| d.count()));
    // The marker is registered all the same: --strict-markers accepts it.
    let strict = pytest(&dir, None, false, &["-p", "cupool", "--strict-markers"]);
    assert_one_failure(&strict);
}

/// The wheel's `pytest11` entry point (pyproject.toml), as an installed
/// distribution's metadata on `PYTHONPATH`: pytest loads the plugin with no
/// `-p` and no `PYTEST_PLUGINS`, loads it once more through `PYTEST_PLUGINS`
/// without clashing, and `-p no:cupool` turns it off.
#[test]
fn the_wheels_entry_point_loads_it_and_no_cupool_turns_it_off() {
    let pyproject = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("pyproject.toml")).unwrap();
    let section = pyproject.split("[project.entry-points.pytest11]").nth(1).expect("a pytest11 entry point");
    let entry = section.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).unwrap();
    assert_eq!(entry, r#"cupool = "cupool""#, "the entry point names the package, as the plugin's docs say");

    let dir = suite("pytest-plugin-entry-point");
    let dist = dir.join("site").join("cupool-0.dist-info");
    fs::create_dir_all(&dist).unwrap();
    fs::write(dist.join("METADATA"), "Metadata-Version: 2.1\nName: cupool\nVersion: 0\n").unwrap();
    fs::write(dist.join("entry_points.txt"), "[pytest11]\ncupool = cupool\n").unwrap();
    let pythonpath =
        std::env::join_paths([Path::new(env!("CARGO_MANIFEST_DIR")).join("python"), dir.join("site")]).unwrap();
    let run = |logs: &Path, plugins_env: bool, args: &[&str]| {
        let mut cmd = preloaded_command(&python(), &[], &dir.join("stats"), "");
        cmd.current_dir(&dir)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", "."])
            .args(args)
            .env("CUPOOL_OPTIONS", cupool_options(logs, ""))
            .env("PYTHONPATH", &pythonpath)
            .env("FAKE_CUDART", fakes().libcudart())
            .env_remove("PYTEST_ADDOPTS")
            .env_remove("PYTEST_PLUGINS");
        if plugins_env {
            cmd.env("PYTEST_PLUGINS", "cupool.pytest_plugin");
        }
        let out = cmd.output().unwrap();
        assert_one_failure(&out);
    };
    let auto = dir.join("auto");
    run(&auto, false, &[]);
    assert_expected(&by_test(&results(&auto)));
    let both = dir.join("both");
    run(&both, true, &[]);
    assert_expected(&by_test(&results(&both)));
    let off = dir.join("off");
    run(&off, false, &["-p", "no:cupool"]);
    assert!(results(&off).is_empty(), "-p no:cupool: no results file");
}

/// A process that dies mid-run leaves the tests before it readable: the
/// header line and a line per finished test, no closing line.
#[test]
fn a_crash_keeps_the_tests_before_it() {
    let dir = suite("pytest-plugin-crash");
    fs::write(
        dir.join("test_crash.py"),
        "import os\nfrom conftest import Buf, KEEP, MIB\n\n\
         def test_a_leaks():\n    KEEP.append(Buf(MIB))\n\n\
         def test_b_dies():\n    os._exit(3)\n\n\
         def test_c_never_runs():\n    pass\n",
    )
    .unwrap();
    let logs = dir.join("logs");
    let out = pytest(&dir, Some(&cupool_options(&logs, "")), false, &["-p", "cupool", "test_crash.py"]);
    assert_eq!(out.status.code(), Some(3), "{}{}", stdout_of(&out), stderr_of(&out));
    let name = fs::read_dir(&logs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("cupool-tests."))
        .expect("a results file");
    let text = fs::read_to_string(&name).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].ends_with("\"tests\":["), "{text}");
    // Closed by the reader, as `cupool check` does with a file cut short.
    let doc: Value = serde_json::from_str(&format!("{}\n{}]}}", lines[0], lines[1])).unwrap();
    assert_eq!(doc["tests"][0]["nodeid"], "test_crash.py::test_a_leaks");
    assert_eq!(doc["tests"][0]["leaked_bytes"], MIB);
    assert!(doc.get("complete").is_none());
}

/// The same suite through `cupool check` itself: the plugin is loaded by the
/// environment the check sets up, and every leaking test becomes one test
/// finding with its bytes; the program's own failure (one test fails on
/// purpose) is the status of the check.
#[test]
fn cupool_check_names_each_leaking_test() {
    let dir = suite("pytest-plugin-check");
    let (out, doc, _) = check_pytest(&dir, "findings", &[]);
    assert_eq!(out.status.code(), Some(1), "the suite's own failure wins:\n{}\n{}", stdout_of(&out), stderr_of(&out));
    let mut got: Vec<(String, u64)> = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "test" && f.get("suppressed_by").is_none())
        .map(|f| (f["test"].as_str().unwrap().to_string(), f["bytes"].as_u64().unwrap()))
        .collect();
    got.sort();
    let mut want: Vec<(String, u64)> =
        EXPECTED.iter().filter(|e| e.1 > 0).map(|e| (format!("test_suite.py::{}", e.0), e.1)).collect();
    want.sort();
    assert_eq!(got, want, "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("Test leak of"), "{}", stderr_of(&out));
}

/// A test's leak that is still live at exit is one allocation: the check
/// counts it once, so a job under its `max_leak_bytes` passes, and every
/// output gives the same figures.
#[test]
fn a_test_leak_live_at_exit_is_counted_once() {
    let dir = scratch_dir("pytest-plugin-once");
    fs::write(dir.join("conftest.py"), CONFTEST).unwrap();
    // The pointer is kept with no owner that frees it: still live at exit.
    let test = "import ctypes\nfrom conftest import _malloc, MIB\nKEPT = []\n\n\ndef test_keeps():\n    \
                p = ctypes.c_void_p()\n    assert _malloc(ctypes.byref(p), 2 * MIB) == 0\n    KEPT.append(p)\n";
    fs::write(dir.join("test_keep.py"), test).unwrap();
    for (limit, status) in [("3m", 0), ("1m", 23)] {
        let max = format!("max_leak_bytes={limit}");
        let (out, doc, _) = check_pytest(&dir, &format!("findings-{limit}"), &["-o", &max]);
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(status), "{limit}:\n{}\n{err}", stdout_of(&out));
        assert!(
            err.contains("Test leak of 2097152 byte(s) in 1 allocation(s) in test test_keep.py::test_keeps"),
            "{err}"
        );
        assert!(err.contains("Direct leak of 2097152 byte(s) in 1 allocation(s)"), "still live at exit: {err}");
        assert!(err.contains("SUMMARY: cupool: 2097152 byte(s) leaked in 1 allocation(s).\n"), "{err}");
        assert_eq!(doc["summary"]["failing_bytes"], 2 * MIB, "{}", doc["summary"]);
        assert_eq!(doc["summary"]["failing_allocations"], 1);
        assert_eq!(doc["summary"]["fails"], status != 0);
    }
}

/// Memory budgets: a test's own `cupool_limit_memory`, the job's
/// `max_peak_bytes`, and a previous run's peaks (`--baseline`), each
/// judged from the log and each failing the job only when passed.
#[test]
fn memory_budgets_fail_the_job_exactly_where_they_are_passed() {
    let dir = scratch_dir("pytest-plugin-budgets");
    fs::write(dir.join("conftest.py"), CONFTEST).unwrap();
    let suite = |big: u64| {
        format!(
            "import os, pytest\nfrom conftest import Buf, MIB\n\n\n@pytest.mark.cupool_limit_memory(\"8 MiB\")\n\
             def test_small():\n    a = Buf(4 * MIB)\n    b = Buf(2 * MIB)\n\n\n\
             @pytest.mark.cupool_limit_memory(\"16m\")\ndef test_big():\n    a = Buf({big} * MIB)\n"
        )
    };
    let run = |name: &str, extra: &[&str]| {
        let (out, doc, json) = check_pytest(&dir, name, extra);
        (out.status.code(), stderr_of(&out), doc, json)
    };
    // Under every limit: it passes, and the peaks are recorded.
    fs::write(dir.join("test_budget.py"), suite(10)).unwrap();
    let (code, err, doc, baseline) = run("first", &[]);
    assert_eq!(code, Some(0), "{err}");
    let peak = |doc: &Value, test: &str| {
        doc["peaks"]["tests"].as_array().unwrap().iter().find(|t| t["test"].as_str().unwrap().ends_with(test)).unwrap()
            ["bytes"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(peak(&doc, "::test_small"), 6 * MIB, "{}", doc["peaks"]);
    assert_eq!(peak(&doc, "::test_big"), 10 * MIB);
    // A test past its own limit fails the job, named.
    fs::write(dir.join("test_budget.py"), suite(20)).unwrap();
    let (code, err, doc, _) = run("over-limit", &[]);
    assert_eq!(code, Some(23), "{err}");
    assert!(
        err.contains(
            "cupool: over budget: test test_budget.py::test_big peaked at 20.0 MiB, over its limit of 16.0 MiB"
        ),
        "{err}"
    );
    assert_eq!(doc["summary"]["over_budget"], 1);
    // ... and, against the first run's peaks, the baseline names its growth (test_small did not grow).
    let (code, err, doc, _) = run("baseline", &["--baseline", path_str(&baseline), "-o", "baseline_growth=50"]);
    assert_eq!(code, Some(23), "{err}");
    let budgets: Vec<&str> = doc["budgets"].as_array().unwrap().iter().map(|b| b["budget"].as_str().unwrap()).collect();
    assert_eq!(budgets.iter().filter(|b| **b == "baseline").count(), 2, "the test and its process: {}", doc["budgets"]);
    assert!(!err.contains("test_small peaked"), "{err}");
    // The job's own peak budget.
    fs::write(dir.join("test_budget.py"), suite(10)).unwrap();
    let (code, err, _, _) = run("max-peak", &["-o", "max_peak_bytes=8m"]);
    assert_eq!(code, Some(23), "{err}");
    assert!(err.contains("over max_peak_bytes=8388608"), "{err}");
    // A baseline that is not one is refused before anything runs.
    let bad = dir.join("not-a-baseline.json");
    fs::write(&bad, "{\"schema\":\"other\"}").unwrap();
    let out =
        cupool_command(&["check", "--baseline", path_str(&bad), "--", "true"], &dir.join("stats")).output().unwrap();
    let (code, err) = (out.status.code(), stderr_of(&out));
    assert_eq!(code, Some(66), "{err}");
    assert!(err.contains("not a cupool check --json document"), "{err}");
}
