//! Behaviour of the preload shim (`libcupool.so`) on the fake CUDA programs:
//! every allocation seen exactly once whatever the way in, leaks reported
//! exactly, valid logs, failures, exit statuses, fork, signals, threads and
//! options. Ground truth comes from the fake driver's own counters
//! (`FAKE_CUDA_STATS`) and from the programs' `result:` lines.
//! `cargo test --test preload`
mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use support::*;

// ---------------------------------------------------------------------------
// Helpers

/// A finished preloaded run with a single CUDA process.
struct Run {
    dir: PathBuf,
    out: Output,
    stdout: String,
    stderr: String,
    result: HashMap<String, u64>,
    log: Value,
    stats: HashMap<String, u64>,
}

/// These tests hold what cupool records against what the fake driver saw, so
/// they observe in passthrough mode unless `extra` names a mode (pool mode,
/// the default, is `tests/pool.rs`'s and `tests/pool_safety.rs`'s).
fn observing(extra: &str) -> String {
    if extra.contains("mode=") {
        extra.to_string()
    } else if extra.is_empty() {
        "mode=passthrough".to_string()
    } else {
        format!("mode=passthrough:{extra}")
    }
}

/// Runs `prog` preloaded, expects exit status `status`, a `result: ok` line,
/// exactly one valid log and the fake driver's stats line for its pid.
fn run_one(prog: &str, args: &[&str], extra: &str, status: i32) -> Run {
    run_program(&fakes().prog(prog), prog, args, extra, status)
}

/// [`run_one`] for a program built elsewhere (`path`), named `prog` in messages.
fn run_program(path: &std::path::Path, prog: &str, args: &[&str], extra: &str, status: i32) -> Run {
    let dir = scratch_dir(&format!("preload-{prog}"));
    let out = run_preloaded(path, args, &dir, &observing(extra));
    let stdout = stdout_of(&out);
    let stderr = stderr_of(&out);
    assert_eq!(
        out.status.code(),
        Some(status),
        "{prog} {args:?} under the shim: status {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let result =
        result_line(&stdout).unwrap_or_else(|| panic!("{prog}: no `result: ok` line under the shim:\n{stdout}"));
    let mut logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{prog}: expected one log in {}, found {:?}", dir.display(), log_files(&dir));
    let log = logs.remove(0);
    assert_valid_log(&log, prog);
    assert_eq!(log["_partial"], false, "{prog}: log is not complete JSON");
    let pid = log["process"]["pid"].as_u64().unwrap();
    let stats = fake_stats_for(&dir, pid)
        .unwrap_or_else(|| panic!("{prog}: no fake-stats line for pid {pid}: {:?}", fake_stats(&dir)));
    Run { dir, out, stdout, stderr, result, log, stats }
}

fn str_of<'a>(e: &'a Value, k: &str) -> &'a str {
    e[k].as_str().unwrap_or("")
}

fn u64_of(e: &Value, k: &str) -> u64 {
    e[k].as_u64().unwrap_or_else(|| panic!("no numeric {k:?} in {e}"))
}

fn is_host(e: &Value) -> bool {
    e["kind"] == "host"
}

fn hex(v: &Value) -> u64 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a hex string: {v}"));
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("not a hex string: {v}"))
}

fn is_runtime_api(api: &str) -> bool {
    api.starts_with("cuda")
}

fn is_driver_api(api: &str) -> bool {
    api.starts_with("cu") && !api.starts_with("cuda")
}

/// The events that name an API entry point the program called (everything
/// but `start`).
fn api_events(log: &Value) -> Vec<&Value> {
    log["events"].as_array().unwrap().iter().filter(|e| e["ev"] != "start").collect()
}

/// Leaks of the end record as a sorted multiset of
/// (size, kind, api, at, device, ptr-or-handle).
type LeakKey = (u64, String, String, String, i64, u64);

fn leak_set(log: &Value) -> Vec<LeakKey> {
    let mut v: Vec<LeakKey> = log["end"]["leaks"]
        .as_array()
        .expect("end.leaks")
        .iter()
        .map(|l| {
            let p = if l["ptr"].is_string() { &l["ptr"] } else { &l["handle"] };
            (
                u64_of(l, "size"),
                str_of(l, "kind").to_string(),
                str_of(l, "api").to_string(),
                str_of(l, "at").to_string(),
                l["device"].as_i64().unwrap(),
                hex(p),
            )
        })
        .collect();
    v.sort();
    v
}

/// `end.leak_summary` agrees with `end.leaks`, and each `end.devices[d]`
/// holds exactly the bytes of the leaks still live at exit on `d`.
fn assert_end_consistent(log: &Value) {
    let end = &log["end"];
    let leaks = end["leaks"].as_array().expect("end.leaks");
    let sum: u64 = leaks.iter().map(|l| u64_of(l, "size")).sum();
    assert_eq!(end["leak_summary"]["bytes"].as_u64(), Some(sum), "leak_summary.bytes vs leaks: {end}");
    assert_eq!(end["leak_summary"]["count"].as_u64(), Some(leaks.len() as u64), "leak_summary.count vs leaks: {end}");
    let mut live_at_exit: BTreeMap<i64, u64> = BTreeMap::new();
    for l in leaks.iter().filter(|l| l["at"] == "exit" && l["kind"] != "host") {
        *live_at_exit.entry(l["device"].as_i64().unwrap()).or_default() += u64_of(l, "size");
    }
    let devices = end["devices"].as_array().expect("end.devices");
    for d in devices {
        let dev = d["device"].as_i64().unwrap();
        let cur = u64_of(d, "current_bytes");
        assert_eq!(
            cur,
            live_at_exit.get(&dev).copied().unwrap_or(0),
            "end.devices[{dev}].current_bytes vs the leaks live at exit on it: {end}"
        );
        assert!(u64_of(d, "peak_bytes") >= cur, "end.devices[{dev}]: peak_bytes < current_bytes: {d}");
    }
    for dev in live_at_exit.keys() {
        assert!(
            devices.iter().any(|d| d["device"].as_i64() == Some(*dev)),
            "device {dev} has leaks but no end.devices entry: {end}"
        );
    }
    let host_leaked: u64 =
        leaks.iter().filter(|l| l["at"] == "exit" && l["kind"] == "host").map(|l| u64_of(l, "size")).sum();
    assert_eq!(end["host"]["current_bytes"].as_u64(), Some(host_leaked), "end.host.current_bytes vs host leaks: {end}");
}

/// The pointers printed by the program's `leaks 0x.. 0x..` line.
fn printed_leak_ptrs(stdout: &str) -> Vec<u64> {
    let line =
        stdout.lines().find(|l| l.starts_with("leaks ")).unwrap_or_else(|| panic!("no `leaks` line in:\n{stdout}"));
    let mut v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|p| u64::from_str_radix(p.trim_start_matches("0x"), 16).expect("hex pointer"))
        .collect();
    v.sort();
    v
}

// ---------------------------------------------------------------------------
// 1. Every allocation seen exactly once, whatever the way in.

/// Which family of entry points the shim must report for a program.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Family {
    Runtime,
    Driver,
}

fn check_seen_once(prog: &str, family: Family) -> Run {
    let r = run_one(prog, &[], "", 0);
    let s = &r.stats;
    let allocs = events(&r.log, "alloc");
    let frees = events(&r.log, "free");
    let dev_allocs = allocs.iter().filter(|e| !is_host(e)).count() as u64;
    let dev_frees = frees.iter().filter(|e| !is_host(e)).count() as u64;
    let host_allocs = allocs.iter().filter(|e| is_host(e)).count() as u64;
    let host_frees = frees.iter().filter(|e| is_host(e)).count() as u64;
    assert_eq!(
        dev_allocs,
        s["allocs"] + s["vmm_creates"],
        "{prog}: device alloc events vs the driver's allocs + vmm_creates {s:?}"
    );
    assert_eq!(
        dev_frees,
        s["frees"] + s["vmm_releases"],
        "{prog}: device free events vs the driver's frees + vmm_releases {s:?}"
    );
    assert_eq!(host_allocs, s["host_allocs"], "{prog}: host alloc events vs the driver {s:?}");
    assert_eq!(host_frees, s["host_frees"], "{prog}: host free events vs the driver {s:?}");
    // The program's own view agrees with the driver (the shim changed nothing).
    assert_eq!(r.result["allocs"], s["allocs"], "{prog}: {s:?} {:?}", r.result);
    assert_eq!(r.result["frees"], s["frees"], "{prog}: {s:?} {:?}", r.result);

    // The end record counts the same allocations.
    let end = &r.log["end"];
    let end_allocs: u64 = end["devices"].as_array().unwrap().iter().map(|d| u64_of(d, "allocs")).sum();
    let end_frees: u64 = end["devices"].as_array().unwrap().iter().map(|d| u64_of(d, "frees")).sum();
    assert_eq!(end_allocs, dev_allocs, "{prog}: end.devices allocs: {end}");
    assert_eq!(end_frees, dev_frees, "{prog}: end.devices frees: {end}");
    assert_eq!(end["host"]["allocs"].as_u64(), Some(host_allocs), "{prog}: end.host: {end}");

    // No double counting: one layer only reports.
    for e in api_events(&r.log) {
        let api = str_of(e, "api");
        match family {
            Family::Runtime => assert!(
                is_runtime_api(api),
                "{prog}: event from the driver layer although the runtime call was recorded: {e}"
            ),
            Family::Driver => assert!(is_driver_api(api), "{prog}: event with a non-driver api: {e}"),
        }
    }
    r
}

#[test]
fn seen_once_prog_runtime_shared_cudart() {
    let r = check_seen_once("prog_runtime", Family::Runtime);
    assert!(
        !api_events(&r.log).iter().any(|e| is_driver_api(str_of(e, "api"))),
        "driver-API events in a shared-runtime program"
    );
}

#[test]
fn seen_once_prog_runtime_static_cudart() {
    check_seen_once("prog_runtime_static", Family::Driver);
}

#[test]
fn seen_once_prog_dlopen_rtld_local_cudart() {
    check_seen_once("prog_dlopen", Family::Runtime);
}

#[test]
fn seen_once_prog_driver() {
    let r = check_seen_once("prog_driver", Family::Driver);
    // VMM: the physical allocation is counted once, its mapping is timeline only.
    let vmm: Vec<_> = events(&r.log, "alloc").into_iter().filter(|e| e["kind"] == "vmm").collect();
    assert_eq!(vmm.len() as u64, r.stats["vmm_creates"]);
    assert_eq!(events(&r.log, "map").len(), 1);
    assert_eq!(events(&r.log, "unmap").len(), 1);
}

#[test]
fn seen_once_prog_getproc() {
    let r = check_seen_once("prog_getproc", Family::Driver);
    assert_eq!(events(&r.log, "alloc").len(), 10);
    assert_eq!(events(&r.log, "free").len(), 9);
}

// ---------------------------------------------------------------------------
// 2. Planted leaks, exactly.

const LEAK_MALLOC: u64 = 1_000_003;
const LEAK_ASYNC: u64 = 2_000_003;
const LEAK_MANAGED: u64 = 3_000_017;
const LEAK_PITCH: u64 = 512 * 7;

fn check_runtime_leaks(prog: &str, apis: [&str; 4]) {
    let r = run_one(prog, &[], "", 0);
    let ptrs = printed_leak_ptrs(&r.stdout);
    let got = leak_set(&r.log);
    let planted = [
        (LEAK_MALLOC, "device", apis[0]),
        (LEAK_ASYNC, "async", apis[1]),
        (LEAK_MANAGED, "managed", apis[2]),
        (LEAK_PITCH, "pitched", apis[3]),
    ];
    let mut want: Vec<(u64, String, String, String, i64)> =
        planted.iter().map(|(s, k, a)| (*s, k.to_string(), a.to_string(), "exit".to_string(), 0)).collect();
    want.sort();
    let got_no_ptr: Vec<_> = got.iter().map(|(s, k, a, at, d, _)| (*s, k.clone(), a.clone(), at.clone(), *d)).collect();
    assert_eq!(got_no_ptr, want, "{prog}: end.leaks");
    let mut got_ptrs: Vec<u64> = got.iter().map(|l| l.5).collect();
    got_ptrs.sort();
    assert_eq!(got_ptrs, ptrs, "{prog}: leaked pointers vs the program's");
    let sum: u64 = planted.iter().map(|p| p.0).sum();
    assert_eq!(r.result["leaked_bytes"], sum, "{prog}: result line");
    assert_eq!(r.stats["live_bytes"], sum, "{prog}: fake driver");
    assert_end_consistent(&r.log);
}

#[test]
fn leaks_prog_runtime() {
    check_runtime_leaks("prog_runtime", ["cudaMalloc", "cudaMallocAsync", "cudaMallocManaged", "cudaMallocPitch"]);
}

#[test]
fn leaks_prog_runtime_static() {
    check_runtime_leaks(
        "prog_runtime_static",
        ["cuMemAlloc_v2", "cuMemAllocAsync", "cuMemAllocManaged", "cuMemAllocPitch_v2"],
    );
}

#[test]
fn leaks_prog_dlopen() {
    check_runtime_leaks("prog_dlopen", ["cudaMalloc", "cudaMallocAsync", "cudaMallocManaged", "cudaMallocPitch"]);
}

#[test]
fn leaks_prog_driver_context_destroy_and_exit() {
    const LEAK_EXIT: u64 = 4_000_037;
    const LEAK_CTX: u64 = 5_000_011;
    let r = run_one("prog_driver", &[], "", 0);
    let ptrs = printed_leak_ptrs(&r.stdout); // sorted: leak0, leak1 in some order
    let got = leak_set(&r.log);
    assert_eq!(got.len(), 2, "prog_driver leaks: {}", r.log["end"]);
    let exit = got.iter().find(|l| l.0 == LEAK_EXIT).expect("exit leak");
    let ctx = got.iter().find(|l| l.0 == LEAK_CTX).expect("context leak");
    assert_eq!(
        (exit.1.as_str(), exit.2.as_str(), exit.3.as_str(), exit.4),
        ("device", "cuMemAlloc_v2", "exit", 0),
        "exit leak: {}",
        r.log["end"]
    );
    assert_eq!(
        (ctx.1.as_str(), ctx.2.as_str(), ctx.3.as_str(), ctx.4),
        ("device", "cuMemAlloc_v2", "cuCtxDestroy_v2", 1),
        "context leak: {}",
        r.log["end"]
    );
    let mut got_ptrs = vec![exit.5, ctx.5];
    got_ptrs.sort();
    assert_eq!(got_ptrs, ptrs, "leaked pointers vs the program's");
    assert_eq!(r.result["leaked_bytes"], LEAK_EXIT + LEAK_CTX);
    assert_eq!(stdout_value(&r.stdout, "checkpoint_leaked_bytes"), Some(LEAK_CTX));
    assert_eq!(r.stats["live_bytes"], LEAK_EXIT, "fake driver: {:?}", r.stats);

    let cps = events(&r.log, "checkpoint");
    assert_eq!(cps.len(), 1, "checkpoint events: {cps:?}");
    let cp = cps[0];
    assert_eq!(cp["api"], "cuCtxDestroy_v2", "{cp}");
    assert_eq!(cp["device"], 1, "{cp}");
    assert_eq!(cp["leaked_bytes"].as_u64(), Some(LEAK_CTX), "{cp}");
    assert_eq!(cp["leaked_count"].as_u64(), Some(1), "{cp}");
    // The checkpoint comes after the leaked allocation was made.
    let leak_alloc = events(&r.log, "alloc")
        .into_iter()
        .find(|e| hex(&e["ptr"]) == ctx.5 && u64_of(e, "size") == LEAK_CTX)
        .expect("alloc event of the context leak");
    assert!(u64_of(leak_alloc, "seq") < u64_of(cp, "seq"));
    assert_end_consistent(&r.log);
}

#[test]
fn leaks_prog_getproc() {
    let r = run_one("prog_getproc", &[], "", 0);
    let got = leak_set(&r.log);
    assert_eq!(got.len(), 1, "{}", r.log["end"]);
    assert_eq!(got[0].0, r.result["leaked_bytes"]);
    assert_eq!(got[0].0, r.stats["live_bytes"]);
    assert_eq!((got[0].1.as_str(), got[0].2.as_str(), got[0].3.as_str()), ("device", "cuMemAlloc_v2", "exit"));
    assert_end_consistent(&r.log);
}

// ---------------------------------------------------------------------------
// 3. Schema validity.

#[test]
fn every_program_writes_schema_valid_logs() {
    for prog in [
        "prog_runtime",
        "prog_runtime_static",
        "prog_dlopen",
        "prog_driver",
        "prog_getproc",
        "prog_fork",
        "prog_threads",
    ] {
        let dir = scratch_dir(&format!("schema-{prog}"));
        let out = run_preloaded(&fakes().prog(prog), &[], &dir, "");
        assert!(out.status.success(), "{prog}: {:?}\n{}{}", out.status, stdout_of(&out), stderr_of(&out));
        let files = log_files(&dir);
        let logs = read_logs(&dir);
        assert!(!logs.is_empty(), "{prog}: no log");
        assert_eq!(logs.len(), files.len(), "{prog}: unreadable logs in {files:?}");
        for name in &files {
            // A finished process leaves one JSON document.
            let text = std::fs::read_to_string(dir.join(name)).unwrap();
            serde_json::from_str::<Value>(&text)
                .unwrap_or_else(|e| panic!("{prog}: {name} is not one JSON document: {e}"));
        }
        for log in &logs {
            assert_valid_log(log, prog);
            assert_eq!(log["_partial"], false, "{prog}");
            assert!(events(log, "start").len() == 1, "{prog}: one start event expected");
        }
    }
}

#[test]
fn validator_rejects_broken_logs() {
    let r = run_one("prog_getproc", &[], "", 0);
    assert_valid_log(&r.log, "prog_getproc");
    assert!(validate_log(&r.log, "prog_runtime").is_err(), "wrong program accepted");

    let mutate = |f: &dyn Fn(&mut Value)| {
        let mut v = r.log.clone();
        f(&mut v);
        v
    };
    let first_alloc = r.log["events"].as_array().unwrap().iter().position(|e| e["ev"] == "alloc").unwrap();
    let cases: Vec<(&str, Value)> = vec![
        ("schema", mutate(&|v| v["schema"] = "x".into())),
        ("version", mutate(&|v| v["version"] = (cupool_core::log::VERSION + 1).into())),
        ("pid", mutate(&|v| v["process"]["pid"] = 1.into())),
        ("duplicate seq", mutate(&|v| v["events"][first_alloc + 1]["seq"] = v["events"][first_alloc]["seq"].clone())),
        (
            "time backwards",
            mutate(&|v| {
                let evs = v["events"].as_array_mut().unwrap();
                let last = evs.len() - 1;
                evs[last]["t_ns"] = 0.into();
                evs[last]["tid"] = evs[first_alloc]["tid"].clone();
            }),
        ),
        ("decimal ptr", mutate(&|v| v["events"][first_alloc]["ptr"] = "12345".into())),
        (
            "missing size",
            mutate(&|v| {
                v["events"][first_alloc].as_object_mut().unwrap().remove("size");
            }),
        ),
        (
            "missing tid",
            mutate(&|v| {
                v["events"][first_alloc].as_object_mut().unwrap().remove("tid");
            }),
        ),
        ("unknown api", mutate(&|v| v["events"][first_alloc]["api"] = "cuMagic".into())),
        (
            "no end",
            mutate(&|v| {
                v.as_object_mut().unwrap().remove("end");
            }),
        ),
    ];
    for (what, v) in cases {
        assert!(validate_log(&v, "prog_getproc").is_err(), "validator accepted: {what}");
    }
}

// ---------------------------------------------------------------------------
// 4. Failures and invalid frees.

#[test]
fn failed_calls_are_recorded_and_results_passed_through() {
    for prog in ["prog_runtime", "prog_dlopen", "prog_runtime_static"] {
        let r = run_one(prog, &[], "", 0);
        // The program's own checks passed: it saw exactly CUDA's error codes.
        assert_eq!(stdout_value(&r.stdout, "bogus_free"), Some(1), "{prog}");
        assert_eq!(stdout_value(&r.stdout, "oversized_malloc"), Some(2), "{prog}");
        let total: u64 = r
            .stdout
            .lines()
            .find(|l| l.starts_with("meminfo "))
            .and_then(|l| l.split_whitespace().find_map(|kv| kv.strip_prefix("total=")))
            .and_then(|v| v.parse().ok())
            .expect("meminfo line");

        let inv = events(&r.log, "invalid_free");
        assert_eq!(inv.len(), 1, "{prog}: invalid_free events {inv:?}");
        assert_eq!(inv[0]["result"], 1, "{prog}: {}", inv[0]);
        assert_eq!(hex(&inv[0]["ptr"]), 0x123400, "{prog}: {}", inv[0]);

        let failed = events(&r.log, "alloc_failed");
        assert_eq!(failed.len(), 1, "{prog}: alloc_failed events {failed:?}");
        assert_eq!(failed[0]["result"], 2, "{prog}: {}", failed[0]);
        assert_eq!(failed[0]["size"].as_u64(), Some(total + 1), "{prog}: {}", failed[0]);
        assert_eq!(failed[0]["kind"], "device", "{prog}: {}", failed[0]);

        let failures: u64 = r.log["end"]["devices"].as_array().unwrap().iter().map(|d| u64_of(d, "failures")).sum();
        assert_eq!(failures, 1, "{prog}: end.devices failures");
        // The bogus pointer was never live, so it cannot be a leak or a free.
        assert!(!events(&r.log, "free").iter().any(|e| hex(&e["ptr"]) == 0x123400), "{prog}");
    }
}

// ---------------------------------------------------------------------------
// 5. Exit status.

#[test]
fn exit_status_is_preserved() {
    let r = run_one("prog_runtime", &["7"], "", 7);
    assert_eq!(r.log["end"]["exit"], serde_json::json!({"how": "exit", "status": 7}), "end.exit");
    let r = run_one("prog_dlopen", &["9"], "", 9);
    assert_eq!(r.log["end"]["exit"]["status"], 9);
}

// ---------------------------------------------------------------------------
// 6. A program that never uses CUDA is untouched.

#[test]
fn non_cuda_program_is_untouched() {
    let base = scratch_dir("nocuda");
    let stats = base.join("stats");
    let logs = base.join("logs"); // not created by the test
    let prog = fakes().prog("prog_nocuda");
    for args in [&[][..], &["3", "a b"][..]] {
        let plain = run_plain(&prog, args, &stats);
        let pre = plain_command(&prog, args, &stats)
            .env("LD_PRELOAD", shim_path())
            .env("CUPOOL_OPTIONS", cupool_options(&logs, "flush_ms=10"))
            .output()
            .unwrap();
        assert_eq!(pre.status.code(), plain.status.code(), "{args:?}");
        assert_eq!(stdout_of(&pre), stdout_of(&plain), "{args:?}");
        assert_eq!(stderr_of(&pre), stderr_of(&plain), "{args:?}");
    }
    assert!(log_files(&logs).is_empty(), "logs written for a non-CUDA program: {:?}", log_files(&logs));
    if logs.exists() {
        let entries: Vec<_> = std::fs::read_dir(&logs).unwrap().collect();
        assert!(entries.is_empty(), "log dir not empty: {entries:?}");
    }
    assert!(fake_stats(&stats).is_empty(), "the shim loaded libcuda.so.1 into a program that never used CUDA");
}

// ---------------------------------------------------------------------------
// 7. fork.

#[test]
fn fork_child_writes_its_own_log() {
    let dir = scratch_dir("fork");
    let out = run_preloaded(&fakes().prog("prog_fork"), &[], &dir, &observing(""));
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}\n{}", stderr_of(&out));
    let result = result_line(&stdout).expect("result line");
    assert!(stdout.contains("child: allocs=2 frees=1 leaked_bytes=7777"));
    let child_pid = stdout_value(&stdout, "child_pid").expect("child_pid");
    let parent_pid = stdout_value(&stdout, "parent_pid").expect("parent_pid");
    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 2, "logs: {:?}", log_files(&dir));
    for l in &logs {
        assert_valid_log(l, "prog_fork");
        assert_eq!(l["_partial"], false);
    }
    let child = log_for_pid(&logs, child_pid).expect("child's log");
    let parent = log_for_pid(&logs, parent_pid).expect("parent's log");
    assert_eq!(child["process"]["ppid"].as_u64(), Some(parent_pid));

    let cstats = fake_stats_for(&dir, child_pid).expect("child stats");
    let pstats = fake_stats_for(&dir, parent_pid).expect("parent stats");

    // Child: 2 allocs, 1 free, one leak of 7777 bytes.
    let c_allocs = events(child, "alloc");
    assert_eq!(c_allocs.len() as u64, cstats["allocs"]);
    assert_eq!(c_allocs.len(), 2, "child allocs: {c_allocs:?}");
    assert_eq!(events(child, "free").len() as u64, cstats["frees"]);
    let cl = leak_set(child);
    assert_eq!(cl.len(), 1, "child leaks: {}", child["end"]);
    assert_eq!((cl[0].0, cl[0].3.as_str()), (7777, "exit"));
    assert_eq!(child["end"]["exit"]["status"], 0);
    assert_end_consistent(child);

    // Parent: 4 allocs (3 before the fork, 1 after), 3 frees, one 6666 B leak.
    let p_allocs = events(parent, "alloc");
    assert_eq!(p_allocs.len() as u64, pstats["allocs"]);
    assert_eq!(p_allocs.len() as u64, result["allocs"]);
    assert_eq!(events(parent, "free").len() as u64, result["frees"]);
    let sizes: BTreeSet<u64> = p_allocs.iter().map(|e| u64_of(e, "size")).collect();
    assert_eq!(sizes, BTreeSet::from([1000, 2000, 3000, 6666]));
    let pl = leak_set(parent);
    assert_eq!(pl.len(), 1, "parent leaks: {}", parent["end"]);
    assert_eq!((pl[0].0, pl[0].3.as_str()), (6666, "exit"));
    assert_end_consistent(parent);
    // Nothing of the child's leaks into the parent's log.
    assert!(
        !parent["events"].as_array().unwrap().iter().any(|e| e["size"] == 7777 || e["tid"].as_u64() == Some(child_pid)),
        "child's events in the parent's log"
    );
    // ... and nothing of the parent's (before the fork) into the child's.
    assert!(c_allocs.iter().all(|e| e["size"] == 7777), "parent's allocations in the child's log: {c_allocs:?}");
}

// ---------------------------------------------------------------------------
// 8. Signals: SIGKILL leaves a readable partial log; SIGTERM finishes it.

#[test]
fn sigkill_leaves_a_readable_partial_log() {
    let dir = scratch_dir("sigkill");
    let cmd = preloaded_command(&fakes().prog("prog_sleep"), &[], &dir, "flush_ms=50");
    let (mut child, lines) = spawn_until(cmd, "ready");
    assert!(lines.iter().any(|l| l.starts_with("result: ok allocs=50")), "{lines:?}");
    let flushed = wait_for_flushed(&dir, "alloc", 50);
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(flushed, "the allocations never reached the log");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");

    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{:?}", log_files(&dir));
    let log = &logs[0];
    assert_eq!(log["_partial"], true, "a SIGKILLed log cannot be complete");
    assert!(log.get("end").is_none(), "end present after SIGKILL");
    assert_valid_log(log, "prog_sleep");
    assert_eq!(log["process"]["pid"].as_u64(), Some(child.id() as u64));
    assert_eq!(events(log, "alloc").len(), 50, "the alloc events flushed before the kill are all in the log");

    let out = run_cupool(&["report", "--json", dir.to_str().unwrap()], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let rep: Value = serde_json::from_slice(&out.stdout).expect("report --json output");
    let rep = rep.as_array().expect("array");
    assert_eq!(rep.len(), 1, "{rep:?}");
    let s = &rep[0];
    assert_eq!(s["complete"], false, "{s}");
    assert_eq!(s["pid"].as_u64(), Some(child.id() as u64));
    let allocs: u64 = s["devices"].as_array().unwrap().iter().map(|d| u64_of(d, "allocs")).sum();
    assert_eq!(allocs, 50, "{s}");
    assert_eq!(s["leaks"].as_array().unwrap().len(), 50, "{s}");
    assert_eq!(s["leak_bytes"].as_u64(), Some(50 * 4096), "{s}");
}

#[test]
fn sigterm_finishes_the_log_and_still_kills() {
    use std::os::unix::process::ExitStatusExt;
    let dir = scratch_dir("sigterm");
    let cmd = preloaded_command(&fakes().prog("prog_sleep"), &[], &dir, "flush_ms=50");
    let (mut child, _) = spawn_until(cmd, "ready");
    send_signal(child.id(), libc::SIGTERM);
    let status = wait_with_timeout(&mut child, Duration::from_secs(10));
    assert_eq!(status.signal(), Some(15), "prog_sleep must still die of SIGTERM (shell status 143), got {status:?}");

    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{:?}", log_files(&dir));
    let log = &logs[0];
    assert_valid_log(log, "prog_sleep");
    assert_eq!(log["_partial"], false, "log not finished on SIGTERM");
    let exit = &log["end"]["exit"];
    assert_eq!(exit["how"], "signal", "{exit}");
    assert_eq!(exit["name"], "SIGTERM", "{exit}");
    assert_eq!(exit["signal"], 15, "{exit}");
    assert_eq!(events(log, "alloc").len(), 50);
    let leaks = leak_set(log);
    assert_eq!(leaks.len(), 50);
    assert!(leaks.iter().all(|l| l.0 == 4096 && l.3 == "exit"));
    assert_end_consistent(log);
}

// ---------------------------------------------------------------------------
// 9. Threads.

#[test]
fn threads_every_alloc_and_free_recorded() {
    let r = run_one("prog_threads", &[], "", 0);
    assert_eq!(r.result["allocs"], 8000);
    assert_eq!(r.result["frees"], 8000);
    assert_eq!(r.stats["allocs"], 8000);
    let allocs = events(&r.log, "alloc");
    let frees = events(&r.log, "free");
    assert_eq!(allocs.len(), 8000);
    assert_eq!(frees.len(), 8000);
    assert!(leak_set(&r.log).is_empty(), "{}", r.log["end"]["leaks"]);
    assert_eq!(r.log["end"]["leak_summary"]["bytes"], 0);
    assert_eq!(r.log["end"]["dropped_events"], 0);
    assert_end_consistent(&r.log);
    // 8 program threads, 1000 allocations each.
    let mut per_tid: BTreeMap<u64, usize> = BTreeMap::new();
    for e in &allocs {
        *per_tid.entry(u64_of(e, "tid")).or_default() += 1;
    }
    assert_eq!(per_tid.len(), 8, "{per_tid:?}");
    assert!(per_tid.values().all(|&n| n == 1000), "{per_tid:?}");
    // Within each thread, allocs and frees alternate and pair up.
    let mut by_seq: Vec<&Value> = allocs.iter().chain(frees.iter()).copied().collect();
    by_seq.sort_by_key(|e| u64_of(e, "seq"));
    let mut open: HashMap<u64, (u64, u64)> = HashMap::new();
    for e in by_seq {
        let tid = u64_of(e, "tid");
        let key = (hex(&e["ptr"]), u64_of(e, "size"));
        if e["ev"] == "alloc" {
            assert!(open.insert(tid, key).is_none(), "two allocs in a row in tid {tid}: {e}");
        } else {
            assert_eq!(open.remove(&tid), Some(key), "free without its alloc in tid {tid}: {e}");
        }
    }
}

/// A disk that fills up mid-run (here a file size limit, with its signal
/// ignored, as a full disk fails a write): the program runs on unchanged,
/// one line says the log stopped, and the log stays readable: cut back to
/// its last whole write, with the end record when it still fits and the
/// events it could not write counted there, else cut short as by SIGKILL.
/// Room for the header and little more leaves the header; with 70% to 82%
/// of the whole log's bytes some events are written, and where the writes
/// happened to stop decides whether the end record fits, so one of those
/// must have it.
#[test]
fn a_log_that_cannot_be_written_on_stops_whole_and_says_so() {
    let full = run_one("prog_threads", &[], "", 0);
    let text = std::fs::read_to_string(full.dir.join(&log_files(&full.dir)[0])).unwrap();
    let start = text.find(r#""ev":"start""#).expect("the start event");
    let header = (start + text[start..].find('\n').unwrap() + 1) as u64;
    let whole = text.len() as u64;
    let mut ended = 0;
    for limit in [header + 50, whole * 70 / 100, whole * 76 / 100, whole * 82 / 100] {
        let log = log_under_a_size_limit(limit);
        let written = events(&log, "alloc").len() + events(&log, "free").len();
        if limit == header + 50 {
            assert_eq!((log["_partial"].as_bool(), written), (Some(true), 0), "only the header fits");
        } else if log["_partial"] == false {
            ended += 1;
            assert!(written > 0 && written < 16_000, "{limit}: {written} events written");
            assert_eq!(log["end"]["devices"][0]["allocs"], 8000, "the counters are whole");
            let dropped = log["end"]["dropped_events"].as_u64().unwrap() as usize;
            assert_eq!(written + dropped, 16_000, "every event written or counted as dropped");
        }
    }
    assert!(ended > 0, "no run had room for its end record");
}

/// Runs `prog_threads` whose files may not grow past `limit` bytes; checks
/// what must hold whatever the limit and returns its log.
fn log_under_a_size_limit(limit: u64) -> Value {
    use std::os::unix::process::CommandExt;
    let dir = scratch_dir("preload-disk-full");
    let mut cmd = preloaded_command(&fakes().prog("prog_threads"), &[], &dir, "mode=passthrough");
    // SAFETY: async-signal-safe calls only, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let rlimit = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &rlimit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("run prog_threads");
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(0), "{limit}: {stdout}{stderr}");
    let result = result_line(&stdout).expect("result line");
    assert_eq!((result["allocs"], result["frees"]), (8000, 8000));
    let said: Vec<&str> = stderr.lines().filter(|l| l.contains("cannot write")).collect();
    assert_eq!(said.len(), 1, "{limit}: one line about the log: {stderr}");
    assert!(said[0].contains("File too large") && said[0].contains("the program runs on"), "{}", said[0]);
    let files = log_files(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(std::fs::metadata(dir.join(&files[0])).unwrap().len() <= limit);
    let mut logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{limit}: the log is readable");
    let log = logs.remove(0);
    assert_valid_log(&log, "prog_threads");
    log
}

/// Event times are the program's own clock (CLOCK_MONOTONIC) since the
/// start, whatever the shim stamps them with: the gaps between calls in the
/// log are the gaps the program measured, across the writer's flushes.
#[test]
fn event_times_follow_the_programs_clock() {
    let prog = compile_fake_program("timed", "prog_timed.c", &link_fake_cudart());
    let Run { result, log, .. } = run_program(&prog, "timed", &[], "flush_ms=20", 0);
    let calls: Vec<&Value> =
        log["events"].as_array().unwrap().iter().filter(|e| e["ev"] == "alloc" || e["ev"] == "free").collect();
    assert_eq!(calls.len(), 4, "{calls:?}");
    let times: Vec<i64> = calls.iter().map(|e| u64_of(e, "t_ns") as i64).collect();
    for k in 1..=3 {
        let logged = times[k] - times[k - 1];
        // The program read its clock just before and just after each call, so
        // the gap between two stamps lies between these, however long the
        // scheduler or the shim's own start held a call; the slack is for
        // turning the stamps' ticks into nanoseconds.
        let least = result[&format!("gap{k}_min_ns")] as i64;
        let most = result[&format!("gap{k}_max_ns")] as i64;
        let slack = 200_000;
        assert!(
            least - slack <= logged && logged <= most + slack,
            "gap {k}: {logged} ns between the events in the log, the program measured {least}..{most} ns; times {times:?}"
        );
    }
}

#[test]
fn threads_racing_the_lazy_start_are_all_recorded() {
    let prog = compile_fake_program("start_race", "preload_start_race.c", &link_fake_cudart());
    for round in 0..8 {
        let Run { result, log, stats, .. } = run_program(&prog, "start_race", &[], "", 0);
        let log = &log;
        let counted: u64 = log["end"]["devices"].as_array().unwrap().iter().map(|d| u64_of(d, "allocs")).sum();
        let tids: BTreeSet<u64> = events(log, "alloc").iter().map(|e| u64_of(e, "tid")).collect();
        assert_eq!(
            (events(log, "alloc").len() as u64, events(log, "free").len() as u64, counted),
            (stats["allocs"], stats["frees"], result["allocs"]),
            "round {round}: (alloc events, free events, end.devices allocs) vs the driver; \
             threads with events: {}",
            tids.len()
        );
    }
}

// ---------------------------------------------------------------------------
// 10. Options.

#[test]
fn bad_options_complain_once_each_and_keep_defaults() {
    let r = run_one("prog_runtime", &[], "mode=turbo:flush_ms=abc", 0);
    let complaints: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("cupool: CUPOOL_OPTIONS:")).collect();
    assert_eq!(complaints.len(), 2, "stderr:\n{}", r.stderr);
    assert_eq!(complaints.iter().filter(|l| l.contains("turbo")).count(), 1, "{complaints:?}");
    assert_eq!(complaints.iter().filter(|l| l.contains("abc")).count(), 1, "{complaints:?}");
    let opts = &r.log["options"];
    assert_eq!(opts["mode"], "pool", "the default mode: {opts}");
    assert_eq!(opts["flush_ms"], 100, "{opts}");
    assert_eq!(opts["log_dir"], r.dir.to_str().unwrap(), "{opts}");
    assert_eq!(r.log["end"]["leak_summary"]["bytes"], 6003607, "the workload's leaks, found in pool mode too");
    assert!(r.out.status.success());
}

#[test]
fn trace_off_keeps_failures_and_leaks_only() {
    let r = run_one("prog_runtime", &[], "trace=0", 0);
    for ev in ["alloc", "free", "map", "unmap"] {
        assert!(events(&r.log, ev).is_empty(), "{ev} events with trace=0");
    }
    assert_eq!(r.log["options"]["trace"], false);
    assert_eq!(events(&r.log, "invalid_free").len(), 1);
    assert_eq!(events(&r.log, "alloc_failed").len(), 1);
    let sizes: Vec<u64> = leak_set(&r.log).iter().map(|l| l.0).collect();
    assert_eq!(sizes, vec![LEAK_PITCH, LEAK_MALLOC, LEAK_ASYNC, LEAK_MANAGED], "{}", r.log["end"]);
    let allocs: u64 = r.log["end"]["devices"].as_array().unwrap().iter().map(|d| u64_of(d, "allocs")).sum();
    assert_eq!(allocs, r.stats["allocs"], "end.devices still counts");
    assert_end_consistent(&r.log);
}

#[test]
fn log_off_writes_no_file() {
    let base = scratch_dir("log-off");
    let logs = base.join("logs");
    let out = plain_command(&fakes().prog("prog_runtime"), &[], &base)
        .env("LD_PRELOAD", shim_path())
        .env("CUPOOL_OPTIONS", cupool_options(&logs, "log=0"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stdout_of(&out));
    assert!(result_line(&stdout_of(&out)).is_some());
    assert!(log_files(&logs).is_empty(), "{:?}", log_files(&logs));
    assert!(log_files(&base).is_empty(), "{:?}", log_files(&base));
    assert_eq!(fake_stats(&base).len(), 1, "the program ran against the driver");
}

#[test]
fn run_id_is_written_into_the_log() {
    let r = run_one("prog_getproc", &[], "run_id=abc123:verbosity=0", 0);
    assert_eq!(r.log["options"]["run_id"], "abc123");
    assert_eq!(r.log["options"]["verbosity"], 0);
    assert!(r.stderr.is_empty(), "verbosity=0 but stderr:\n{}", r.stderr);
}

/// The hot path's thread-locals are in static TLS, which makes the shim's
/// whole TLS segment static: it must stay small enough for a `dlopen` after
/// start-up to fit in glibc's default surplus (a 5 KiB buffer once did not:
/// "cannot allocate memory in static TLS block").
#[test]
fn the_shim_can_be_dlopened_after_start_up() {
    let prog = compile_c(
        "dlopen_shim",
        r#"
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char** argv) {
    void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    printf("%s\n", h ? "result: loaded" : dlerror());
    return h ? 0 : 1;
}
"#,
        &["-ldl".to_string()],
    );
    let out = std::process::Command::new(&prog).arg(shim_path()).env_remove("GLIBC_TUNABLES").output().unwrap();
    assert!(out.status.success(), "{}{}", stdout_of(&out), stderr_of(&out));
    assert_eq!(stdout_of(&out).trim(), "result: loaded");
}

/// A program that closes a descriptor number it no longer owns and then
/// writes a file of its own under that number keeps its file as it wrote
/// it, and the log is whole. A number closed twice (`double`) never reaches
/// the shim's descriptors, which sit far above the program's; a program that
/// closes the log's own descriptor and puts its file there (`log`) gets not
/// a byte of the log, which goes on in its file opened again by its path.
/// Passed through, in blocks too small for the fake driver to keep a file
/// for: a double close would take a driver's own descriptor from it, as it
/// would a real driver's.
#[test]
fn a_program_reusing_a_closed_descriptor_number_keeps_its_file() {
    let prog = compile_fake_program("fd_reuse", "fd_reuse.c", &link_fake_cudart());
    for mode in ["double", "log"] {
        let dir = scratch_dir(&format!("preload-fd-{mode}"));
        let own = dir.join("own.txt");
        let args = [mode, own.to_str().unwrap()];
        let out = preloaded_command(&prog, &args, &dir.join("logs"), "mode=passthrough").output().unwrap();
        let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
        assert_eq!(out.status.code(), Some(0), "{mode}: {stdout}\n{stderr}");
        let result = result_line(&stdout).unwrap_or_else(|| panic!("{mode}: no result line: {stdout}\n{stderr}"));
        let logs = read_logs(&dir.join("logs"));
        assert_eq!(logs.len(), 1, "{mode}: {stderr}");
        // The program's close found one of the shim's descriptors only where it aimed at the log.
        assert_eq!(result["closed_another"], u64::from(mode == "log"), "{mode}: {stderr}");
        assert_eq!(logs[0]["_partial"], false, "{mode}: the log is whole");
        assert_eq!(events(&logs[0], "alloc").len(), 1 + 100 + 3000, "{mode}: every event written");
        assert!(!stderr.contains("cannot write"), "{mode}: {stderr}");
    }
}
