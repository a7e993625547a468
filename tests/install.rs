//! "Install anywhere": a `cupool` binary copied alone (as `cargo install`
//! leaves it) carries the shim and the bundled traces.
//! `cargo test --test install`
mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::*;

/// A copy of the `cupool` binary alone in a fresh directory, like
/// `~/.cargo/bin/cupool`, and a private cache directory for it.
fn lone_cupool(name: &str) -> (PathBuf, PathBuf) {
    let dir = scratch_dir(name);
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let exe = bin.join("cupool");
    fs::copy(cli(), &exe).unwrap();
    (exe, dir.join("cache"))
}

fn run_lone(exe: &Path, cache: &Path, args: &[&str], dir: &Path) -> Output {
    // A binary just copied can be briefly "busy" (ETXTBSY): another test
    // thread that forks at that moment holds the copy's write descriptor
    // until its exec closes it.
    for _ in 0..50 {
        let out = Command::new(exe)
            .args(args)
            .env_remove("LD_PRELOAD")
            .env_remove("CUPOOL_OPTIONS")
            .env_remove("CUPOOL_LIB")
            .env_remove("CUPOOL_TRACES")
            .env("XDG_CACHE_HOME", cache)
            .envs(fakes().env())
            .env("FAKE_CUDA_STATS", dir.join(FAKE_STATS_FILE))
            .current_dir(dir)
            .output();
        match out {
            Err(e) if e.raw_os_error() == Some(libc_etxtbsy()) => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            other => return other.unwrap(),
        }
    }
    panic!("{} stayed busy", exe.display());
}

/// ETXTBSY on Linux.
fn libc_etxtbsy() -> i32 {
    26
}

#[test]
fn a_lone_binary_runs_programs_with_its_embedded_shim() {
    let (exe, cache) = lone_cupool("install-run");
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let logs = dir.join("logs");
    let prog = fakes().prog("prog_runtime");
    let args = ["run", "-v", "-q", "--log-dir", logs.to_str().unwrap(), "--", prog.to_str().unwrap()];
    let out = run_lone(&exe, &cache, &args, &dir);
    let stderr = stderr_of(&out);
    assert!(out.status.success(), "{}\n{stderr}", stdout_of(&out));
    assert!(stderr.contains("embedded in cupool, cached"), "--verbose names the embedded shim: {stderr}");
    // The copy lies in the cache, named by version and content hash.
    let versions: Vec<PathBuf> = fs::read_dir(cache.join("cupool")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(versions.len(), 1, "{versions:?}");
    let name = versions[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with(concat!(env!("CARGO_PKG_VERSION"), "-")), "{name}");
    let cached = versions[0].join("libcupool.so");
    assert!(stderr.contains(cached.to_str().unwrap()), "{stderr}");
    let logs_written = read_logs(&logs);
    assert_eq!(logs_written.len(), 1, "{:?}", log_files(&logs));
    assert_valid_log(&logs_written[0], "prog_runtime");

    // A second run reuses the copy as it is.
    let before = fs::metadata(&cached).unwrap().modified().unwrap();
    let out = run_lone(&exe, &cache, &args, &dir);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(fs::metadata(&cached).unwrap().modified().unwrap(), before, "rewritten");
    assert_eq!(fs::read_dir(&versions[0]).unwrap().count(), 1, "no temporary file left behind");

    // A damaged copy is replaced.
    fs::write(&cached, b"not a library").unwrap();
    let out = run_lone(&exe, &cache, &args, &dir);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(fs::metadata(&cached).unwrap().len() > 100_000);
}

#[test]
fn the_shim_beside_the_binary_and_cupool_lib_come_first() {
    let (exe, cache) = lone_cupool("install-order");
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let beside = exe.with_file_name("libcupool.so");
    fs::copy(shim_path(), &beside).unwrap();
    let out = run_lone(&exe, &cache, &["run", "-v", "-q", "--", "true"], &dir);
    let stderr = stderr_of(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("{} (beside the cupool executable)", beside.display())), "{stderr}");
    assert!(!cache.exists(), "nothing cached when the shim lies beside the binary");

    let mut cmd = Command::new(&exe);
    cmd.args(["run", "-v", "-q", "--", "true"]).env("CUPOOL_LIB", shim_path()).env("XDG_CACHE_HOME", &cache);
    let out = cmd.output().unwrap();
    assert!(stderr_of(&out).contains("($CUPOOL_LIB)"), "{}", stderr_of(&out));

    let out =
        Command::new(&exe).args(["run", "--", "true"]).env("CUPOOL_LIB", dir.join("missing.so")).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr_of(&out).contains("missing.so does not exist"), "{}", stderr_of(&out));
}

#[test]
fn a_lone_binary_replays_its_bundled_traces() {
    let (exe, cache) = lone_cupool("install-replay");
    let dir = exe.parent().unwrap().to_path_buf();
    let out = run_lone(&exe, &cache, &["replay"], &dir);
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    for trace in ["cupy.json.gz", "gpt2.json.gz", "resnet18.json.gz", "torch-transformer.json.gz"] {
        assert!(stdout.lines().any(|l| l.starts_with(trace)), "{trace} missing:\n{stdout}");
    }
    // $CUPOOL_TRACES overrides the bundled set.
    let traces = dir.join("traces");
    fs::create_dir_all(&traces).unwrap();
    fs::write(traces.join("mine.csv"), "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x1000,512,0x0\n")
        .unwrap();
    let out = Command::new(&exe).arg("replay").env("CUPOOL_TRACES", &traces).output().unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("mine.csv")), "{stdout}");
    assert!(!stdout.contains("gpt2"), "{stdout}");
}
