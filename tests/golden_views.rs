//! Every view of the same logs against stored expected output (golden
//! files): `cupool report` as text and `--json`, `cupool export --perfetto`
//! and `--memory-viz`, the data of `cupool report --html`, and the check's
//! verdict (`cupool merge --json`). The logs, in `tests/logs/edge/`, hold the
//! cases a reader can get wrong: an address handed out again without a logged
//! free, pinned host and managed memory, two devices, a context destroyed
//! holding memory, an out-of-memory refusal, a VMM-backed pool with its
//! page records and a request it left to CUDA, a rank, and a process killed
//! mid-run whose leak is both growth and exit. Each edge case itself is
//! tested once, in the core's model (`core/src/model/tests.rs`); these files
//! show that every view prints the model's figures.
//!
//! After a deliberate change, `CUPOOL_BLESS=1 cargo test --test golden_views`
//! rewrites the files; the diff is then the review.
//! `cargo test --release --test golden_views`
mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use support::*;

fn logs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/logs/edge")
}

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name)
}

/// `cupool ARGS` in the directory of the logs, which it reads as `.`.
fn cupool(args: &[&str]) -> std::process::Output {
    std::process::Command::new(cli())
        .args(args)
        .current_dir(logs())
        .env_remove("CUPOOL_OPTIONS")
        .env_remove("GITHUB_ACTIONS")
        .output()
        .unwrap_or_else(|e| panic!("run cupool {args:?}: {e}"))
}

/// `got` against the golden file `name` (rewritten with `CUPOOL_BLESS=1`);
/// in text, this build's version reads `VERSION`.
fn check_golden(name: &str, got: &[u8]) {
    let path = golden(name);
    let got = match std::str::from_utf8(got) {
        Ok(text) => text.replace(env!("CARGO_PKG_VERSION"), "VERSION").into_bytes(),
        Err(_) => got.to_vec(),
    };
    if std::env::var_os("CUPOOL_BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (CUPOOL_BLESS=1 writes it)", path.display()));
    if want != got {
        let (w, g) = (String::from_utf8_lossy(&want), String::from_utf8_lossy(&got));
        let line =
            w.lines().zip(g.lines()).position(|(a, b)| a != b).unwrap_or(w.lines().count().min(g.lines().count()));
        panic!(
            "{} differs from line {} on (CUPOOL_BLESS=1 rewrites it after a deliberate change):\n--- want\n{}\n--- got\n{}",
            path.display(),
            line + 1,
            w.lines().skip(line).take(8).collect::<Vec<_>>().join("\n"),
            g.lines().skip(line).take(8).collect::<Vec<_>>().join("\n")
        );
    }
}

fn pretty(v: &Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).unwrap();
    s.push('\n');
    s.into_bytes()
}

#[test]
fn report_text() {
    let out = cupool(&["report", "."]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    check_golden("report.txt", &out.stdout);
}

#[test]
fn report_json() {
    let out = cupool(&["report", "--json", "."]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    check_golden("report.json", &pretty(&v));
}

#[test]
fn perfetto() {
    let dir = scratch_dir("golden-perfetto");
    let file = dir.join("trace.json");
    let out = cupool(&["export", "--perfetto", path_str(&file), "."]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    check_golden("perfetto.json", &pretty(&v));
}

#[test]
fn memory_viz() {
    let dir = scratch_dir("golden-memviz");
    let file = dir.join("snap.pickle");
    let out = cupool(&["export", "--memory-viz", path_str(&file), "."]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    for pid in [101, 202, 303] {
        let bytes = std::fs::read(dir.join(format!("snap.{pid}.pickle"))).unwrap();
        check_golden(&format!("memviz.{pid}.pickle"), &bytes);
    }
}

#[test]
fn html_data() {
    let dir = scratch_dir("golden-html");
    let page = dir.join("report.html");
    let out = cupool(&["report", "--html", path_str(&page), "."]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let text = std::fs::read_to_string(&page).unwrap();
    let open = "<script type=\"application/json\" id=\"cupool-data\">";
    let start = text.find(open).unwrap() + open.len();
    let len = text[start..].find("</script>").unwrap();
    let v: Value = serde_json::from_str(&text[start..start + len]).unwrap();
    check_golden("html-data.json", &pretty(&v));
}

#[test]
fn verdict() {
    let dir = scratch_dir("golden-verdict");
    let json = dir.join("findings.json");
    let out = cupool(&["merge", "--json", path_str(&json), "."]);
    assert_eq!(out.status.code(), Some(23), "{}", stderr_of(&out));
    check_golden("merge.txt", &out.stderr);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    check_golden("merge.json", &pretty(&v));
}

/// The figures every view shows come from one model: the same peaks, the
/// same reserved memory (the VMM pool's pages, as its end record has them),
/// the same leaked bytes.
#[test]
fn the_views_agree_with_each_other_and_with_the_end_records() {
    let out = cupool(&["report", "--json", "."]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let by_pid = |pid: u64| report.as_array().unwrap().iter().find(|r| r["pid"] == pid).unwrap().clone();
    // The VMM pool: reserved is its pages plus the request CUDA served, as the end record says.
    let vmm = by_pid(202);
    let dev = &vmm["memory"]["devices"][0];
    assert_eq!(vmm["memory"]["reserved_from"], "pool_records");
    assert_eq!(dev["peak_reserved"]["bytes"], 68 << 20);
    assert_eq!(dev["peak_reserved"]["bytes"], vmm["devices"][0]["peak_reserved_bytes"]);
    assert!(vmm["memory"]["rebuilt"].is_null());
    // Passthrough: every device's peaks are the end record's; host memory is apart.
    let pass = by_pid(101);
    for (i, d) in pass["memory"]["devices"].as_array().unwrap().iter().enumerate() {
        assert_eq!(d["peak_allocated"]["bytes"], pass["devices"][i]["peak_bytes"], "{d}");
        assert_eq!(d["peak_reserved"]["bytes"], pass["devices"][i]["peak_reserved_bytes"], "{d}");
    }
    assert_eq!(pass["memory"]["host"]["peak_allocated"]["bytes"], 8192);
    // The HTML page plots the same peaks.
    let dir = scratch_dir("golden-agree");
    let page = dir.join("r.html");
    cupool(&["report", "--html", path_str(&page), "."]);
    let text = std::fs::read_to_string(&page).unwrap();
    let open = "<script type=\"application/json\" id=\"cupool-data\">";
    let start = text.find(open).unwrap() + open.len();
    let len = text[start..].find("</script>").unwrap();
    let html: Value = serde_json::from_str(&text[start..start + len]).unwrap();
    for p in html["processes"].as_array().unwrap() {
        let r = by_pid(p["pid"].as_u64().unwrap());
        for (d, m) in p["devices"].as_array().unwrap().iter().zip(r["memory"]["devices"].as_array().unwrap()) {
            assert_eq!(d["peak_reserved"], m["peak_reserved"]);
            assert_eq!(d["peak_allocated"], m["peak_allocated"]);
            // The pictures: the flame graph at the peak holds the peak's bytes, site by site,
            // the bands reach it, and the one at the end holds what the end leaves live.
            let sum = |v: &Value| -> u64 { v.as_array().unwrap().chunks(3).map(|c| c[1].as_u64().unwrap()).sum() };
            assert_eq!(sum(&d["flame"]["peak"]["sites"]), m["peak_allocated"]["bytes"].as_u64().unwrap(), "{d}");
            assert_eq!(d["flame"]["peak"]["t_ns"], m["peak_allocated"]["t_ns"], "{d}");
            assert_eq!(sum(&d["flame"]["end"]["sites"]), d["flame"]["end"]["bytes"].as_u64().unwrap());
            let b = &d["bands"];
            let column = |k: usize| -> u64 {
                b["values"].as_array().unwrap().iter().map(|v| v[k].as_u64().unwrap()).sum::<u64>()
                    + b["other"][k].as_u64().unwrap()
            };
            let top = (0..b["other"].as_array().unwrap().len()).map(column).max().unwrap();
            assert_eq!(top, m["peak_allocated"]["bytes"].as_u64().unwrap(), "{b}");
        }
    }
    // The verdict: the killed loop's 12 kept buffers are a growth leak and an
    // exit leak, counted once.
    let (json, sarif) = (dir.join("f.json"), dir.join("f.sarif"));
    let out = cupool(&["merge", "--json", path_str(&json), "--sarif", path_str(&sarif), "."]);
    let f: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let sarif: Value = serde_json::from_str(&std::fs::read_to_string(&sarif).unwrap()).unwrap();
    let run = &sarif["runs"][0]["properties"];
    assert_eq!(run["failing_bytes"], f["summary"]["failing_bytes"]);
    assert_eq!(run["failing_allocations"], f["summary"]["failing_allocations"]);
    let exit: u64 = f["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["kind"] == "exit")
        .map(|x| x["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(f["summary"]["failing_bytes"], exit, "growth adds no allocation the exit leaks do not hold");
    let summary =
        format!("SUMMARY: cupool: {exit} byte(s) leaked in {} allocation(s).", f["summary"]["failing_allocations"]);
    assert!(stderr_of(&out).contains(&summary), "{}", stderr_of(&out));
    let per_log: u64 = report.as_array().unwrap().iter().map(|r| r["leak_bytes"].as_u64().unwrap()).sum();
    assert_eq!(per_log, exit, "the report's leaks are the check's exit leaks");
}
