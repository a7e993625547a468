//! Tools see through the pool: under an NVTX tool, pool mode registers each
//! segment as a sub-allocator heap and each pooled block as a region of it
//! while the program holds it, through NVTX's memory extension, as
//! compute-sanitizer needs to check a pooled block's bounds and leaks. The
//! tool here is a fake (`tests/fake/nvtx_tool.c`) that logs every call.
//! `cargo test --test tools`
mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use support::*;

const MIB: u64 = 1 << 20;
/// Pool mode with empty segments kept cached until the end, where a tool's
/// leak check would see them (with `give_back=auto` some go back at once).
const POOL: &str = "mode=pool:give_back=never";

/// One call the fake tool logged: its first word and its `key=number` fields.
type Call = (String, HashMap<String, u64>);

fn fake_tool() -> PathBuf {
    let args = ["-shared", "-fPIC", "-fvisibility=hidden", "-pthread"].map(String::from);
    compile_fake_program("libnvtx_tool.so", "nvtx_tool.c", &args)
}

fn program() -> PathBuf {
    compile_fake_program("tools_blocks", "tools_blocks.c", &link_fake_cudart())
}

/// Runs `tools_blocks` (see [`run_prog`]).
fn run(options: &str, tool: Option<&Path>, env: &[(&str, &str)]) -> (Output, PathBuf, Vec<Call>) {
    run_prog(&program(), options, tool, env)
}

/// Runs `prog` preloaded with `options`, `NVTX_INJECTION64_PATH` set to
/// `tool` (unset for `None`) and `env` for the fake tool; returns its output,
/// its directory and the calls the fake tool logged.
fn run_prog(prog: &Path, options: &str, tool: Option<&Path>, env: &[(&str, &str)]) -> (Output, PathBuf, Vec<Call>) {
    let dir = scratch_dir("tools");
    let log = dir.join("nvtx.log");
    let mut cmd = preloaded_command(prog, &[], &dir, options);
    cmd.env("FAKE_NVTX_LOG", &log).env_remove("NVTX_INJECTION64_PATH").envs(env.iter().copied());
    if let Some(tool) = tool {
        cmd.env("NVTX_INJECTION64_PATH", tool);
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout_of(&out), stderr_of(&out));
    assert!(result_line(&stdout_of(&out)).is_some(), "{}", stdout_of(&out));
    let lines = std::fs::read_to_string(&log).unwrap_or_default();
    let calls = lines
        .lines()
        .map(|l| {
            let mut words = l.split_whitespace();
            let kind = words.next().unwrap_or("").to_string();
            let kv = words.filter_map(|w| w.split_once('=')).filter_map(|(k, v)| Some((k.into(), v.parse().ok()?)));
            (kind, kv.collect())
        })
        .collect();
    (out, dir, calls)
}

fn of<'a>(calls: &'a [Call], kind: &str) -> Vec<&'a HashMap<String, u64>> {
    calls.iter().filter(|(k, _)| k == kind).map(|(_, m)| m).collect()
}

fn addr(out: &Output, name: &str) -> u64 {
    stdout_value(&stdout_of(out), name).unwrap_or_else(|| panic!("no {name}= in {}", stdout_of(out)))
}

/// The memory module as offered to the tool, in order: (segment id, slots, filled).
fn offers(calls: &[Call]) -> Vec<(u64, u64, u64)> {
    of(calls, "ext").iter().map(|m| (m["segment"], m["slots"], m["filled"])).collect()
}

#[test]
fn pooled_blocks_are_regions_of_segment_heaps() {
    let tool = fake_tool();
    let (out, dir, calls) = run(&format!("{POOL}:verbosity=2"), Some(&tool), &[]);
    let stderr = stderr_of(&out);

    // The client protocol: core first, then the memory extension, then cupool's domain.
    let kinds: Vec<&str> = calls.iter().take(3).map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["core", "ext", "domain"], "{calls:?}");
    assert_eq!((calls[0].1["version"], calls[0].1["core2_size"]), (3, 16));
    assert_eq!((calls[1].1["module"], calls[1].1["compat"]), (1, 0x0102));
    assert_eq!(offers(&calls), [(1, 16, 1)]);
    assert!(stderr.contains("registered with the NVTX tool's memory API"), "{stderr}");
    assert_blocks_registered(&out, &dir, &calls);
}

/// Tools fill the slot layouts of the NVTX headers they were built with:
/// every known one is offered until one is filled, and a tool filling slot
/// 0 with the first callback id is read that way.
#[test]
fn each_slot_layout_a_tool_knows_is_offered() {
    let tool = fake_tool();
    let (out, dir, calls) = run(POOL, Some(&tool), &[("FAKE_NVTX_SHIFTED", "1")]);
    assert_eq!(offers(&calls), [(1, 16, 1)]);
    assert_blocks_registered(&out, &dir, &calls);

    let (out, dir, calls) = run(POOL, Some(&tool), &[("FAKE_NVTX_MIN_SLOTS", "63")]);
    assert_eq!(offers(&calls), [(1, 16, 0), (1, 63, 1)]);
    assert_blocks_registered(&out, &dir, &calls);

    // A tool that fills none: one note, nothing registered, the pool as always.
    let (out, dir, calls) = run(&format!("{POOL}:verbosity=2"), Some(&tool), &[("FAKE_NVTX_MIN_SLOTS", "100")]);
    assert_eq!(offers(&calls), [(1, 16, 0), (1, 63, 0), (0, 17, 0)]);
    assert!(of(&calls, "heap").is_empty() && of(&calls, "region").is_empty(), "{calls:?}");
    let stderr = stderr_of(&out);
    assert_eq!(stderr.matches("registers no heaps and regions").count(), 1, "{stderr}");
    assert_eq!(fake_stats(&dir)[0]["frees"], 0);
}

/// What the fake tool must have seen of `tools_blocks`.
fn assert_blocks_registered(out: &Output, dir: &Path, calls: &[Call]) {
    let [a, b, c, d, e] = ["a", "b", "c", "d", "e"].map(|k| addr(out, k));
    assert_eq!(e, a, "the freed block is reused");

    // One heap per segment, with the segment's range: a and c each open one.
    let heaps = of(calls, "heap");
    let ranges: Vec<(u64, u64)> = heaps.iter().map(|h| (h["addr"], h["size"])).collect();
    assert_eq!(ranges, [(a, 2 * MIB), (c, 20 * MIB)], "{calls:?}");
    for h in &heaps {
        assert_eq!((h["domain"], h["usage"], h["type"], h["desc"], h["struct"]), (0xd0d0, 1, 1, 16, 48), "{h:?}");
    }
    let stats = fake_stats(dir);
    assert_eq!(stats.len(), 1, "{stats:?}");
    assert_eq!(stats[0]["allocs"], 2, "the driver saw exactly the two segments: {stats:?}");

    // One region per block with the size asked for, in its segment's heap,
    // unregistered when freed (before the block is handed out again).
    let heap_of = |x: u64| heaps.iter().find(|h| h["addr"] <= x && x < h["addr"] + h["size"]).map(|h| h["handle"]);
    let events: Vec<(String, u64, u64)> = calls
        .iter()
        .filter(|(k, _)| k == "region" || k == "unregion")
        .map(|(k, m)| (k.clone(), m["addr"], m.get("size").copied().unwrap_or(0)))
        .collect();
    let want = [
        ("region", a, 1000),
        ("region", b, 3000),
        ("region", c, 5 * MIB),
        ("region", d, 777),
        ("unregion", a, 0),
        ("region", a, 1000),
        ("unregion", b, 0),
        ("unregion", c, 0),
        ("unregion", a, 0),
    ]
    .map(|(k, x, s)| (k.to_string(), x, s));
    assert_eq!(events, want);
    for r in of(calls, "region") {
        assert_eq!(Some(r["heap"]), heap_of(r["addr"]), "{r:?}");
        assert_eq!((r["domain"], r["struct"]), (0xd0d0, 48));
    }
    assert!(of(calls, "unregion").iter().all(|u| (u["domain"], u["struct"]) == (0xd0d0, 32)));

    // At the program's end the wholly free segment goes back to CUDA (its
    // heap first); the one holding the leaked d stays, and so does d's region.
    let unregistered: Vec<u64> = of(calls, "heap_unregister").iter().map(|h| h["handle"]).collect();
    assert_eq!(unregistered, [heap_of(c).unwrap()], "{calls:?}");
    assert_eq!(stats[0]["frees"], 1, "{stats:?}");
    assert_eq!(stats[0]["live_bytes"], 2 * MIB, "{stats:?}");
}

/// No tool, or cupool named as the tool (what `cupool run` sets): nothing is
/// registered, and the pool keeps what it caches to the end as it always does.
#[test]
fn without_a_memory_tool_nothing_is_registered() {
    let tool = fake_tool();
    let shim = shim_path();
    for (options, tool) in [(POOL, None), (POOL, Some(shim.as_path())), ("mode=passthrough", Some(tool.as_path()))] {
        let (out, dir, calls) = run(options, tool, &[]);
        assert!(calls.is_empty(), "{options} {tool:?}: {calls:?}\n{}", stderr_of(&out));
        let stats = fake_stats(&dir);
        let pooled = options.contains("pool");
        assert_eq!(stats[0]["frees"], if pooled { 0 } else { 4 }, "{options} {tool:?}: {stats:?}");
    }
}

/// A context that dies takes its segments with it: their heaps are
/// unregistered, the leaked block's region with them (never one by one).
#[test]
fn heaps_go_with_their_context() {
    let prog = compile_fake_program("ctxdestroy", "pool_ctx_destroy.c", &link_fake_cuda());
    let (out, _, calls) = run_prog(&prog, POOL, Some(&fake_tool()), &[]);
    let leak = stdout_value(&stdout_of(&out), "leak").expect("leak=");
    // The fake driver hands the dead context's addresses out again: follow the calls in order.
    let is_leak = |(k, m): &Call| k == "region" && m["addr"] == leak && m["size"] == 3_000_017;
    let registered = calls.iter().position(is_leak).unwrap_or_else(|| panic!("no region for {leak}: {calls:?}"));
    let heap = calls[registered].1["heap"];
    let is_gone = |(k, m): &Call| k == "heap_unregister" && m["handle"] == heap;
    let gone = calls.iter().position(is_gone).unwrap_or_else(|| panic!("heap {heap} stays: {calls:?}"));
    assert!(gone > registered);
    assert!(!calls[registered..gone].iter().any(|(k, m)| k == "unregion" && m["addr"] == leak), "{calls:?}");
    assert_eq!(calls.iter().filter(|c| is_gone(c)).count(), 1, "{calls:?}");
}

/// A memory checker in the process that took no NVTX memory tool (what
/// compute-sanitizer is without `--nvtx yes`) would see only segments: the
/// pool then stays out of its way and every allocation goes to CUDA.
#[test]
fn a_checker_that_cannot_hear_of_pooled_blocks_turns_the_pool_off() {
    let checker =
        compile_c("libfake-sanitizer-collection.so", "int fake_checker_loaded;\n", &["-shared".into(), "-fPIC".into()]);
    let preload = format!("{}:{}", shim_path().display(), checker.display());
    let (out, dir, calls) = run("", None, &[("LD_PRELOAD", preload.as_str())]);
    assert!(calls.is_empty(), "{calls:?}");
    let stats = fake_stats(&dir);
    assert_eq!(stats[0]["frees"], 4, "every allocation went to CUDA: {stats:?}\n{}", stderr_of(&out));
    let log = &read_logs(&dir)[0];
    assert!(
        log["end"]["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("cannot see pooled blocks")),
        "notes: {}",
        log["end"]["notes"]
    );
    // With an NVTX memory tool the checker hears of every block: the pool stays.
    let tool = fake_tool();
    let (_, dir, calls) = run("", Some(&tool), &[("LD_PRELOAD", preload.as_str())]);
    assert_eq!(of(&calls, "heap").len(), 2, "the tool heard of both segments: {calls:?}");
    assert_eq!(fake_stats(&dir)[0]["allocs"], 2, "the driver saw only the pool's two segments");
}
