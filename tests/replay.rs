//! `cupool replay`: traces in both accepted formats go through the pool core
//! and the figures it prints follow from the trace.

mod support;

use std::path::PathBuf;
use std::process::Command;
use support::cli;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cupool-replay-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The row printed for `file`: (ops, ratio, segments).
fn row(stdout: &str, file: &str) -> (u64, f64, u64) {
    let line = stdout.lines().find(|l| l.starts_with(file)).unwrap_or_else(|| panic!("no row for {file}:\n{stdout}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    // name, ops, live (2 words), reserved (2 words), ratio, segments, ns/op
    (f[1].parse().unwrap(), f[6].parse().unwrap(), f[7].parse().unwrap())
}

#[test]
fn rmm_csv_trace_is_replayed() {
    let dir = scratch("csv");
    // Two 1 MiB blocks live at once, then a 512 B one after both are freed:
    // everything fits one 2 MiB small-pool segment.
    let csv = "Thread,Time,Action,Pointer,Size,Stream\n\
               1,0.1,allocate,0x1000,1048576,0x0\n\
               1,0.2,allocate,0x2000,1048576,0x0\n\
               1,0.3,free,0x1000,1048576,0x0\n\
               1,0.4,free,0x2000,1048576,0x0\n\
               1,0.5,allocate,0x3000,512,0x0\n\
               1,0.6,free,0x3000,512,0x0\n";
    let path = dir.join("rmm.csv");
    std::fs::write(&path, csv).unwrap();
    let out = Command::new(cli()).arg("replay").arg(&path).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (ops, ratio, segments) = row(&stdout, "rmm.csv");
    assert_eq!(ops, 6);
    assert_eq!(segments, 1, "two 1 MiB blocks share one 2 MiB small segment:\n{stdout}");
    assert!((ratio - 1.0).abs() < 1e-9, "2 MiB live in a 2 MiB segment: ratio {ratio}\n{stdout}");
}

#[test]
fn bundled_traces_replay_with_sane_figures() {
    let out = Command::new(cli()).arg("replay").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for trace in ["torch-transformer.json.gz", "resnet18.json.gz", "gpt2.json.gz", "cupy.json.gz"] {
        let (ops, ratio, segments) = row(&stdout, trace);
        assert!(ops > 100, "{trace}: {ops} ops");
        assert!(segments > 0);
        assert!((1.0..2.0).contains(&ratio), "{trace}: reserved/live {ratio}");
    }
}

#[test]
fn unreadable_trace_fails_with_status_2() {
    let dir = scratch("bad");
    let path = dir.join("junk.json");
    std::fs::write(&path, "not a trace").unwrap();
    let out = Command::new(cli()).arg("replay").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("junk.json"));
}
