//! A program that loads Python only after it started capturing, as an
//! embedding program does with dlopen: `capture` must notice Python by
//! itself (it looks again every 1024 calls while none was found), then read
//! the frames of Python code that calls back into this binary.
//!
//! Its own test binary: it changes the process (loads and starts Python).

use std::ffi::{c_char, c_int, c_void, CString};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use cupool_capture::python::{capture, describe, status, FrameInfo, PyFrame, Status};

/// Frames seen by the first call of `frames_here` that found any.
static SEEN: Mutex<Vec<FrameInfo>> = Mutex::new(Vec::new());
/// How many calls of `frames_here` that took.
static CALLS: AtomicUsize = AtomicUsize::new(0);
static CALLS_UNTIL_FOUND: AtomicUsize = AtomicUsize::new(0);

/// Called from Python through ctypes (so without the GIL); returns how many
/// frames `capture` gave.
extern "C" fn frames_here() -> i64 {
    let mut out = [PyFrame::default(); 8];
    let n = capture(&mut out);
    let calls = CALLS.fetch_add(1, Ordering::Relaxed) + 1;
    if n > 0 && CALLS_UNTIL_FOUND.load(Ordering::Relaxed) == 0 {
        CALLS_UNTIL_FOUND.store(calls, Ordering::Relaxed);
        let undescribed = || FrameInfo { file: "<undescribed>".into(), function: String::new(), line: 0 };
        *SEEN.lock().unwrap() = out[..n].iter().map(|f| describe(f).unwrap_or_else(undescribed)).collect();
    }
    n as i64
}

fn python3(code: &str) -> String {
    let o = Command::new("python3").args(["-c", code]).output().expect("python3 is needed for this test");
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

#[test]
fn python_loaded_later_is_found_and_read() {
    assert_eq!(status(), Status::NoPython);
    let mut out = [PyFrame::default(); 8];
    assert_eq!(capture(&mut out), 0);

    let shared = python3("import sysconfig; print(sysconfig.get_config_var('Py_ENABLE_SHARED') or 0)");
    if shared != "1" {
        eprintln!("skipped: python3 has no shared libpython to load");
        return;
    }
    let lib = python3(
        "import os, sysconfig; print(os.path.join(sysconfig.get_config_var('LIBDIR'), \
         sysconfig.get_config_var('INSTSONAME')))",
    );
    let home = python3("import sys; print(sys.base_prefix)");
    let (major, minor) = {
        let v = python3("import sys; print(*sys.version_info[:2])");
        let mut it = v.split(' ').map(|s| s.parse::<u8>().unwrap());
        (it.next().unwrap(), it.next().unwrap())
    };

    // Before Python starts: it finds its standard library from here.
    std::env::set_var("PYTHONHOME", &home);
    let path = CString::new(lib.clone()).unwrap();
    // SAFETY: the symbols are CPython's C API with these signatures; Python
    // is started once, on this thread.
    let ran = unsafe {
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
        assert!(!handle.is_null(), "dlopen {lib}");
        let sym = |name: &str| -> *mut c_void {
            let name = CString::new(name).unwrap();
            let p = libc::dlsym(handle, name.as_ptr());
            assert!(!p.is_null(), "{name:?} missing");
            p
        };
        let initialize: extern "C" fn(c_int) = std::mem::transmute(sym("Py_InitializeEx"));
        let run: extern "C" fn(*const c_char) -> c_int = std::mem::transmute(sym("PyRun_SimpleString"));
        initialize(0);
        // Line numbers matter: `f()` is on line 5, `inner()` on line 6.
        let code = format!(
            "import ctypes\n\
             f = ctypes.CFUNCTYPE(ctypes.c_int64)({addr})\n\
             def inner():\n\
             \x20   for _ in range(2000):\n\
             \x20       if f(): return\n\
             inner()\n",
            addr = frames_here as *const () as usize
        );
        run(CString::new(code).unwrap().as_ptr())
    };
    assert_eq!(ran, 0, "the embedded Python code failed");

    let calls = CALLS_UNTIL_FOUND.load(Ordering::Relaxed);
    assert!((2..=1024).contains(&calls), "Python found after {calls} calls: not rate-limited, or never");
    assert_eq!(status(), Status::Supported { major, minor });
    let file = "<string>".to_string();
    assert_eq!(
        *SEEN.lock().unwrap(),
        vec![
            FrameInfo { file: file.clone(), function: "inner".into(), line: 5 },
            FrameInfo { file, function: "<module>".into(), line: 6 },
        ]
    );
}
