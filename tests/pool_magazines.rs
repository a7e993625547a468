//! Thread magazines (`magazines=always`: every thread keeps small blocks of
//! its own, taken from the pool 16 at a time and freed back 32 at a time)
//! over the fake driver, on both backings. Every program must give the
//! output it gives without cupool; a freed pointer must answer as freed
//! memory however long its batch waits; a handle keeps exactly the exported
//! block out of reuse; the end record must show the program's blocks only.
//! `cargo test --test pool_magazines`
mod support;

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;
use support::*;

const ALWAYS: &str = "magazines=always";

struct Run {
    stdout: String,
    result: Option<HashMap<String, u64>>,
    log: Value,
}

fn run(prog: &Path, args: &[&str], options: &str) -> Run {
    run_with(prog, args, options, &[])
}

/// `run` with `env` set for the program (and the fake driver).
fn run_with(prog: &Path, args: &[&str], options: &str, env: &[(&str, &str)]) -> Run {
    let name = prog.file_name().unwrap().to_string_lossy().into_owned();
    let dir = scratch_dir(&format!("mag-{name}"));
    let out = preloaded_command(prog, args, &dir, options).envs(env.iter().copied()).output().unwrap();
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(0), "{name} {args:?} {options}: {:?}\n{stdout}\n{stderr}", out.status);
    let mut logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{name}: {:?}", log_files(&dir));
    let log = logs.remove(0);
    assert_valid_log(&log, &name);
    Run { result: result_line(&stdout), stdout, log }
}

fn plain_result(prog: &Path, args: &[&str]) -> HashMap<String, u64> {
    let name = prog.file_name().unwrap().to_string_lossy().into_owned();
    let out = run_plain(prog, args, &scratch_dir(&format!("mag-plain-{name}")));
    assert!(out.status.success(), "{name} plain: {:?}\n{}", out.status, stderr_of(&out));
    result_line(&stdout_of(&out)).unwrap_or_else(|| panic!("{name} plain: no result line"))
}

fn pools(log: &Value) -> &Vec<Value> {
    log["end"]["pools"].as_array().expect("end.pools")
}

/// The pools' requested bytes now and at their peak, summed.
fn requested(log: &Value) -> (u64, u64) {
    pools(log).iter().fold((0, 0), |(c, p), pool| {
        let r = &pool["requested_bytes"];
        (c + r["current"].as_u64().unwrap(), p + r["peak"].as_u64().unwrap())
    })
}

#[test]
fn programs_run_unchanged_with_a_magazine_per_thread() {
    for backing in ["backing=vmm", "backing=segments"] {
        for prog in
            ["prog_runtime", "prog_runtime_static", "prog_dlopen", "prog_driver", "prog_getproc", "prog_threads"]
        {
            let prog = fakes().prog(prog);
            let r = run(&prog, &[], &format!("{ALWAYS}:{backing}"));
            assert_eq!(r.result.as_ref(), Some(&plain_result(&prog, &[])), "{prog:?} {backing}");
            assert_eq!(r.log["options"]["magazines"], "always");
        }
    }
}

/// Where threads allocating at once meet: the end record counts the times a
/// thread found the pool's lock taken. Eight threads of a thousand pairs
/// each, every pair through the lock (no magazines), meet there; a lone
/// thread never does. The driver takes 20 ms to create a page, which the
/// pool does under its lock: the other threads find it taken even where
/// they run one at a time (a CI host of one CPU).
#[test]
fn the_end_record_counts_waits_on_the_pools_lock() {
    let lock_waits = |r: &Run| pools(&r.log).iter().map(|p| p["lock_waits"].as_u64().expect("lock_waits")).sum::<u64>();
    let slow_pages = [("FAKE_CUDA_CREATE_US", "20000")];
    let threads = run_with(&fakes().prog("prog_threads"), &[], "magazines=never", &slow_pages);
    assert!(lock_waits(&threads) > 0, "8 threads: no wait on the pool's lock counted");
    let alone = run(&fakes().prog("prog_runtime"), &[], "magazines=never");
    assert_eq!(lock_waits(&alone), 0, "one thread");
}

#[test]
fn a_block_cycled_in_a_loop_comes_from_the_magazine_and_goes_back_at_exit() {
    let reuse = compile_runtime_program("mag-reuse", "pool_reuse.c");
    for args in [&[][..], &["stream"][..]] {
        let r = run(&reuse, args, ALWAYS);
        // The pool handed out a refill of several blocks of 4 KiB at once
        // (two: a class's first refill) ...
        let (current, peak) = requested(&r.log);
        assert!(peak >= 2 * 4096, "{args:?}: requested peak {peak}: {}", r.log["end"]["pools"]);
        // ... and took every one back when the program exited: it leaks nothing.
        assert_eq!(current, 0, "{args:?}: {}", r.log["end"]["pools"]);
        let never = run(&reuse, args, "magazines=never");
        assert_eq!(requested(&never.log).1, 4096, "{args:?}: one block at a time without magazines");
        assert_eq!(stdout_value(&never.stdout, "distinct"), stdout_value(&never.stdout, "distinct"));
    }
}

#[test]
fn a_freed_pointer_answers_as_freed_while_its_batch_waits() {
    let prog = compile_driver_program("mag-ptrquery", "pool_ptr_query.c");
    for backing in ["backing=vmm", "backing=segments"] {
        let r = run(&prog, &[], &format!("{ALWAYS}:{backing}"));
        let v = |k: &str| stdout_value(&r.stdout, k).unwrap_or_else(|| panic!("no {k}= in {}", r.stdout));
        let p = v("p");
        assert_eq!((v("range_base"), v("range_size")), (p, 1000), "{backing}");
        assert_eq!((v("freed_range"), v("freed_attr")), (500, 1), "{backing}: a freed block answers as freed memory");
        assert_eq!([v("ids_differ"), v("id_same_inside"), v("id_new_after_reuse")], [1, 1, 1], "{backing}");
    }
}

#[test]
fn an_exported_block_stays_out_of_reuse_and_freed_memory_cannot_be_exported() {
    let prog = compile_runtime_program("mag-ipcrules", "ipc_export_rules.c");
    for backing in ["backing=vmm", "backing=segments"] {
        let r = run(&prog, &[], &format!("{ALWAYS}:{backing}"));
        let v = |k: &str| stdout_value(&r.stdout, k).unwrap_or_else(|| panic!("no {k}= in {}", r.stdout));
        assert_eq!(
            ["freed_export", "b_reused", "a_export", "a_kept", "a_freed_export", "a_freed_range"].map(v),
            [1, 1, 0, 1, 1, 500],
            "{backing}"
        );
    }
}

/// A magazine holds blocks of a context that is reset; the new context's
/// pool may take the same addresses. The old blocks, handed back when the
/// magazine refills for the new pool, must free nothing of the new
/// context's memory, and the device's reserved bytes must not be taken
/// off twice (once at the death, again at the hand-back).
#[test]
fn blocks_a_magazine_held_through_a_context_reset_free_nothing_of_the_new_context() {
    let prog = compile_driver_program("mag-ctxreset", "magazine_context_reset.c");
    let plain = plain_result(&prog, &[]);
    assert_eq!((plain["blocks_with_data"], plain["big_rc"]), (3, 0));
    for backing in ["backing=segments", "backing=vmm"] {
        let r = run(&prog, &[], &format!("{ALWAYS}:{backing}"));
        let result = r.result.unwrap_or_else(|| panic!("{backing}: no result line: {}", r.stdout));
        assert_eq!(result, plain, "{backing}: {}", r.stdout);
        for device in r.log["end"]["devices"].as_array().expect("end.devices") {
            let reserved = &device["reserved_bytes"];
            assert!(reserved.as_u64().is_some_and(|b| b < 1 << 40), "{backing}: {device}");
        }
    }
}

#[test]
fn a_fork_child_keeps_nothing_of_its_parents_magazines() {
    let prog = fakes().prog("prog_fork");
    let dir = scratch_dir("mag-fork");
    let out = run_preloaded(&prog, &[], &dir, ALWAYS);
    assert!(out.status.success(), "{}{}", stdout_of(&out), stderr_of(&out));
    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 2, "{:?}", log_files(&dir));
    // Each process leaks exactly its own planted block (prog_fork's header).
    let mut leaked: Vec<u64> =
        logs.iter().map(|l| l["end"]["leak_summary"]["bytes"].as_u64().unwrap()).collect::<Vec<_>>();
    leaked.sort();
    assert_eq!(leaked, [6666, 7777]);
}

#[test]
fn sixteen_threads_churning_never_get_a_live_block() {
    // 16 threads x 4000 pairs of sizes up to 256 KiB: a quarter of them in
    // magazine classes, which the 4 class slots of each magazine keep
    // replacing, so blocks go back and forth between magazines and the pool.
    let prog = compile_fake_program("mag-churn", "pool_churn.c", &link_fake_cudart());
    for backing in ["backing=vmm", "backing=segments"] {
        let r = run(&prog, &[], &format!("{ALWAYS}:{backing}"));
        assert_eq!(events(&r.log, "alloc").len(), 16 * 4000, "{backing}");
        let twice = allocs_at_a_live_address(&r.log);
        assert!(twice.is_empty(), "{backing}: {} blocks handed out while live, e.g. {}", twice.len(), twice[0]);
        assert_eq!(requested(&r.log).0, 0, "{backing}: every magazine went back at exit");
        assert_eq!(r.log["end"]["leak_summary"]["count"], 0, "{backing}");
        counters_agree_with_the_events(&r.log, 16, backing);
    }
}

/// The end record's counters of device 0 against the event stream: calls
/// and what is held at the end exactly; the peaks within what threads keep
/// in their books' counter batches (64 KiB and 1,024 calls each, the bound
/// the log schema states) of the peaks replayed in `seq` order.
fn counters_agree_with_the_events(log: &Value, threads: u64, what: &str) {
    let d = log["end"]["devices"].as_array().and_then(|d| d.iter().find(|d| d["device"] == 0)).expect("device 0");
    let get = |k: &str| d[k].as_u64().unwrap_or_else(|| panic!("{what}: {k} in {d}"));
    let mut by_seq: Vec<&Value> = events(log, "alloc").into_iter().chain(events(log, "free")).collect();
    by_seq.sort_by_key(|e| e["seq"].as_u64().expect("seq"));
    let (mut bytes, mut count, mut peak_bytes, mut peak_count) = (0i64, 0i64, 0i64, 0i64);
    for e in &by_seq {
        let size = e["size"].as_i64().expect("size");
        let sign = if e["ev"] == "alloc" { 1 } else { -1 };
        bytes += sign * size;
        count += sign;
        peak_bytes = peak_bytes.max(bytes);
        peak_count = peak_count.max(count);
    }
    assert_eq!(get("allocs"), events(log, "alloc").len() as u64, "{what}");
    assert_eq!(get("frees"), events(log, "free").len() as u64, "{what}");
    assert_eq!((get("current_bytes") as i64, get("current_count") as i64), (bytes, count), "{what}");
    let near = |counted: u64, replayed: i64, slack: u64| counted.abs_diff(replayed as u64) <= slack;
    assert!(
        near(get("peak_bytes"), peak_bytes, threads * (64 << 10)),
        "{what}: {} against {peak_bytes}",
        get("peak_bytes")
    );
    assert!(near(get("peak_count"), peak_count, threads * 1024), "{what}: {} against {peak_count}", get("peak_count"));
}

/// Per-thread books: threads free their own blocks, blocks another thread
/// made, and blocks of threads that have exited; a second wave of threads
/// takes the first wave's books over. Every call is counted once, and the
/// blocks leaked on purpose are exactly the end record's leaks.
#[test]
fn threads_freeing_each_others_blocks_and_exiting_keep_every_count_exact() {
    let prog = compile_fake_program("books", "pool_books.c", &link_fake_cudart());
    let plain = plain_result(&prog, &[]);
    for options in ["magazines=auto", ALWAYS, "magazines=never:backing=segments"] {
        let r = run(&prog, &[], options);
        let result = r.result.as_ref().unwrap_or_else(|| panic!("{options}: no result line in {}", r.stdout));
        assert_eq!(result["allocs"], plain["allocs"], "{options}");
        assert_eq!(events(&r.log, "alloc").len() as u64, result["allocs"], "{options}");
        assert_eq!(events(&r.log, "free").len() as u64, result["frees"], "{options}");
        let twice = allocs_at_a_live_address(&r.log);
        assert!(twice.is_empty(), "{options}: {} blocks handed out while live, e.g. {}", twice.len(), twice[0]);
        let leaks = &r.log["end"]["leak_summary"];
        assert_eq!(leaks["count"].as_u64(), Some(result["leaked_count"]), "{options}");
        assert_eq!(leaks["bytes"].as_u64(), Some(result["leaked_bytes"]), "{options}");
        counters_agree_with_the_events(&r.log, 8, options);
    }
}

#[test]
fn blocks_held_at_once_by_eight_threads_never_overlap() {
    let prog = compile_runtime_program("mag-hold", "pool_hold.c");
    for backing in ["backing=vmm", "backing=segments"] {
        let r = run(&prog, &[], &format!("{ALWAYS}:{backing}"));
        assert_eq!(stdout_value(&r.stdout, "wrong"), Some(0), "{backing}: {}", r.stdout);
        let twice = allocs_at_a_live_address(&r.log);
        assert!(twice.is_empty(), "{backing}: {} blocks handed out while live, e.g. {}", twice.len(), twice[0]);
        assert_eq!(requested(&r.log).0, 0, "{backing}");
        counters_agree_with_the_events(&r.log, 8, backing);
    }
}

/// `end.magazines` says what the magazines did, and shows when fences come
/// too late for a thread's pace: 10,000 pairs of one thread reuse its own
/// frees while events complete at once (or while the pool can order the
/// streams behind each fence on the GPU), and push them back to the pool
/// (overflow) with twelve streams and a GPU that never catches up by itself.
#[test]
fn the_end_record_counts_what_magazines_did() {
    let prog = compile_runtime_program("reuse", "pool_reuse.c");
    let counts = |streams: &str, latency_us: &str| {
        let dir = scratch_dir(&format!("mag-counts-{streams}-{latency_us}"));
        let mut cmd = preloaded_command(&prog, &[streams], &dir, ALWAYS);
        let out = cmd.env("FAKE_CUDA_EVENT_LATENCY_US", latency_us).output().expect("run reuse");
        assert!(out.status.success(), "{}{}", stdout_of(&out), stderr_of(&out));
        let log = &read_logs(&dir)[0];
        let m = log["end"]["magazines"].clone();
        let n = |k: &str| m[k].as_u64().unwrap_or_else(|| panic!("{k} in {m}"));
        assert_eq!(n("threads"), 1, "{m}");
        // All but the first, which the pool serves while 4 KiB is not yet taken on.
        assert_eq!(
            n("own_frees_reused") + n("stock_handed_out"),
            9_999,
            "every later pair served by the magazine: {m}"
        );
        assert!(n("refills") >= n("stock_handed_out") / 16, "16 blocks a refill at most: {m}");
        (n("own_frees_reused"), n("overflowed"))
    };
    for (streams, latency) in [("stream", "0"), ("streams", "0"), ("stream", "100000")] {
        let (reused, overflowed) = counts(streams, latency);
        assert!(reused > 9_000 && overflowed < 1_000, "{streams} {latency}: reused {reused}, overflowed {overflowed}");
    }
    // Nothing completes by itself within the run; half the frees overflow,
    // the rest are reused after the pool itself waits for the GPU (it holds
    // too much that is pending), which the fake answers at once.
    let (reused, overflowed) = counts("streams", "100000000");
    assert!(reused < 6_000 && overflowed > 4_000, "GPU behind: reused {reused}, overflowed {overflowed}");
}

/// `magazines=auto` (the default): a lone thread whose small frees must wait
/// for fences (a stream was created) cannot have them back from the pool at
/// once, so each pair placed another block. Once it has freed the same few
/// sizes 64 times it starts a magazine of its own and takes its frees back
/// as their fences complete. A thread whose sizes keep changing, and a
/// program whose work all goes to one stream, never start one.
#[test]
fn a_lone_thread_whose_small_frees_wait_for_fences_starts_a_magazine() {
    let prog = compile_runtime_program("reuse", "pool_reuse.c");
    for backing in ["backing=vmm", "backing=segments"] {
        let fenced = run(&prog, &["stream"], backing);
        let m = &fenced.log["end"]["magazines"];
        let n = |k: &str| m[k].as_u64().unwrap_or_else(|| panic!("{backing}: {k} in {m}"));
        assert_eq!(n("threads"), 1, "{backing}: {m}");
        assert!(n("own_frees_reused") > 9_000, "{backing}: the thread's own frees come back to it: {m}");
        assert_eq!(requested(&fenced.log).0, 0, "{backing}: the magazine's blocks went back at exit");
        let one_stream = run(&prog, &[], backing);
        assert!(one_stream.log["end"]["magazines"].is_null(), "{backing}: {}", one_stream.log["end"]["magazines"]);
        let never = run(&prog, &["stream"], &format!("{backing}:magazines=never"));
        assert!(never.log["end"]["magazines"].is_null(), "{backing}: {}", never.log["end"]["magazines"]);
        let varying = run(&prog, &["stream-vary"], backing);
        assert!(varying.log["end"]["magazines"].is_null(), "{backing}: {}", varying.log["end"]["magazines"]);
    }
}

#[test]
fn a_block_freed_while_its_stream_works_is_not_handed_out_again_before_the_work_ends() {
    let prog = compile_runtime_program("busy_stream", "magazine_busy_stream.c");
    // 8 more streams: too many for GPU-side barriers, so that reuse waits for the work itself.
    for spare_streams in ["0", "8"] {
        for options in [ALWAYS, "", "backing=segments:magazines=always"] {
            let what = format!("{options} with {spare_streams} more streams");
            let run = run(&prog, &[spare_streams], options);
            let result = run.result.unwrap_or_else(|| panic!("{what}: no result line: {}", run.stdout));
            assert_eq!(
                result["unordered"], 0,
                "{what}: a busy block came back with later work not ordered behind its work: {}",
                run.stdout
            );
            assert!(result["pairs"] >= 100, "{what}: too few pairs inside the busy time to tell: {}", run.stdout);
            if options.contains(ALWAYS) {
                let m = &run.log["end"]["magazines"];
                assert!(m["stock_handed_out"].as_u64() > Some(0), "{what}: the magazines served nothing: {m}");
            }
        }
    }
}
