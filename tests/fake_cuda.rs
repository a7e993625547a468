//! Smoke tests of the fake CUDA driver/runtime and the C test programs,
//! run WITHOUT the cupool shim: each program must report `result: ok` and the
//! fake driver's ground-truth counters must agree with what the program says
//! it did. `cargo test --test fake_cuda`
mod support;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;

use support::*;

/// Runs `name` without the shim; asserts exit status and the result line.
fn run_ok(name: &str, args: &[&str], expect_status: i32) -> (String, HashMap<String, u64>, std::path::PathBuf) {
    let dir = scratch_dir(name);
    let out = run_plain(&fakes().prog(name), args, &dir);
    let stdout = stdout_of(&out);
    assert_eq!(
        out.status.code(),
        Some(expect_status),
        "{name} {args:?}: status {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let result = result_line(&stdout).unwrap_or_else(|| panic!("{name}: no `result: ok` line in:\n{stdout}"));
    (stdout, result, dir)
}

/// The single fake-stats line of a run with one process.
fn only_stats(dir: &Path) -> HashMap<String, u64> {
    let mut stats = fake_stats(dir);
    assert_eq!(stats.len(), 1, "expected one fake-stats line: {stats:?}");
    stats.remove(0)
}

/// Device allocations, frees and live bytes agree between program and driver.
fn assert_agrees(name: &str, result: &HashMap<String, u64>, stats: &HashMap<String, u64>, live_bytes: u64) {
    assert_eq!(stats["allocs"], result["allocs"], "{name}: allocs {stats:?} vs {result:?}");
    assert_eq!(stats["frees"], result["frees"], "{name}: frees {stats:?} vs {result:?}");
    assert_eq!(stats["live_bytes"], live_bytes, "{name}: live_bytes {stats:?}");
}

fn tool_output(tool: &str, args: &[&str]) -> Option<String> {
    match Command::new(tool).args(args).output() {
        Ok(o) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => panic!("{tool} {args:?}: {}", String::from_utf8_lossy(&o.stderr)),
        Err(_) => {
            eprintln!("skipping: {tool} not available");
            None
        }
    }
}

/// Names of the defined dynamic symbols of an ELF file (`nm -D --defined-only`).
fn dynamic_defined(path: &Path) -> Option<BTreeSet<String>> {
    let out = tool_output("nm", &["-D", "--defined-only", path.to_str()?])?;
    Some(out.lines().filter_map(|l| l.split_whitespace().nth(2)).map(String::from).collect())
}

fn dynamic_undefined(path: &Path) -> Option<BTreeSet<String>> {
    let out = tool_output("nm", &["-D", "--undefined-only", path.to_str()?])?;
    Some(
        out.lines()
            .filter_map(|l| l.split_whitespace().last())
            .map(|s| s.split('@').next().unwrap().to_string())
            .collect(),
    )
}

fn needed(path: &Path) -> Option<Vec<String>> {
    let out = tool_output("readelf", &["-d", path.to_str()?])?;
    Some(
        out.lines()
            .filter(|l| l.contains("(NEEDED)"))
            .filter_map(|l| Some(l.split('[').nth(1)?.trim_end_matches(']').to_string()))
            .collect(),
    )
}

#[test]
fn libcuda_exports_exactly_the_driver_api() {
    let expected: BTreeSet<String> = [
        "cuInit",
        "cuDriverGetVersion",
        "cuDeviceGet",
        "cuDeviceGetCount",
        "cuDeviceGetName",
        "cuDeviceTotalMem_v2",
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease_v2",
        "cuDevicePrimaryCtxReset_v2",
        "cuCtxCreate_v2",
        "cuCtxDestroy_v2",
        "cuCtxGetCurrent",
        "cuCtxSetCurrent",
        "cuCtxPushCurrent_v2",
        "cuCtxPopCurrent_v2",
        "cuCtxGetDevice",
        "cuCtxSynchronize",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemAllocPitch_v2",
        "cuMemAllocManaged",
        "cuMemAllocAsync",
        "cuMemAllocAsync_ptsz",
        "cuMemFreeAsync",
        "cuMemFreeAsync_ptsz",
        "cuMemAllocFromPoolAsync",
        "cuMemAllocFromPoolAsync_ptsz",
        "cuMemAllocHost_v2",
        "cuMemHostAlloc",
        "cuMemFreeHost",
        "cuMemCreate",
        "cuMemRelease",
        "cuMemAddressReserve",
        "cuMemAddressFree",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemGetInfo_v2",
        "cuMemGetAddressRange_v2",
        "cuPointerGetAttribute",
        "cuStreamCreate",
        "cuStreamCreateWithPriority",
        "cuStreamDestroy_v2",
        "cuStreamSynchronize",
        "cuStreamIsCapturing",
        "cuEventCreate",
        "cuEventRecord",
        "cuEventQuery",
        "cuEventSynchronize",
        "cuEventDestroy_v2",
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoH_v2",
        "cuMemsetD8_v2",
        "cuGetErrorString",
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let Some(got) = dynamic_defined(&fakes().libcuda()) else {
        return;
    };
    assert_eq!(got, expected);
}

#[test]
fn libcudart_reaches_the_driver_only_through_dlopen() {
    let f = fakes();
    let Some(exports) = dynamic_defined(&f.libcudart()) else {
        return;
    };
    for sym in ["cudaMalloc", "cudaFree", "cudaMalloc3D", "cudaGetDriverEntryPointByVersion"] {
        assert!(exports.contains(sym), "libcudart.so.13 does not export {sym}");
    }
    assert!(exports.iter().all(|s| s.starts_with("cuda")), "stray exports: {exports:?}");
    let undefined = dynamic_undefined(&f.libcudart()).unwrap();
    assert!(undefined.iter().all(|s| !s.starts_with("cu")), "driver symbols referenced: {undefined:?}");
    let deps = needed(&f.libcudart()).unwrap();
    assert!(deps.iter().all(|d| !d.starts_with("libcuda")), "libcudart NEEDED: {deps:?}");
}

#[test]
fn program_linkage_is_as_intended() {
    let f = fakes();
    let Some(static_syms) = dynamic_defined(&f.prog("prog_runtime_static")) else {
        return;
    };
    assert!(!static_syms.iter().any(|s| s.starts_with("cuda")), "static-like exports {static_syms:?}");
    let undefined = dynamic_undefined(&f.prog("prog_runtime_static")).unwrap();
    assert!(!undefined.iter().any(|s| s.starts_with("cu")), "static-like imports {undefined:?}");
    let deps = needed(&f.prog("prog_runtime_static")).unwrap();
    assert!(!deps.iter().any(|d| d.starts_with("libcud")), "static-like NEEDED {deps:?}");

    assert!(needed(&f.prog("prog_runtime")).unwrap().contains(&"libcudart.so.13".to_string()));
    assert!(needed(&f.libplugin()).unwrap().contains(&"libcudart.so.13".to_string()));
    assert!(!needed(&f.prog("prog_dlopen")).unwrap().iter().any(|d| d.starts_with("libcud")));
    assert!(needed(&f.prog("prog_driver")).unwrap().contains(&"libcuda.so.1".to_string()));
    assert!(!needed(&f.prog("prog_getproc")).unwrap().iter().any(|d| d.starts_with("libcud")));
}

/// The workload of prog_runtime / prog_runtime_static / prog_dlopen.
const RUNTIME_LEAKED: u64 = 1_000_003 + 2_000_003 + 3_000_017 + 512 * 7;

fn check_runtime_workload(name: &str, args: &[&str], status: i32) {
    let (stdout, result, dir) = run_ok(name, args, status);
    assert_eq!(result["allocs"], 108, "{stdout}");
    assert_eq!(result["frees"], 104, "{stdout}");
    assert_eq!(result["leaked_bytes"], RUNTIME_LEAKED);
    assert!(stdout.contains("bogus_free=1"), "{stdout}");
    assert!(stdout.contains("oversized_malloc=2"), "{stdout}");
    let stats = only_stats(&dir);
    assert_agrees(name, &result, &stats, RUNTIME_LEAKED);
    assert_eq!(stats["live"], 4);
    assert_eq!(stats["host_allocs"], 2);
    assert_eq!(stats["host_frees"], 2);
}

#[test]
fn prog_runtime_workload_agrees_with_the_drivers_counts() {
    check_runtime_workload("prog_runtime", &[], 0);
}

#[test]
fn prog_runtime_exits_with_the_status_it_is_given() {
    check_runtime_workload("prog_runtime", &["3"], 3);
}

#[test]
fn prog_runtime_static_workload_agrees_with_the_drivers_counts() {
    check_runtime_workload("prog_runtime_static", &[], 0);
}

#[test]
fn prog_dlopen_plugin_workload_agrees_with_the_drivers_counts() {
    check_runtime_workload("prog_dlopen", &[], 0);
}

#[test]
fn prog_runtime_honours_total_mem() {
    let dir = scratch_dir("total-mem");
    let out = plain_command(&fakes().prog("prog_runtime"), &[], &dir)
        .env("FAKE_CUDA_TOTAL_MEM", (64u64 << 20).to_string())
        .output()
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("total=67108864"), "{stdout}");

    // Too small for the 8 MiB blocks of the loop: cudaMalloc fails with 2.
    let out = plain_command(&fakes().prog("prog_runtime"), &[], &dir)
        .env("FAKE_CUDA_TOTAL_MEM", (4u64 << 20).to_string())
        .output()
        .unwrap();
    let stdout = stdout_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("result: FAIL cudaMalloc(&p, n) -> 2"), "{stdout}");
}

#[test]
fn prog_driver_leaves_only_its_device_0_leak_live() {
    let (stdout, result, dir) = run_ok("prog_driver", &[], 0);
    let checkpoint = stdout_value(&stdout, "checkpoint_leaked_bytes").expect("checkpoint line");
    assert_eq!(checkpoint, 5_000_011);
    assert_eq!(result["leaked_bytes"], 4_000_037 + 5_000_011);
    let stats = only_stats(&dir);
    // The device-1 context was destroyed: only the device-0 leak is live.
    assert_agrees("prog_driver", &result, &stats, 4_000_037);
    assert_eq!(stats["live"], 1);
    assert_eq!(stats["host_allocs"], 2);
    assert_eq!(stats["host_frees"], 2);
    assert_eq!(stats["vmm_creates"], 1);
    assert_eq!(stats["vmm_releases"], 1);
}

#[test]
fn prog_driver_needs_two_devices() {
    let dir = scratch_dir("one-device");
    let out = plain_command(&fakes().prog("prog_driver"), &[], &dir).env("FAKE_CUDA_DEVICES", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout_of(&out).contains("need 2 devices, have 1"));
}

#[test]
fn prog_getproc_via_cu_get_proc_address() {
    let (stdout, result, dir) = run_ok("prog_getproc", &[], 0);
    assert_eq!(stdout_value(&stdout, "getproc_matches_dlsym"), Some(1), "{stdout}");
    assert_eq!(result["allocs"], 10);
    assert_eq!(result["frees"], 9);
    let stats = only_stats(&dir);
    assert_agrees("prog_getproc", &result, &stats, result["leaked_bytes"]);
}

#[test]
fn prog_fork_counts_per_process() {
    let (stdout, result, dir) = run_ok("prog_fork", &[], 0);
    let child = stdout_value(&stdout, "child_pid").expect("child_pid");
    let parent = stdout_value(&stdout, "parent_pid").expect("parent_pid");
    assert!(stdout.contains("child: allocs=2 frees=1 leaked_bytes=7777"), "{stdout}");
    assert_eq!(fake_stats(&dir).len(), 2);
    let p = fake_stats_for(&dir, parent).expect("parent stats");
    assert_agrees("prog_fork parent", &result, &p, 6666);
    let c = fake_stats_for(&dir, child).expect("child stats");
    assert_eq!((c["allocs"], c["frees"], c["live"], c["live_bytes"]), (2, 1, 1, 7777));
}

#[test]
fn prog_sleep_runs_to_completion() {
    let (_, result, dir) = run_ok("prog_sleep", &["0"], 0);
    let stats = only_stats(&dir);
    assert_agrees("prog_sleep", &result, &stats, 50 * 4096);
    assert_eq!(stats["live"], 50);
}

#[test]
fn prog_sleep_killed_writes_no_stats() {
    let dir = scratch_dir("sleep-kill");
    let (mut child, lines) = spawn_until(plain_command(&fakes().prog("prog_sleep"), &[], &dir), "ready");
    assert!(lines.iter().any(|l| l.starts_with("result: ok allocs=50")), "{lines:?}");
    child.kill().unwrap(); // SIGKILL: no destructor runs
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert!(fake_stats(&dir).is_empty());
}

#[test]
fn prog_nocuda_runs_without_loading_libcuda() {
    let dir = scratch_dir("nocuda");
    let out = run_plain(&fakes().prog("prog_nocuda"), &["5", "x y"], &dir);
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(stdout_of(&out), "hello 5 x y\n");
    assert!(fake_stats(&dir).is_empty(), "prog_nocuda must not load libcuda");
}

#[test]
fn prog_threads_8000_pairs_agree_with_the_drivers_counts() {
    let (_, result, dir) = run_ok("prog_threads", &[], 0);
    assert_eq!(result["allocs"], 8000);
    assert_eq!(result["frees"], 8000);
    let stats = only_stats(&dir);
    assert_agrees("prog_threads", &result, &stats, 0);
}

#[test]
fn read_logs_handles_complete_and_partial_files() {
    let dir = scratch_dir("logs");
    let header = r#"{"schema":"cupool-log","version":1,"process":{"pid":11,"ppid":1,"cmdline":["a"],"exe":"/a","start_unix_ms":5},"options":{},"events":["#;
    let complete = format!(
        "{header}\n{}\n{}\n{}\n",
        r#"{"seq":0,"t_ns":0,"ev":"start"}"#,
        r#",{"seq":1,"t_ns":9,"ev":"alloc","api":"cudaMalloc","kind":"device","ptr":"0x10","size":3,"device":0,"tid":1}"#,
        concat!(
            r#"],"end":{"end_unix_ms":6,"duration_ms":1,"exit":{"how":"exit","status":0},"devices":[],"#,
            r#""host":{"device":-1,"allocs":0,"frees":0,"failures":0,"current_bytes":0,"peak_bytes":0,"#,
            r#""current_count":0,"peak_count":0},"leaks":[],"leak_summary":{"bytes":0,"count":0},"#,
            r#""dropped_events":0,"pools":[],"ooms":[],"complete":true}}"#
        )
    );
    std::fs::write(dir.join("cupool.11.json"), complete).unwrap();
    let partial = format!(
        "{}\n{}\n{}\n{}",
        header.replace("\"pid\":11", "\"pid\":12"),
        r#"{"seq":0,"t_ns":0,"ev":"start"}"#,
        r#",{"seq":1,"t_ns":9,"ev":"alloc","api":"cuMemAlloc_v2","kind":"device","ptr":"0x20","size":4,"device":1,"tid":1}"#,
        r#",{"seq":2,"t_ns":10,"ev":"fr"#
    );
    std::fs::write(dir.join("cupool.12.json"), partial).unwrap();
    std::fs::write(dir.join("unrelated.json"), "{}").unwrap();

    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 2);
    assert_eq!(logs[0]["_partial"], false);
    assert_eq!(logs[0]["end"]["leak_summary"]["count"], 0);
    assert_eq!(events(&logs[0], "alloc").len(), 1);
    let p = log_for_pid(&logs, 12).unwrap();
    assert_eq!(p["_partial"], true);
    assert_eq!(p["events"].as_array().unwrap().len(), 2);
    assert_eq!(events(p, "alloc")[0]["size"], 4);
    assert!(p.get("end").is_none());
}
