//! The example log that ships with the project (`examples/torch-leak/log/`),
//! which README.md's first recipe reads on any machine: `cupool report`,
//! `report --html`, `export --perfetto`/`--memory-viz` and `cupool merge`
//! (the check's verdict) all work on it; the check names the line marked
//! ALLOCATED in the program that the log recorded; and the lines README.md
//! quotes from the verdict are the ones `cupool merge` prints for it.
//!
//! The log was recorded on a GPU by `scripts/gpu-example-log.sh`
//! (PyTorch); rerecorded, its files replace those there.
//! `cargo test --release --test example`
mod support;

use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use support::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn example() -> PathBuf {
    root().join("examples/torch-leak/log")
}

fn said(out: &std::process::Output) -> String {
    format!("status {:?}\n{}{}", out.status.code(), stdout_of(out), stderr_of(out))
}

/// The example's programs, by file name, with the line marked ALLOCATED in each.
fn allocated_lines() -> Vec<(String, u64)> {
    let mut found = Vec::new();
    for e in fs::read_dir(root().join("examples/torch-leak")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_none_or(|x| x != "py") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        for (i, line) in text.lines().enumerate() {
            if line.contains("# ALLOCATED") {
                found.push((path.file_name().unwrap().to_string_lossy().into_owned(), i as u64 + 1));
            }
        }
    }
    assert!(!found.is_empty(), "no line marked ALLOCATED in examples/torch-leak/");
    found
}

#[test]
fn the_example_log_is_there_and_reads_whole() {
    let logs: Vec<String> = fs::read_dir(example())
        .expect("examples/torch-leak/log/")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("cupool.") && n.ends_with(".json.gz"))
        .collect();
    assert_eq!(logs.len(), 1, "one gzipped log: {logs:?}");
    let out = run_cupool(&["report", "--json", path_str(&example())], &example());
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &report.as_array().unwrap()[0];
    assert_eq!(p["complete"], true, "the log has its end record: {p}");
}

#[test]
fn report_and_exports_work_on_the_example() {
    let dir = scratch_dir("example-views");
    let log = path_str(&example()).to_string();
    let out = run_cupool(&["report", &log], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let text = stdout_of(&out);
    assert!(text.contains("Peaks") && text.contains("Phases"), "{text}");
    assert!(text.contains("Leaks (as cupool check judges them"), "{text}");

    let page = dir.join("report.html");
    let out = run_cupool(&["report", "--html", path_str(&page), &log], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(fs::read_to_string(&page).unwrap().starts_with("<!DOCTYPE html>"));

    let (trace, snapshot) = (dir.join("trace.json"), dir.join("snapshot.pickle"));
    let out = run_cupool(&["export", "--perfetto", path_str(&trace), "--memory-viz", path_str(&snapshot), &log], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let t: Value = serde_json::from_slice(&fs::read(&trace).unwrap()).unwrap();
    assert!(t["traceEvents"].as_array().is_some_and(|e| e.len() > 10), "a Perfetto trace");
    assert!(fs::metadata(&snapshot).unwrap().len() > 1000, "a memory_viz snapshot");
}

#[test]
fn the_check_names_the_planted_line() {
    let dir = scratch_dir("example-merge");
    let json = dir.join("findings.json");
    let out = run_cupool(&["merge", "--json", path_str(&json), path_str(&example())], &dir);
    assert_eq!(out.status.code(), Some(23), "the planted leak fails the check: {}", said(&out));
    let doc: Value = serde_json::from_str(&fs::read_to_string(&json).unwrap()).unwrap();
    let growth: Vec<&Value> = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "growth" && f.get("suppressed_by").is_none())
        .collect();
    assert_eq!(growth.len(), 1, "one growth finding: {}", said(&out));
    let planted = allocated_lines();
    let at_planted = growth[0]["frames"].as_array().unwrap().iter().any(|fr| {
        let file = fr["file"].as_str().unwrap_or("");
        planted.iter().any(|(name, line)| file.ends_with(&format!("/{name}")) && fr["line"] == *line)
    });
    assert!(at_planted, "the growth finding names a line marked ALLOCATED {planted:?}: {}", growth[0]);
}

/// The verdict's lines that README.md's first recipe quotes (those that
/// begin as below) are the ones `cupool merge` prints for the example.
#[test]
fn readme_quotes_the_examples_verdict() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let recipe = readme.split("cupool merge examples/torch-leak/log").nth(1).expect("README runs cupool merge on it");
    let block = recipe.split("```").next().unwrap();
    let kinds =
        ["ERROR: cupool", "Direct leak of", "Growing leak of", "  phases:", "SUMMARY: cupool", "cupool: held at exit"];
    let quoted: Vec<&str> = block.lines().filter(|l| kinds.iter().any(|k| l.starts_with(k))).collect();
    assert!(quoted.iter().any(|l| l.starts_with("SUMMARY: cupool")), "README quotes the SUMMARY line:\n{block}");
    let out = run_cupool(&["merge", path_str(&example())], Path::new(&scratch_dir("example-readme")));
    let said = stderr_of(&out);
    for line in quoted {
        assert!(
            said.lines().any(|l| l == line),
            "README.md quotes {line:?}, which cupool merge examples/torch-leak/log does not print; update README.md \
             from:\n{said}"
        );
    }
    let status =
        block.split("$ echo $?").nth(1).and_then(|rest| rest.lines().nth(1)).expect("README quotes the status");
    assert_eq!(status.trim().parse::<i32>().ok(), out.status.code(), "the status README.md quotes");
}
