//! The pool backed by VMM pages (`backing=vmm`) over the fake driver, whose
//! `cuMemMap`ped memory faults until `cuMemSetAccess` grants it, as on a GPU.
//! Every program must give the output it gives without cupool, the driver
//! must see pages (`cuMemCreate`/`cuMemMap`) instead of `cuMemAlloc`
//! segments, pointer queries must describe the block, and a block exported
//! through legacy IPC must fail with CUDA's error, never name other memory.
//! `cargo test --test pool_vmm`
mod support;

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;
use support::*;

const VMM: &str = "backing=vmm";
const MIB: u64 = 1 << 20;

struct Run {
    stdout: String,
    result: HashMap<String, u64>,
    log: Value,
    stats: HashMap<String, u64>,
}

fn run(prog: &Path, args: &[&str], options: &str) -> Run {
    let name = prog.file_name().unwrap().to_string_lossy().into_owned();
    let dir = scratch_dir(&format!("vmm-{name}"));
    let out = run_preloaded(prog, args, &dir, options);
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(0), "{name} {args:?} {options}: {:?}\n{stdout}\n{stderr}", out.status);
    let result = result_line(&stdout).unwrap_or_else(|| panic!("{name}: no result line\n{stdout}\n{stderr}"));
    let mut logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{name}: {:?}", log_files(&dir));
    let log = logs.remove(0);
    let pid = log["process"]["pid"].as_u64().unwrap();
    let stats = fake_stats_for(&dir, pid).unwrap_or_else(|| panic!("{name}: no fake stats"));
    Run { stdout, result, log, stats }
}

fn plain_result(prog: &Path, args: &[&str]) -> HashMap<String, u64> {
    let name = prog.file_name().unwrap().to_string_lossy().into_owned();
    let out = run_plain(prog, args, &scratch_dir(&format!("vmm-plain-{name}")));
    assert!(out.status.success(), "{name} plain: {:?}\n{}", out.status, stderr_of(&out));
    result_line(&stdout_of(&out)).unwrap_or_else(|| panic!("{name} plain: no result line"))
}

fn pools(log: &Value) -> &Vec<Value> {
    log["end"]["pools"].as_array().expect("end.pools")
}

fn pages_sum(log: &Value, field: &str) -> u64 {
    pools(log).iter().map(|p| p["pages"][field].as_u64().unwrap_or(0)).sum()
}

/// Allocations of the kinds the pool passes to the driver (managed, stream-ordered).
fn passed_through(log: &Value) -> u64 {
    events(log, "alloc").iter().filter(|e| matches!(e["kind"].as_str(), Some("managed" | "async"))).count() as u64
}

/// The program ran as it does without cupool, its device allocations came
/// from VMM pages, and the driver saw no `cuMemAlloc` for them.
fn check_vmm(prog: &Path, args: &[&str]) -> Run {
    let name = prog.file_name().unwrap().to_string_lossy().into_owned();
    let plain = plain_result(prog, args);
    let r = run(prog, args, VMM);
    assert_eq!(r.result, plain, "{name}: result line under backing=vmm vs plain");
    assert_eq!(r.log["options"]["backing"], "vmm");
    assert!(!pools(&r.log).is_empty(), "{name}: no pool");
    for p in pools(&r.log) {
        assert_eq!(p["backing"], "vmm", "{name}: {p}");
        let pages = &p["pages"];
        assert!(pages["maps"].as_u64().unwrap() > 0 && pages["grants"].as_u64().unwrap() > 0, "{name}: {p}");
        assert_eq!(pages["page_bytes"], 2 * MIB, "{name}: the fake's granularity");
    }
    let program_vmm = events(&r.log, "alloc").iter().filter(|e| e["kind"] == "vmm").count() as u64;
    assert_eq!(r.stats["vmm_creates"], pages_sum(&r.log, "creates") + program_vmm, "{name}: {:?}", r.stats);
    assert_eq!(r.stats["allocs"], passed_through(&r.log), "{name}: no cuMemAlloc segments: {:?}", r.stats);
    assert_eq!(r.stats["vmm_maps"], pages_sum(&r.log, "maps") + program_vmm, "{name}: {:?}", r.stats);
    assert_valid_log(&r.log, &name);
    r
}

#[test]
fn cupool_run_summary_names_the_page_work() {
    let dir = scratch_dir("vmm-summary");
    let prog = fakes().prog("prog_runtime");
    let mut cmd = cupool_command(&["run", "--log-dir", path_str(&dir), "-o", VMM, "--", path_str(&prog)], &dir);
    let out = run_ok(&mut cmd, "cupool run");
    let err = stderr_of(&out);
    let line = err.lines().find(|l| l.contains("VMM pages:")).unwrap_or_else(|| panic!("no VMM line in:\n{err}"));
    assert!(line.contains(" made, ") && line.contains(" unmaps, ") && line.len() <= 100, "{line}");
    // And the time those calls took, by call.
    let calls = err.lines().find(|l| l.contains("VMM cuMem*:")).unwrap_or_else(|| panic!("no cuMem line in:\n{err}"));
    for call in [" ms (create ", ", map ", ", access ", ", unmap ", ", release "] {
        assert!(calls.contains(call), "{call}: {calls}");
    }
    assert!(calls.len() <= 100, "{calls}");
    // Where the pages were at their peak: the workload's blocks, nothing
    // else on a GPU (the fake one) that never falls behind.
    let peak = err.lines().find(|l| l.contains("VMM peak")).unwrap_or_else(|| panic!("no peak line in:\n{err}"));
    assert!(peak.contains(" in blocks") && !peak.contains("awaiting the GPU") && peak.len() <= 100, "{peak}");
}

#[test]
fn runtime_programs_run_unchanged_on_vmm_pages() {
    for prog in ["prog_runtime", "prog_runtime_static", "prog_dlopen"] {
        let r = check_vmm(&fakes().prog(prog), &[]);
        // The workload's oversized request fails in the pool, as CUDA's would.
        assert_eq!(stdout_value(&r.stdout, "oversized_malloc"), Some(2), "{prog}");
        assert_eq!(stdout_value(&r.stdout, "bogus_free"), Some(1), "{prog}");
    }
}

/// A process that may map less address space than the pool's 64 GiB ranges
/// (`ulimit -v`, as clusters set it; valgrind) runs as it does without
/// cupool: its ranges shrink to what it may map, where refusing them would
/// fail `cudaMalloc`s that succeed plainly, and ranges as large as it may
/// map would leave it no room of its own.
#[test]
fn a_process_short_of_address_space_runs_unchanged() {
    let prog = fakes().prog("prog_runtime");
    let plain = plain_result(&prog, &[]);
    let dir = scratch_dir("vmm-ulimit");
    // 8 GB of address space (ulimit counts KiB): room for ranges of a few GiB.
    let limited = ["-c", "ulimit -v 8000000 && exec \"$0\"", prog.to_str().unwrap()];
    let out = preloaded_command(Path::new("/bin/sh"), &limited, &dir, VMM).output().unwrap();
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(0), "{:?}\n{stdout}\n{stderr}", out.status);
    assert_eq!(result_line(&stdout).as_ref(), Some(&plain), "{stdout}\n{stderr}");
    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{:?}", log_files(&dir));
    // Short ranges, one for small blocks and one for large: most of the 8 GB stays the program's.
    let reserved = pages_sum(&logs[0], "va_reserved_bytes");
    assert_eq!(reserved, 2 << 30, "reserved {reserved} bytes of addresses");
    assert_valid_log(&logs[0], "prog_runtime");
}

/// Requests of `direct_min` bytes and more go to CUDA as they are: the
/// driver sees a `cuMemAlloc` for each, the pool maps no page for them, and
/// the program's output, its leaks and its frees are as without the option.
#[test]
fn requests_from_direct_min_up_go_to_cuda_as_they_are() {
    let prog = fakes().prog("prog_runtime");
    let plain = plain_result(&prog, &[]);
    let direct_min = 2 * MIB;
    let (pooled, direct) = (run(&prog, &[], VMM), run(&prog, &[], &format!("{VMM}:direct_min=2m")));
    assert_eq!(direct.result, plain, "result line with direct_min=2m vs plain");
    assert_eq!(direct.log["options"]["direct_min"], direct_min);
    let device_allocs = |log: &Value, from: u64| {
        events(log, "alloc").iter().filter(|e| e["kind"] == "device" && e["size"].as_u64().unwrap() >= from).count()
            as u64
    };
    let big = device_allocs(&direct.log, direct_min);
    assert!(big >= 3 && big < device_allocs(&direct.log, 0), "{big} of the device allocations are 2 MiB or more");
    assert_eq!(direct.stats["allocs"], passed_through(&direct.log) + big, "{:?}", direct.stats);
    assert_eq!(pooled.stats["allocs"], passed_through(&pooled.log), "{:?}", pooled.stats);
    assert!(
        pages_sum(&direct.log, "creates") < pages_sum(&pooled.log, "creates"),
        "pages made: {} with direct_min=2m, {} without",
        pages_sum(&direct.log, "creates"),
        pages_sum(&pooled.log, "creates")
    );
    // The leak report names the same blocks, those CUDA gave out among them.
    let leaks = |log: &Value| {
        let mut sizes: Vec<u64> =
            log["end"]["leaks"].as_array().expect("end.leaks").iter().map(|l| l["size"].as_u64().unwrap()).collect();
        sizes.sort();
        sizes
    };
    assert_eq!(leaks(&direct.log), leaks(&pooled.log));
    assert!(leaks(&direct.log).iter().any(|&s| s >= direct_min), "{:?}", leaks(&direct.log));
    assert_valid_log(&direct.log, "prog_runtime");
}

#[test]
fn driver_and_threaded_programs_run_unchanged_on_vmm_pages() {
    for prog in ["prog_driver", "prog_getproc", "prog_threads"] {
        check_vmm(&fakes().prog(prog), &[]);
    }
}

#[test]
fn blocks_on_two_devices_and_streams_run_unchanged() {
    check_vmm(&compile_runtime_program("crossdev", "pool_cross_device.c"), &[]);
    let reuse = compile_runtime_program("reuse", "pool_reuse.c");
    let r = check_vmm(&reuse, &[]);
    // 10000 cycles of one 4 KiB block: the first free gives its page back
    // (a bulk free, as far as anyone can tell), the next allocation makes it
    // again within a second, and from then on it stays: two pages made.
    assert_eq!(pages_sum(&r.log, "creates"), 2, "{}", r.log["end"]["pools"]);
    assert_eq!(stdout_value(&r.stdout, "distinct"), Some(1));
    // With a stream, frees wait for fences; the pages stay few.
    let r = check_vmm(&reuse, &["stream"]);
    assert!(pages_sum(&r.log, "creates") <= 2, "{}", r.log["end"]["pools"]);
    assert!(r.log["end"]["pools"][0]["fences"]["recorded"].as_u64().unwrap() > 0);
}

#[test]
fn pointer_queries_describe_the_block_on_vmm_pages() {
    let prog = compile_driver_program("ptrquery", "pool_ptr_query.c");
    let r = run(&prog, &[], VMM);
    let (a, p) = (stdout_value(&r.stdout, "a").unwrap(), stdout_value(&r.stdout, "p").unwrap());
    assert_eq!(p, a + 1024, "p is packed after a in the same page");
    let v = |k: &str| stdout_value(&r.stdout, k).unwrap_or_else(|| panic!("no {k}= in {}", r.stdout));
    assert_eq!((v("range_base"), v("range_size")), (p, 1000));
    assert_eq!((v("attr_start"), v("attr_size")), (p, 1000));
    assert_eq!((v("a_base"), v("a_size")), (a, 1000));
    assert_eq!((v("freed_range"), v("freed_attr")), (500, 1), "a freed block answers as freed memory");
    assert_eq!([v("ids_differ"), v("id_same_inside"), v("id_new_after_reuse")], [1, 1, 1]);
    // As a cudaMalloc block: exportable through legacy IPC (cupool shares the
    // pages), no allocation handle of its own.
    assert_eq!((v("ipc_capable"), v("retain")), (1, 1), "cudaErrorInvalidValue for the handle");
    assert_eq!(r.log["end"]["pools"][0]["backing"], "vmm");
}

/// Export rules hold on VMM pages as on segments: a handle keeps exactly
/// the exported block out of reuse, and freed memory cannot be exported.
#[test]
fn ipc_export_of_a_vmm_block_keeps_it_out_of_reuse() {
    let prog = compile_runtime_program("ipcrules", "ipc_export_rules.c");
    let r = run(&prog, &[], VMM);
    let v = |k: &str| stdout_value(&r.stdout, k).unwrap_or_else(|| panic!("no {k}= in {}", r.stdout));
    assert_eq!(
        ["freed_export", "b_reused", "a_export", "a_kept", "a_freed_export", "a_freed_range"].map(v),
        [1, 1, 0, 1, 1, 500],
        "freed_export b_reused a_export a_kept"
    );
    assert_eq!(r.log["end"]["pools"][0]["backing"], "vmm");
}

/// Under `limit`, the device looks as large as the limit and as full as the
/// pool's pages plus the program's other memory, and a request past it gets
/// CUDA's out-of-memory code and a snapshot naming the pages held, the live
/// blocks and the addresses reserved. Pages come from anywhere: a 50 MiB
/// request beside a live block fits, where fixed segments (tests/pool.rs)
/// could not place it.
#[test]
fn a_capped_vmm_pool_shapes_mem_get_info_and_names_its_addresses_at_oom() {
    let prog = compile_runtime_program("vmmlimit", "pool_limit.c");
    let r = run(&prog, &[], &format!("{VMM}:limit=64m"));
    let v = |k: &str| r.result.get(k).copied().or_else(|| stdout_value(&r.stdout, k)).unwrap();
    assert_eq!((v("total0"), v("free0")), (64 * MIB, 64 * MIB));
    // 3,000,000 B on two 2 MiB pages, and 1 MiB of managed memory.
    for (f, t) in [("free1", "total1"), ("drv_free1", "drv_total1")] {
        assert_eq!((v(t), v(f)), (64 * MIB, 64 * MIB - 4 * MIB - MIB), "{f}, {t}");
    }
    assert_eq!((v("big"), v("big_untouched")), (2, 1), "cudaMalloc(100 MiB) under limit=64m");
    assert_eq!(v("mid"), 0, "50 MiB beside the 4 MiB held fits in pages");
    assert_eq!(v("small_works"), 1);
    assert_eq!(v("mid_after_free"), 2, "a second 50 MiB does not");
    assert_eq!(v("mid_works"), 1);
    let ooms = r.log["end"]["ooms"].as_array().expect("end.ooms");
    assert_eq!(ooms.len(), 2, "{ooms:?}");
    let first = &ooms[0];
    assert_eq!(first["requested"].as_u64(), Some(100 * MIB), "{first}");
    assert_eq!(first["reserved"].as_u64(), Some(4 * MIB), "{first}: the pages mapped");
    let allocated = first["allocated"].as_u64().unwrap();
    assert!((3_000_000..4 * MIB).contains(&allocated), "{first}: the live block, rounded");
    assert_eq!(first["largest_live"], serde_json::json!([3_000_000]), "{first}");
    assert!(first["address_reserved"].as_u64().unwrap() >= 64 << 30, "{first}: one 64 GiB range at least");
    let p = &pools(&r.log)[0];
    assert!(p["reserved_bytes"]["peak"].as_u64().unwrap() <= 64 * MIB - MIB, "the pool passed its limit: {p}");
    assert_valid_log(&r.log, "vmmlimit");
}

/// A device that cannot map pages (no VMM support) gets the fixed-segment
/// pool, says so once in the log, and the program runs as without cupool.
#[test]
fn a_device_without_vmm_gets_segments_and_a_note() {
    let prog = fakes().prog("prog_runtime");
    let plain = plain_result(&prog, &[]);
    let dir = scratch_dir("vmm-unsupported");
    let mut cmd = preloaded_command(&prog, &[], &dir, VMM);
    let out = cmd.env("FAKE_CUDA_NO_VMM", "1").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(result_line(&stdout_of(&out)).unwrap(), plain, "result line without VMM vs plain");
    let log = read_logs(&dir).remove(0);
    assert_eq!(log["options"]["backing"], "vmm", "asked for");
    assert!(!pools(&log).is_empty());
    for p in pools(&log) {
        assert_eq!(p["backing"], "segments", "{p}");
        assert!(p["pages"].is_null(), "{p}");
    }
    let notes: Vec<&str> = log["end"]["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
    assert!(notes.iter().any(|n| n.contains("cannot map pages") && n.contains("pool segments instead")), "{notes:?}");
    assert_valid_log(&log, "prog_runtime");
}
