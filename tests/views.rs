//! `cupool report` and `cupool export` on real logs: programs run under the
//! shim against the fake CUDA runtime, then read back.
//! `cargo test --test views`
mod support;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

use serde_json::Value;
use support::*;

/// A failed or finished write leaves no temporary file behind in `dir`.
fn assert_no_temporary_files(dir: &Path) {
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// `tests/fake/pool_limit.c`: refused allocations under `limit=64m`.
fn pool_limit() -> &'static Path {
    static PROG: OnceLock<PathBuf> = OnceLock::new();
    PROG.get_or_init(|| {
        let mut args = link_fake_cudart();
        args.extend(link_fake_cuda());
        compile_fake_program("pool_limit", "pool_limit.c", &args)
    })
}

/// Runs `prog args` under the shim with `options`; the one log it wrote, as JSON, and its path.
fn logged(dir: &Path, prog: &Path, args: &[&str], options: &str) -> (Value, PathBuf) {
    let out = run_preloaded(prog, args, dir, options);
    assert!(out.status.success(), "{}\n{}", stdout_of(&out), stderr_of(&out));
    let logs = read_logs(dir);
    assert_eq!(logs.len(), 1, "{:?}", log_files(dir));
    let file = dir.join(logs[0]["_file"].as_str().unwrap());
    (logs[0].clone(), file)
}

fn report_json(paths: &[&Path], dir: &Path) -> Vec<Value> {
    let mut args = vec!["report", "--json"];
    args.extend(paths.iter().map(|p| path_str(p)));
    let out = run_cupool(&args, dir);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    v.as_array().expect("one entry per log").clone()
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

// ---------------------------------------------------------------------------
// cupool report

#[test]
fn report_of_a_training_loop_has_peaks_phases_sizes_sites_and_leaks() {
    for mode in ["pool", "passthrough"] {
        let dir = scratch_dir(&format!("views-report-{mode}"));
        let (log, file) = logged(&dir, check_loop(), &["20", "leak", "mark"], &format!("mode={mode}"));
        let end = &log["end"]["devices"][0];
        let rep = report_json(&[&file], &dir);
        assert_eq!(rep.len(), 1);
        let r = &rep[0];
        assert_eq!(r["path"], path_str(&file));
        let dev = &r["memory"]["devices"][0];
        assert_eq!(dev["device"], 0);
        assert_eq!(dev["peak_allocated"]["bytes"], end["peak_bytes"], "{mode}: {dev}");
        // The last step holds the most: every step leaks 4 KiB.
        assert_eq!(dev["peak_allocated"]["phase"], "step 19", "{mode}: {dev}");
        // In pool mode, reserved comes from the pool's own records of the pages it took.
        assert_eq!(dev["peak_reserved"]["bytes"], end["peak_reserved_bytes"], "{mode}: {dev}");
        assert_eq!(dev["recorded_peak_reserved"], end["peak_reserved_bytes"]);
        assert!(r["memory"]["rebuilt"].is_null());
        if mode == "pool" {
            assert_eq!(r["memory"]["reserved_from"], "pool_records");
            assert!(u64_of(&dev["peak_reserved"]["bytes"]) > u64_of(&dev["peak_allocated"]["bytes"]), "whole pages");
        } else {
            assert_eq!(r["memory"]["reserved_from"], "allocations");
            assert_eq!(dev["peak_reserved"]["bytes"], dev["peak_allocated"]["bytes"]);
        }
        // Sizes: every allocation in one bucket.
        let counted: u64 = r["memory"]["sizes"].as_array().unwrap().iter().map(|b| u64_of(&b["count"])).sum();
        assert_eq!(counted, u64_of(&end["allocs"]));
        let bucket_4k = r["memory"]["sizes"].as_array().unwrap().iter().find(|b| b["low"] == 4096).unwrap();
        assert_eq!(bucket_4k["count"], 20, "the leaked 4 KiB buffers");
        // Phases: 20 steps, one group; each grows by what it leaks (the first also by the
        // optimizer state of step 1's warm-up, which begins in step 1).
        let groups = r["phase_groups"].as_array().unwrap();
        assert_eq!(groups.len(), 1, "{groups:?}");
        assert_eq!(groups[0]["name"], "step #");
        assert_eq!(groups[0]["count"], 20);
        assert_eq!(u64_of(&groups[0]["growth"]), 19 * 4096 + (512 << 10), "{}", groups[0]);
        assert_eq!(groups[0]["peak_in"], "step 19");
        let spans = r["memory"]["phases"].as_array().unwrap();
        assert_eq!(spans.len(), 20);
        assert!(spans.iter().all(|s| s["family"] == "mark" && s["devices"].as_array().unwrap().len() == 1));
        assert!(spans[..19].iter().all(|s| !s["end_ns"].is_null()), "marked steps end at the next mark");
        // Fragmentation points span the run.
        let f = &r["fragmentation"][0];
        assert_eq!(f["points"].as_array().unwrap().len(), 12);
        // Sites by bytes still live: the leaking site holds 20 x 4 KiB.
        assert_eq!(r["sites"]["by_live"][0]["live_bytes"], 20 * 4096);
        // docs/report.md names every field.
        let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/report.md")).unwrap();
        let phase = &r["memory"]["phases"][0];
        for obj in [r, &r["memory"], dev, phase, &phase["devices"][0], &groups[0], &r["fragmentation"][0], &r["sites"]]
        {
            for key in obj.as_object().unwrap().keys() {
                assert!(doc.contains(&format!("`{key}`")), "docs/report.md does not name `{key}`");
            }
        }
        // Findings as cupool check makes them: the exit leak and the growth.
        let kinds: Vec<&str> = r["findings"].as_array().unwrap().iter().map(|f| f["kind"].as_str().unwrap()).collect();
        assert!(kinds.contains(&"exit") && kinds.contains(&"growth"), "{kinds:?}");

        let out = run_cupool(&["report", path_str(&file)], &dir);
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        let text = stdout_of(&out);
        for part in [
            "Peaks",
            "allocated",
            "reserved",
            "step 19",
            "Allocation sizes (device memory)",
            "Reserved against allocated, device 0:",
            "Phases",
            "step #",
            "Leaks (as cupool check judges them",
            "growth  4.0 KiB per phase",
        ] {
            assert!(text.contains(part), "{mode}: no {part:?} in\n{text}");
        }
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            assert!(line.chars().count() <= 100, "{mode}: longer than 100 columns: {line:?}");
            assert_eq!(line, line.trim_end(), "trailing blanks: {line:?}");
        }
    }
}

#[test]
fn report_shows_out_of_memory_with_the_pools_snapshot() {
    let dir = scratch_dir("views-oom");
    let (log, file) = logged(&dir, pool_limit(), &[], "limit=64m");
    let rep = report_json(&[&file], &dir);
    let ooms = rep[0]["memory"]["ooms"].as_array().unwrap();
    let recorded = log["end"]["ooms"].as_array().unwrap();
    assert!(!recorded.is_empty());
    assert_eq!(ooms.iter().filter(|o| !o["snapshot"].is_null()).count(), recorded.len(), "{ooms:?}");
    assert!(ooms.iter().any(|o| o["requested"] == 100 << 20 && o["api"] == "cudaMalloc"), "{ooms:?}");
    let text = stdout_of(&run_cupool(&["report", path_str(&file)], &dir));
    assert!(text.contains("Out of memory at ") && text.contains("cudaMalloc of 100.0 MiB on device 0"), "{text}");
    assert!(text.contains("the pool held ") && text.contains("largest live: "), "{text}");
}

#[test]
fn report_reads_gzipped_logs_and_per_rank_directories() {
    let base = scratch_dir("views-ranks");
    let mut pids = Vec::new();
    for rank in 0..2 {
        let dir = base.join(format!("rank{rank}"));
        let (log, file) = logged(&dir, check_loop(), &["3", "clean"], "");
        pids.push(log["process"]["pid"].clone());
        if rank == 1 {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(&std::fs::read(&file).unwrap()).unwrap();
            std::fs::write(file.with_extension("json.gz"), gz.finish().unwrap()).unwrap();
            std::fs::remove_file(&file).unwrap();
        }
    }
    let rep = report_json(&[&base], &base);
    let mut got: Vec<Value> = rep.iter().map(|r| r["pid"].clone()).collect();
    got.sort_by_key(|p| p.as_u64());
    pids.sort_by_key(|p| p.as_u64());
    assert_eq!(got, pids);
    assert!(rep.iter().any(|r| r["path"].as_str().unwrap().ends_with(".json.gz")));
}

// ---------------------------------------------------------------------------
// cupool export --perfetto

fn export(args: &[&str], dir: &Path) -> Output {
    let mut v = vec!["export"];
    v.extend_from_slice(args);
    run_cupool(&v, dir)
}

#[test]
fn perfetto_trace_has_counters_nested_phases_and_instants() {
    let dir = scratch_dir("views-perfetto");
    let (log, loop_file) = logged(&dir.join("loop"), check_loop(), &["20", "leak", "mark"], "");
    let (_, oom_file) = logged(&dir.join("oom"), pool_limit(), &[], "limit=64m");
    let trace = dir.join("trace.json");
    let out = export(&["--perfetto", path_str(&trace), path_str(&loop_file), path_str(&oom_file)], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("open it in ui.perfetto.dev"), "{}", stderr_of(&out));
    let t: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).expect("the trace is JSON");
    let events = t["traceEvents"].as_array().expect("traceEvents");
    let pid = log["process"]["pid"].as_u64().unwrap();
    let mine: Vec<&Value> = events.iter().filter(|e| e["pid"].as_u64() == Some(pid)).collect();
    // Counters: the allocated track's maximum is the process's peak.
    let allocated: Vec<u64> = mine
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "device 0")
        .filter_map(|e| e["args"]["allocated"].as_u64())
        .collect();
    assert!(allocated.len() > 20);
    assert_eq!(allocated.iter().max().copied(), log["end"]["devices"][0]["peak_bytes"].as_u64());
    assert!(mine.iter().any(|e| e["ph"] == "C" && e["args"]["reserved"].is_u64()));
    // Phases: 20 marks as B/E pairs that nest on their track, in time order.
    let slices: Vec<&&Value> = mine.iter().filter(|e| e["ph"] == "B" || e["ph"] == "E").collect();
    assert_eq!(slices.len(), 40);
    let mut stack: Vec<(&str, u64)> = Vec::new();
    let mut last_ts = 0.0;
    for e in slices {
        let ts = e["ts"].as_f64().unwrap();
        assert!(ts >= last_ts, "B/E in time order");
        last_ts = ts;
        let key = (e["name"].as_str().unwrap(), e["tid"].as_u64().unwrap());
        if e["ph"] == "B" {
            stack.push(key);
        } else {
            assert_eq!(stack.pop(), Some(key), "E closes the innermost B");
        }
    }
    assert!(stack.is_empty());
    assert!(mine.iter().any(|e| e["ph"] == "M" && e["name"] == "process_name"));
    // The refused allocations of the other process are instant events with the pool's snapshot.
    let ooms: Vec<&Value> = events.iter().filter(|e| e["ph"] == "i" && e["cat"] == "oom").collect();
    assert!(!ooms.is_empty());
    assert!(ooms.iter().any(|e| e["args"]["snapshot"]["reserved"].is_u64()), "{ooms:?}");
}

#[test]
fn perfetto_counters_are_downsampled_with_the_peak_kept() {
    let dir = scratch_dir("views-downsample");
    let (log, file) = logged(&dir.join("logs"), check_loop(), &["3000", "wave"], "");
    let trace = dir.join("trace.json");
    let out = export(&["--perfetto", path_str(&trace), "--max-points", "1000", path_str(&file)], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("downsampled from"), "{}", stderr_of(&out));
    let t: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let allocated: Vec<u64> = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C")
        .filter_map(|e| e["args"]["allocated"].as_u64())
        .collect();
    // At least 1000 points per track are kept, the least --max-points takes; the run had many more.
    assert!(allocated.len() <= 1001 + 1, "{}", allocated.len());
    assert!(u64_of(&log["end"]["devices"][0]["allocs"]) > 6000);
    assert_eq!(allocated.iter().max().copied(), log["end"]["devices"][0]["peak_bytes"].as_u64(), "the peak survives");
}

// ---------------------------------------------------------------------------
// cupool export --memory-viz

/// The opcodes memory_viz's JavaScript unpickler reads (shared/notes/reports.md).
const ALLOWED: &[(u8, &str)] = &[
    (0x80, "PROTO"),
    (0x95, "FRAME"),
    (b'(', "MARK"),
    (b'}', "EMPTY_DICT"),
    (b']', "EMPTY_LIST"),
    (b')', "EMPTY_TUPLE"),
    (b's', "SETITEM"),
    (b'u', "SETITEMS"),
    (b'a', "APPEND"),
    (b'e', "APPENDS"),
    (0x85, "TUPLE1"),
    (0x86, "TUPLE2"),
    (0x87, "TUPLE3"),
    (b'J', "BININT"),
    (b'K', "BININT1"),
    (b'M', "BININT2"),
    (0x8a, "LONG1"),
    (b'G', "BINFLOAT"),
    (0x8c, "SHORT_BINUNICODE"),
    (b'X', "BINUNICODE"),
    (b'q', "BINPUT"),
    (b'r', "LONG_BINPUT"),
    (b'h', "BINGET"),
    (b'j', "LONG_BINGET"),
    (b'N', "NONE"),
    (0x88, "NEWTRUE"),
    (0x89, "NEWFALSE"),
    (b'.', "STOP"),
];

/// The opcodes of `bytes`, walked one by one with the argument sizes of the
/// allowed opcodes; an opcode outside the list fails the test.
fn opcodes(bytes: &[u8]) -> Vec<u8> {
    let mut ops = Vec::new();
    let mut i = 0;
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap()) as usize;
    while i < bytes.len() {
        let code = bytes[i];
        assert!(ALLOWED.iter().any(|(c, _)| *c == code), "opcode 0x{code:02x} at byte {i} is not one memory_viz reads");
        ops.push(code);
        i += 1;
        i += match code {
            0x80 | b'K' | b'q' | b'h' => 1,
            b'M' => 2,
            b'J' | b'r' | b'j' => 4,
            b'G' | 0x95 => 8,
            0x8a | 0x8c => 1 + bytes[i] as usize,
            b'X' => 4 + u32_at(i),
            b'.' => {
                assert_eq!(i, bytes.len(), "bytes after STOP");
                return ops;
            }
            _ => 0,
        };
    }
    panic!("no STOP");
}

/// Loads a snapshot with Python's pickle and sums it up: the opcodes
/// (pickletools), segments and blocks by state, trace entries by action, and
/// the peak of allocated bytes the trace gives.
const SUMMARY_PY: &str = r#"
import json, pickle, pickletools, sys
data = open(sys.argv[1], "rb").read()
s = pickle.loads(data)
ops = sorted({op.name for op, _, _ in pickletools.genops(data)})
states = {}
for seg in s["segments"]:
    addr = seg["address"]
    for b in seg["blocks"]:
        assert b["address"] == addr, "blocks tile their segment"
        addr += b["size"]
        states[b["state"]] = states.get(b["state"], 0) + 1
    assert addr == seg["address"] + seg["total_size"]
actions, peak, live, live_blocks = {}, 0, 0, {}
for entry in s["device_traces"][0]:
    a = entry["action"]
    actions[a] = actions.get(a, 0) + 1
    for f in entry["frames"]:
        assert set(f) == {"filename", "line", "name"}
    if a == "alloc":
        live += entry["size"]; live_blocks[entry["addr"]] = entry["size"]; peak = max(peak, live)
    elif a == "free_completed":
        live -= live_blocks.pop(entry["addr"])
print(json.dumps({"ops": ops, "segments": len(s["segments"]), "states": states, "actions": actions,
                  "peak": peak, "live_at_end": live, "devices": len(s["device_traces"]),
                  "cupool": s["cupool"], "framed": sum(1 for seg in s["segments"] for b in seg["blocks"] if b["frames"])}))
"#;

fn python_summary(file: &Path) -> Value {
    let out =
        std::process::Command::new("python3").args(["-c", SUMMARY_PY, path_str(file)]).output().expect("python3 runs");
    assert!(out.status.success(), "python3 could not load {}:\n{}", file.display(), stderr_of(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn memory_viz_snapshot_loads_in_python_with_only_the_opcodes_memory_viz_reads() {
    // A pool of segments is rebuilt as memory_viz's segments; a VMM-backed
    // pool's blocks, as passthrough allocations, are each a segment of their own.
    for (mode, options) in
        [("pool", "mode=pool:backing=segments"), ("vmm", "mode=pool"), ("passthrough", "mode=passthrough")]
    {
        let dir = scratch_dir(&format!("views-memviz-{mode}"));
        let (log, file) = logged(&dir.join("logs"), check_loop(), &["20", "leak", "mark"], options);
        let snap = dir.join("snap.pickle");
        let out = export(&["--memory-viz", path_str(&snap), path_str(&file)], &dir);
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        assert!(stderr_of(&out).contains("open it in pytorch.org/memory_viz"), "{}", stderr_of(&out));
        let bytes = std::fs::read(&snap).unwrap();
        let ops = opcodes(&bytes);
        assert_eq!(ops.first(), Some(&0x80));
        let s = python_summary(&snap);
        let names: Vec<&str> = s["ops"].as_array().unwrap().iter().map(|o| o.as_str().unwrap()).collect();
        for name in &names {
            assert!(ALLOWED.iter().any(|(_, n)| n == name), "{mode}: pickletools saw {name}");
        }
        let end = &log["end"];
        let allocs = u64_of(&end["devices"][0]["allocs"]);
        let frees = u64_of(&end["devices"][0]["frees"]);
        assert_eq!(s["devices"], 1);
        assert_eq!(s["actions"]["alloc"], allocs, "{mode}: {s}");
        assert_eq!(s["actions"]["free_requested"], frees);
        assert_eq!(s["actions"]["free_completed"], frees);
        assert_eq!(s["peak"], end["devices"][0]["peak_bytes"], "{mode}: the trace's peak is the log's");
        assert_eq!(s["live_at_end"], end["leak_summary"]["bytes"]);
        // What is live at the end: the 20 leaked buffers, each with its frames.
        assert_eq!(s["states"]["active_allocated"], 20, "{mode}: {s}");
        assert_eq!(s["framed"], 20, "{mode}: {s}");
        if mode == "pool" {
            // The pool's own segments: one small segment holds the 20 blocks and the free space.
            assert_eq!(s["segments"], 1, "{s}");
            assert!(u64_of(&s["states"]["inactive"]) >= 1, "{s}");
            let freed = s["actions"]["segment_free"].as_u64().unwrap_or(0);
            assert_eq!(s["actions"]["segment_alloc"], freed + 1, "{s}");
            assert_eq!(s["cupool"]["segments_rebuilt"], true);
            assert_eq!(s["cupool"]["at_real_addresses"], true);
        } else {
            // Each allocation its own segment.
            assert_eq!(s["segments"], 20, "{s}");
            assert_eq!(s["actions"]["segment_alloc"], allocs);
            assert_eq!(s["actions"]["segment_free"], frees);
        }
    }
}

#[test]
fn memory_viz_of_several_processes_writes_one_file_each() {
    let dir = scratch_dir("views-memviz-many");
    let (a, _) = logged(&dir.join("a"), check_loop(), &["2", "clean"], "");
    let (b, _) = logged(&dir.join("b"), check_loop(), &["2", "clean"], "");
    let out = export(&["--memory-viz", path_str(&dir.join("snap.pickle")), path_str(&dir)], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    for log in [a, b] {
        let file = dir.join(format!("snap.{}.pickle", log["process"]["pid"]));
        assert_eq!(python_summary(&file)["cupool"]["pid"], log["process"]["pid"]);
    }
    assert!(!dir.join("snap.pickle").exists());
}

// ---------------------------------------------------------------------------
// Bad input and outputs that cannot be written.

#[test]
fn export_names_bad_inputs_and_outputs_in_one_line_and_loses_nothing() {
    let dir = scratch_dir("views-bad");
    let (_, good) = logged(&dir.join("logs"), check_loop(), &["2", "clean"], "");
    let corrupt = dir.join("logs").join("cupool.1.json");
    std::fs::write(&corrupt, "{\"hello\": 1}\n").unwrap();
    let trace = dir.join("trace.json");

    // An input that cannot be read: named, status 2, the others exported all the same.
    let out = export(&["--perfetto", path_str(&trace), path_str(&dir.join("logs"))], &dir);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let stderr = stderr_of(&out);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("cupool.1.json")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("cupool export: ") && lines[0].contains("not a cupool log"), "{stderr}");
    assert!(trace.exists(), "the readable log was exported: {stderr}");
    let written = std::fs::read(&trace).unwrap();

    // Nothing readable: status 2, and the file already there is left as it was.
    let missing = dir.join("nope.json");
    let out = export(&["--perfetto", path_str(&trace), path_str(&missing)], &dir);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains(&format!("{}: No such file or directory", missing.display())),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(std::fs::read(&trace).unwrap(), written, "the old output is kept");

    // Outputs that cannot be written: status 73 before anything is read.
    for bad in [Path::new("/proc/nope/trace.json").to_path_buf(), dir.clone()] {
        for flag in ["--perfetto", "--memory-viz"] {
            let out = export(&[flag, path_str(&bad), path_str(&good)], &dir);
            assert_eq!(out.status.code(), Some(73), "{flag} {}: {}", bad.display(), stderr_of(&out));
            let stderr = stderr_of(&out);
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(stderr.starts_with(&format!("cupool export: {}: ", bad.display())), "{stderr}");
        }
    }
    // Neither a format nor a path: clap's usage error.
    assert_eq!(export(&[path_str(&good)], &dir).status.code(), Some(2));
    // No temporary file is left behind, and stderr (a pipe) carries no progress bar.
    assert_no_temporary_files(&dir);
    let out = export(&["--perfetto", path_str(&trace), path_str(&good)], &dir);
    assert!(!stderr_of(&out).contains('\r') && !stderr_of(&out).contains('\u{1b}'), "{}", stderr_of(&out));
    assert_eq!(stderr_of(&out).lines().count(), 1, "{}", stderr_of(&out));
}

// ---------------------------------------------------------------------------
// cupool report --html

/// The inline JSON blob of a page, parsed.
fn html_blob(page: &str) -> Value {
    let open = "<script type=\"application/json\" id=\"cupool-data\">";
    assert_eq!(page.matches(open).count(), 1, "one data blob");
    let start = page.find(open).unwrap() + open.len();
    let len = page[start..].find("</script>").unwrap();
    serde_json::from_str(&page[start..start + len]).expect("the blob parses")
}

/// The maximum of a series written as `[dt0, v0, dt1, v1, ...]`.
fn series_max(flat: &Value) -> u64 {
    let v: Vec<u64> = flat.as_array().unwrap().iter().map(u64_of).collect();
    assert_eq!(v.len() % 2, 0);
    v.chunks(2).map(|c| c[1]).max().unwrap_or(0)
}

#[test]
fn html_report_is_one_self_contained_page_whose_plot_peaks_at_the_recorded_peak() {
    let dir = scratch_dir("views-html");
    let (log, file) = logged(&dir, check_loop(), &["30", "leak", "mark"], "");
    let end = &log["end"]["devices"][0];
    let page_path = dir.join("report.html");
    let out = run_cupool(&["report", "--html", path_str(&page_path), path_str(&file)], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stdout_of(&out).is_empty(), "the page, not the text: {}", stdout_of(&out));
    let stderr = stderr_of(&out);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with(&format!("cupool report: {}: 1 process(es), ", page_path.display())), "{stderr}");
    let page = std::fs::read_to_string(&page_path).unwrap();

    // Self-contained: nothing fetched from outside, one inline script besides the data.
    for outside in ["http://", "https://", "src=", "href=", "@import", "url("] {
        assert!(!page.contains(outside), "{outside} in the page");
    }
    assert_eq!(page.matches("<script").count(), 2);
    let data = html_blob(&page);
    let p = &data["processes"][0];
    let dev = &p["devices"][0];
    // The series' maximum is the end record's peak (allocated and reserved).
    assert_eq!(series_max(&dev["allocated"]), u64_of(&end["peak_bytes"]), "{}", dev["peak_allocated"]);
    assert_eq!(series_max(&dev["reserved"]), u64_of(&end["peak_reserved_bytes"]));
    assert_eq!(dev["peak_allocated"]["bytes"], end["peak_bytes"]);
    // Phases, sites with frames, leaks.
    assert_eq!(p["phases"].as_array().unwrap().len(), 30);
    assert_eq!(p["phase_groups"][0]["name"], "step #");
    let by_peak = p["sites"]["by_peak"].as_array().unwrap();
    assert!(!by_peak.is_empty() && !by_peak[0]["frames"].as_array().unwrap().is_empty(), "{by_peak:?}");
    let text =
        by_peak.iter().flat_map(|s| s["frames"].as_array().unwrap()).map(|f| f.as_str().unwrap()).collect::<Vec<_>>();
    assert!(text.iter().any(|f| f.contains("leak_one_buffer (check_loop+")), "{text:?}");
    // Allocations for hovering, each with a site whose frames are in the page.
    let allocs = dev["alloc_events"].as_array().unwrap();
    assert_eq!(allocs.len() / 3, u64_of(&dev["alloc_events_seen"]) as usize);
    let stack = allocs[2].as_u64().expect("a site");
    assert!(!p["stacks"][stack.to_string()].as_array().unwrap().is_empty());
    let kinds: Vec<&str> = data["findings"].as_array().unwrap().iter().map(|f| f["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"exit") && kinds.contains(&"growth"), "{kinds:?}");

    // The page's own script, run under node against a stub DOM (where node is).
    if std::process::Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let stub = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/html-stub.js");
        let out = std::process::Command::new("node").arg(&stub).arg(&page_path).output().unwrap();
        assert!(out.status.success(), "{}", stderr_of(&out));
        let seen: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
        assert_eq!(seen["body"]["data-cupool-drawn"], "1", "{seen}");
        assert_eq!(seen["body"]["data-cupool-plots"], "1", "{seen}");
        assert_eq!(seen["body"]["data-cupool-plot-max"], end["peak_bytes"].to_string(), "{seen}");
        let c = &seen["canvases"][0];
        assert_eq!(c["data-plot-max"], c["data-peak"], "{seen}");
        assert_eq!(c["data-plot-max-reserved"], end["peak_reserved_bytes"].to_string(), "{seen}");
        assert!(u64_of(&seen["calls"]) > 100, "{seen}");
        let tip = seen["tip"].as_str().unwrap();
        assert!(
            tip.contains("allocated ") && tip.contains("nearest allocation: ") && tip.contains("(check_loop+"),
            "{tip}"
        );
    } else {
        eprintln!("no node here: the page's script was not run");
    }
}

#[test]
fn html_report_names_an_unwritable_page_in_one_line_before_reading() {
    let dir = scratch_dir("views-html-bad");
    let (_, good) = logged(&dir.join("logs"), check_loop(), &["2", "clean"], "");
    let page = dir.join("page.html");
    std::fs::write(&page, "old").unwrap();
    for bad in [Path::new("/proc/nope/page.html").to_path_buf(), dir.clone()] {
        let out = run_cupool(&["report", "--html", path_str(&bad), path_str(&good)], &dir);
        assert_eq!(out.status.code(), Some(73), "{}: {}", bad.display(), stderr_of(&out));
        let stderr = stderr_of(&out);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with(&format!("cupool report: {}: ", bad.display())), "{stderr}");
    }
    // Nothing readable: status 2, and the page already there is kept.
    let out = run_cupool(&["report", "--html", path_str(&page), path_str(&dir.join("nope.json"))], &dir);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert_eq!(std::fs::read_to_string(&page).unwrap(), "old");
    assert_eq!(
        run_cupool(&["report", "--html", path_str(&page), "--json", path_str(&good)], &dir).status.code(),
        Some(2)
    );
    assert_no_temporary_files(&dir);
}

#[test]
fn html_report_of_several_processes_has_a_plot_each_and_the_ooms() {
    let dir = scratch_dir("views-html-oom");
    let (oom_log, oom) = logged(&dir.join("a"), pool_limit(), &[], "limit=64m");
    let (loop_log, looped) = logged(&dir.join("b"), check_loop(), &["5", "clean"], "");
    let page_path = dir.join("both.html");
    let out = run_cupool(&["report", "--html", path_str(&page_path), path_str(&oom), path_str(&looped)], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let page = std::fs::read_to_string(&page_path).unwrap();
    let data = html_blob(&page);
    let procs = data["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2);
    let with_ooms = procs.iter().find(|p| !p["ooms"].as_array().unwrap().is_empty()).expect("the OOMs");
    assert!(with_ooms["ooms"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o["requested"] == 100 << 20 && !o["snapshot"].is_null()));
    if std::process::Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let stub = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/html-stub.js");
        let out = std::process::Command::new("node").arg(&stub).arg(&page_path).output().unwrap();
        assert!(out.status.success(), "{}", stderr_of(&out));
        let seen: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
        assert_eq!(seen["body"]["data-cupool-plots"], "2", "{seen}");
        let mut plotted: Vec<String> =
            seen["body"]["data-cupool-plot-max"].as_str().unwrap().split(',').map(String::from).collect();
        let mut peaks: Vec<String> =
            [&oom_log, &loop_log].iter().map(|l| l["end"]["devices"][0]["peak_bytes"].to_string()).collect();
        plotted.sort();
        peaks.sort();
        assert_eq!(plotted, peaks, "{seen}");
    }
}
