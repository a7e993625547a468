//! Allocation sites: native stacks unwound in the hook, Python frames read
//! without the GIL, symbolised by `cupool report` from the files on disk.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;

/// `tests/fake/sites.c` (+ `sites_nounwind.c` without unwind tables),
/// built with `extra` flags (`-g` or none), then stripped when asked.
fn sites_program(name: &str, extra: &[&str], strip: bool) -> PathBuf {
    let nounwind = compile_c_file(
        &format!("{name}-nounwind.o"),
        &fake_source_dir().join("sites_nounwind.c"),
        &["-c", "-O2", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-fomit-frame-pointer"]
            .map(String::from),
    );
    let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    args.push(nounwind.display().to_string());
    args.extend(link_fake_cudart());
    let prog = compile_c_file(name, &fake_source_dir().join("sites.c"), &args);
    if strip {
        let st = Command::new("strip").arg(&prog).status().expect("run strip");
        assert!(st.success(), "strip failed");
    }
    prog
}

/// The line of `tests/fake/<file>` that contains `marker`.
fn line_of(file: &str, marker: &str) -> u64 {
    let text = std::fs::read_to_string(fake_source_dir().join(file)).unwrap();
    text.lines().position(|l| l.contains(marker)).expect("marker") as u64 + 1
}

/// `cupool report --json --sites 20 DIR`: the sites of the one log in it, by peak.
fn report_sites(dir: &Path) -> Vec<Value> {
    let out = run_cupool(&["report", "--json", "--sites", "20", dir.to_str().unwrap()], dir);
    assert!(out.status.success(), "report failed: {}", stderr_of(&out));
    let rep: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let logs = rep.as_array().expect("one entry per log");
    assert_eq!(logs.len(), 1, "{rep}");
    logs[0]["sites"]["by_peak"].as_array().expect("sites.by_peak").clone()
}

/// The definition lines of a log as `read_logs` gives it.
fn definitions(log: &Value) -> Vec<Value> {
    log.get("definitions").and_then(Value::as_array).cloned().unwrap_or_default()
}

fn site_of_size(sites: &[Value], size: u64) -> &Value {
    sites
        .iter()
        .find(|s| s["peak_bytes"] == size)
        .unwrap_or_else(|| panic!("no site with a peak of {size} bytes in {}", Value::Array(sites.to_vec())))
}

fn functions(site: &Value) -> Vec<String> {
    site["frames"].as_array().unwrap().iter().map(|f| f["function"].as_str().unwrap_or("??").to_string()).collect()
}

#[test]
fn native_sites_name_the_programs_functions_and_lines() {
    let prog = sites_program("sites_debug", &["-g", "-fno-omit-frame-pointer"], false);
    let dir = scratch_dir("sites-debug");
    let out = run_preloaded(&prog, &[], &dir, "");
    assert_eq!(result_line(&stdout_of(&out)).map(|_| ()), Some(()), "{}{}", stdout_of(&out), stderr_of(&out));
    assert!(stdout_of(&out).contains("result: ok"), "{}", stdout_of(&out));
    let sites = report_sites(&dir);

    let planted = site_of_size(&sites, 1234567);
    let top = &planted["frames"][0];
    assert_eq!(top["function"], "planted_alloc", "innermost frame of {planted}");
    assert!(top["file"].as_str().unwrap().ends_with("sites.c"), "{top}");
    assert_eq!(top["line"], line_of("sites.c", "/* PLANTED */"), "{top}");
    assert!(functions(planted).contains(&"main".to_string()), "{planted}");

    // 1500 frames deep: exactly stack_depth (32) frames, all of them the recursion.
    let deep = functions(site_of_size(&sites, 2222222));
    assert_eq!(deep.len(), 32, "{deep:?}");
    assert!(deep.iter().all(|f| f == "recurse"), "{deep:?}");

    // Through a function without unwind tables: the frames above it are found.
    let nounwind = functions(site_of_size(&sites, 3333333));
    assert_eq!(nounwind.first().map(String::as_str), Some("nounwind_target"), "{nounwind:?}");

    let thread = functions(site_of_size(&sites, 4444444));
    assert_eq!(thread.first().map(String::as_str), Some("thread_main"), "{thread:?}");
    // No frame of cupool itself or of the CUDA runtime is shown.
    for site in [planted, site_of_size(&sites, 4444444)] {
        for f in site["frames"].as_array().unwrap() {
            let module = f["module"].as_str().unwrap_or("");
            assert!(!module.starts_with("libcupool") && !module.starts_with("libcudart"), "{f}");
        }
    }
    // Leaks name their site.
    let log = &read_logs(&dir)[0];
    let leaks = log["end"]["leaks"].as_array().unwrap();
    assert_eq!(leaks.len(), 4, "{leaks:?}");
    assert!(leaks.iter().all(|l| l["stack"].as_u64().is_some()), "{leaks:?}");
}

#[test]
fn a_program_without_symbols_still_gets_module_and_offset() {
    let prog = sites_program("sites_stripped", &[], true);
    let dir = scratch_dir("sites-stripped");
    let out = run_preloaded(&prog, &[], &dir, "");
    assert!(stdout_of(&out).contains("result: ok"), "{}{}", stdout_of(&out), stderr_of(&out));
    let sites = report_sites(&dir);
    let planted = site_of_size(&sites, 1234567);
    let top = &planted["frames"][0];
    assert_eq!(top["module"], "sites_stripped", "{top}");
    assert!(top["offset"].as_u64().is_some() && top["function"].is_null(), "{top}");
    assert!(top["line"].is_null(), "{top}");
}

#[test]
fn stack_depth_0_and_python_depth_0_capture_nothing() {
    let prog = sites_program("sites_off", &["-g"], false);
    let dir = scratch_dir("sites-off");
    let out = run_preloaded(&prog, &[], &dir, "stack_depth=0:python_depth=0");
    assert!(stdout_of(&out).contains("result: ok"), "{}", stdout_of(&out));
    let log = &read_logs(&dir)[0];
    let allocs = events(log, "alloc");
    assert_eq!(allocs.len(), 4);
    assert!(allocs.iter().all(|e| e.get("stack").is_none()), "{allocs:?}");
    assert!(definitions(log).is_empty(), "{:?}", definitions(log));
}

const PY_SCRIPT: &str = r#"
import ctypes, os, sys, threading
ctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL)   # the (fake) CUDA runtime
rt = ctypes.CDLL(None)                          # cudaMalloc as the program sees it: cupool's
helper = ctypes.CDLL(sys.argv[2])
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]

def planted(n):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), n) == 0  # PY-PLANTED

def outer():
    planted(7654321)  # PY-OUTER

outer()
t = threading.Thread(target=planted, args=(5555555,))
t.start(); t.join()
helper.alloc_on_native_thread(ctypes.c_size_t(6666666))
print("result: ok")
"#;

/// Runs `script` (saved as `<name>.py`) with python3 (or `$PYTHON`) under
/// the shim, its arguments the fake runtime and then `args`; checks that it
/// printed `result: ok` and returns the script's path and its log.
fn run_python(name: &str, script: &str, args: &[&Path]) -> (PathBuf, Value) {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let dir = scratch_dir(&format!("sites-{name}"));
    let path = dir.join(format!("{name}.py"));
    std::fs::write(&path, script).unwrap();
    let logs = dir.join("logs");
    let out = Command::new(&python)
        .arg(&path)
        .arg(fakes().libcudart())
        .args(args)
        .envs(fakes().env())
        .env("LD_PRELOAD", shim_path())
        .env("CUPOOL_OPTIONS", cupool_options(&logs, ""))
        .output()
        .expect("run python3");
    assert!(stdout_of(&out).contains("result: ok"), "{}{}", stdout_of(&out), stderr_of(&out));
    (path, read_logs(&logs).remove(0))
}

#[test]
fn python_frames_name_the_scripts_lines_and_native_threads_have_none() {
    let helper = compile_c_file(
        "libsites_thread.so",
        &fake_source_dir().join("sites_thread.c"),
        &[vec!["-shared".into(), "-fPIC".into()], link_fake_cudart()].concat(),
    );
    let (script, log) = run_python("planted", PY_SCRIPT, &[&helper]);
    let log = &log;
    let strings: std::collections::HashMap<u64, String> = definitions(log)
        .iter()
        .filter(|e| e["def"] == "string")
        .map(|e| (e["id"].as_u64().unwrap(), e["text"].as_str().unwrap().to_string()))
        .collect();
    let stack_of = |size: u64| -> Value {
        let alloc = events(log, "alloc").into_iter().find(|e| e["size"] == size).expect("the allocation").clone();
        let id = alloc["stack"].clone();
        definitions(log)
            .iter()
            .find(|e| e["def"] == "stack" && e["id"] == id)
            .unwrap_or_else(|| panic!("no stack for the allocation of {size}: {alloc}"))
            .clone()
    };
    let py = |size: u64| -> Vec<(String, String, u64)> {
        stack_of(size)["python"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    strings[&f[0].as_u64().unwrap()].clone(),
                    strings[&f[1].as_u64().unwrap()].clone(),
                    f[2].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let line = |marker: &str| PY_SCRIPT.lines().position(|l| l.contains(marker)).unwrap() as u64 + 1;
    let file = script.display().to_string();

    let main_thread = py(7654321);
    assert_eq!(
        main_thread[..2],
        [(file.clone(), "planted".into(), line("PY-PLANTED")), (file.clone(), "outer".into(), line("PY-OUTER"))],
        "{main_thread:?}"
    );
    assert_eq!(main_thread[2].1, "<module>", "{main_thread:?}");

    let python_thread = py(5555555);
    assert_eq!(python_thread[0], (file.clone(), "planted".into(), line("PY-PLANTED")), "{python_thread:?}");
    assert!(python_thread.iter().any(|f| f.1 == "Thread.run"), "threading's frames below: {python_thread:?}");

    let native = stack_of(6666666);
    assert_eq!(native["python"], Value::Array(vec![]), "a thread that never ran Python: {native}");
    assert!(!native["native"].as_array().unwrap().is_empty(), "{native}");
}

/// A thread remembers the id of its last stack; a fork child starts a log of
/// its own, so it must define that stack again rather than reuse the id.
#[test]
fn a_fork_child_defines_the_site_its_parent_used_last() {
    let prog = compile_c_file("sites_fork", &fake_source_dir().join("sites_fork.c"), &{
        // -O0: one call site for both rounds (-O1 peels the loop).
        let mut args = vec!["-g".to_string(), "-O0".to_string()];
        args.extend(link_fake_cudart());
        args
    });
    let dir = scratch_dir("sites-fork");
    let out = run_preloaded(&prog, &[], &dir, "");
    assert!(out.status.success(), "{}{}", stdout_of(&out), stderr_of(&out));
    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 2, "a log from the parent and one from the child");
    for log in &logs {
        let file = dir.join(log["_file"].as_str().expect("read_logs names each file")).display().to_string();
        let out = run_cupool(&["report", "--json", "--sites", "20", &file], &dir);
        assert!(out.status.success(), "report failed: {}", stderr_of(&out));
        let rep: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
        let sites = rep[0]["sites"]["by_peak"].as_array().expect("sites.by_peak").clone();
        let site = site_of_size(&sites, 4321);
        assert_eq!(functions(site).first().map(String::as_str), Some("forked_site"), "{file}: {site}");
    }
}

const PY_ALTERNATING: &str = r#"
import ctypes, os, sys
ctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL)
rt = ctypes.CDLL(None)
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
rt.cudaFree.argtypes = [ctypes.c_void_p]
p = ctypes.c_void_p()
for i in range(300):
    if i % 2:
        rt.cudaMalloc(ctypes.byref(p), 4096)  # PY-ODD
    else:
        rt.cudaMalloc(ctypes.byref(p), 8192)  # PY-EVEN
    rt.cudaFree(p)
print("result: ok")
"#;

/// One native path reached from two Python lines in turn: a thread that
/// recognises a repeated native walk (and skips comparing its frames) must
/// still tell the sites apart by their Python frames, every time.
#[test]
fn one_native_path_from_two_python_lines_in_turn_gets_two_sites() {
    let (_, log) = run_python("alternating", PY_ALTERNATING, &[]);
    let log = &log;
    let defs = definitions(log);
    let line_of_stack = |id: &Value| -> u64 {
        let stack = defs.iter().find(|e| e["def"] == "stack" && e["id"] == *id).expect("defined");
        assert!(!stack["native"].as_array().unwrap().is_empty(), "{stack}");
        stack["python"][0][2].as_u64().expect("a Python frame")
    };
    let line = |marker: &str| PY_ALTERNATING.lines().position(|l| l.contains(marker)).unwrap() as u64 + 1;
    let allocs = events(log, "alloc");
    assert_eq!(allocs.len(), 300);
    for (size, marker) in [(4096, "PY-ODD"), (8192, "PY-EVEN")] {
        let ids: std::collections::BTreeSet<String> =
            allocs.iter().filter(|e| e["size"] == size).map(|e| e["stack"].to_string()).collect();
        assert_eq!(ids.len(), 1, "one site for every allocation of {size}: {ids:?}");
        let id = allocs.iter().find(|e| e["size"] == size).unwrap()["stack"].clone();
        assert_eq!(line_of_stack(&id), line(marker), "allocations of {size}");
    }
}
