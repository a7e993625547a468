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
        "cuMemExportToShareableHandle",
        "cuMemImportFromShareableHandle",
        "cuMemRetainAllocationHandle",
        "cuMemAddressReserve",
        "cuMemAddressFree",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemGetInfo_v2",
        "cuMemGetAddressRange_v2",
        "cuPointerGetAttribute",
        "cuMemSetAccess",
        "cuMemGetAllocationGranularity",
        "cuDeviceCanAccessPeer",
        "cuIpcGetMemHandle",
        "cuIpcOpenMemHandle",
        "cuIpcOpenMemHandle_v2",
        "cuIpcCloseMemHandle",
        "cuStreamCreate",
        "cuStreamCreateWithPriority",
        "cuStreamDestroy_v2",
        "cuStreamSynchronize",
        "cuStreamIsCapturing",
        "cuStreamBeginCapture_v2",
        "cuStreamEndCapture",
        "cuCtxGetId",
        // Test-only doors into the fake, under names no shim hooks.
        "fake_device_used",
        "fake_reset_primary_unseen",
        "fake_stream_busy",
        "cuEventCreate",
        "cuEventRecord",
        "cuEventQuery",
        "cuStreamWaitEvent",
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
    for sym in [
        "cudaMalloc",
        "cudaFree",
        "cudaMalloc3D",
        "cudaGetDriverEntryPointByVersion",
        "cudaIpcGetMemHandle",
        "cudaIpcOpenMemHandle",
        "cudaIpcCloseMemHandle",
    ] {
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
    assert!(needed(&f.prog("prog_ipc")).unwrap().contains(&"libcudart.so.13".to_string()));
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

// ---------------------------------------------------------------------------
// Legacy CUDA IPC between real processes (prog_ipc, fake_cuda_ipc.c)

/// The first 16 bytes of the exporter's buffer, as `prog_ipc import` prints
/// them (byte i of MiB k is `k << 4 | i`).
const BASE_DATA: &str = "000102030405060708090a0b0c0d0e0f";

/// A running `prog_ipc` with piped stdin and stdout.
struct Proc {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    out: std::io::BufReader<std::process::ChildStdout>,
    lines: Vec<String>,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Proc {
        use std::process::Stdio;
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawn prog_ipc");
        let stdin = child.stdin.take();
        let out = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
        Proc { child, stdin, out, lines: Vec::new() }
    }

    /// Reads lines until one equal to `marker`; returns the lines of this call.
    fn until(&mut self, marker: &str) -> Vec<String> {
        use std::io::BufRead;
        let mut got = Vec::new();
        loop {
            let mut line = String::new();
            if self.out.read_line(&mut line).expect("read prog_ipc stdout") == 0 {
                let _ = self.child.kill();
                panic!("prog_ipc ended before {marker:?}; output: {:?}", self.lines);
            }
            let line = line.trim_end().to_string();
            self.lines.push(line.clone());
            got.push(line.clone());
            if line == marker {
                return got;
            }
        }
    }

    fn send(&mut self, text: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin.write_all(text.as_bytes()).and_then(|_| stdin.flush()).expect("write to prog_ipc");
    }

    /// Closes stdin, reads the rest of stdout and waits (at most 30 s).
    fn finish(mut self) -> (i32, String) {
        use std::io::Read;
        drop(self.stdin.take());
        let mut rest = String::new();
        self.out.read_to_string(&mut rest).expect("read prog_ipc stdout");
        let status = wait_with_timeout(&mut self.child, std::time::Duration::from_secs(30));
        let mut all = self.lines.join("\n");
        all.push('\n');
        all.push_str(&rest);
        (status.code().unwrap_or(-1), all)
    }
}

/// `prog_ipc export n` (without the shim, stats in `dir`), up to `ready`.
/// Returns the process and its handle lines.
fn ipc_exporter(dir: &Path, n: usize) -> (Proc, Vec<String>) {
    let mut p = Proc::spawn(plain_command(&fakes().prog("prog_ipc"), &["export", &n.to_string()], dir));
    let lines = p.until("ready");
    assert!(lines.contains(&"small_handle=1".to_string()), "a 4 KiB buffer has no handle: {lines:?}");
    let handles: Vec<String> = lines.into_iter().filter(|l| l.len() == 128).collect();
    assert_eq!(handles.len(), n, "{:?}", p.lines);
    for h in &handles {
        assert!(h.bytes().all(|b| b.is_ascii_hexdigit()), "{h}");
    }
    (p, handles)
}

/// One `open` line of `prog_ipc import`: rc, and for rc 0 the delta and data.
#[derive(Debug, PartialEq)]
struct Opened {
    rc: u64,
    delta: Option<i64>,
    data: Option<String>,
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

fn opens(stdout: &str) -> Vec<Opened> {
    stdout
        .lines()
        .filter(|l| l.starts_with("open "))
        .map(|l| Opened {
            rc: field(l, "rc").and_then(|v| v.parse().ok()).expect("rc"),
            delta: field(l, "delta").map(|v| v.parse().expect("delta")),
            data: field(l, "data").map(String::from),
        })
        .collect()
}

fn opened_base() -> Opened {
    Opened { rc: 0, delta: Some(0), data: Some(BASE_DATA.to_string()) }
}

fn refused() -> Opened {
    Opened { rc: 1, delta: None, data: None }
}

/// Runs `prog_ipc import` on `handles` to completion (stats in `dir`);
/// asserts it passed its own checks. Returns stdout, result line and pid.
fn ipc_import(dir: &Path, handles: &[String]) -> (String, HashMap<String, u64>, u64) {
    let mut p = Proc::spawn(plain_command(&fakes().prog("prog_ipc"), &["import"], dir));
    let pid = u64::from(p.child.id());
    p.send(&format!("{}\nend\n", handles.join("\n")));
    let (code, stdout) = p.finish();
    assert_eq!(code, 0, "prog_ipc import:\n{stdout}");
    let result = result_line(&stdout).unwrap_or_else(|| panic!("no result line:\n{stdout}"));
    (stdout, result, pid)
}

/// Lets the exporter free and exit; asserts it did so cleanly.
fn finish_exporter(mut exporter: Proc, dir: &Path) {
    let pid = u64::from(exporter.child.id());
    exporter.send("free\n");
    exporter.until("freed");
    let (code, stdout) = exporter.finish();
    assert_eq!(code, 0, "prog_ipc export:\n{stdout}");
    let stats = fake_stats_for(dir, pid).expect("exporter stats");
    assert_eq!((stats["allocs"], stats["frees"], stats["live"]), (2, 2, 0), "{stats:?}");
    assert_eq!((stats["ipc_opens"], stats["ipc_closes"]), (0, 0), "{stats:?}");
}

fn hex_bytes(h: &str) -> Vec<u8> {
    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect()
}

fn bytes_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn ipc_interior_handles_are_the_bases_and_open_the_whole_allocation() {
    let dir = scratch_dir("ipc-interior");
    let (exporter, handles) = ipc_exporter(&dir, 4);
    // Handles of base + k MiB: byte-identical to the base's, bytes 56..63 zero.
    for h in &handles {
        assert_eq!(h, &handles[0], "interior handle differs from the base's");
        assert!(hex_bytes(h)[56..].iter().all(|&b| b == 0), "{h}");
    }
    let (stdout, result, pid) = ipc_import(&dir, &handles);
    // Every open maps the whole allocation and returns its base: the data is
    // the base's (00 01 ..), not that of MiB k (k0 k1 ..).
    assert_eq!(opens(&stdout), (0..4).map(|_| opened_base()).collect::<Vec<_>>(), "{stdout}");
    assert_eq!((result["opens"], result["errors"], result["closes"]), (4, 0, 4), "{stdout}");
    let stats = fake_stats_for(&dir, pid).expect("importer stats");
    assert_eq!((stats["ipc_opens"], stats["ipc_closes"]), (4, 4), "{stats:?}");
    // The mapping counts as no allocation of the importer's.
    assert_eq!((stats["allocs"], stats["frees"], stats["live"], stats["live_bytes"]), (1, 1, 0, 0), "{stats:?}");
    finish_exporter(exporter, &dir);
}

#[test]
fn ipc_repeated_opens_share_one_mapping_and_each_needs_a_close() {
    let dir = scratch_dir("ipc-refcount");
    let (exporter, handles) = ipc_exporter(&dir, 1);
    let three = vec![handles[0].clone(); 3];
    let (stdout, result, pid) = ipc_import(&dir, &three);
    // Same pointer three times (delta 0); prog_ipc closes each open (every
    // close succeeds), then checks that a fourth close of the pointer and a
    // close of its own cudaMalloc pointer fail with 1.
    assert_eq!(opens(&stdout), (0..3).map(|_| opened_base()).collect::<Vec<_>>(), "{stdout}");
    assert_eq!((result["opens"], result["closes"]), (3, 3), "{stdout}");
    let stats = fake_stats_for(&dir, pid).expect("importer stats");
    assert_eq!((stats["ipc_opens"], stats["ipc_closes"]), (3, 3), "{stats:?}");
    finish_exporter(exporter, &dir);
}

#[test]
fn ipc_handle_bytes_0_and_60_are_ignored_and_garbage_is_refused() {
    let dir = scratch_dir("ipc-garbage");
    let (exporter, handles) = ipc_exporter(&dir, 1);
    let good = hex_bytes(&handles[0]);
    let variant = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        bytes_hex(&b)
    };
    let accepted = [
        variant(&|b| b[0] ^= 0xff),
        variant(&|b| b[60] ^= 0x5a),
        variant(&|b| {
            b[0] = 0x11;
            b[60] = 0x22;
        }),
    ];
    let refused_handles = vec![
        "00".repeat(64),
        "5a".repeat(64),
        variant(&|b| b[1] ^= 1),                                         // magic
        variant(&|b| b[8..12].copy_from_slice(&i32::MAX.to_ne_bytes())), // no such process
        variant(&|b| b[12..16].copy_from_slice(&0i32.to_ne_bytes())),    // the exporter's stdin, not the memfd
        variant(&|b| b[12..16].copy_from_slice(&999i32.to_ne_bytes())),  // no such descriptor
        variant(&|b| b[45] = 1),                                         // a reserved byte
        variant(&|b| b[63] = 1),                                         // bytes 56..63 other than 60
    ];
    let all: Vec<String> = accepted.iter().chain(&refused_handles).cloned().collect();
    let (stdout, result, _) = ipc_import(&dir, &all);
    let want: Vec<Opened> =
        accepted.iter().map(|_| opened_base()).chain(refused_handles.iter().map(|_| refused())).collect();
    assert_eq!(opens(&stdout), want, "{stdout}");
    assert_eq!((result["opens"], result["errors"]), (3, 8), "{stdout}");
    finish_exporter(exporter, &dir);
}

#[test]
fn ipc_mapping_outlives_the_exporters_free_and_later_opens_fail() {
    let dir = scratch_dir("ipc-free");
    let (mut exporter, handles) = ipc_exporter(&dir, 2);
    let mut holder = Proc::spawn(plain_command(&fakes().prog("prog_ipc"), &["import", "hold"], &dir));
    holder.send(&format!("{}\nend\n", handles.join("\n")));
    let held = holder.until("holding");
    assert_eq!(opens(&held.join("\n")), vec![opened_base(), opened_base()], "{held:?}");

    // The exporter frees its buffer (and stays alive, its memfd closed).
    exporter.send("free\n");
    exporter.until("freed");
    let (stdout, result, _) = ipc_import(&dir, &handles[..1]);
    assert_eq!(opens(&stdout), vec![refused()], "open after the exporter's free:\n{stdout}");
    assert_eq!(result["errors"], 1);

    // The holder's mapping still holds the data, until its last close.
    holder.send("go\n");
    let (code, out) = holder.finish();
    assert_eq!(code, 0, "{out}");
    let after: Vec<&str> = out.lines().filter(|l| l.starts_with("after ")).collect();
    assert_eq!(after.len(), 2, "{out}");
    for l in after {
        assert_eq!(field(l, "data"), Some(BASE_DATA), "{out}");
    }
    assert_eq!(result_line(&out).unwrap()["closes"], 2, "{out}");

    let pid = u64::from(exporter.child.id());
    let (code, out) = exporter.finish();
    assert_eq!(code, 0, "{out}");
    assert_eq!(fake_stats_for(&dir, pid).expect("exporter stats")["live"], 0);
    // The exporter is gone altogether: still refused.
    let (stdout, _, _) = ipc_import(&dir, &handles[..1]);
    assert_eq!(opens(&stdout), vec![refused()], "open after the exporter's exit:\n{stdout}");
}

#[test]
fn ipc_through_the_driver_api_and_pointer_attributes() {
    // fake_cuda_ipc.c checks BUFFER_ID / IS_LEGACY_CUDA_IPC_CAPABLE, the
    // handles, cuGetProcAddress, and (in a forked receiver) the driver's
    // copies and memset on the mapping, both ways.
    let prog = compile_fake_program("ipcdriver", "fake_cuda_ipc.c", &link_fake_cuda());
    let dir = scratch_dir("ipc-driver");
    let out = run_plain(&prog, &[], &dir);
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(stdout.contains("child: ok"), "{stdout}");
    let result = result_line(&stdout).expect("result line");
    let child = stdout_value(&stdout, "child_pid").expect("child_pid");
    let parent = fake_stats(&dir).into_iter().find(|s| s["pid"] != child).expect("parent stats");
    assert_agrees("ipcdriver", &result, &parent, 0);
    assert_eq!((parent["ipc_opens"], parent["ipc_closes"]), (0, 0));
    let c = fake_stats_for(&dir, child).expect("child stats");
    assert_eq!((c["ipc_opens"], c["ipc_closes"], c["allocs"], c["live"]), (2, 2, 0, 0), "{c:?}");
}
