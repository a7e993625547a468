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
    poll_for(Duration::from_secs(10), || cupool.try_wait().expect("wait for cupool")).unwrap_or_else(|| {
        let prog_alive = Path::new(&format!("/proc/{prog_pid}")).exists();
        // SAFETY: `kill` takes integers; it signals the test's own child program.
        unsafe { libc::kill(prog_pid as libc::pid_t, libc::SIGKILL) };
        let _ = cupool.kill();
        let _ = cupool.wait();
        panic!(
            "{what}: `cupool run` still running 10 s after SIGTERM \
             (program pid {prog_pid} still alive: {prog_alive})"
        );
    })
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
    // And vice versa: every option line of the help (`  key  default D  what`) is one the
    // core parses, with the core's default.
    let listed: Vec<(&str, &str)> = help
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let key = w.next()?;
            (w.next()? == "default").then_some((key, l))
        })
        .collect();
    let known: Vec<&str> = cupool_core::options::OPTION_HELP.iter().map(|(k, _, _)| *k).collect();
    assert_eq!(listed.iter().map(|(k, _)| *k).collect::<Vec<_>>(), known, "{help}");
    let defaults = cupool_core::options::Options::default();
    for (key, line) in listed {
        // cupool run's own log directory, not the bare shim's `.`.
        let default = match key {
            "log_dir" => "./cupool-logs".to_string(),
            _ => cupool_core::options::value_of(&defaults, key).unwrap(),
        };
        assert!(line.contains(&format!("default {default} ")), "{key}: the parser's default is {default:?}: {line}");
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
    assert_eq!(opts["log_dir"], path_str(&run_dir(&dir).canonicalize().unwrap()), "the run's own directory: {opts}");
    assert!(events(&logs[0], "alloc").is_empty());
    assert_eq!(logs[0]["end"]["leak_summary"]["bytes"], 10007);
}

/// Without `--log-dir` or `-o log_dir=`, an inherited `CUPOOL_OPTIONS`
/// log directory is where the logs go, not `./cupool-logs`.
#[test]
fn run_keeps_an_inherited_log_dir() {
    let dir = scratch_dir("cli-inherited-log-dir");
    // Quoted, with a `:` inside, as `cupool run` itself would pass it on.
    let logs_there = dir.join("from:environment");
    let out = cupool_command(&["run", "-q", "--", path_str(&fakes().prog("prog_getproc"))], &dir)
        .current_dir(&dir)
        .env("CUPOOL_OPTIONS", format!("verbosity=0:log_dir='{}'", logs_there.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let logs = read_logs(&logs_there);
    assert_eq!(logs.len(), 1, "{:?}", log_files(&logs_there));
    assert_eq!(Path::new(logs[0]["options"]["log_dir"].as_str().unwrap()).parent(), Some(logs_there.as_path()));
    assert!(!dir.join("cupool-logs").exists(), "the default directory was made all the same");
}

#[test]
fn run_tags_and_summarises_every_process_of_one_run() {
    let dir = scratch_dir("cli-fork");
    let prog = fakes().prog("prog_fork");
    let first = cupool_run(&dir, &[], &prog, &[]);
    assert!(first.status.success(), "{}", stderr_of(&first));
    let second = cupool_run(&dir, &[], &prog, &[]);
    assert!(second.status.success(), "{}", stderr_of(&second));
    // A directory per run, each with its two processes under one run_id.
    let runs = run_dirs(&dir);
    assert_eq!(runs.len(), 2, "{runs:?}");
    let mut run_ids = BTreeSet::new();
    for run in &runs {
        let logs = read_logs(run);
        assert_eq!(logs.len(), 2, "{:?}", log_files(run));
        let ids: BTreeSet<&str> = logs.iter().map(|l| l["options"]["run_id"].as_str().unwrap()).collect();
        assert_eq!(ids.len(), 1, "{ids:?}");
        run_ids.extend(ids.into_iter().map(String::from));
    }
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

/// The `run-*` directories in `dir`, oldest first.
fn run_dirs(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut runs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("run-") && p.is_dir())
        .collect();
    runs.sort();
    runs
}

/// The pids `cupool report --json` read, sorted.
fn reported_pids(out: &Output) -> Vec<u64> {
    let rep: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr_of(out)));
    let mut pids: Vec<u64> = rep.as_array().unwrap().iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    pids.sort_unstable();
    pids
}

/// Runs do not mix: each writes into a directory of its own under the log
/// directory, `latest` names the newest, and the readers read the newest run
/// unless told several.
#[test]
fn each_run_has_a_directory_and_readers_take_the_newest() {
    let cwd = scratch_dir("cli-runs");
    let prog = fakes().prog("prog_fork");
    let run = || {
        let out = cupool_command(&["run", "--", path_str(&prog)], &cwd).current_dir(&cwd).output().unwrap();
        assert!(out.status.success(), "{}", stderr_of(&out));
        out
    };
    let (first, second) = (run(), run());
    let root = cwd.join("cupool-logs");
    let runs = run_dirs(&root);
    assert_eq!(runs.len(), 2, "{runs:?}");
    let latest = std::fs::read_link(root.join("latest")).unwrap();
    assert_eq!(root.join(latest), runs[1], "latest names the newest run");
    for (out, dir) in [(&first, &runs[0]), (&second, &runs[1])] {
        let said = format!("logs in {}", dir.display());
        assert!(stderr_of(out).contains(&said), "the summary names the run's directory ({said}):\n{}", stderr_of(out));
    }
    let pids = |dir: &Path| -> Vec<u64> {
        let mut p: Vec<u64> = read_logs(dir).iter().map(|l| l["process"]["pid"].as_u64().unwrap()).collect();
        p.sort_unstable();
        p
    };
    let (older, newer) = (pids(&runs[0]), pids(&runs[1]));
    assert_eq!((older.len(), newer.len()), (2, 2));

    // No path: the newest run of ./cupool-logs.
    let out = cupool_command(&["report", "--json"], &cwd).current_dir(&cwd).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(reported_pids(&out), newer);
    assert!(stderr_of(&out).contains("reading the newest run, cupool-logs/run-"), "{}", stderr_of(&out));
    // The log directory named: its newest run, saying what it left out.
    let out = run_cupool(&["report", "--json", path_str(&root)], &cwd);
    assert_eq!(reported_pids(&out), newer);
    assert!(stderr_of(&out).contains("reading its newest run"), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("left out: 1 older run(s)"), "{}", stderr_of(&out));
    // Several runs together: named.
    let out = run_cupool(&["report", "--json", path_str(&runs[0]), path_str(&runs[1])], &cwd);
    let mut both = [older.clone(), newer.clone()].concat();
    both.sort_unstable();
    assert_eq!(reported_pids(&out), both);
    // export and merge read the newest run too.
    let trace = cwd.join("trace.json");
    let out = cupool_command(&["export", "--perfetto", path_str(&trace)], &cwd).current_dir(&cwd).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("2 process(es)"), "{}", stderr_of(&out));
    let out = cupool_command(&["merge"], &cwd).current_dir(&cwd).output().unwrap();
    assert!(stderr_of(&out).contains("reading the newest run"), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("2 process(es) checked"), "{}", stderr_of(&out));

    // A run that logs nothing leaves no directory, and latest still names the newest run.
    let out = cupool_command(&["run", "-q", "--", path_str(&fakes().prog("prog_nocuda"))], &cwd)
        .current_dir(&cwd)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(run_dirs(&root), runs);
    assert_eq!(root.join(std::fs::read_link(root.join("latest")).unwrap()), runs[1]);
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

// ---------------------------------------------------------------------------
// Bad input: every one answered with one line naming it, a documented status,
// and (for `cupool run`) before the program starts.

/// One bad input: the arguments of `cupool` (for `run`, the flags before `--`),
/// an inherited `CUPOOL_OPTIONS`, the exit status, a fragment of the message.
struct BadInput {
    args: Vec<String>,
    env: Option<&'static str>,
    code: i32,
    says: String,
}

fn bad(args: &[&str], code: i32, says: &str) -> BadInput {
    BadInput { args: args.iter().map(|s| s.to_string()).collect(), env: None, code, says: says.into() }
}

#[test]
fn bad_input_is_refused_with_one_line_and_a_documented_status() {
    let base = scratch_dir("cli-bad-input");
    let p = |name: &str| base.join(name).display().to_string();
    // Inputs on disk.
    let file = base.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let empty = base.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let no_logs = base.join("no-logs");
    std::fs::create_dir_all(&no_logs).unwrap();
    std::fs::write(no_logs.join("notes.txt"), "hello").unwrap();
    std::fs::write(base.join("junk.json"), "not a trace").unwrap();
    std::fs::write(base.join("empty.json"), "").unwrap();
    std::fs::write(base.join("hello.json"), "{\"hello\": 1}\n").unwrap();
    let header = "Thread,Time,Action,Pointer,Size,Stream\n";
    let good_row = "1,0.1,allocate,0x1000,4096,0x0\n";
    std::fs::write(base.join("rmm.csv"), format!("{header}{good_row}")).unwrap();
    std::fs::write(base.join("zzz.csv"), format!("{header}{good_row}zzz\n")).unwrap();
    std::fs::write(base.join("abc.csv"), format!("{header}1,0.1,abc,0x1000,4096,0x0\n")).unwrap();
    std::fs::write(base.join("cols.csv"), format!("{header}{good_row}1,0.2,free,0x1000,4096,0x0,extra\n")).unwrap();
    std::fs::write(base.join("ptr.csv"), format!("{header}1,0.1,allocate,0xzz,4096,0x0\n")).unwrap();
    std::fs::write(base.join("size.csv"), format!("{header}1,0.1,allocate,0x1000,lots,0x0\n")).unwrap();
    std::fs::write(base.join("nohdr.csv"), "Thread,Time,Pointer\n1,2,0x1\n").unwrap();
    {
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(format!("{header}{good_row}{good_row}abc\n").as_bytes()).unwrap();
        std::fs::write(base.join("bad.csv.gz"), gz.finish().unwrap()).unwrap();
    }
    let not_a_dir = format!("{}/sub", file.display());

    let mut cases = vec![
        // cupool run: flags and options (status 2).
        bad(
            &["run", "--limit", "lots"],
            2,
            "cupool run: --limit: bad value 'lots' for 'limit' (expected bytes such as 16g",
        ),
        bad(&["run", "--limit", "1bbbbb"], 2, "--limit: bad value '1bbbbb' for 'limit'"),
        bad(&["run", "--limit", ""], 2, "--limit: no value for 'limit'"),
        bad(&["run", "--mode", "turbo"], 2, "--mode: bad value 'turbo' for 'mode' (expected pool or passthrough)"),
        bad(&["run", "-o", "bogus=1"], 2, "-o bogus=1: unknown option 'bogus' (options: mode, log_dir, log,"),
        bad(&["run", "-o", "flush_ms=abc"], 2, "-o flush_ms=abc: bad value 'abc' for 'flush_ms' (expected a number"),
        bad(&["run", "-o", "flush_ms=5"], 2, "'5' for 'flush_ms' (expected a number of milliseconds, 10..10000)"),
        bad(&["run", "-o", "verbosity=9"], 2, "bad value '9' for 'verbosity' (expected 0, 1 or 2)"),
        bad(&["run", "-o", "trace=maybe"], 2, "bad value 'maybe' for 'trace' (expected 1 or 0)"),
        bad(&["run", "-o", "limit=16gg"], 2, "bad value '16gg' for 'limit'"),
        bad(&["run", "-o", "mode="], 2, "-o mode=: no value for 'mode' (expected pool or passthrough)"),
        bad(&["run", "-o", "log_dir="], 2, "-o log_dir=: no value for 'log_dir' (expected a directory)"),
        bad(&["run", "-o", "noequals"], 2, "-o noequals: expected key=value"),
        bad(&["run", "-o", "run_id=x"], 2, "-o run_id=x: run_id is set by cupool run itself"),
        bad(&["run", "--log-dir", ""], 2, "a value is required for '--log-dir <DIR>'"),
        bad(&["run", "--no-such-flag"], 2, "--no-such-flag"),
        BadInput {
            env: Some("mode=turbo"),
            ..bad(&["run"], 2, "cupool run: CUPOOL_OPTIONS: bad value 'turbo' for 'mode'")
        },
        BadInput {
            env: Some("flush_ms=20:log_dir='/tmp/x"),
            ..bad(&["run"], 2, "CUPOOL_OPTIONS: 'log_dir='/tmp/x': the quote is never closed")
        },
        BadInput { env: Some("colour=blue"), ..bad(&["run"], 2, "CUPOOL_OPTIONS: unknown option 'colour'") },
        // cupool run: a log directory that cannot be created or written (status 123).
        bad(&["run", "--log-dir", "/proc/nope"], 123, "cupool run: cannot create log directory /proc/nope: "),
        bad(&["run", "--log-dir", &not_a_dir], 123, &format!("cannot create log directory {not_a_dir}: ")),
        bad(&["run", "--log-dir", "/proc"], 123, "cupool run: cannot write into log directory /proc: "),
        bad(&["run", "-o", "log_dir=/proc/nope"], 123, "cannot create log directory /proc/nope"),
        // cupool report (status 2).
        bad(&["report", "/nonexistent/x.json"], 2, "cupool report: /nonexistent/x.json: No such file or directory"),
        bad(&["report", &p("empty")], 2, &format!("{}: no cupool logs in this directory", p("empty"))),
        bad(&["report", &p("no-logs")], 2, &format!("{}: no cupool logs in this directory", p("no-logs"))),
        bad(&["report", &p("junk.json")], 2, &format!("{}: not a cupool log", p("junk.json"))),
        bad(&["report", &p("empty.json")], 2, &format!("{}: not a cupool log (the file is empty)", p("empty.json"))),
        bad(&["report", &p("hello.json")], 2, &format!("{}: not a cupool log (no \"schema\"", p("hello.json"))),
        bad(&["report", &p("rmm.csv")], 2, "(it is an RMM logging CSV: cupool replay reads those)"),
        // No path: the newest run of ./cupool-logs, which is not there (the cases run in `base`).
        bad(&["report"], 2, "cupool report: no path given, and cupool-logs holds no run to read"),
        bad(&["export", "--perfetto", &p("t.json")], 2, "cupool export: no path given, and cupool-logs holds no run"),
        bad(&["export", "--perfetto", &p("t.json"), "--max-points", "0", &p("empty")], 2, "at least 1000"),
        bad(&["run", "./prog"], 2, "tip: the program and its arguments go after --: 'cupool run [OPTIONS] -- ./prog"),
        // cupool replay (status 2).
        bad(&["replay", "/nonexistent/t.csv"], 2, "cupool replay: /nonexistent/t.csv: No such file or directory"),
        bad(&["replay", &p("empty")], 2, &format!("{}: no traces in this directory", p("empty"))),
        bad(&["replay", &p("no-logs")], 2, &format!("{}: no traces in this directory", p("no-logs"))),
        bad(
            &["replay", &p("junk.json")],
            2,
            &format!("{}: neither a cupool log nor an RMM logging CSV", p("junk.json")),
        ),
        bad(&["replay", &p("empty.json")], 2, "the file is empty"),
        bad(&["replay", &p("zzz.csv")], 2, &format!("{}:3: 1 column(s) where the header has 6", p("zzz.csv"))),
        bad(&["replay", &p("abc.csv")], 2, &format!("{}:2: unknown action 'abc'", p("abc.csv"))),
        bad(&["replay", &p("cols.csv")], 2, &format!("{}:3: 7 column(s) where the header has 6", p("cols.csv"))),
        bad(&["replay", &p("ptr.csv")], 2, &format!("{}:2: bad pointer '0xzz'", p("ptr.csv"))),
        bad(&["replay", &p("size.csv")], 2, &format!("{}:2: bad size 'lots'", p("size.csv"))),
        bad(&["replay", &p("nohdr.csv")], 2, &format!("{}:1: the header has no Action column", p("nohdr.csv"))),
        bad(&["replay", &p("bad.csv.gz")], 2, &format!("{}:4: 1 column(s)", p("bad.csv.gz"))),
        bad(&["replay", "--policy", "nope"], 2, "no policy \"nope\"; the policies are cupool-segments, cupool-vmm,"),
    ];
    // SAFETY: `geteuid` takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        // Root writes into read-only directories; /proc above stands in for it there.
        let ro = base.join("read-only");
        std::fs::create_dir_all(&ro).unwrap();
        std::fs::set_permissions(&ro, std::os::unix::fs::PermissionsExt::from_mode(0o555)).unwrap();
        let ro = ro.display().to_string();
        cases.push(bad(&["run", "--log-dir", &ro], 123, &format!("cannot write into log directory {ro}: ")));
    }

    let marker = base.join("the-program-ran");
    let logs = base.join("logs");
    for case in &cases {
        let mut args: Vec<String> = case.args.clone();
        if args[0] == "run" {
            if !args.iter().any(|a| a == "--log-dir" || a.starts_with("log_dir=")) {
                args.extend(["--log-dir".into(), logs.display().to_string()]);
            }
            args.extend(["--".into(), "touch".into(), marker.display().to_string()]);
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut cmd = cupool_command(&argv, &base);
        cmd.current_dir(&base);
        if let Some(env) = case.env {
            cmd.env("CUPOOL_OPTIONS", env);
        }
        let out = cmd.output().unwrap();
        let stderr = stderr_of(&out);
        let what = format!("cupool {argv:?} (CUPOOL_OPTIONS={:?})", case.env);
        assert_eq!(out.status.code(), Some(case.code), "{what}: status\n{stderr}");
        assert!(stderr.contains(&case.says), "{what}: stderr lacks {:?}:\n{stderr}", case.says);
        assert!(stdout_of(&out).trim().is_empty(), "{what}: stdout\n{}", stdout_of(&out));
        if argv[0] == "run" && !stderr.starts_with("error:") {
            assert_eq!(stderr.lines().count(), 1, "{what}: one line\n{stderr}");
        }
        assert!(!marker.exists(), "{what}: the program ran");
        assert!(!logs.exists(), "{what}: the log directory was created");
    }
}

#[test]
fn log_dirs_with_colons_and_equals_reach_the_shim() {
    let base = scratch_dir("cli-colon");
    let prog = fakes().prog("prog_getproc");
    // --log-dir, and -o log_dir: each value as it is.
    for (i, how) in ["--log-dir", "-o"].into_iter().enumerate() {
        let dir = base.join(format!("a:b=c {i}"));
        let value = if how == "-o" { format!("log_dir={}", dir.display()) } else { dir.display().to_string() };
        let out = run_cupool(&["run", "-q", how, &value, "--", path_str(&prog)], &base);
        assert!(out.status.success(), "{how}: {}", stderr_of(&out));
        let logs = read_logs(&dir);
        assert_eq!(logs.len(), 1, "{how}: {:?}", log_files(&dir));
        assert_eq!(Path::new(logs[0]["options"]["log_dir"].as_str().unwrap()).parent(), Some(dir.as_path()));
    }
    // A quoted value in CUPOOL_OPTIONS, as cupool run writes it, read by the bare shim.
    let dir = base.join("x:y='z'");
    let spec = format!("log_dir={}:verbosity=0", cupool_core::options::quote(path_str(&dir)));
    assert!(spec.starts_with("log_dir=\""), "{spec}");
    let out =
        plain_command(&prog, &[], &base).env("LD_PRELOAD", shim_path()).env("CUPOOL_OPTIONS", spec).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(stderr_of(&out).is_empty(), "{}", stderr_of(&out));
    assert_eq!(read_logs(&dir).len(), 1, "{:?}", log_files(&dir));
}

/// The bare shim keeps the program running when it cannot write its log, and says so once.
#[test]
fn shim_without_a_writable_log_dir_keeps_the_program_running() {
    let base = scratch_dir("shim-no-log-dir");
    let file = base.join("a-file");
    std::fs::write(&file, "x").unwrap();
    for prog in ["prog_runtime", "prog_driver"] {
        let plain = run_plain(&fakes().prog(prog), &[], &base);
        for dir in [Path::new("/proc/nope").to_path_buf(), file.join("sub")] {
            let out = plain_command(&fakes().prog(prog), &[], &base)
                .env("LD_PRELOAD", shim_path())
                .env("CUPOOL_OPTIONS", format!("log_dir={}", dir.display()))
                .output()
                .unwrap();
            assert_eq!(out.status.code(), plain.status.code(), "{prog} {}", dir.display());
            assert_eq!(
                result_line(&stdout_of(&out)),
                result_line(&stdout_of(&plain)),
                "{prog} {}: {}",
                dir.display(),
                stdout_of(&out)
            );
            let stderr = stderr_of(&out);
            let ours: Vec<&str> = stderr.lines().filter(|l| l.starts_with("cupool:")).collect();
            assert_eq!(ours.len(), 1, "{prog} {}: one line from cupool:\n{stderr}", dir.display());
            assert!(
                ours[0].contains(&format!("cannot create log_dir {}", dir.display()))
                    && ours[0].contains("no log will be written"),
                "{}",
                ours[0]
            );
        }
    }
}

// ---------------------------------------------------------------------------
// The summary's wording.

#[test]
fn summary_explains_failures_and_cuts_long_command_lines() {
    let dir = scratch_dir("cli-summary-driver");
    let long = "an-argument-long-enough-to-need-cutting-in-the-middle";
    let out = cupool_run(&dir, &[], &fakes().prog("prog_driver"), &[long, "last"]);
    let stderr = stderr_of(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("; logs in {}", dir.display())), "{stderr}");
    assert!(!stderr.contains("device -1"), "{stderr}");
    assert!(stderr.contains("allocation call(s) failed before reaching any device (no current context)"), "{stderr}");
    let pid_line = stderr.lines().find(|l| l.trim_start().starts_with("pid ")).expect("a pid line");
    assert!(
        pid_line.contains("prog_driver an-arg...") && pid_line.contains("...") && pid_line.contains(" last"),
        "{pid_line}"
    );
    assert!(pid_line.contains("exit 0"), "{pid_line}");
    assert!(stderr.contains("live when cuCtxDestroy_v2 destroyed its context"), "{stderr}");
}

#[test]
fn summary_of_a_killed_process_says_so_plainly() {
    let dir = scratch_dir("cli-summary-killed");
    let (mut cupool, pid) = start_sleep_under_cupool(&dir);
    let flushed = wait_for_flushed(&dir, "alloc", 50); // the allocations reach the log before the kill
    send_signal(pid, libc::SIGKILL);
    let status = wait_for_cupool(&mut cupool, pid, "SIGKILL to the program");
    assert!(flushed, "the allocations never reached the log");
    assert_eq!(status.code(), Some(137), "{status:?}");
    let out = run_cupool(&["report", path_str(&dir)], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let text = stdout_of(&out);
    assert!(text.contains("killed, replaced by exec, or still running (the log has no end)"), "{text}");
    assert!(text.contains("still live when the log stopped"), "{text}");
    assert!(!text.contains("logs in"), "report names no directory: {text}");
}

#[test]
fn summary_names_no_directory_that_does_not_exist() {
    let base = scratch_dir("cli-summary-nodir");
    let logs = base.join("never-made");
    let out = run_cupool(&["run", "--log-dir", path_str(&logs), "--", path_str(&fakes().prog("prog_nocuda"))], &base);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let stderr = stderr_of(&out);
    assert!(stderr.contains("no CUDA memory activity recorded"), "{stderr}");
    assert!(!stderr.contains(path_str(&logs)), "{stderr}");
    assert!(!logs.exists(), "cupool run left an empty log directory behind");
}

#[test]
fn summary_says_what_threads_magazines_did() {
    let dir = scratch_dir("cli-summary-magazines");
    let logs = dir.join("logs");
    let prog = compile_runtime_program("reuse", "pool_reuse.c");
    let out = run_cupool(
        &["run", "--log-dir", path_str(&logs), "-o", "magazines=always", "--", path_str(&prog), "stream"],
        &dir,
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let stderr = stderr_of(&out);
    let line = stderr.lines().find(|l| l.trim_start().starts_with("magazines:")).unwrap_or_else(|| panic!("{stderr}"));
    // One thread's 10,000 pairs of 4 KiB: all but the first, which the pool
    // serves while the size is not yet taken on, come from its magazine.
    assert!(line.contains("1 thread(s) served 9999 small blocks"), "{line}");
}
