//! `python` in a process without Python (this test binary), and against real
//! interpreters: capture/tests/pyprobe_check.py loads the pyprobe example
//! into each CPython found here and checks its answers against Python's own.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use cupool_capture::python::{capture, describe, frame_of_code, status, PyFrame, Status};

#[test]
fn without_python_nothing_is_captured_and_status_says_so() {
    assert_eq!(status(), Status::NoPython);
    assert_eq!(status().to_string(), "no Python in this process");
    let mut out = [PyFrame::default(); 16];
    // Past the first call too, where the rate-limited probe looks again.
    for _ in 0..3000 {
        assert_eq!(capture(&mut out), 0);
    }
    assert_eq!(out, [PyFrame::default(); 16]);
    assert_eq!(describe(&PyFrame { code: 0x1000, tag: 1, lasti: 0 }), None);
    // SAFETY: 0 is allowed.
    assert_eq!(unsafe { frame_of_code(0, 0) }, None);
}

/// The newest modification time of the files the pyprobe example is built
/// from.
fn newest_source() -> SystemTime {
    fn walk(dir: &Path, newest: &mut SystemTime) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, newest);
            } else if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
                *newest = (*newest).max(t);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut newest = SystemTime::UNIX_EPOCH;
    for part in ["src", "examples", "Cargo.toml"] {
        let path = root.join(part);
        if path.is_dir() {
            walk(&path, &mut newest);
        } else if let Ok(t) = path.metadata().and_then(|m| m.modified()) {
            newest = newest.max(t);
        }
    }
    newest
}

/// The pyprobe example of this test's profile. `cargo test` builds it along
/// with this test; it is built here only when missing or older than its
/// sources (a run of this test alone), since a nested cargo under
/// `cargo test --workspace` may resolve features differently and rebuild
/// dependencies.
fn pyprobe() -> PathBuf {
    // This binary is <target>/<profile>/deps/python-<hash>.
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().and_then(Path::parent).unwrap().join("examples/libpyprobe.so");
    let fresh = lib.metadata().and_then(|m| m.modified()).is_ok_and(|t| t >= newest_source());
    if !fresh {
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let mut cmd = Command::new(cargo);
        cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args(["build", "-p", "cupool-capture", "--example", "pyprobe"]);
        if !cfg!(debug_assertions) {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo");
        assert!(status.success(), "building the pyprobe example failed");
    }
    assert!(lib.exists(), "{} missing", lib.display());
    lib
}

/// `python3`, and every other CPython found on PATH (`python3.N`) or in
/// pyenv's versions, once each (by the executable it really runs).
fn interpreters() -> Vec<PathBuf> {
    let mut candidates = vec![PathBuf::from("python3")];
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME") {
        let versions = Path::new(&home).join(".pyenv/versions");
        if let Ok(entries) = std::fs::read_dir(versions) {
            dirs.extend(entries.flatten().map(|e| e.path().join("bin")));
        }
    }
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let minor = name.strip_prefix("python3.").unwrap_or("");
            if !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit()) {
                candidates.push(e.path());
            }
        }
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for c in candidates {
        let Ok(o) = Command::new(&c).args(["-c", "import sys, os; print(os.path.realpath(sys.executable))"]).output()
        else {
            continue;
        };
        let real = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if o.status.success() && !real.is_empty() && seen.insert(real) {
            out.push(c);
        }
    }
    out
}

#[test]
fn frames_match_what_each_python_says() {
    let lib = pyprobe();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pyprobe_check.py");
    let pythons = interpreters();
    assert!(!pythons.is_empty() && pythons[0] == Path::new("python3"), "python3 is needed for this test");
    let mut failed = Vec::new();
    let mut supported = 0;
    for python in &pythons {
        let o = Command::new(python).arg(&script).arg(&lib).output().expect("run python");
        let stdout = String::from_utf8_lossy(&o.stdout);
        println!("=== {}\n{}{}", python.display(), stdout, String::from_utf8_lossy(&o.stderr));
        if !o.status.success() || !stdout.contains("ALL PASSED") {
            failed.push(python.display().to_string());
        }
        supported += stdout.lines().any(|l| l.starts_with("PASS status says 'Python 3.")) as usize;
    }
    assert!(failed.is_empty(), "pyprobe_check.py failed under {failed:?}");
    assert!(supported > 0, "no supported Python was checked");
}
