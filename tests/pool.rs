//! Pool mode on fixed segments (`CUPOOL_OPTIONS=mode=pool:backing=segments`):
//! device allocations served from cupool's per-context pools over the fake driver. Every fake program must
//! still run correctly, the driver must see only the pools' segments (plus
//! what pool mode passes through: managed and stream-ordered memory), blocks
//! must be reused, `limit` must cap the pool and shape `cuMemGetInfo`, pointer
//! range queries must describe the block the program got, error codes must be
//! CUDA's own, and context destruction must leave the other contexts working.
//! Ground truth comes from the fake driver's counters (`FAKE_CUDA_STATS`), the
//! programs' own `result:` lines and `key=value` lines they print.
//! `cargo test --test pool`
mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::*;

/// The segment pool with every segment kept (`give_back=never`): these
/// tests are about the segment pool's own mechanics (`tests/pool_vmm.rs`
/// runs programs on VMM pages); `tests/pool_safety.rs` covers giving
/// segments back, which the default options do.
const POOL: &str = "mode=pool:backing=segments:give_back=never";
const PASSTHROUGH: &str = "mode=passthrough";
const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------
// Helpers

/// A finished preloaded run with a single CUDA process.
struct Run {
    dir: PathBuf,
    stdout: String,
    result: HashMap<String, u64>,
    log: Value,
    stats: HashMap<String, u64>,
}

/// Runs `prog` preloaded with `extra` options in a fresh log directory;
/// expects exit status 0, a `result: ok` line, exactly one complete log and
/// the fake driver's stats line for the process. The log is *not* validated
/// here: callers do it last, so that a schema problem does not hide the
/// behaviour under test.
fn run_prog(prog: &Path, args: &[&str], extra: &str) -> Run {
    let name = prog.file_name().unwrap().to_string_lossy().into_owned();
    let dir = scratch_dir(&format!("pool-{name}"));
    let out = run_preloaded(prog, args, &dir, extra);
    let stdout = stdout_of(&out);
    let stderr = stderr_of(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{name} {args:?} with {extra:?}: status {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let result = result_line(&stdout).unwrap_or_else(|| {
        panic!("{name} {args:?} with {extra:?}: no `result: ok` line:\n{stdout}\nstderr:\n{stderr}")
    });
    let mut logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{name}: expected one log in {}, found {:?}", dir.display(), log_files(&dir));
    let log = logs.remove(0);
    assert_eq!(log["_partial"], false, "{name}: log is not complete JSON");
    let pid = log["process"]["pid"].as_u64().unwrap();
    let stats = fake_stats_for(&dir, pid)
        .unwrap_or_else(|| panic!("{name}: no fake-stats line for pid {pid}: {:?}", fake_stats(&dir)));
    Run { dir, stdout, result, log, stats }
}

fn run_fake(prog: &str, extra: &str) -> Run {
    run_prog(&fakes().prog(prog), &[], extra)
}

/// `key=<number>` printed by the program; panics when missing.
fn value(r: &Run, key: &str) -> u64 {
    stdout_value(&r.stdout, key)
        .unwrap_or_else(|| panic!("no `{key}=` line (run in {}) in:\n{}", r.dir.display(), r.stdout))
}

fn u64_of(e: &Value, k: &str) -> u64 {
    e[k].as_u64().unwrap_or_else(|| panic!("no numeric {k:?} in {e}"))
}

fn str_of<'a>(e: &'a Value, k: &str) -> &'a str {
    e[k].as_str().unwrap_or("")
}

fn hex(v: &Value) -> u64 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a hex string: {v}"));
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("not a hex string: {v}"))
}

/// Kinds that pool mode passes through to the driver.
fn passed_through(e: &Value) -> bool {
    matches!(str_of(e, "kind"), "managed" | "async")
}

/// Kinds the pool serves.
fn pooled_kind(e: &Value) -> bool {
    matches!(str_of(e, "kind"), "device" | "pitched")
}

/// `ev` events of device memory the program allocated (not host, not VMM).
fn mem_events<'a>(log: &'a Value, ev: &str) -> Vec<&'a Value> {
    events(log, ev).into_iter().filter(|e| !matches!(str_of(e, "kind"), "host" | "vmm")).collect()
}

fn pools(log: &Value) -> &Vec<Value> {
    log["end"]["pools"].as_array().unwrap_or_else(|| panic!("end.pools is not an array: {}", log["end"]))
}

fn pool_sum(log: &Value, field: &str) -> u64 {
    pools(log).iter().map(|p| u64_of(p, field)).sum()
}

fn stat_current(p: &Value, field: &str) -> u64 {
    p[field]["current"].as_u64().unwrap_or_else(|| panic!("no {field}.current in {p}"))
}

/// One counter of a pool's `fences` (an object since log schema version 2).
fn fence_counter(p: &Value, name: &str) -> u64 {
    p["fences"][name].as_u64().unwrap_or_else(|| panic!("no {name} in fences {}", p["fences"]))
}

/// Leaks of the end record as sorted (size, kind, api, at, device).
fn leak_set(log: &Value) -> Vec<(u64, String, String, String, i64)> {
    let mut v: Vec<_> = log["end"]["leaks"]
        .as_array()
        .expect("end.leaks")
        .iter()
        .map(|l| {
            (
                u64_of(l, "size"),
                str_of(l, "kind").to_string(),
                str_of(l, "api").to_string(),
                str_of(l, "at").to_string(),
                l["device"].as_i64().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

fn leak_ptrs(log: &Value) -> Vec<u64> {
    let mut v: Vec<u64> = log["end"]["leaks"].as_array().expect("end.leaks").iter().map(|l| hex(&l["ptr"])).collect();
    v.sort();
    v
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

/// `end.leak_summary` agrees with `end.leaks`, and each `end.devices[d]`
/// holds exactly the bytes of the device leaks still live at exit on `d`.
fn assert_end_consistent(log: &Value) {
    let end = &log["end"];
    let leaks = end["leaks"].as_array().expect("end.leaks");
    let sum: u64 = leaks.iter().map(|l| u64_of(l, "size")).sum();
    assert_eq!(end["leak_summary"]["bytes"].as_u64(), Some(sum), "leak_summary.bytes vs leaks: {end}");
    assert_eq!(end["leak_summary"]["count"].as_u64(), Some(leaks.len() as u64), "leak_summary.count: {end}");
    let mut live_at_exit: BTreeMap<i64, u64> = BTreeMap::new();
    for l in leaks.iter().filter(|l| l["at"] == "exit" && l["kind"] != "host") {
        *live_at_exit.entry(l["device"].as_i64().unwrap()).or_default() += u64_of(l, "size");
    }
    for d in end["devices"].as_array().expect("end.devices") {
        let dev = d["device"].as_i64().unwrap();
        assert_eq!(
            u64_of(d, "current_bytes"),
            live_at_exit.get(&dev).copied().unwrap_or(0),
            "end.devices[{dev}].current_bytes vs the leaks live at exit on it: {end}"
        );
    }
}

// ---------------------------------------------------------------------------
// 1. Every fake program runs correctly in pool mode, and the pool serves it.

const LEAK_MALLOC: u64 = 1_000_003;
const LEAK_ASYNC: u64 = 2_000_003;
const LEAK_MANAGED: u64 = 3_000_017;
const LEAK_PITCH: u64 = 512 * 7;
const LEAK_EXIT_DRIVER: u64 = 4_000_037;
const LEAK_CTX_DRIVER: u64 = 5_000_011;

type Planted<'a> = &'a [(u64, &'a str, &'a str, &'a str, i64)];

/// Checks one process's pool-mode log against its program and the driver:
/// alloc/free events equal the program's own counts, leaks are exactly the
/// planted ones, and the driver's counters equal the pools' segments plus the
/// passed-through allocations. Strict driver-count equalities and schema
/// validation come last.
fn check_pool_process(
    name: &str,
    prog: &str,
    log: &Value,
    stats: &HashMap<String, u64>,
    result: &HashMap<String, u64>,
    planted: Planted,
) {
    assert_eq!(log["options"]["mode"], "pool", "{name}: options {}", log["options"]);
    let allocs = mem_events(log, "alloc");
    let frees = mem_events(log, "free");
    assert_eq!(allocs.len() as u64, result["allocs"], "{name}: alloc events vs the program's count");
    assert_eq!(frees.len() as u64, result["frees"], "{name}: free events vs the program's count");
    let count = |ev: &str, kind: &str| events(log, ev).iter().filter(|e| e["kind"] == kind).count() as u64;
    assert_eq!(count("alloc", "host"), stats["host_allocs"], "{name}: pinned host memory passes through {stats:?}");
    assert_eq!(count("free", "host"), stats["host_frees"], "{name}: {stats:?}");
    assert_eq!(count("alloc", "vmm"), stats["vmm_creates"], "{name}: VMM passes through {stats:?}");
    assert_eq!(count("free", "vmm"), stats["vmm_releases"], "{name}: {stats:?}");
    let end = &log["end"];
    let end_allocs: u64 = end["devices"].as_array().unwrap().iter().map(|d| u64_of(d, "allocs")).sum();
    assert_eq!(end_allocs, allocs.len() as u64 + count("alloc", "vmm"), "{name}: end.devices allocs: {end}");
    // Pooled blocks are 512-byte aligned (and so 256-byte aligned like CUDA's).
    for e in allocs.iter().filter(|e| pooled_kind(e)) {
        assert_eq!(hex(&e["ptr"]) % 512, 0, "{name}: misaligned pooled block {e}");
    }

    // Leaks: exactly the planted ones.
    let mut want: Vec<_> =
        planted.iter().map(|(s, k, a, at, d)| (*s, k.to_string(), a.to_string(), at.to_string(), *d)).collect();
    want.sort();
    assert_eq!(leak_set(log), want, "{name}: end.leaks {}", end["leaks"]);
    let planted_bytes: u64 = planted.iter().map(|p| p.0).sum();
    assert_eq!(result["leaked_bytes"], planted_bytes, "{name}: the program's own leaked_bytes");
    assert_end_consistent(log);

    // What the driver still holds at exit: the live pools' segments plus the
    // passed-through allocations still live.
    let reserved: u64 = pools(log).iter().map(|p| stat_current(p, "reserved_bytes")).sum();
    let passthrough_live: u64 = end["leaks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["at"] == "exit" && passed_through(l))
        .map(|l| u64_of(l, "size"))
        .sum();
    assert_eq!(
        stats["live_bytes"],
        reserved + passthrough_live,
        "{name}: driver's live bytes vs pools' reserved {reserved} + passed-through leaks {passthrough_live}: {}",
        end["pools"]
    );
    // Each pool's books: what is still requested is exactly the pooled leaks of its device.
    for p in pools(log) {
        let dev = p["device"].as_i64().unwrap();
        let pooled_live: u64 = end["leaks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["at"] == "exit" && pooled_kind(l) && l["device"].as_i64() == Some(dev))
            .map(|l| u64_of(l, "size"))
            .sum();
        assert_eq!(stat_current(p, "requested_bytes"), pooled_live, "{name}: pool of device {dev}: {p}");
        assert!(stat_current(p, "reserved_bytes") >= stat_current(p, "allocated_bytes"), "{name}: {p}");
        assert!(stat_current(p, "allocated_bytes") >= stat_current(p, "requested_bytes"), "{name}: {p}");
    }

    // The pool really served the device allocations: the driver saw only
    // segments and the passed-through kinds.
    let pooled = allocs.iter().filter(|e| pooled_kind(e)).count() as u64;
    let through_allocs = allocs.iter().filter(|e| passed_through(e)).count() as u64;
    let through_frees = frees.iter().filter(|e| passed_through(e)).count() as u64;
    assert_eq!(pooled + through_allocs, allocs.len() as u64, "{name}: unexpected kinds in {allocs:?}");
    let segments = pool_sum(log, "num_device_alloc");
    assert!(pooled > 0 && segments > 0, "{name}: nothing pooled: {}", end["pools"]);
    assert!(segments < pooled, "{name}: {segments} segments for {pooled} pooled allocations");
    assert_eq!(
        (stats["allocs"], stats["frees"]),
        (segments + through_allocs, pool_sum(log, "num_device_free") + through_frees),
        "{name}: the driver's (allocs, frees) vs (Σ end.pools[].num_device_alloc + passed-through allocations \
         ({through_allocs}), Σ end.pools[].num_device_free + passed-through frees ({through_frees})); pools: {}",
        end["pools"]
    );
    assert_valid_log(log, prog);
}

fn check_pool_program(prog: &str, planted: Planted) -> Run {
    let r = run_fake(prog, POOL);
    check_pool_process(prog, prog, &r.log, &r.stats, &r.result, planted);
    r
}

fn check_runtime_program(prog: &str, apis: [&str; 4]) {
    let planted = [
        (LEAK_MALLOC, "device", apis[0], "exit", 0),
        (LEAK_ASYNC, "async", apis[1], "exit", 0),
        (LEAK_MANAGED, "managed", apis[2], "exit", 0),
        (LEAK_PITCH, "pitched", apis[3], "exit", 0),
    ];
    let r = check_pool_program(prog, &planted);
    assert_eq!(leak_ptrs(&r.log), printed_leak_ptrs(&r.stdout), "{prog}: leaked pointers vs the program's");
    // The workload's own checks of CUDA's error codes passed; the oversized
    // request failed in the pool, with an OOM snapshot.
    assert_eq!(stdout_value(&r.stdout, "bogus_free"), Some(1), "{prog}");
    assert_eq!(stdout_value(&r.stdout, "oversized_malloc"), Some(2), "{prog}");
    let failed = events(&r.log, "alloc_failed");
    assert_eq!(failed.len(), 1, "{prog}: {failed:?}");
    assert_eq!(failed[0]["result"], 2, "{prog}: {}", failed[0]);
    assert_eq!(events(&r.log, "oom").len(), 1, "{prog}");
    assert!(pool_sum(&r.log, "num_ooms") >= 1, "{prog}: {}", r.log["end"]["pools"]);
    let oom = &r.log["end"]["ooms"][0];
    assert_eq!(oom["requested"].as_u64(), failed[0]["size"].as_u64(), "{prog}: end.ooms {}", r.log["end"]["ooms"]);
    // Both pitched calls got the documented pitch (the workload checks 512 too).
    let pitched: Vec<u64> =
        mem_events(&r.log, "alloc").iter().filter(|e| e["kind"] == "pitched").map(|e| u64_of(e, "size")).collect();
    assert!(pitched.contains(&(512 * 10)) && pitched.contains(&LEAK_PITCH), "{prog}: pitched sizes {pitched:?}");
}

#[test]
fn pool_prog_runtime() {
    check_runtime_program("prog_runtime", ["cudaMalloc", "cudaMallocAsync", "cudaMallocManaged", "cudaMallocPitch"]);
}

#[test]
fn pool_prog_runtime_static() {
    check_runtime_program(
        "prog_runtime_static",
        ["cuMemAlloc_v2", "cuMemAllocAsync", "cuMemAllocManaged", "cuMemAllocPitch_v2"],
    );
}

#[test]
fn pool_prog_dlopen() {
    check_runtime_program("prog_dlopen", ["cudaMalloc", "cudaMallocAsync", "cudaMallocManaged", "cudaMallocPitch"]);
}

#[test]
fn pool_prog_driver() {
    let planted = [
        (LEAK_EXIT_DRIVER, "device", "cuMemAlloc_v2", "exit", 0),
        (LEAK_CTX_DRIVER, "device", "cuMemAlloc_v2", "cuCtxDestroy_v2", 1),
    ];
    let r = check_pool_program("prog_driver", &planted);
    assert_eq!(leak_ptrs(&r.log), printed_leak_ptrs(&r.stdout), "leaked pointers vs the program's");
}

#[test]
fn pool_prog_getproc() {
    let r = check_pool_program("prog_getproc", &[(10_007, "device", "cuMemAlloc_v2", "exit", 0)]);
    assert_eq!(r.stats["allocs"], 1, "10 small allocations fit one 2 MiB segment: {:?}", r.stats);
}

#[test]
fn pool_prog_threads() {
    let r = check_pool_program("prog_threads", &[]);
    assert_eq!(r.result["allocs"], 8000);
    assert_eq!(r.log["end"]["dropped_events"], 0);
    // 8 threads hold at most 8 × 256 KiB at once: a handful of segments, not 8000 allocations.
    assert!(r.stats["allocs"] <= 4, "driver allocations for 8000 pooled ones: {:?}", r.stats);
    // Within each thread, allocs and frees alternate and pair up.
    let mut by_seq: Vec<&Value> = events(&r.log, "alloc").into_iter().chain(events(&r.log, "free")).collect();
    by_seq.sort_by_key(|e| u64_of(e, "seq"));
    let mut open: HashMap<u64, (u64, u64)> = HashMap::new();
    for e in by_seq {
        let tid = u64_of(e, "tid");
        let (ptr, size) = (hex(&e["ptr"]), u64_of(e, "size"));
        if e["ev"] == "alloc" {
            assert!(open.insert(tid, (ptr, size)).is_none(), "two allocs in a row in tid {tid}: {e}");
        } else {
            assert_eq!(open.remove(&tid), Some((ptr, size)), "free without its alloc in tid {tid}: {e}");
        }
    }
}

#[test]
fn timeline_never_hands_out_a_block_before_its_free() {
    // A block freed by one thread and taken by another at once must appear in
    // the log (in `seq` order, the documented order) as freed before it is
    // allocated again. The window is narrow: up to three runs.
    let prog = compile_fake_program("churn", "pool_churn.c", &link_fake_cudart());
    for run in 0..3 {
        let r = run_prog(&prog, &[], POOL);
        assert_eq!(mem_events(&r.log, "alloc").len(), 16 * 4000);
        assert_eq!(mem_events(&r.log, "free").len(), 16 * 4000);
        let early = allocs_at_a_live_address(&r.log);
        assert!(
            early.is_empty(),
            "run {run}: {} allocations logged before the free of the same block, e.g. {}",
            early.len(),
            early[0]
        );
    }
}

#[test]
fn pool_prog_fork() {
    let dir = scratch_dir("pool-fork");
    let out = run_preloaded(&fakes().prog("prog_fork"), &[], &dir, POOL);
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}\n{}", stderr_of(&out));
    let result = result_line(&stdout).expect("result line");
    assert!(stdout.contains("child: allocs=2 frees=1 leaked_bytes=7777"), "{stdout}");
    let child_pid = stdout_value(&stdout, "child_pid").expect("child_pid");
    let parent_pid = stdout_value(&stdout, "parent_pid").expect("parent_pid");
    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 2, "logs: {:?}", log_files(&dir));
    let child = log_for_pid(&logs, child_pid).expect("child's log");
    let parent = log_for_pid(&logs, parent_pid).expect("parent's log");
    let cstats = fake_stats_for(&dir, child_pid).expect("child stats");
    let pstats = fake_stats_for(&dir, parent_pid).expect("parent stats");
    let child_result: HashMap<String, u64> =
        [("allocs", 2), ("frees", 1), ("leaked_bytes", 7777)].iter().map(|(k, v)| (k.to_string(), *v)).collect();
    check_pool_process(
        "prog_fork child",
        "prog_fork",
        child,
        &cstats,
        &child_result,
        &[(7777, "device", "cudaMalloc", "exit", 0)],
    );
    check_pool_process(
        "prog_fork parent",
        "prog_fork",
        parent,
        &pstats,
        &result,
        &[(6666, "device", "cudaMalloc", "exit", 0)],
    );
    // The child starts with no pool of its parent's: its own single segment.
    assert_eq!(pools(child).len(), 1, "child's pools: {}", child["end"]["pools"]);
    assert_eq!(u64_of(&pools(child)[0], "num_device_alloc"), 1, "child's pools: {}", child["end"]["pools"]);
}

// ---------------------------------------------------------------------------
// 2. Reuse.

#[test]
fn reuse_without_streams_is_immediate() {
    let prog = compile_runtime_program("reuse", "pool_reuse.c");
    let r = run_prog(&prog, &[], POOL);
    assert_eq!(r.stats["allocs"], 1, "10000 cudaMalloc(4096) must make one driver allocation: {:?}", r.stats);
    assert_eq!(value(&r, "same_as_first"), 10_000, "the freed block is handed out again at once");
    assert_eq!(value(&r, "distinct"), 1);
    assert_eq!(mem_events(&r.log, "alloc").len(), 10_000);
    assert_eq!(mem_events(&r.log, "free").len(), 10_000);
    assert_eq!(pool_sum(&r.log, "num_device_alloc"), 1, "{}", r.log["end"]["pools"]);
    assert_eq!(r.log["end"]["pools"][0]["multi_stream"], false);
    assert!(leak_set(&r.log).is_empty(), "{}", r.log["end"]["leaks"]);
    assert_valid_log(&r.log, "reuse");

    // The same program without the pool: one driver allocation per call.
    let plain = run_prog(&prog, &[], PASSTHROUGH);
    assert_eq!(plain.stats["allocs"], 10_000, "passthrough: {:?}", plain.stats);
}

#[test]
fn reuse_after_a_stream_exists_goes_through_fences() {
    // Fences start as soon as a stream exists: the runtime's own kernel
    // launches cannot be observed, so a created stream counts as in use.
    let prog = compile_runtime_program("reuse", "pool_reuse.c");
    let r = run_prog(&prog, &["stream"], POOL);
    let p = &pools(&r.log)[0];
    assert_eq!((&p["multi_stream"], &p["multi_stream_because"]), (&true.into(), &"stream_created".into()), "{p}");
    // Freed blocks come back once their fence completed (at once in the fake):
    // the pool stays within a couple of segments.
    assert!(r.stats["allocs"] <= 2, "driver allocations for 10000 cycles with a stream: {:?}", r.stats);
    assert_eq!(pool_sum(&r.log, "num_device_alloc"), r.stats["allocs"], "{p}");
    let distinct = value(&r, "distinct");
    assert!(distinct < 10_000, "no block was ever handed out twice ({distinct} distinct pointers)");
    assert!(distinct <= 2 * 2 * MIB / 4096, "{distinct} distinct 4 KiB blocks: more than two 2 MiB segments hold");
    assert!(fence_counter(p, "recorded") > 0, "{p}");
    assert!(fence_counter(p, "completed") > 0, "{p}");
    assert_eq!(mem_events(&r.log, "alloc").len(), 10_000);
    assert_valid_log(&r.log, "reuse");
}

// ---------------------------------------------------------------------------
// 3. limit.

#[test]
fn limit_caps_the_pool_and_shapes_mem_get_info() {
    let prog = compile_runtime_program("limit", "pool_limit.c");
    let r = run_prog(&prog, &[], &format!("{POOL}:limit=64m"));
    assert_eq!(r.log["options"]["limit"].as_u64(), Some(64 * MIB), "{}", r.log["options"]);
    // Nothing held yet: the device looks 64 MiB large and empty.
    assert_eq!(value(&r, "total0"), 64 * MIB);
    assert_eq!(value(&r, "free0"), 64 * MIB);
    // Holding 3,000,000 B (a 20 MiB segment) and 1 MiB of managed memory.
    let held = 3_000_000 + MIB;
    for (f, t) in [("free1", "total1"), ("drv_free1", "drv_total1")] {
        assert_eq!(value(&r, t), 64 * MIB, "{t}");
        let free = value(&r, f);
        assert!(free <= 64 * MIB - held, "{f}={free}: more than the limit minus what the program holds");
        assert_eq!(free, 64 * MIB - 20 * MIB - MIB, "{f}: limit − (pool reserved + live non-pooled bytes)");
    }
    // Over the limit: CUDA's out-of-memory code, the out-parameter untouched.
    assert_eq!(value(&r, "big"), 2, "cudaMalloc(100 MiB) under limit=64m");
    assert_eq!(value(&r, "big_untouched"), 1);
    // Within the limit alone, but not next to the 20 MiB segment in use.
    assert_eq!(value(&r, "mid"), 2, "cudaMalloc(50 MiB) with 20 MiB reserved under limit=64m");
    // The program goes on: small allocations still work, and once the
    // segment is free the pool gives it back to make room.
    assert_eq!(value(&r, "small_works"), 1);
    assert_eq!(value(&r, "mid_after_free"), 0, "cudaMalloc(50 MiB) after freeing the 20 MiB segment's only block");
    assert_eq!(value(&r, "mid_works"), 1);
    // NULL out-parameters are still refused with CUDA_ERROR_INVALID_VALUE.
    assert_eq!(value(&r, "drv_null_free"), 1);
    assert_eq!(value(&r, "drv_null_total"), 1);
    assert_eq!(value(&r, "rt_null_free"), 1);

    let failed = events(&r.log, "alloc_failed");
    let sizes: Vec<(u64, i64)> = failed.iter().map(|e| (u64_of(e, "size"), e["result"].as_i64().unwrap())).collect();
    assert_eq!(sizes, vec![(100 * MIB, 2), (50 * MIB, 2)], "alloc_failed events: {failed:?}");
    let ooms = events(&r.log, "oom");
    assert_eq!(ooms.iter().map(|e| u64_of(e, "size")).collect::<Vec<_>>(), vec![100 * MIB, 50 * MIB], "{ooms:?}");
    let end_ooms = r.log["end"]["ooms"].as_array().expect("end.ooms");
    assert_eq!(end_ooms.len(), 2, "{end_ooms:?}");
    assert_eq!(end_ooms[0]["requested"].as_u64(), Some(100 * MIB), "{}", end_ooms[0]);
    assert_eq!(end_ooms[0]["device"], 0, "{}", end_ooms[0]);
    assert_eq!(end_ooms[1]["requested"].as_u64(), Some(50 * MIB), "{}", end_ooms[1]);
    assert_eq!(end_ooms[1]["reserved"].as_u64(), Some(20 * MIB), "{}", end_ooms[1]);
    assert_eq!(end_ooms[1]["largest_live"], serde_json::json!([3_000_000]), "{}", end_ooms[1]);
    let p = &pools(&r.log)[0];
    assert!(u64_of(p, "num_ooms") >= 2, "{p}");
    assert!(p["reserved_bytes"]["peak"].as_u64().unwrap() <= 64 * MIB, "the pool passed its limit: {p}");
    let failures: u64 = r.log["end"]["devices"].as_array().unwrap().iter().map(|d| u64_of(d, "failures")).sum();
    assert_eq!(failures, 2, "end.devices failures");
    assert_eq!(mem_events(&r.log, "alloc").len(), 4);
    assert_valid_log(&r.log, "limit");
}

/// The cap is one rule in every mode: requests past it fail with CUDA's
/// out-of-memory error through the runtime and the driver alike, and near the
/// cap the pool shrinks its segments to what fits instead of failing.
#[test]
fn limit_is_one_cap_in_every_mode() {
    let prog = compile_runtime_program("limit_modes", "limit_modes.c");
    for mode in [PASSTHROUGH, POOL] {
        let r = run_prog(&prog, &[], &format!("{mode}:limit=64m"));
        let got: Vec<u64> =
            ["total_mib", "a", "b", "driver", "near_cap", "near_cap_works"].iter().map(|k| value(&r, k)).collect();
        assert_eq!(got, vec![64, 0, 2, 2, 0, 1], "{mode}: total_mib a b driver near_cap near_cap_works");
        let failed = events(&r.log, "alloc_failed");
        let apis: Vec<(&str, u64, i64)> =
            failed.iter().map(|e| (str_of(e, "api"), u64_of(e, "size"), e["result"].as_i64().unwrap())).collect();
        assert_eq!(apis, vec![("cudaMalloc", 40 * MIB, 2), ("cuMemAlloc_v2", 40 * MIB, 2)], "{mode}: {failed:?}");
        if mode == POOL {
            let p = &pools(&r.log)[0];
            assert!(p["reserved_bytes"]["peak"].as_u64().unwrap() <= 64 * MIB, "the pool passed its limit: {p}");
        } else {
            assert_eq!(r.stats["allocs"], 2, "passthrough: only the two allocations within the cap reach CUDA");
        }
        assert_valid_log(&r.log, "limit_modes");
    }
}

/// The C API the Python module reads: allocated is what the program holds,
/// reserved what cupool holds from CUDA for it (the pool's segments in pool
/// mode), peaks start again on request.
#[test]
fn memory_stats_api_reports_allocated_and_reserved() {
    let prog = compile_fake_program("api_stats", "api_stats.c", &{
        let mut args = link_fake_cudart();
        args.extend(link_fake_cuda());
        args.push("-ldl".into());
        args
    });
    // Passthrough: reserved is what CUDA allocated. Pool: a 2 MiB small
    // segment for the 1 MiB block and a 20 MiB segment for the 3 MiB one.
    for (mode, reserved, peak_reserved) in [("mode=passthrough", MIB, 4 * MIB), (POOL, 22 * MIB, 22 * MIB)] {
        let r = run_prog(&prog, &[], mode);
        let keys = ["has_api", "allocated", "peak_allocated", "reserved", "peak_reserved"];
        let got: Vec<u64> = keys.iter().map(|k| value(&r, k)).collect();
        assert_eq!(got, vec![1, MIB, 4 * MIB, reserved, peak_reserved], "{mode}: {keys:?}");
        let counts = ["allocations", "peak_allocations", "num_allocs", "num_frees", "peak_after_reset"];
        let got: Vec<u64> = counts.iter().map(|k| value(&r, k)).collect();
        assert_eq!(got, vec![1, 2, 2, 1, MIB], "{mode}: {counts:?}");
    }
    // Not under cupool: the symbols are simply absent.
    let dir = scratch_dir("api-stats-plain");
    let out = run_plain(&prog, &[], &dir);
    assert_eq!(stdout_value(&stdout_of(&out), "has_api"), Some(0));
}

/// Phases named through the C API are in the log with what is live and
/// reserved at each edge; a phase begun before the first CUDA call is written
/// when recording starts; a program that names phases but never touches CUDA
/// memory writes no log.
#[test]
fn phases_from_the_c_api_are_in_the_log() {
    let mut args = link_fake_cudart();
    args.extend(link_fake_cuda());
    args.push("-ldl".into());
    let prog = compile_fake_program("api_phases", "api_phases.c", &args);
    for mode in [PASSTHROUGH, POOL] {
        let r = run_prog(&prog, &[], mode);
        let phases: Vec<(String, String, i64, u64)> = r.log["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ev"].as_str().is_some_and(|k| k.starts_with("phase_")))
            .map(|e| {
                (
                    str_of(e, "ev").to_string(),
                    str_of(e, "name").to_string(),
                    e["device"].as_i64().unwrap(),
                    u64_of(e, "live"),
                )
            })
            .collect();
        let want = vec![
            // Begun before any CUDA call: written when recording starts, before
            // the first allocation is counted, so no device has seen activity yet.
            ("phase_begin", "setup \"quoted\"", -1, 0),
            ("phase_begin", "epoch 1", 0, MIB),
            ("phase_end", "epoch 1", 0, 3 * MIB),
            ("phase_begin", "epoch 2", 0, 3 * MIB),
            ("phase_end", "setup \"quoted\"", 0, MIB),
        ];
        let want: Vec<(String, String, i64, u64)> =
            want.into_iter().map(|(a, b, c, d)| (a.to_string(), b.to_string(), c, d)).collect();
        assert_eq!(phases, want, "{mode}");
        let apis: Vec<&str> = events(&r.log, "phase_begin").iter().map(|e| str_of(e, "api")).collect();
        assert_eq!(apis, vec!["cupool_phase_begin", "cupool_mark", "cupool_mark"], "{mode}");
        for e in events(&r.log, "phase_begin") {
            assert!(u64_of(e, "reserved") >= u64_of(e, "live"), "{mode}: reserved below live: {e}");
        }
        assert_valid_log(&r.log, "api_phases");
    }
    let dir = scratch_dir("api-phases-nocuda");
    let out = run_preloaded(&prog, &["nocuda"], &dir, "");
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(stdout_value(&stdout_of(&out), "has_api"), Some(1));
    assert!(log_files(&dir).is_empty(), "no CUDA memory touched, yet logs: {:?}", log_files(&dir));
}

#[test]
fn oom_events_name_the_allocating_api() {
    let prog = compile_runtime_program("limit", "pool_limit.c");
    let r = run_prog(&prog, &[], &format!("{POOL}:limit=64m"));
    // Each pool OOM follows the alloc_failed event of the call it failed, and
    // names that call like every other event (the validator requires it).
    let evs = r.log["events"].as_array().unwrap();
    let mut pairs = Vec::new();
    for (i, e) in evs.iter().enumerate().filter(|(_, e)| e["ev"] == "oom") {
        let failed = evs[..i].iter().rev().find(|f| f["ev"] == "alloc_failed").expect("alloc_failed before oom");
        assert_eq!(failed["size"], e["size"], "{failed} / {e}");
        pairs.push((str_of(e, "api").to_string(), str_of(failed, "api").to_string()));
    }
    assert_eq!(pairs.len(), 2, "oom events: {pairs:?}");
    for (oom_api, call_api) in pairs {
        assert_eq!(oom_api, call_api, "oom event api vs the failed call's");
    }
}

#[test]
fn without_limit_mem_get_info_is_the_drivers() {
    let prog = compile_runtime_program("limit", "pool_limit.c");
    let r = run_prog(&prog, &[], POOL);
    // The fake has 1 GiB; no cap: total is the device's, and the 100 MiB request fits.
    assert_eq!(value(&r, "total0"), 1 << 30);
    assert_eq!(value(&r, "big"), 0, "cudaMalloc(100 MiB) without a limit");
    // With no limit the driver's free memory is reported as is: it counts
    // the pool's segment and the managed allocation.
    assert_eq!(value(&r, "free1"), (1 << 30) - 20 * MIB - MIB);
}

// ---------------------------------------------------------------------------
// 4. Pointer range queries.

#[test]
fn pointer_range_queries_describe_the_pooled_block() {
    let prog = compile_driver_program("ptrquery", "pool_ptr_query.c");
    let r = run_prog(&prog, &[], POOL);
    let (a, p, m) = (value(&r, "a"), value(&r, "p"), value(&r, "m"));
    // p is the second 1000 B block of one small segment: 512-byte rounding puts it 1024 B after a.
    assert_eq!(p, a + 1024, "a={a:#x} p={p:#x}: p must lie inside the segment, not at its start");
    assert_eq!(r.stats["allocs"], 2, "one segment plus the managed allocation: {:?}", r.stats);
    assert_eq!((value(&r, "range_base"), value(&r, "range_size")), (p, 1000), "cuMemGetAddressRange_v2(p+100)");
    assert_eq!(value(&r, "range_last_base"), p, "cuMemGetAddressRange_v2(p+999), size NULL");
    assert_eq!(value(&r, "range_exact_size"), 1000, "cuMemGetAddressRange_v2(p), base NULL");
    assert_eq!(value(&r, "attr_start"), p, "cuPointerGetAttribute(RANGE_START_ADDR, p+100)");
    assert_eq!(value(&r, "attr_size"), 1000, "cuPointerGetAttribute(RANGE_SIZE, p+100)");
    assert_eq!(value(&r, "attr_ordinal"), 0, "other attributes pass through");
    assert_eq!((value(&r, "a_base"), value(&r, "a_size")), (a, 1000), "block at the segment start");
    assert_eq!((value(&r, "ipc_capable"), value(&r, "retain")), (1, 1), "exportable; no VMM handle to retain");
    assert_eq!(value(&r, "a_attr_size"), 1000);
    // Managed memory is not pooled: the driver's own answers.
    assert_eq!((value(&r, "m_base"), value(&r, "m_size")), (m, 5000));
    assert_eq!((value(&r, "m_attr_start"), value(&r, "m_attr_size")), (m, 5000));
    // Errors are the driver's.
    assert_eq!(value(&r, "range_unknown"), 500, "CUDA_ERROR_NOT_FOUND");
    assert_eq!(value(&r, "attr_unknown"), 1, "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(value(&r, "attr_null"), 1, "CUDA_ERROR_INVALID_VALUE");
    // A freed block answers as freed memory does without cupool, although its
    // segment lives on around the other block.
    assert_eq!((value(&r, "freed_range"), value(&r, "freed_attr")), (500, 1), "queries on a freed pooled block");
    // Buffer ids: one per allocation, the same anywhere inside it, fresh when
    // the pool hands the same block out again.
    assert_eq!(value(&r, "q_is_p"), 1, "the pool reuses p's block for q");
    let ids = ["ids_differ", "id_same_inside", "id_new_after_reuse"].map(|k| value(&r, k));
    assert_eq!(ids, [1, 1, 1], "ids_differ id_same_inside id_new_after_reuse");
    assert_valid_log(&r.log, "ptrquery");

    // Passthrough: every answer is the fake driver's own (each allocation is its own range).
    let r = run_prog(&prog, &[], PASSTHROUGH);
    let (a, p, m) = (value(&r, "a"), value(&r, "p"), value(&r, "m"));
    assert_eq!(r.stats["allocs"], 4, "a, p, m and q: {:?}", r.stats);
    assert_eq!((value(&r, "range_base"), value(&r, "range_size")), (p, 1000));
    assert_eq!(value(&r, "range_last_base"), p);
    assert_eq!(value(&r, "range_exact_size"), 1000);
    assert_eq!((value(&r, "attr_start"), value(&r, "attr_size"), value(&r, "attr_ordinal")), (p, 1000, 0));
    assert_eq!((value(&r, "a_base"), value(&r, "a_size"), value(&r, "a_attr_size")), (a, 1000, 1000));
    assert_eq!((value(&r, "m_base"), value(&r, "m_size")), (m, 5000));
    assert_eq!((value(&r, "m_attr_start"), value(&r, "m_attr_size")), (m, 5000));
    assert_eq!((value(&r, "range_unknown"), value(&r, "attr_unknown"), value(&r, "attr_null")), (500, 1, 1));
    assert_eq!((value(&r, "freed_range"), value(&r, "freed_attr")), (500, 1));
}

// ---------------------------------------------------------------------------
// 5. Exact error codes.

fn invalid_frees(log: &Value) -> Vec<(u64, i64)> {
    events(log, "invalid_free").iter().map(|e| (hex(&e["ptr"]), e["result"].as_i64().unwrap())).collect()
}

#[test]
fn error_codes_are_cudas_own() {
    let prog = compile_runtime_program("errors", "pool_errors.c");
    let plain = run_prog(&prog, &[], PASSTHROUGH);
    let pool = run_prog(&prog, &[], POOL);
    let (a, b) = (value(&pool, "a"), value(&pool, "b"));
    assert_eq!(b, a + 1024, "b must lie inside a's segment in pool mode");
    for key in
        ["bogus_free", "null_out", "zero", "zero_ptr", "free", "double_free", "other_works", "c_works", "d_works"]
    {
        assert_eq!(value(&pool, key), value(&plain, key), "{key}: pool mode vs passthrough");
    }
    assert_eq!(value(&pool, "bogus_free"), 1, "cudaFree(bogus): cudaErrorInvalidValue");
    assert_eq!(value(&pool, "null_out"), 1, "cudaMalloc(NULL, 16): the runtime's cudaErrorInvalidValue");
    assert_eq!((value(&pool, "zero"), value(&pool, "zero_ptr")), (0, 0), "cudaMalloc(&p, 0): success and NULL");
    assert_eq!(value(&pool, "free"), 0);
    assert_eq!(value(&pool, "double_free"), 1, "second cudaFree of a pooled block");
    for key in ["other_works", "c_works", "d_works"] {
        assert_eq!(value(&pool, key), 1, "{key}");
    }
    for key in ["free_other", "free_c", "free_d"] {
        assert_eq!(value(&pool, key), 0, "{key}");
    }
    // cudaMalloc(&p, 0) and cudaMalloc(NULL, ..) made no driver allocation in either mode.
    assert_eq!(pool.stats["allocs"], 1, "pool mode: one segment: {:?}", pool.stats);
    assert_eq!(plain.stats["allocs"], 4, "passthrough: {:?}", plain.stats);

    // Logged: the bogus free and the double free as invalid_free with CUDA's
    // result, the NULL out-pointer as a failed allocation.
    assert_eq!(invalid_frees(&pool.log), vec![(0x123400, 1), (b, 1)], "pool mode invalid_free events");
    assert_eq!(invalid_frees(&plain.log).len(), 2, "passthrough invalid_free events");
    let failed: Vec<(u64, i64)> =
        events(&pool.log, "alloc_failed").iter().map(|e| (u64_of(e, "size"), e["result"].as_i64().unwrap())).collect();
    let failed_plain = events(&plain.log, "alloc_failed").len();
    assert_eq!(failed.len(), failed_plain, "alloc_failed events, pool mode {failed:?} vs passthrough");
    assert!(failed.iter().all(|f| f.1 == 1), "{failed:?}");
    assert_eq!(mem_events(&pool.log, "free").len(), mem_events(&plain.log, "free").len());
    assert_eq!(leak_set(&pool.log), leak_set(&plain.log), "leaks, pool mode vs passthrough");
    assert_valid_log(&pool.log, "errors");
}

#[test]
fn double_free_of_the_block_at_a_segment_start_is_refused() {
    let prog = compile_runtime_program("errors", "pool_errors.c");
    let plain = run_prog(&prog, &["segment_start"], PASSTHROUGH);
    assert_eq!(value(&plain, "double_free"), 1, "passthrough: the fake refuses a double free");
    let r = run_prog(&prog, &["segment_start"], POOL);
    let a = value(&r, "a");
    assert_eq!(value(&r, "b"), a + 1024);
    let observed = |r: &Run| {
        (
            value(r, "double_free"),
            invalid_frees(&r.log).contains(&(value(r, "a"), 1)),
            r.stats["frees"],
            value(r, "other_works"),
            value(r, "c_works"),
            value(r, "d_works"),
        )
    };
    // Expected: the second cudaFree gets the fake's answer to a double free
    // (1, as in passthrough) and is logged as invalid_free; the pool's
    // segment is not handed back to the driver (no driver free until exit);
    // block b in the same segment and blocks allocated afterwards still work.
    assert_eq!(
        observed(&r),
        (value(&plain, "double_free"), true, 0, 1, 1, 1),
        "pool mode, second cudaFree of the pooled block at the start of its segment: \
         (result, logged as invalid_free, driver frees, b works, c works, d works); invalid_free events: {:?}",
        invalid_frees(&r.log)
    );
}

#[test]
fn zero_byte_malloc_is_not_recorded_as_an_allocation() {
    let prog = compile_runtime_program("errors", "pool_errors.c");
    let r = run_prog(&prog, &[], POOL);
    assert_eq!((value(&r, "zero"), value(&r, "zero_ptr")), (0, 0));
    // cudaMalloc(&p, 0) succeeds with p = NULL and allocates nothing: there is
    // nothing to free (cudaFree(NULL) is a no-op), so it must be neither an
    // allocation of the timeline nor a leak at exit.
    let null_allocs: Vec<_> = events(&r.log, "alloc").into_iter().filter(|e| hex(&e["ptr"]) == 0).collect();
    assert!(null_allocs.is_empty(), "alloc events of the NULL pointer: {null_allocs:?}");
    let null_leaks: Vec<_> =
        r.log["end"]["leaks"].as_array().unwrap().iter().filter(|l| hex(&l["ptr"]) == 0).cloned().collect();
    assert!(null_leaks.is_empty(), "leaks at the NULL pointer: {null_leaks:?}");
}

// ---------------------------------------------------------------------------
// 6. Context destruction.

#[test]
fn pool_context_destroy_reports_the_checkpoint_leak() {
    let r = run_fake("prog_driver", POOL);
    assert_eq!(stdout_value(&r.stdout, "checkpoint_leaked_bytes"), Some(LEAK_CTX_DRIVER));
    let cps = events(&r.log, "checkpoint");
    assert_eq!(cps.len(), 1, "checkpoint events: {cps:?}");
    let cp = cps[0];
    assert_eq!(cp["api"], "cuCtxDestroy_v2", "{cp}");
    assert_eq!(cp["device"], 1, "{cp}");
    assert_eq!(cp["leaked_bytes"].as_u64(), Some(LEAK_CTX_DRIVER), "{cp}");
    assert_eq!(cp["leaked_count"].as_u64(), Some(1), "{cp}");
    let leaks = r.log["end"]["leaks"].as_array().unwrap();
    let ctx_leak = leaks.iter().find(|l| l["at"] == "cuCtxDestroy_v2").expect("context leak in end.leaks");
    assert_eq!((u64_of(ctx_leak, "size"), ctx_leak["device"].as_i64()), (LEAK_CTX_DRIVER, Some(1)), "{ctx_leak}");
    let printed = printed_leak_ptrs(&r.stdout);
    assert!(printed.contains(&hex(&ctx_leak["ptr"])), "{ctx_leak} vs the program's {printed:?}");
    // The destroyed context's segments went with it; the driver holds only the
    // primary context's pool.
    let reserved: u64 = pools(&r.log).iter().map(|p| stat_current(p, "reserved_bytes")).sum();
    assert_eq!(r.stats["live_bytes"], reserved, "{:?} vs {}", r.stats, r.log["end"]["pools"]);
    assert_valid_log(&r.log, "prog_driver");
}

#[test]
fn pool_context_destroy_leaves_the_primary_context_working() {
    let prog = compile_driver_program("ctxdestroy", "pool_ctx_destroy.c");
    let r = run_prog(&prog, &[], POOL);
    assert_eq!(value(&r, "x_intact"), 1, "a primary-context block after another context died");
    assert_eq!(value(&r, "new_blocks_ok"), 21, "new primary-context blocks after another context died");
    assert_eq!(value(&r, "x_still_intact"), 1);
    assert_eq!(value(&r, "keep_ok"), 1);
    let leak = value(&r, "leak");

    let cps = events(&r.log, "checkpoint");
    assert_eq!(cps.len(), 1, "{cps:?}");
    assert_eq!(cps[0]["api"], "cuCtxDestroy_v2", "{}", cps[0]);
    assert_eq!(cps[0]["device"], 0, "{}", cps[0]);
    assert_eq!(cps[0]["leaked_bytes"].as_u64(), Some(3_000_017), "{}", cps[0]);
    assert_eq!(cps[0]["leaked_count"].as_u64(), Some(1), "{}", cps[0]);
    assert_eq!(
        leak_set(&r.log),
        vec![
            (7777, "device".into(), "cuMemAlloc_v2".into(), "exit".into(), 0),
            (3_000_017, "device".into(), "cuMemAlloc_v2".into(), "cuCtxDestroy_v2".into(), 0),
        ],
        "{}",
        r.log["end"]["leaks"]
    );
    assert!(leak_ptrs(&r.log).contains(&leak), "{}", r.log["end"]["leaks"]);
    assert_eq!(mem_events(&r.log, "alloc").len() as u64, r.result["allocs"]);
    assert_eq!(mem_events(&r.log, "free").len() as u64, r.result["frees"]);
    assert_end_consistent(&r.log);
    // The driver holds the primary context's pool only.
    let reserved: u64 = pools(&r.log).iter().map(|p| stat_current(p, "reserved_bytes")).sum();
    assert_eq!(r.stats["live_bytes"], reserved, "{:?} vs {}", r.stats, r.log["end"]["pools"]);
    assert_valid_log(&r.log, "ctxdestroy");
}

/// (api, device, leaked_bytes, leaked_count) of each checkpoint event.
fn checkpoints(log: &Value) -> Vec<(String, i64, u64, u64)> {
    events(log, "checkpoint")
        .iter()
        .map(|e| {
            (
                str_of(e, "api").to_string(),
                e["device"].as_i64().unwrap(),
                u64_of(e, "leaked_bytes"),
                u64_of(e, "leaked_count"),
            )
        })
        .collect()
}

#[test]
fn primary_context_reset_leaves_other_contexts_pools_alone() {
    let prog = compile_driver_program("reset", "pool_primary_reset.c");
    let r = run_prog(&prog, &["wc"], POOL);
    let (x, a, b) = (value(&r, "x"), value(&r, "a"), value(&r, "b"));
    assert_eq!(b, a + 1024, "a and b share one segment of the second context's pool");
    assert_eq!(value(&r, "y_works"), 1, "the primary context after its reset");
    // Expected: the other context's blocks are untouched by the reset of the
    // primary context (the fake, like CUDA, destroys only the primary's memory).
    assert_eq!(
        (value(&r, "a_free"), value(&r, "b_works"), value(&r, "b_free"), value(&r, "c_works")),
        (0, 1, 0, 1),
        "second context after cuDevicePrimaryCtxReset_v2: (cuMemFree(a), b holds data, cuMemFree(b), new block c \
         works); invalid_free events: {:?}",
        invalid_frees(&r.log)
    );
    assert!(invalid_frees(&r.log).is_empty(), "invalid_free events: {:?}", invalid_frees(&r.log));
    // Only x died with the primary context.
    assert_eq!(checkpoints(&r.log), vec![("cuDevicePrimaryCtxReset_v2".to_string(), 0, 1000, 1)], "checkpoint events");
    let at_reset: Vec<u64> = r.log["end"]["leaks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["at"] == "cuDevicePrimaryCtxReset_v2")
        .map(|l| hex(&l["ptr"]))
        .collect();
    assert_eq!(at_reset, vec![x], "leaks found at the reset: {}", r.log["end"]["leaks"]);
    assert_eq!(mem_events(&r.log, "free").len() as u64, r.result["frees"], "every free of the program recorded");
    assert_valid_log(&r.log, "reset");
}

#[test]
fn primary_context_reset_reports_the_processs_first_allocation() {
    let prog = compile_driver_program("reset", "pool_primary_reset.c");
    let r = run_prog(&prog, &[], POOL);
    let x = value(&r, "x");
    assert_eq!(value(&r, "y_works"), 1, "the primary context after its reset");
    // x, the process's very first CUDA allocation, died with the primary context.
    let leaks: Vec<(u64, String)> = r.log["end"]["leaks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (hex(&l["ptr"]), str_of(l, "at").to_string()))
        .collect();
    assert_eq!(
        (checkpoints(&r.log), leaks),
        (
            vec![("cuDevicePrimaryCtxReset_v2".to_string(), 0, 1000, 1)],
            vec![(x, "cuDevicePrimaryCtxReset_v2".to_string())]
        ),
        "(checkpoint events, end.leaks as (ptr, at)) for the first allocation of the process"
    );
    // The driver holds only the new primary pool's segment.
    let reserved: u64 = pools(&r.log).iter().map(|p| stat_current(p, "reserved_bytes")).sum();
    assert_eq!(r.stats["live_bytes"], reserved, "{:?} vs {}", r.stats, r.log["end"]["pools"]);
    assert_valid_log(&r.log, "reset");
}

// ---------------------------------------------------------------------------
// Bookkeeping of the tests themselves.

#[test]
fn fence_counter_parses_the_end_record() {
    let p = serde_json::json!({"fences": {"recorded": 12, "completed": 3, "skipped_for_capture": 0}});
    assert_eq!(fence_counter(&p, "recorded"), 12);
    assert_eq!(fence_counter(&p, "completed"), 3);
}

// ---------------------------------------------------------------------------
// IPC of pooled blocks, between real processes (the fakes share memory
// through memfd files, as the driver does through its handles).

/// The same check the GPU runs (`scripts/gpu/ipc_check.py` over
/// `tests/fake/ipc_blocks.c`): two 1 MiB blocks that the pool puts in one
/// segment are exported (runtime and driver API, and an interior pointer);
/// a receiver under cupool sees each block's own bytes, also after the
/// exporter freed them and allocated again; a receiver outside cupool gets an
/// error for the block past the segment's start, never the segment's start.
#[test]
fn ipc_of_pooled_blocks_never_maps_the_wrong_memory() {
    let stdout = ipc_check("segments");
    assert!(
        stdout.contains("pool-plain ok=1") && stdout.contains("refused=['b', 'b_driver', 'b_interior']"),
        "{stdout}"
    );
    assert!(stdout.contains("pool-pool ok=1") && stdout.contains("b_minus_a=1048576"), "{stdout}");
}

/// The same check with the blocks on VMM pages, which legacy IPC cannot
/// name: a receiver under cupool maps the exported pages from their
/// shareable handles (the exporter's broker passes them over a Unix socket)
/// and sees each block's bytes, also after the exporter freed it; a
/// receiver outside cupool is refused every pooled block.
#[test]
fn ipc_of_vmm_blocks_maps_the_exported_pages() {
    let stdout = ipc_check("vmm");
    assert!(
        stdout.contains("pool-plain ok=1") && stdout.contains("refused=['a', 'b', 'b_driver', 'b_interior']"),
        "{stdout}"
    );
    assert!(stdout.contains("pool-pool ok=1 wrong=[] refused=[] b_minus_a=1048576 closed=4/4"), "{stdout}");
}

/// A receiver under cupool that closes VMM blocks during a relaxed stream
/// capture leaves the capture whole: the wait for its work before the unmap
/// (a synchronisation, which fails under any capture and breaks it) comes
/// when the capture ends, and from then on the blocks are gone, as plainly.
#[test]
fn closing_vmm_blocks_during_a_capture_leaves_it_whole() {
    let stdout = ipc_check_with("vmm", &[("IPC_CLOSE_IN_CAPTURE", "1")]);
    assert!(
        stdout.contains(
            "pool-pool ok=1 wrong=[] refused=[] b_minus_a=1048576 closed=4/4 capture_end=0 range_after_close=gone"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("passthrough-plain ok=1") && stdout.contains("capture_end=0"), "{stdout}");
    assert!(
        !stdout.contains("range_after_close=still"),
        "a block closed during the capture stays mapped after it:\n{stdout}"
    );
}

/// Runs `scripts/gpu/ipc_check.py` over the fakes with the pool on
/// `backing`; returns its output after checking each combination passed.
fn ipc_check(backing: &str) -> String {
    ipc_check_with(backing, &[])
}

fn ipc_check_with(backing: &str, envs: &[(&str, &str)]) -> String {
    let mut args = vec!["-DFAKE_CUDA".to_string()];
    args.extend(link_fake_cudart());
    args.extend(link_fake_cuda());
    let prog = compile_fake_program("ipc_blocks", "ipc_blocks.c", &args);
    let logs = scratch_dir(&format!("ipc-blocks-{backing}"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu/ipc_check.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(&prog)
        .arg(cli())
        .arg(&logs)
        .arg(backing)
        .envs(fakes().env())
        .envs(envs.iter().copied())
        .output()
        .expect("python3 runs scripts/gpu/ipc_check.py");
    let stdout = stdout_of(&out);
    let results: Vec<&str> = stdout.lines().filter(|l| l.starts_with("result:")).collect();
    assert_eq!(results.len(), 4, "one result per combination:\n{stdout}\n{}", stderr_of(&out));
    for line in &results {
        assert!(line.contains(" ok=1 "), "{line}\nall:\n{stdout}");
    }
    stdout
}

/// NVTX ranges are phases: the shim attaches as the NVTX tool (what
/// `cupool run` arranges with NVTX_INJECTION64_PATH), push/pop ranges nest
/// per thread, start/end ranges match by id, registered and wide strings
/// name them; `nvtx=0` declines to attach.
#[test]
fn nvtx_ranges_are_phases() {
    let mut args = link_fake_cudart();
    args.extend(link_fake_cuda());
    args.extend(["-ldl".to_string(), "-lpthread".to_string()]);
    let prog = compile_fake_program("nvtx_client", "nvtx_client.c", &args);
    let shim = shim_path();
    let dir = scratch_dir("nvtx-client");
    let out = preloaded_command(&prog, &[], &dir, "").env("NVTX_INJECTION64_PATH", &shim).output().unwrap();
    let stdout = stdout_of(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", stderr_of(&out));
    let depths = ["attached", "d_outer", "d_inner", "pop_inner", "pop_outer"].map(|k| stdout_value(&stdout, k));
    assert_eq!(depths, [Some(1), Some(0), Some(1), Some(1), Some(0)], "{stdout}");
    assert!(stdout.contains("pop_extra=-1"), "{stdout}");
    let operation = ["d_op", "d_callback", "pop_callback", "pop_op"].map(|k| stdout_value(&stdout, k));
    assert_eq!(operation, [Some(0), Some(1), Some(1), Some(0)], "an operation's range still nests: {stdout}");
    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 2, "{:?}", log_files(&dir));
    let child = stdout_value(&stdout, "child_pid").expect("child_pid=");
    let (children, parents): (Vec<&Value>, Vec<&Value>) = logs.iter().partition(|l| l["process"]["pid"] == child);
    let (parent, child) = (parents[0], children[0]);
    let phases_of = |log: &Value| -> Vec<(String, String, String, u64)> {
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ev"].as_str().is_some_and(|k| k.starts_with("phase_")))
            .map(|e| (str_of(e, "ev").into(), str_of(e, "name").into(), str_of(e, "api").into(), u64_of(e, "live")))
            .collect()
    };
    let phases = phases_of(parent);
    // A range open at a fork began in the parent's log: the child writes no end of it.
    assert_eq!(phases_of(child), vec![], "{}", child["events"]);
    let want = [
        ("phase_begin", "outer", "nvtxRangePushA", MIB),
        ("phase_begin", "inner", "nvtxRangePushEx", MIB),
        ("phase_end", "inner", "nvtxRangePop", 3 * MIB),
        ("phase_end", "outer", "nvtxRangePop", 3 * MIB),
        ("phase_begin", "async", "nvtxRangeStartA", 3 * MIB),
        ("phase_end", "async", "nvtxRangeEnd", MIB),
        ("phase_begin", "registered", "nvtxDomainRangePushEx", MIB),
        ("phase_end", "registered", "nvtxDomainRangePop", MIB),
        ("phase_begin", "callback", "nvtxDomainRangePushEx", MIB),
        ("phase_end", "callback", "nvtxDomainRangePop", MIB),
        ("phase_begin", "wide \u{2713}", "nvtxRangePushW", MIB),
        ("phase_end", "wide \u{2713}", "nvtxRangePop", MIB),
        ("phase_begin", "thread", "nvtxRangePushA", MIB),
        ("phase_end", "thread", "nvtxRangePop", MIB),
        ("phase_begin", "forked", "nvtxRangePushA", MIB),
        ("phase_end", "forked", "nvtxRangePop", MIB),
    ]
    .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), d));
    assert_eq!(phases, want);
    let notes = parent["end"]["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("(Thunk:#...#) were not written")), "{notes:?}");
    assert_valid_log(parent, "nvtx_client");
    assert_valid_log(child, "nvtx_client");

    // nvtx=0: the shim declines to attach, and no range reaches the log.
    let dir = scratch_dir("nvtx-client-off");
    let out = preloaded_command(&prog, &[], &dir, "nvtx=0").env("NVTX_INJECTION64_PATH", &shim).output().unwrap();
    assert_eq!(stdout_value(&stdout_of(&out), "attached"), Some(0), "{}", stdout_of(&out));
    let logs = read_logs(&dir);
    assert!(logs[0]["events"].as_array().unwrap().iter().all(|e| !e["ev"].as_str().unwrap().starts_with("phase_")));

    // `cupool run` makes the shim the NVTX tool by itself.
    let dir = scratch_dir("nvtx-client-cli");
    let out = std::process::Command::new(cli())
        .args(["run", "-q", "--log-dir"])
        .arg(&dir)
        .arg("--")
        .arg(&prog)
        .envs(fakes().env())
        .env_remove("NVTX_INJECTION64_PATH")
        .output()
        .unwrap();
    assert_eq!(stdout_value(&stdout_of(&out), "attached"), Some(1), "{}\n{}", stdout_of(&out), stderr_of(&out));
}

/// An export keeps a block out of reuse only once its handle went out, and
/// freed pooled memory cannot be exported (CUDA refuses freed memory).
#[test]
fn ipc_export_keeps_exactly_the_exported_blocks_out_of_reuse() {
    let prog = compile_runtime_program("ipc_export_rules", "ipc_export_rules.c");
    let r = run_prog(&prog, &[], POOL);
    let got =
        ["freed_export", "b_reused", "a_export", "a_kept", "a_freed_export", "a_freed_range"].map(|k| value(&r, k));
    assert_eq!(got, [1, 1, 0, 1, 1, 500], "freed_export b_reused a_export a_kept");
    assert_eq!(value(&r, "a_freed_export_last"), 1, "the refused export is the thread's last error");
}
