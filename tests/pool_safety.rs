//! The pool on by default and safe: stream capture gets CUDA's own answers,
//! a context destroyed behind the shim's back takes its pool with it, and
//! memory freed in bulk goes back to the device. Programs over the fake
//! driver and runtime, preloaded with the default options (pool mode).
//! `cargo test --test pool_safety`
mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::*;

const MIB: u64 = 1 << 20;

/// The `key=value` lines a program printed, in order of key.
fn printed(stdout: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .filter(|l| !l.starts_with("result:"))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The `key=code` lines a program should print, as [`printed`] reads them.
fn codes(lines: &[(&str, i32)]) -> BTreeMap<String, String> {
    lines.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Runs `prog` plainly and preloaded (with `options`); both must print
/// `result: ok`. Returns (plain stdout, preloaded stdout, the one log).
fn both_ways(prog: &Path, options: &str) -> (String, String, Value) {
    let name = prog.file_name().unwrap().to_string_lossy().into_owned();
    let plain = run_plain(prog, &[], &scratch_dir(&format!("safety-plain-{name}")));
    let dir = scratch_dir(&format!("safety-{name}"));
    let shim = run_preloaded(prog, &[], &dir, options);
    for (how, out) in [("plain", &plain), ("under cupool", &shim)] {
        assert!(
            out.status.success() && result_line(&stdout_of(out)).is_some(),
            "{name} {how}: {:?}\n{}{}",
            out.status,
            stdout_of(out),
            stderr_of(out)
        );
    }
    let mut logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{name}: one log in {}", dir.display());
    (stdout_of(&plain), stdout_of(&shim), logs.remove(0))
}

/// Runs `prog` preloaded with the default options; returns its one log.
fn run_default(prog: &Path, args: &[&str]) -> Value {
    let dir = scratch_dir("safety-default");
    let out = run_preloaded(prog, args, &dir, "");
    assert!(result_line(&stdout_of(&out)).is_some(), "{}{}", stdout_of(&out), stderr_of(&out));
    read_logs(&dir).remove(0)
}

fn notes(log: &Value) -> Vec<String> {
    log["end"]["notes"]
        .as_array()
        .map(|n| n.iter().filter_map(|s| s.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

fn leak_sizes(log: &Value) -> Vec<(u64, String)> {
    log["end"]["leaks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["size"].as_u64().unwrap(), l["at"].as_str().unwrap_or("").to_string()))
        .collect()
}

#[test]
fn the_pool_is_the_default() {
    let prog = compile_driver_program("giveback", "pool_give_back.c");
    let (_, _, log) = both_ways(&prog, "");
    assert_eq!(log["options"]["mode"], "pool", "default options: {}", log["options"]);
    let (_, _, log) = both_ways(&prog, "mode=passthrough");
    assert_eq!(log["options"]["mode"], "passthrough");
}

#[test]
fn capture_gets_cudas_own_answers_under_the_pool() {
    let prog = compile_runtime_program("capture", "pool_capture.c");
    let (plain, shim, log) = both_ways(&prog, "");
    // With empty segments kept, asking for free memory during the capture
    // must not give them back (a cuMemFree would break the capture).
    let (_, kept, _) = both_ways(&prog, "give_back=never");
    let want = codes(&[
        ("relaxed_malloc", 0),
        ("relaxed_end", 0),
        ("relaxed_free", 0),
        // Global mode: allocating is refused and breaks the capture ...
        ("global_malloc", 900),
        ("global_end", 901),
        // ... and so is freeing.
        ("global_free", 900),
        ("global_free_end", 901),
        ("free_after_capture", 0),
        ("global_other_malloc", 900),
        ("global_other_end", 901),
        // Thread-local mode: only the capturing thread is refused.
        ("local_other_malloc", 0),
        ("local_own_malloc", 900),
        ("local_end", 901),
        // A relaxed capture forbids no free, nor does another thread's
        // thread-local one, and the free leaves them whole (a synchronisation
        // would break them); a global one invalidated and left open forbids
        // allocating and freeing still.
        ("relaxed_held_free", 0),
        ("relaxed_held_end", 0),
        ("open_malloc", 900),
        ("open_free", 900),
        ("open_malloc_again", 900),
        ("open_free_again", 0),
        ("open_end", 901),
        ("open_free_after", 0),
        ("local_other_free", 0),
        ("local_other_free_end", 0),
        // A driver free from a thread with no current context.
        ("no_context_free", 0),
        ("no_context_capture_free", 900),
        ("no_context_capture_end", 901),
        ("no_context_free_after", 0),
        ("graph_malloc", 0),
        ("graph_meminfo", 0),
        ("graph_end", 0),
        ("malloc_after", 0),
        ("free_after", 0),
    ]);
    assert_eq!(printed(&plain), want, "the fake runtime, plainly:\n{plain}");
    assert_eq!(printed(&shim), want, "under cupool's pool:\n{shim}");
    assert_eq!(printed(&kept), want, "under cupool's pool, give_back=never:\n{kept}");
    assert_eq!(log["options"]["mode"], "pool");
    // The graph's own allocation is the graph's: not a leak of the program's.
    assert!(
        !leak_sizes(&log).iter().any(|(size, _)| *size == 8192),
        "graph allocation reported as a leak: {:?}",
        leak_sizes(&log)
    );
    assert!(
        notes(&log).iter().any(|n| n.starts_with("1 stream-ordered allocation(s) were captured into CUDA graphs")),
        "notes: {:?}",
        notes(&log)
    );
    assert_valid_log(&log, "capture");
}

#[test]
fn a_context_reset_behind_the_shims_back_takes_its_pool_with_it() {
    let prog = compile_driver_program("unseenreset", "pool_unseen_reset.c");
    let (plain, shim, log) = both_ways(&prog, "");
    assert_eq!(stdout_value(&plain, "x_works"), Some(1), "plainly:\n{plain}");
    assert_eq!(stdout_value(&shim, "same_handle"), Some(1), "the fake keeps the primary context's handle");
    assert_eq!(stdout_value(&shim, "x_works"), Some(1), "a block allocated after the reset holds data:\n{shim}");
    assert_eq!(
        leak_sizes(&log),
        vec![(1000, "cudaDeviceReset".to_string())],
        "b died with the context it was allocated in"
    );
    assert!(notes(&log).iter().any(|n| n.contains("behind cupool's back")), "notes: {:?}", notes(&log));
    assert_valid_log(&log, "unseenreset");
}

/// CuPy's `TestMemoryAsyncPool` failed under the pool on an H200: with a
/// stream created, the pool's frees wait for fences, and memory freed in
/// bulk stayed held until the pool's next allocation, so CUDA's own
/// stream-ordered pool found the device full. A bulk free now waits for the
/// GPU and goes back, as `cudaFree` does; and a request CUDA refuses while
/// the pool keeps a size cached gets that memory back and is made again.
#[test]
fn memory_freed_behind_fences_is_there_for_cudas_own_pool() {
    let prog = compile_runtime_program("free_then_async", "pool_free_then_async.c");
    // Every request pooled: 70 % of the device would otherwise go to CUDA
    // as it is (`direct_min`), and this is about the pool's own frees.
    for options in ["direct_min=0", "backing=segments"] {
        let (plain, shim, log) = both_ways(&prog, options);
        for (how, out) in [("plainly", &plain), ("under the pool", &shim)] {
            assert_eq!(stdout_value(out, "async_after_bulk_free"), Some(0), "{options} {how}:\n{out}");
            assert_eq!(stdout_value(out, "async_after_churn"), Some(0), "{options} {how}:\n{out}");
            assert_eq!(stdout_value(out, "vmm_after_churn"), Some(0), "{options} {how}:\n{out}");
        }
        assert_eq!(stdout_value(&shim, "used_after_bulk_free"), Some(0), "{options}: the bulk free went back at once");
        assert!(
            notes(&log).iter().any(|n| n.contains("the pools gave back")),
            "{options}: the retried request is noted: {:?}",
            notes(&log)
        );
        // What went back was counted once: the device's reserved bytes are
        // the pool's (everything else was freed), not a wrapped-around count.
        let end = &log["end"];
        assert_eq!(
            end["devices"][0]["reserved_bytes"], end["pools"][0]["reserved_bytes"]["current"],
            "{options}: {end}"
        );
        assert_valid_log(&log, "free_then_async");
    }
}

/// A free that waits for the GPU (much memory freed behind queued work)
/// waits with the pool's lock let go: another thread's allocation meanwhile
/// is served at once, not after the GPU (the fake's synchronisation takes
/// 300 ms), and the freed memory has gone back when the free returns.
/// A request past the device's memory goes to CUDA as it is (`direct_min`)
/// and fails there at once, as without cupool: no wait for the GPU to give
/// back the pool's memory first (the fake's synchronisation takes 300 ms),
/// since all of it could not make the request fit.
#[test]
fn a_request_past_the_device_fails_without_waiting_for_the_gpu() {
    let prog = compile_runtime_program("oom_behind", "pool_oom_behind.c");
    for times in ["1", "2"] {
        let dir = scratch_dir(&format!("safety-oom-at-once-{times}"));
        let mut cmd = preloaded_command(&prog, &[times], &dir, "");
        cmd.env("FAKE_CUDA_EVENT_LATENCY_US", "100000").env("FAKE_CUDA_SYNC_US", "300000");
        let out = cmd.output().expect("run oom_behind");
        let result = result_line(&stdout_of(&out)).unwrap_or_else(|| panic!("{}{}", stdout_of(&out), stderr_of(&out)));
        assert!(result["oom_ms"] < 150, "{times}: the refusal took {} ms", result["oom_ms"]);
        let log = &read_logs(&dir)[0];
        assert_eq!(log["end"]["pools"][0]["fences"]["syncs"], 0, "{times}: {}", log["end"]["pools"][0]);
    }
}

/// `pool_free_wait_unlocked.c` with `args`, under the shim with `options`,
/// a synchronisation taking 300 ms: its result line, its stdout and its log
/// directory. The free waited for the GPU, as `cudaFree` does.
fn free_wait_unlocked(args: &[&str], options: &str) -> (HashMap<String, u64>, String, PathBuf) {
    let prog = compile_runtime_program("free_wait_unlocked", "pool_free_wait_unlocked.c");
    let dir = scratch_dir("safety-free-wait-unlocked");
    let mut cmd = preloaded_command(&prog, args, &dir, options);
    cmd.env("FAKE_CUDA_SYNC_US", "300000");
    let out = cmd.output().expect("run free_wait_unlocked");
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{options}: {stdout}{}", stderr_of(&out));
    let result = result_line(&stdout).unwrap_or_else(|| panic!("{options}: no result line: {stdout}"));
    assert!(result["free_ms"] >= 250, "{options}: the free waited for the GPU, as cudaFree does: {stdout}");
    (result, stdout, dir)
}

#[test]
fn a_free_waits_for_the_gpu_without_the_pools_lock() {
    for options in ["", "backing=segments"] {
        let (result, stdout, dir) = free_wait_unlocked(&[], options);
        assert!(
            result["other_alloc_ms"] < 150,
            "{options}: the other thread did not wait on the pool's lock: {stdout}"
        );
        assert!(
            result["used_after_free_mib"] <= 66,
            "{options}: the memory went back before the free returned: {stdout}"
        );
        let log = &read_logs(&dir)[0];
        let pool = &log["end"]["pools"][0];
        assert!(pool["num_syncs"].as_u64().unwrap() >= 1 && pool["fences"]["syncs"].as_u64().unwrap() >= 1, "{pool}");
        assert!(pool["fences"]["wait_ns"].as_u64().unwrap() >= 250_000_000, "{options}: the wait is counted: {pool}");
        assert_valid_log(log, "free_wait_unlocked");
    }
}

/// A capture that another thread begins while a free waits for the GPU
/// with the pool's lock let go: once the wait is over, nothing goes back to
/// CUDA during the capture (a `cuMemFree` there invalidates a global-mode
/// capture, as the fake driver does like the real one), and the capture
/// ends as it would without cupool.
#[test]
fn a_capture_begun_during_a_frees_wait_is_not_broken_by_its_give_back() {
    for options in ["backing=segments", ""] {
        let (result, stdout, dir) = free_wait_unlocked(&["capture"], options);
        assert_eq!(result["capture_end"], 0, "{options}: the capture ended as without cupool: {stdout}");
        assert_valid_log(&read_logs(&dir)[0], "free_wait_unlocked");
    }
}

/// A stream destroyed with work still queued on it, then a free of the
/// block that work uses: CUDA lets the work run on, and `cudaFree` waits for
/// it. The pool's fences no longer see the stream, so the stream's last
/// event, recorded as it is destroyed, must join them: the block is not
/// handed out again ahead of the work (unless the streams are made to wait
/// for it on the GPU, as a barrier does).
#[test]
fn a_block_freed_after_its_stream_was_destroyed_waits_for_that_streams_work() {
    let prog = compile_runtime_program("destroyed_stream", "pool_destroyed_stream.c");
    // "older": the block comes back behind a GPU-side barrier on a fence
    // recorded after the one that carried the destroyed stream's event.
    for (args, options) in
        [(&[][..], ""), (&[], "backing=segments"), (&["older"], ""), (&["older"], "backing=segments")]
    {
        let dir = scratch_dir("safety-destroyed-stream");
        let out = preloaded_command(&prog, args, &dir, options).output().expect("run destroyed_stream");
        let stdout = stdout_of(&out);
        assert!(out.status.success(), "{options}: {stdout}{}", stderr_of(&out));
        let result = result_line(&stdout).unwrap_or_else(|| panic!("{options}: no result line: {stdout}"));
        assert_eq!(result["ordered_during_work"], 1, "{args:?} {options}: handed out ahead of the work: {stdout}");
        assert_eq!(result["reused_after_work"], 1, "{args:?} {options}: reused once the work was done: {stdout}");
        assert_valid_log(&read_logs(&dir)[0], "destroyed_stream");
    }
}

/// A block freed before any stream exists is reusable at once (all work
/// so far is ordered on the one stream). Streams created later, not only
/// the first, are ordered behind the work queued before them: the block may
/// go to any of them while that work still runs.
#[test]
fn every_stream_created_later_waits_for_the_work_queued_before_the_first() {
    let prog = compile_runtime_program("late_stream", "pool_late_stream.c");
    for options in ["", "backing=segments"] {
        let dir = scratch_dir("safety-late-stream");
        let out = preloaded_command(&prog, &[], &dir, options).output().expect("run late_stream");
        let stdout = stdout_of(&out);
        assert!(out.status.success(), "{options}: {stdout}{}", stderr_of(&out));
        let result = result_line(&stdout).unwrap_or_else(|| panic!("{options}: no result line: {stdout}"));
        assert_eq!(result["ordered"], 1, "{options}: the second stream may touch x ahead of the work: {stdout}");
        assert_valid_log(&read_logs(&dir)[0], "late_stream");
    }
}

#[test]
fn memory_freed_in_bulk_goes_back_to_the_device() {
    let prog = compile_driver_program("giveback", "pool_give_back.c");
    let used = |out: &str| {
        ["used_after_bulk_free", "used_after_churn", "used_after_other_bulk_free", "used_after_meminfo"]
            .map(|k| stdout_value(out, k).unwrap_or_else(|| panic!("no {k} in:\n{out}")))
    };
    let (plain, vmm, log) = both_ways(&prog, "");
    assert_eq!(used(&plain), [0, 0, 0, 0], "without cupool every free goes back");
    // VMM pages (the default) by the same rule, by block size: the bulk free
    // goes back, the 64 MiB churn keeps its pages; the 96 MiB blocks take
    // those pages (no page is made while one is idle) and give them back.
    assert_eq!(used(&vmm), [0, 64 * MIB, 0, 0], "backing=vmm, give_back=auto:\n{vmm}");
    assert_eq!((log["options"]["give_back"].as_str(), log["options"]["backing"].as_str()), (Some("auto"), Some("vmm")));
    let (_, auto, _) = both_ways(&prog, "backing=segments");
    // Bulk frees go back at once; the churn that follows (a 64 MiB segment
    // grown again within a second of one going back) keeps its size cached,
    // while a bulk free of another size still goes back, and everything
    // goes once the program asks how much memory is free.
    assert_eq!(used(&auto), [0, 64 * MIB, 64 * MIB, 0], "give_back=auto:\n{auto}");
    let (_, always, _) = both_ways(&prog, "backing=segments:give_back=always");
    assert_eq!(used(&always), [0, 0, 0, 0], "give_back=always");
    let (_, never, _) = both_ways(&prog, "backing=segments:give_back=never");
    // Never: cached segments go only to make room below the peak (the 96 MiB
    // ones take the place of 64 MiB ones) and when the program asks.
    assert_eq!(used(&never), [512 * MIB, 512 * MIB, 512 * MIB, 0], "give_back=never");
    let (_, passthrough, _) = both_ways(&prog, "mode=passthrough");
    assert_eq!(used(&passthrough), [0, 0, 0, 0], "passthrough");
}

#[test]
fn kernels_on_per_thread_default_streams_make_reuse_wait_for_fences() {
    let prog = compile_runtime_program("ptds", "pool_ptds.c");
    let multi_stream = |args: &[&str]| {
        let pool = run_default(&prog, args)["end"]["pools"][0].clone();
        let fenced = pool["multi_stream"].as_bool().expect("a pool record");
        if fenced {
            assert_eq!(pool["multi_stream_because"], "second_stream", "{args:?}: {pool}");
        }
        fenced
    };
    // Kernels of two threads on the legacy stream run in the order queued:
    // a freed block may be reused at once.
    assert!(!multi_stream(&[]), "legacy stream");
    // On per-thread default streams they run side by side, however launched.
    assert!(multi_stream(&["ptsz"]), "per-thread default streams");
    assert!(multi_stream(&["ex-ptsz"]), "per-thread default streams, cudaLaunchKernelExC");
    assert!(multi_stream(&["coop-ptsz"]), "per-thread default streams, cudaLaunchCooperativeKernel");
}

#[test]
fn a_program_that_cycles_keeps_its_segment_cached() {
    // 10000 cudaMalloc/cudaFree pairs: the first free gives the segment (the
    // page) back, the next allocation regrows it at once, and from then on it stays.
    let prog = compile_fake_program("reuse", "pool_reuse.c", &{
        let mut args = link_fake_cudart();
        args.extend(link_fake_cuda());
        args
    });
    for (backing, made, gone) in [("segments", "allocs", "frees"), ("vmm", "vmm_creates", "vmm_releases")] {
        let dir = scratch_dir(&format!("safety-reuse-{backing}"));
        let out = run_preloaded(&prog, &[], &dir, &format!("backing={backing}"));
        assert!(out.status.success(), "{}{}", stdout_of(&out), stderr_of(&out));
        let log = &read_logs(&dir)[0];
        let stats = fake_stats_for(&dir, log["process"]["pid"].as_u64().unwrap()).expect("fake stats");
        assert_eq!((stats[made], stats[gone]), (2, 1), "{backing}: made and given back: {stats:?}");
    }
}

/// A runtime call the pool answers itself with an error leaves it as the
/// thread's last error, as the runtime would: a double free, a device too
/// full for a pooled block, a free refused by a capture.
#[test]
fn an_error_the_pool_answers_is_the_threads_last_error_too() {
    let mut args = vec!["-DFAKE_CUDA".to_string()];
    args.extend(link_fake_cudart());
    args.extend(link_fake_cuda());
    let prog = compile_fake_program("last_error", "last_error.c", &args);
    let want = codes(&[
        ("double_free", 1),
        ("double_free_last", 1),
        ("double_free_last_again", 0),
        ("oom", 2),
        ("oom_last", 2),
        ("oom_last_again", 0),
        ("capture_free", 900),
        ("capture_free_last", 900),
        ("capture_end", 901),
        ("capture_end_last", 901),
    ]);
    for options in ["", "backing=segments"] {
        let (plain, shim, _) = both_ways(&prog, options);
        assert_eq!(printed(&plain), want, "the fake runtime, plainly:\n{plain}");
        assert_eq!(printed(&shim), want, "under cupool's pool, {options:?}:\n{shim}");
    }
    // The limit refuses a stream-ordered allocation during another stream's
    // global capture: its echo as the last error (an allocation, which the
    // capture forbids) must not break the capture.
    let out = run_preloaded(&prog, &["capture-limit"], &scratch_dir("last-error-capture"), "limit=64m");
    let shim = stdout_of(&out);
    assert!(out.status.success() && result_line(&shim).is_some(), "{shim}{}", stderr_of(&out));
    let got = printed(&shim);
    assert_eq!((got["limit_async"].as_str(), got["limit_capture_end"].as_str()), ("2", "0"), "{shim}");
}

#[test]
fn the_run_summary_says_what_the_pool_did_differently() {
    let prog = compile_runtime_program("capture", "pool_capture.c");
    let dir = scratch_dir("safety-summary");
    let logs = dir.join("logs");
    let out = run_cupool(&["run", "--log-dir", logs.to_str().unwrap(), "--", prog.to_str().unwrap()], &dir);
    assert!(out.status.success(), "{}{}", stdout_of(&out), stderr_of(&out));
    let summary = stderr_of(&out);
    assert!(
        summary.contains("    note: 1 stream-ordered allocation(s) were captured into CUDA graphs"),
        "summary:\n{summary}"
    );
}

#[test]
fn driver_api_allocations_from_two_threads_make_reuse_wait_for_fences() {
    let prog = compile_runtime_program("drvthreads", "pool_driver_threads.c");
    let run = |args: &[&str]| run_default(&prog, args);
    let one = run(&["one"]);
    assert_eq!(one["end"]["pools"][0]["multi_stream"], false, "one thread: reuse at once");
    let two = run(&[]);
    assert_eq!(two["end"]["pools"][0]["multi_stream"], true, "two threads: fences");
    // Here the second thread's binding, before it allocates, already shows it
    // (the next test); after a launch the hooks saw, its allocations do.
    let said = |n: &String| n.contains("from several threads") || n.contains("a second thread made a context current");
    assert!(notes(&two).iter().any(said), "notes: {:?}", notes(&two));
    let seen = run(&["launch-two"]);
    assert_eq!(seen["end"]["pools"][0]["multi_stream"], true, "two allocating threads after a launch: fences");
    assert_eq!(seen["end"]["pools"][0]["multi_stream_because"], "driver_threads");
    assert!(one["end"]["pools"][0].get("multi_stream_because").is_none(), "nothing to say: {}", one["end"]["pools"][0]);
    assert!(notes(&seen).iter().any(|n| n.contains("from several threads")), "notes: {:?}", notes(&seen));
}

/// A static runtime's launches are invisible, and a thread that only
/// launches kernels shows itself only by making a context current: once one
/// does, while pooled allocations come only through the driver API and no
/// launch was seen, reuse waits for fences.
#[test]
fn a_second_thread_binding_a_context_makes_reuse_wait_where_launches_are_unseen() {
    let prog = compile_runtime_program("drvthreads-bind", "pool_driver_threads.c");
    let with = |mode: &str, options: &str| {
        let dir = scratch_dir("safety-bound");
        let out = run_preloaded(&prog, &[mode], &dir, options);
        assert!(result_line(&stdout_of(&out)).is_some(), "{mode}: {}{}", stdout_of(&out), stderr_of(&out));
        let log = read_logs(&dir).remove(0);
        let pool = &log["end"]["pools"][0];
        let fenced = pool["multi_stream"].as_bool().expect("a pool record");
        let bound = notes(&log).iter().any(|n| n.contains("a second thread made a context current"));
        assert_eq!(bound, pool["multi_stream_because"] == "bound_thread", "{mode}: {pool}");
        (fenced, bound)
    };
    let multi_stream = |mode: &str| with(mode, "");
    assert_eq!(multi_stream("one"), (false, false), "one thread: reuse at once");
    assert_eq!(multi_stream("bind"), (true, true), "a second thread bound the context after the allocations");
    assert_eq!(multi_stream("early"), (true, true), "a second thread bound the context before them");
    assert_eq!(multi_stream("push"), (true, true), "bound through cuCtxPushCurrent");
    assert_eq!(multi_stream("procaddr"), (true, true), "bound through cuGetProcAddress's cuCtxSetCurrent");
    // A program whose launches are seen has its streams followed launch by launch.
    assert_eq!(multi_stream("launch"), (false, false), "a launch was seen");
    // The shim's own binding (here to give a segment back after a free from a
    // thread with no context) is not a thread of the program's.
    assert_eq!(with("foreign-free", "backing=segments:give_back=always"), (false, false), "the shim's own push");
}

#[test]
fn a_block_freed_while_another_device_is_current_is_fenced_in_its_own_context() {
    let prog = compile_runtime_program("crossdev", "pool_cross_device.c");
    let dir = scratch_dir("safety-crossdev");
    let out = run_preloaded(&prog, &[], &dir, "give_back=never");
    assert!(result_line(&stdout_of(&out)).is_some(), "{}{}", stdout_of(&out), stderr_of(&out));
    let log = &read_logs(&dir)[0];
    let stats = fake_stats_for(&dir, log["process"]["pid"].as_u64().unwrap()).expect("fake stats");
    // CUDA refuses an event recorded on a stream of another context; a fence
    // made that way would leave the block's own streams unfenced.
    assert_eq!(stats["cross_context_records"], 0, "{stats:?}");
    let pools = log["end"]["pools"].as_array().expect("pools");
    assert_eq!(pools.len(), 2, "one pool per device: {pools:?}");
    for p in pools {
        let fences = &p["fences"];
        assert!(fences["recorded"].as_u64().unwrap() > 0, "fences recorded: {p}");
        assert_eq!(fences["record_errors"], 0, "{p}");
    }
}

#[test]
fn a_segment_emptied_on_a_thread_without_a_context_goes_back_to_its_device() {
    let prog = compile_runtime_program("crossdev", "pool_cross_device.c");
    // The driver freed the segment (released the block's 32 pages): the
    // pool's books and the device agree.
    for (backing, made, gone, count) in [("segments", "allocs", "frees", 1), ("vmm", "vmm_creates", "vmm_releases", 32)]
    {
        let dir = scratch_dir(&format!("safety-nocontext-{backing}"));
        let out = run_preloaded(&prog, &["thread"], &dir, &format!("backing={backing}:give_back=always"));
        assert!(result_line(&stdout_of(&out)).is_some(), "{}{}", stdout_of(&out), stderr_of(&out));
        let log = &read_logs(&dir)[0];
        let stats = fake_stats_for(&dir, log["process"]["pid"].as_u64().unwrap()).expect("fake stats");
        assert_eq!((stats[made], stats[gone], stats["live"]), (count, count, 0), "{backing}: {stats:?}");
    }
}

#[test]
fn a_contexts_first_stream_waits_for_the_work_queued_before_it() {
    // A block freed before any stream existed was reusable at once; the
    // first stream created afterwards must be ordered behind that work (on
    // a GPU: a non-blocking stream is not ordered behind the legacy one).
    let prog = compile_runtime_program("first-stream", "pool_first_stream.c");
    for (options, waits) in [("", 1), ("mode=passthrough", 0)] {
        let dir = scratch_dir(&format!("safety-first-stream{}", waits));
        let out = run_preloaded(&prog, &[], &dir, options);
        assert!(result_line(&stdout_of(&out)).is_some(), "{}{}", stdout_of(&out), stderr_of(&out));
        let log = &read_logs(&dir)[0];
        let stats = fake_stats_for(&dir, log["process"]["pid"].as_u64().unwrap()).expect("fake stats");
        // One wait: the first stream's; the second stream needs none.
        assert_eq!(stats["stream_waits"], waits, "{options:?}: {stats:?}");
    }
}

#[test]
fn no_fence_leaves_out_a_live_stream_whose_record_failed() {
    // The driver refuses a record on a stream that still exists: a fence
    // without that stream would complete before the stream's work, so no
    // fence is made and freed blocks stay pending (the pool grows instead).
    // A stream destroyed behind the shim's back is left out, as before. A
    // refused fence is tried again a `fence_us` later, not on every free.
    let prog = compile_runtime_program("reuse", "pool_reuse.c");
    let dir = scratch_dir("safety-refused-record");
    let out = preloaded_command(&prog, &["stream"], &dir, "fence_us=100000")
        .env("FAKE_CUDA_REFUSE_STREAM_RECORDS", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", stdout_of(&out), stderr_of(&out));
    let log = &read_logs(&dir)[0];
    let fences = &log["end"]["pools"][0]["fences"];
    let refused = fences["record_errors"].as_u64().unwrap();
    assert!((1..100).contains(&refused), "10000 frees, fences 100 ms apart: {fences}");
    assert_eq!((fences["recorded"].as_u64(), fences["completed"].as_u64()), (Some(0), Some(0)), "{fences}");
    assert_eq!(stdout_value(&stdout_of(&out), "same_as_first"), Some(1), "a freed block was reused without a fence");
}

/// A request the device cannot serve fails as `cudaMalloc` would, and
/// leaves the device's memory free for other allocators even while the GPU
/// is behind (events complete 100 ms after their record): one for 32 MiB
/// more than is free is tried, and the pages made for it go back at once
/// instead of cooling, and are not the run's peak; one for more than the
/// device has makes no page at all. (Every request pooled, `direct_min=0`:
/// this is about the pool's own refusal.)
#[test]
fn a_request_larger_than_the_device_leaves_its_memory_free_with_the_gpu_behind() {
    let prog = compile_runtime_program("oom_behind", "pool_oom_behind.c");
    let total: u64 = 1 << 30;
    for (times, fewest_made, most_made) in [("0", 100, total >> 21), ("1", 0, 2), ("2", 0, 2)] {
        let dir = scratch_dir(&format!("safety-oom-behind-{times}"));
        let mut cmd = preloaded_command(&prog, &[times], &dir, "direct_min=0");
        cmd.env("FAKE_CUDA_EVENT_LATENCY_US", "100000").env("FAKE_CUDA_TOTAL_MEM", total.to_string());
        let out = cmd.output().expect("run oom_behind");
        assert!(result_line(&stdout_of(&out)).is_some(), "{times}: {}{}", stdout_of(&out), stderr_of(&out));
        let log = &read_logs(&dir)[0];
        let pool = &log["end"]["pools"][0];
        assert_eq!(pool["num_ooms"], 1, "{pool}");
        let peak = pool["reserved_bytes"]["peak"].as_u64().unwrap();
        assert!(peak < total / 16, "{times}: the failed request is the pool's peak: {peak} of {total}");
        let stats = fake_stats_for(&dir, log["process"]["pid"].as_u64().unwrap()).expect("fake stats");
        let made = stats["vmm_creates"];
        assert!((fewest_made..=most_made).contains(&made), "{times}: pages made: {stats:?}");
    }
}
