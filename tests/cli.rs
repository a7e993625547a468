//! The `cupool` CLI: `cupool run` (exit statuses, signals, LD_PRELOAD,
//! options, transparency) and `cupool report`.
//! `cargo test --test cli`
mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use support::*;

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `cupool run --log-dir <dir> [flags] -- <prog> <args>`, run to completion.
fn cupool_run(dir: &Path, flags: &[&str], prog: &Path, args: &[&str]) -> Output {
    let mut v: Vec<&str> = vec!["run", "--log-dir", path_str(dir)];
    v.extend_from_slice(flags);
    v.push("--");
    v.push(path_str(prog));
    v.extend_from_slice(args);
    run_cupool(&v, dir)
}

fn u64_of(e: &Value, k: &str) -> u64 {
    e[k].as_u64().unwrap_or_else(|| panic!("no numeric {k:?} in {e}"))
}

// ---------------------------------------------------------------------------
// Exit status.

#[test]
fn run_returns_the_programs_exit_status() {
    let dir = scratch_dir("cli-exit");
    let prog = fakes().prog("prog_runtime");
    let out = cupool_run(&dir, &["-q"], &prog, &["7"]);
    let stdout = stdout_of(&out);
    assert_eq!(out.status.code(), Some(7), "{stdout}\n{}", stderr_of(&out));
    assert!(result_line(&stdout).is_some(), "{stdout}");
    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{:?}", log_files(&dir));
    assert_valid_log(&logs[0], "prog_runtime");
    assert_eq!(logs[0]["end"]["exit"]["status"], 7);
    assert!(
        !logs[0]["options"]["run_id"].as_str().unwrap_or("").is_empty(),
        "cupool run sets a run_id: {}",
        logs[0]["options"]
    );

    for code in ["0", "3"] {
        let out = cupool_run(&dir, &["-q"], &fakes().prog("prog_nocuda"), &[code]);
        assert_eq!(out.status.code(), Some(code.parse().unwrap()));
    }
}

#[test]
fn run_exits_128_plus_signal_when_the_program_is_killed() {
    let dir = scratch_dir("cli-selfkill");
    let out = run_cupool(&["run", "--log-dir", path_str(&dir), "-q", "--", "sh", "-c", "kill -TERM $$"], &dir);
    assert_eq!(out.status.code(), Some(143), "{}", stderr_of(&out));
    let out = run_cupool(&["run", "--log-dir", path_str(&dir), "-q", "--", "sh", "-c", "kill -KILL $$"], &dir);
    assert_eq!(out.status.code(), Some(137), "{}", stderr_of(&out));
}

/// Starts `cupool run -- prog_sleep` and waits for `ready`; returns the
/// cupool child and the pid of prog_sleep (from its log's name).
fn start_sleep_under_cupool(dir: &Path) -> (std::process::Child, u32) {
    let cmd = cupool_command(
        &["run", "--log-dir", path_str(dir), "-q", "-o", "flush_ms=20", "--", path_str(&fakes().prog("prog_sleep"))],
        dir,
    );
    let (child, _) = spawn_until(cmd, "ready");
    let files = log_files(dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let pid: u32 = files[0]
        .strip_prefix("cupool.")
        .and_then(|n| n.strip_suffix(".json"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("log name {}", files[0]));
    assert_ne!(pid, child.id(), "the log belongs to cupool itself");
    (child, pid)
}

/// Waits for `cupool` at most 10 s; on timeout kills both it and the
/// program (`prog_pid`) so that nothing is left sleeping, then panics.
fn wait_for_cupool(cupool: &mut std::process::Child, prog_pid: u32, what: &str) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = cupool.try_wait().expect("wait for cupool") {
            return status;
        }
        if std::time::Instant::now() >= deadline {
            let prog_alive = Path::new(&format!("/proc/{prog_pid}")).exists();
            unsafe { libc::kill(prog_pid as libc::pid_t, libc::SIGKILL) };
            let _ = cupool.kill();
            let _ = cupool.wait();
            panic!(
                "{what}: `cupool run` still running 10 s after SIGTERM \
                 (program pid {prog_pid} still alive: {prog_alive})"
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn assert_died_of_sigterm(dir: &Path, pid: u32) {
    let logs = read_logs(dir);
    let log = log_for_pid(&logs, pid as u64).expect("prog_sleep's log");
    assert_valid_log(log, "prog_sleep");
    assert_eq!(log["_partial"], false, "log not finished");
    assert_eq!(log["end"]["exit"]["how"], "signal", "{}", log["end"]["exit"]);
    assert_eq!(log["end"]["exit"]["name"], "SIGTERM", "{}", log["end"]["exit"]);
    assert_eq!(log["end"]["leak_summary"]["count"], 50);
}

#[test]
fn run_exits_143_when_the_program_gets_sigterm() {
    let dir = scratch_dir("cli-sigterm-child");
    let (mut cupool, pid) = start_sleep_under_cupool(&dir);
    send_signal(pid, libc::SIGTERM);
    let status = wait_for_cupool(&mut cupool, pid, "SIGTERM to the program");
    assert_eq!(status.code(), Some(143), "{status:?}");
    assert_died_of_sigterm(&dir, pid);
}

#[test]
fn run_forwards_sigterm_to_the_program() {
    let dir = scratch_dir("cli-sigterm-fwd");
    let (mut cupool, pid) = start_sleep_under_cupool(&dir);
    send_signal(cupool.id(), libc::SIGTERM);
    let status = wait_for_cupool(&mut cupool, pid, "SIGTERM to cupool");
    assert_eq!(status.code(), Some(143), "{status:?}");
    assert_died_of_sigterm(&dir, pid);
}

// ---------------------------------------------------------------------------
// Transparency.

#[test]
fn run_on_a_non_cuda_program_changes_nothing() {
    let base = scratch_dir("cli-nocuda");
    let logs = base.join("logs");
    let prog = fakes().prog("prog_nocuda");
    for args in [&[][..], &["4", "x  y"][..]] {
        let plain = run_plain(&prog, args, &base);
        let quiet = cupool_run(&logs, &["-q"], &prog, args);
        assert_eq!(quiet.status.code(), plain.status.code(), "{args:?}");
        assert_eq!(stdout_of(&quiet), stdout_of(&plain), "{args:?}");
        assert_eq!(stderr_of(&quiet), stderr_of(&plain), "-q {args:?}");
        let loud = cupool_run(&logs, &[], &prog, args);
        assert_eq!(loud.status.code(), plain.status.code(), "{args:?}");
        assert_eq!(stdout_of(&loud), stdout_of(&plain), "{args:?}");
        assert!(stderr_of(&loud).contains("no CUDA memory activity"), "summary: {}", stderr_of(&loud));
    }
    // `logs` also held FAKE_CUDA_STATS of the cupool runs: nothing at all there.
    let entries: Vec<_> = std::fs::read_dir(&logs)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        entries.is_empty(),
        "cupool run left files for a non-CUDA program (a log, or fake-stats \
         from loading libcuda.so.1): {entries:?}"
    );
    assert!(fake_stats(&base).is_empty());
}

/// The CLI process is never observed itself: only the program writes logs.
#[test]
fn cli_process_is_not_intercepted() {
    let dir = scratch_dir("cli-self");
    let mut child =
        cupool_command(&["run", "--log-dir", path_str(&dir), "--", path_str(&fakes().prog("prog_nocuda"))], &dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
    let cupool_pid = child.id();
    let status = wait_with_timeout(&mut child, Duration::from_secs(30));
    assert!(status.success());
    assert!(!dir.join(format!("cupool.{cupool_pid}.json")).exists(), "cupool wrote a log of itself");
    assert!(log_files(&dir).is_empty(), "{:?}", log_files(&dir));

    // With a CUDA program: exactly one log, the program's.
    let dir = scratch_dir("cli-self-cuda");
    let mut child = cupool_command(
        &["run", "--log-dir", path_str(&dir), "-q", "--", path_str(&fakes().prog("prog_getproc"))],
        &dir,
    )
    .stdout(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let cupool_pid = child.id() as u64;
    assert!(wait_with_timeout(&mut child, Duration::from_secs(30)).success());
    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{:?}", log_files(&dir));
    assert_valid_log(&logs[0], "prog_getproc");
    assert_eq!(logs[0]["process"]["ppid"].as_u64(), Some(cupool_pid));
    let stats = fake_stats(&dir);
    assert_eq!(stats.len(), 1, "libcuda loaded by more than the program: {stats:?}");
}

// ---------------------------------------------------------------------------
// LD_PRELOAD and options.

#[test]
fn run_appends_to_an_existing_ld_preload() {
    let source = fake_source_dir().join("prog_marker.c");
    let source = std::fs::read_to_string(&source).unwrap_or_else(|e| panic!("read {}: {e}", source.display()));
    let marker = compile_c("libmarker.so", &source, &["-shared".into(), "-fPIC".into()]);
    let dir = scratch_dir("cli-preload");
    let mut cmd = cupool_command(
        &["run", "--log-dir", path_str(&dir), "-q", "--", path_str(&fakes().prog("prog_runtime"))],
        &dir,
    );
    cmd.env("LD_PRELOAD", &marker);
    let child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let cupool_pid = child.id();
    let out = child.wait_with_output().unwrap();
    let stderr = stderr_of(&out);
    assert!(out.status.success(), "{}\n{stderr}", stdout_of(&out));

    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{:?}", log_files(&dir));
    assert_valid_log(&logs[0], "prog_runtime");
    assert_eq!(logs[0]["end"]["leak_summary"]["count"], 4);
    let prog_pid = logs[0]["process"]["pid"].as_u64().unwrap();

    let marker_of = |pid: u64| -> Option<String> {
        let prefix = format!("preload-marker pid={pid} LD_PRELOAD=");
        stderr.lines().find_map(|l| l.strip_prefix(prefix.as_str())).map(str::to_string)
    };
    let prog_preload =
        marker_of(prog_pid).unwrap_or_else(|| panic!("the marker library did not load into the program:\n{stderr}"));
    let entries: Vec<&str> = prog_preload.split([':', ' ']).filter(|s| !s.is_empty()).collect();
    assert_eq!(entries.first().copied(), Some(path_str(&marker)), "the user's LD_PRELOAD comes first: {prog_preload}");
    assert!(
        entries.len() == 2
            && Path::new(entries[1]).file_name() == Some("libcupool.so".as_ref())
            && Path::new(entries[1]).is_absolute(),
        "the shim is appended: {prog_preload}"
    );
    // cupool itself runs with the user's LD_PRELOAD untouched.
    assert_eq!(marker_of(cupool_pid as u64).as_deref(), Some(path_str(&marker)), "{stderr}");
}

#[test]
fn run_help_lists_every_option() {
    let dir = scratch_dir("cli-help");
    let out = run_cupool(&["run", "--help"], &dir);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let help = stdout_of(&out);
    let mut keys: BTreeSet<&str> =
        ["mode", "log_dir", "log", "trace", "run_id", "flush_ms", "limit", "verbosity"].into_iter().collect();
    keys.extend(cupool_core::options::OPTION_HELP.iter().map(|(k, _, _)| *k));
    for key in keys {
        assert!(
            help.lines().any(|l| l.split_whitespace().next() == Some(key)),
            "`cupool run --help` does not list option {key:?}:\n{help}"
        );
    }
}

#[test]
fn run_flags_and_environment_reach_the_shim() {
    let dir = scratch_dir("cli-flags");
    let out = cupool_command(
        &[
            "run",
            "--log-dir",
            path_str(&dir),
            "-q",
            "--no-trace",
            "--limit",
            "16g",
            "-o",
            "flush_ms=20",
            "--",
            path_str(&fakes().prog("prog_getproc")),
        ],
        &dir,
    )
    .env("CUPOOL_OPTIONS", "trace=1:verbosity=0:log_dir=/nonexistent/elsewhere")
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{:?}", log_files(&dir));
    let opts = &logs[0]["options"];
    assert_eq!(opts["trace"], false, "--no-trace overrides CUPOOL_OPTIONS: {opts}");
    assert_eq!(opts["verbosity"], 0, "CUPOOL_OPTIONS is kept: {opts}");
    assert_eq!(opts["flush_ms"], 20, "{opts}");
    assert_eq!(opts["limit"].as_u64(), Some(16 << 30), "{opts}");
    assert_eq!(opts["log_dir"], path_str(&dir), "{opts}");
    assert!(events(&logs[0], "alloc").is_empty());
    assert_eq!(logs[0]["end"]["leak_summary"]["bytes"], 10007);
}

#[test]
fn run_tags_and_summarises_every_process_of_one_run() {
    let dir = scratch_dir("cli-fork");
    let prog = fakes().prog("prog_fork");
    let first = cupool_run(&dir, &[], &prog, &[]);
    assert!(first.status.success(), "{}", stderr_of(&first));
    let second = cupool_run(&dir, &[], &prog, &[]);
    assert!(second.status.success(), "{}", stderr_of(&second));
    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 4, "{:?}", log_files(&dir));
    let run_ids: BTreeSet<&str> = logs.iter().map(|l| l["options"]["run_id"].as_str().unwrap()).collect();
    assert_eq!(run_ids.len(), 2, "one run_id per run: {run_ids:?}");
    assert!(!run_ids.contains(""));
    for out in [&first, &second] {
        let stderr = stderr_of(out);
        assert!(
            stderr.contains("cupool: 2 process(es) used CUDA memory"),
            "each summary covers its own run only:\n{stderr}"
        );
        assert!(stderr.contains("2 allocation(s) not freed"), "summary:\n{stderr}");
        let child = stdout_value(&stdout_of(out), "child_pid").unwrap();
        assert!(stderr.contains(&format!("pid {child}")), "{stderr}");
    }
}

// ---------------------------------------------------------------------------
// cupool report.

#[test]
fn report_json_agrees_with_the_log() {
    let dir = scratch_dir("cli-report");
    let out = run_preloaded(&fakes().prog("prog_driver"), &[], &dir, "");
    assert!(out.status.success(), "{}", stdout_of(&out));
    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 1);
    let log = &logs[0];
    let end = &log["end"];

    let out = run_cupool(&["report", "--json", path_str(&dir)], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let rep: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let rep = rep.as_array().expect("one entry per log");
    assert_eq!(rep.len(), 1);
    let s = &rep[0];
    assert_eq!(s["pid"], log["process"]["pid"]);
    assert_eq!(s["complete"], true);
    assert_eq!(s["exit"], end["exit"]);
    assert_eq!(s["leaks"], end["leaks"]);
    assert_eq!(s["leak_bytes"], end["leak_summary"]["bytes"]);
    assert_eq!(s["events"].as_u64(), Some(log["events"].as_array().unwrap().len() as u64));
    let project = |devs: &Value| -> Vec<(i64, u64, u64, u64, u64, u64)> {
        devs.as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["device"].as_i64().unwrap(),
                    u64_of(d, "allocs"),
                    u64_of(d, "frees"),
                    u64_of(d, "failures"),
                    u64_of(d, "current_bytes"),
                    u64_of(d, "peak_bytes"),
                )
            })
            .collect()
    };
    assert_eq!(project(&s["devices"]), project(&end["devices"]));

    // The same file named directly, and the text form.
    let file = dir.join(log["_file"].as_str().unwrap());
    let out2 = run_cupool(&["report", "--json", path_str(&file)], &dir);
    assert_eq!(out2.status.code(), Some(0));
    assert_eq!(
        serde_json::from_slice::<Value>(&out2.stdout).unwrap(),
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    );
    let text = run_cupool(&["report", path_str(&dir)], &dir);
    assert_eq!(text.status.code(), Some(0));
    let text = stdout_of(&text);
    assert!(text.contains("2 allocation(s) not freed") && text.contains("cuCtxDestroy_v2"), "{text}");
}

#[test]
fn report_fails_on_a_file_that_is_not_a_log() {
    let dir = scratch_dir("cli-report-bad");
    let bad = dir.join("cupool.1.json");
    std::fs::write(&bad, "{\"hello\": 1}\n").unwrap();
    let out = run_cupool(&["report", "--json", path_str(&dir)], &dir);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("cupool.1.json"), "{}", stderr_of(&out));
}
