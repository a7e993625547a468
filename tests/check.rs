//! `cupool check` and `cupool merge` on real programs run against the fake
//! CUDA: the report, the exit status, growth with and without marks,
//! children and ranks in one report, merging, and every kind of bad input.
//! `cargo test --test check`
mod support;

use std::path::Path;
use std::process::Output;

use support::*;

/// `cupool check --log-dir <dir> [flags] -- <argv>`. Steps of `check_loop`
/// take a millisecond (`STEP_US`): a loop of bare steps, over in
/// microseconds, is set-up to the check when a busy host delays the
/// program's last frees.
fn check(dir: &Path, flags: &[&str], argv: &[&str]) -> Output {
    let mut v: Vec<&str> = vec!["check", "--log-dir", path_str(dir)];
    v.extend_from_slice(flags);
    v.push("--");
    v.extend_from_slice(argv);
    cupool_command(&v, dir).env("STEP_US", "1000").output().unwrap_or_else(|e| panic!("run cupool {v:?}: {e}"))
}

/// `cupool check`'s status when it could not check (apart from `timeout`'s 124 and the shells').
const COULD_NOT_CHECK: i32 = 66;

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or_else(|| panic!("killed: {out:?}"))
}

/// The status and stderr of a run, for assertion messages.
fn show(out: &Output) -> String {
    format!("status {:?}\n{}{}", out.status.code(), stdout_of(out), stderr_of(out))
}

/// Whether the logs in `dir` record allocation sites (native stack capture).
fn has_stacks(dir: &Path) -> bool {
    read_logs(dir)
        .iter()
        .any(|l| !events(l, "alloc").is_empty() && events(l, "alloc").iter().all(|e| e["stack"].is_u64()))
}

#[test]
fn a_clean_loop_passes_and_a_leaky_one_fails_with_and_without_marks() {
    let prog = path_str(check_loop());
    for marks in ["", "mark"] {
        let dir = scratch_dir("check-clean");
        let out = check(&dir, &[], &[prog, "40", "clean", marks]);
        assert_eq!(code(&out), 0, "{}", show(&out));
        let err = stderr_of(&out);
        assert!(err.contains("cupool: 1 process(es) checked\n") && err.contains("cupool: no leaks\n"), "{err}");
        assert!(!err.contains("Growing"), "{err}");

        let dir = scratch_dir("check-wave");
        let out = check(&dir, &[], &[prog, "40", "wave", marks]);
        assert_eq!(code(&out), 0, "memory that goes up and down is no leak: {}", show(&out));

        let dir = scratch_dir("check-leak");
        let out = check(&dir, &[], &[prog, "40", "leak", marks]);
        assert_eq!(code(&out), 23, "{}", show(&out));
        let err = stderr_of(&out);
        assert!(err.contains("ERROR: cupool: detected CUDA memory leaks\n"), "{err}");
        assert!(err.contains("Direct leak of 163840 byte(s) in 40 allocation(s) allocated from:\n"), "{err}");
        let (phases, from) = if marks.is_empty() {
            ("39", "  phases: periods of the loop, each begun by an allocation of cudaMalloc (device)")
        } else {
            ("39", "  phases: 'step #' (cupool_mark)")
        };
        let growth = format!("Growing leak of 4096 byte(s) per phase over {phases} phases (site now holds");
        assert!(err.contains(&growth) && err.contains(from), "{err}");
        assert!(err.contains("SUMMARY: cupool: 163840 byte(s) leaked in 40 allocation(s).\n"), "{err}");
        assert!(err.contains(&format!("cupool check: logs in {}/run-", dir.display())), "{err}");
    }
}

/// With the trace off a clean process queues no event at all: its log is
/// still written (the end record), so the check passes it, and finds what
/// it leaks at exit.
#[test]
fn with_the_trace_off_a_clean_loop_passes_and_exit_leaks_fail() {
    let prog = path_str(check_loop());
    let dir = scratch_dir("check-trace-off-clean");
    let out = check(&dir, &["-o", "trace=0"], &[prog, "10", "clean"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let err = stderr_of(&out);
    assert!(err.contains("cupool: 1 process(es) checked\n") && err.contains("cupool: no leaks\n"), "{err}");
    assert!(err.contains("logged with trace=0, so growth was not checked"), "{err}");
    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 1, "{}", show(&out));
    assert!(events(&logs[0], "alloc").is_empty(), "trace=0 records no allocation");
    let allocs: u64 = logs[0]["end"]["devices"].as_array().unwrap().iter().map(|d| d["allocs"].as_u64().unwrap()).sum();
    assert_eq!(allocs, 1 + 1 + 10, "the weights, the optimizer state and a temporary a step: {}", logs[0]["end"]);

    let dir = scratch_dir("check-trace-off-leak");
    let out = check(&dir, &["-o", "trace=0"], &[prog, "10", "leak"]);
    assert_eq!(code(&out), 23, "{}", show(&out));
    assert!(stderr_of(&out).contains("SUMMARY: cupool: 40960 byte(s) leaked in 10 allocation(s).\n"), "{}", show(&out));

    // `cupool run` counts the process too, rather than saying nothing used CUDA memory.
    let dir = scratch_dir("run-trace-off-clean");
    let out = run_cupool(&["run", "--log-dir", path_str(&dir), "-o", "trace=0", "--", prog, "10", "clean"], &dir);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert!(stderr_of(&out).contains("cupool: 1 process(es) used CUDA memory"), "{}", show(&out));
}

/// A process that leaves through `quick_exit`, dies of a signal or replaces
/// itself (`exec`) still has its leaks found, with the trace on and off:
/// its end record is written by the shim's handlers, not by `atexit`, and
/// before an `exec` what is queued is written (with the trace off, the end
/// record too).
#[test]
fn leaks_are_found_past_quick_exit_a_fatal_signal_and_exec() {
    let prog = path_str(check_loop());
    for (exit_by, status) in [("quick_exit", 23), ("term", 128 + 15), ("exec", 23)] {
        for trace in ["trace=1", "trace=0"] {
            let dir = scratch_dir("check-exit-by");
            let mut v = vec!["check", "--log-dir", path_str(&dir), "-o", trace, "--", prog, "10", "leak"];
            let out = cupool_command(&v, &dir).env("STEP_US", "1000").env("EXIT_BY", exit_by).output().unwrap();
            assert_eq!(code(&out), status, "{exit_by} {trace}: {}", show(&out));
            let err = stderr_of(&out);
            assert!(
                err.contains("SUMMARY: cupool: 40960 byte(s) leaked in 10 allocation(s).\n"),
                "{exit_by} {trace}: {err}"
            );
            // Past a successful `exec` the traced log has no end: the call could have failed.
            let ended = exit_by != "exec" || trace == "trace=0";
            assert_eq!(!err.contains("no end record"), ended, "{exit_by} {trace}: {err}");
            *v.last_mut().unwrap() = "clean";
            let out = cupool_command(&v, &dir).env("STEP_US", "1000").env("EXIT_BY", exit_by).output().unwrap();
            assert_eq!(code(&out), if status == 23 { 0 } else { status }, "{exit_by} {trace}: {}", show(&out));
            let err = stderr_of(&out);
            assert!(
                err.contains("cupool: 1 process(es) checked\n") && err.contains("cupool: no leaks\n"),
                "{exit_by} {trace}: {err}"
            );
        }
    }
}

/// Python's `subprocess` starts commands through `vfork`: the child runs in
/// the parent's memory until its `exec` (or, when that fails, its `_exit`),
/// where the shim's hooks must leave the parent's session alone. A program
/// that allocates through the fake runtime (ctypes) and runs commands, some
/// missing, in between, is checked as without them; then it replaces itself.
#[test]
fn subprocess_children_leave_the_parents_session_alone() {
    let script = format!(
        r#"
import ctypes, os, subprocess, sys
rt = ctypes.CDLL("{}")
p, q = ctypes.c_void_p(), ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), 4096) == 0
for _ in range(10):
    try:
        subprocess.run(["/nonexistent-command"])
    except FileNotFoundError:
        pass
    subprocess.run(["true"], check=True)
assert rt.cudaMalloc(ctypes.byref(q), 8192) == 0
assert rt.cudaFree(p) == 0
if sys.argv[1] == "clean":
    assert rt.cudaFree(q) == 0
if sys.argv[2] == "exec":
    os.execvp("true", ["true"])
print("result: ok")
"#,
        path_str(&fakes().libcudart())
    );
    for ending in ["exit", "exec"] {
        for (mode, status) in [("clean", 0), ("leak", 23)] {
            let dir = scratch_dir("check-subprocess");
            let out = check(&dir, &[], &["python3", "-c", &script, mode, ending]);
            assert_eq!(code(&out), status, "{mode} {ending}: {}", show(&out));
            let err = stderr_of(&out);
            assert!(err.contains("cupool: 1 process(es) checked\n"), "{mode} {ending}: {err}");
            if status == 23 {
                assert!(err.contains("SUMMARY: cupool: 8192 byte(s) leaked in 1 allocation(s).\n"), "{err}");
            }
        }
    }
}

/// A child the program leaves running (it returns at once; the child still
/// allocates, waits, then leaves) is waited for: its log is read once it
/// ends, not as the first bytes of a log being written.
#[test]
fn a_child_left_running_is_waited_for() {
    let script = format!(
        r#"
import ctypes, os, sys, time
if os.fork() == 0:
    rt = ctypes.CDLL("{}")
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), 8192) == 0
    time.sleep(0.5)
    if sys.argv[1] == "clean":
        assert rt.cudaFree(p) == 0
    os._exit(0)
"#,
        path_str(&fakes().libcudart())
    );
    for (mode, status) in [("clean", 0), ("leak", 23)] {
        let dir = scratch_dir("check-straggler");
        let out = check(&dir, &[], &["python3", "-c", &script, mode]);
        assert_eq!(code(&out), status, "{mode}: {}", show(&out));
        let err = stderr_of(&out);
        assert!(err.contains("waiting up to 10 s for processes of the run still running"), "{mode}: {err}");
        assert!(err.contains("cupool: 1 process(es) checked\n"), "{mode}: {err}");
        assert!(!err.contains("no end record"), "{mode}: {err}");
    }
}

#[test]
fn the_programs_failure_wins_then_the_options_decide() {
    let prog = path_str(check_loop());
    let dir = scratch_dir("check-status");
    let out = check(&dir, &[], &[prog, "12", "leak", "5"]);
    assert_eq!(code(&out), 5, "{}", show(&out));
    assert!(stderr_of(&out).contains("Direct leak of 49152 byte(s)"), "still reported: {}", show(&out));
    assert!(stderr_of(&out).contains("cupool check: the program failed (exit status 5)"), "{}", show(&out));
    let out = check(&dir, &["-o", "exitcode=7"], &[prog, "12", "leak"]);
    assert_eq!(code(&out), 7, "{}", show(&out));
    let out = check(&dir, &["-o", "max_leak_bytes=1m"], &[prog, "12", "leak"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert!(stderr_of(&out).contains("no more than max_leak_bytes=1048576: the job does not fail"), "{}", show(&out));
    let out = check(&dir, &["-o", "max_leak_bytes=49151"], &[prog, "12", "leak"]);
    assert_eq!(code(&out), 23, "{}", show(&out));
    let fork = path_str(&fakes().prog("prog_fork")).to_string();
    let out = check(&dir, &["-o", "fail_on=growth"], &[&fork]);
    assert_eq!(code(&out), 0, "exit leaks only, and they do not fail: {}", show(&out));
    assert!(stderr_of(&out).contains("  reported only: fail_on does not name exit leaks\n"), "{}", show(&out));
    // CUPOOL_OPTIONS carries them too.
    let mut cmd = cupool_command(&["check", "--log-dir", path_str(&dir), "--", &fork], &dir);
    let out = cmd.env("CUPOOL_OPTIONS", "exitcode=9").output().unwrap();
    assert_eq!(code(&out), 9, "{}", show(&out));
    // A program killed by a signal: 128 + N, as cupool run.
    let out = check(&dir, &[], &["sh", "-c", &format!("{fork} && kill -TERM $$")]);
    assert_eq!(code(&out), 143, "{}", show(&out));
}

#[test]
fn children_and_ranks_are_checked_in_one_report() {
    let fork = path_str(&fakes().prog("prog_fork")).to_string();
    let dir = scratch_dir("check-ranks");
    let script = format!("RANK=0 {fork} && RANK=1 {fork}");
    let out = check(&dir, &[], &["sh", "-c", &script]);
    assert_eq!(code(&out), 23, "{}", show(&out));
    let err = stderr_of(&out);
    assert!(err.contains("cupool: 4 process(es) checked\n"), "{err}");
    let logs = read_logs(&dir);
    assert_eq!(logs.len(), 4);
    let mut ranks: Vec<u64> = logs.iter().map(|l| l["process"]["rank"].as_u64().expect("rank from RANK")).collect();
    ranks.sort();
    assert_eq!(ranks, [0, 0, 1, 1]);
    if has_stacks(&dir) {
        eprintln!("allocation sites recorded: the leaks of parent and child are told apart by their frames");
        return;
    }
    // Without frames, the same API and size group: each finding names both ranks.
    for (bytes, each) in [(13332, 6666), (15554, 7777)] {
        let head = format!(
            "Direct leak of {bytes} byte(s) in 2 allocation(s) allocated from:\n    \
             (no stack recorded: cudaMalloc (device), {each} byte(s) each)\n"
        );
        let at = err.find(&head).unwrap_or_else(|| panic!("{head} in {err}"));
        let lines: Vec<&str> = err[at + head.len()..].lines().take(2).collect();
        assert!(lines[0].starts_with("  in pid ") && lines[0].contains(" (rank 0): prog_fork"), "{lines:?}");
        assert!(lines[1].starts_with("  in pid ") && lines[1].contains(" (rank 1): prog_fork"), "{lines:?}");
    }
    assert!(err.contains("SUMMARY: cupool: 28886 byte(s) leaked in 4 allocation(s).\n"), "{err}");
}

/// A complete log written by hand: `definitions` (JSON lines without the
/// leading comma), one allocation per leak `(ptr, size, stack)`, all live at exit.
fn hand_log(pid: u32, rank: u32, definitions: &[String], leaks: &[(u64, u64, u32)]) -> String {
    let counters = |d: i32| {
        format!(
            "{{\"device\":{d},\"allocs\":0,\"frees\":0,\"failures\":0,\"current_bytes\":0,\"peak_bytes\":0,\
             \"current_count\":0,\"peak_count\":0}}"
        )
    };
    let mut lines = vec![
        format!(
            "{{\"schema\":\"cupool-log\",\"version\":3,\"process\":{{\"pid\":{pid},\"ppid\":1,\
             \"cmdline\":[\"python\",\"train.py\"],\"exe\":\"/usr/bin/python3\",\"start_unix_ms\":1,\"rank\":{rank}}},\
             \"options\":{{}},\"events\":["
        ),
        "{\"seq\":0,\"t_ns\":0,\"ev\":\"start\",\"tid\":1}".to_string(),
    ];
    lines.extend(definitions.iter().map(|d| format!(",{d}")));
    for (i, (ptr, size, stack)) in leaks.iter().enumerate() {
        lines.push(format!(
            ",{{\"seq\":{},\"t_ns\":{},\"ev\":\"alloc\",\"api\":\"cudaMalloc\",\"kind\":\"device\",\
             \"ptr\":\"{ptr:#x}\",\"size\":{size},\"device\":0,\"stack\":{stack},\"tid\":1}}",
            i + 1,
            10 * (i + 1)
        ));
    }
    let listed: Vec<String> = leaks
        .iter()
        .map(|(ptr, size, stack)| {
            format!(
                "{{\"ptr\":\"{ptr:#x}\",\"size\":{size},\"device\":0,\"kind\":\"device\",\"api\":\"cudaMalloc\",\
                 \"age_ms\":1,\"tid\":1,\"at\":\"exit\",\"stack\":{stack}}}"
            )
        })
        .collect();
    let bytes: u64 = leaks.iter().map(|l| l.1).sum();
    lines.push(format!(
        "],\"end\":{{\"end_unix_ms\":2,\"duration_ms\":1,\"exit\":{{\"how\":\"exit\",\"status\":0}},\
         \"devices\":[{}],\"host\":{},\"leak_summary\":{{\"bytes\":{bytes},\"count\":{}}},\"leaks\":[{}],\
         \"dropped_events\":0,\"pools\":[],\"ooms\":[],\"complete\":true}}}}",
        counters(0),
        counters(-1),
        leaks.len(),
        listed.join(",")
    ));
    lines.join("\n")
}

/// Rank 2 of a job, with Python allocation sites: it leaks 3000 bytes
/// from `prefetch` (called by `main`) and 1000 from `main`.
fn python_log(pid: u32) -> String {
    let defs = [
        "{\"def\":\"string\",\"id\":1,\"text\":\"/src/train.py\"}",
        "{\"def\":\"string\",\"id\":2,\"text\":\"main\"}",
        "{\"def\":\"string\",\"id\":3,\"text\":\"/src/loader.py\"}",
        "{\"def\":\"string\",\"id\":4,\"text\":\"prefetch\"}",
        "{\"def\":\"stack\",\"id\":1,\"native\":[],\"python\":[[1,2,12]]}",
        "{\"def\":\"stack\",\"id\":2,\"native\":[],\"python\":[[3,4,40],[1,2,9]]}",
    ];
    let defs: Vec<String> = defs.iter().map(|d| d.to_string()).collect();
    hand_log(pid, 2, &defs, &[(0x1000, 1000, 1), (0x2000, 3000, 2)])
}

/// The address of function `name` in the ELF file `file` (as `nm` reads it).
fn symbol(file: &Path, name: &str) -> u64 {
    let out = std::process::Command::new("nm").arg(file).output().expect("run nm");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            let (addr, _, sym) = (words.next()?, words.next()?, words.next()?);
            (sym == name).then(|| u64::from_str_radix(addr, 16).ok()).flatten()
        })
        .unwrap_or_else(|| panic!("no {name} in {}", file.display()))
}

/// A module definition line: `file` loaded at `base`.
fn module(id: u32, file: &Path, base: u64) -> String {
    format!(
        "{{\"def\":\"module\",\"id\":{id},\"path\":\"{}\",\"base\":\"{base:#x}\",\"start\":\"{base:#x}\",\
         \"end\":\"{:#x}\",\"build_id\":\"\"}}",
        file.display(),
        base + 0x10_0000
    )
}

#[test]
fn merge_reads_logs_gathered_elsewhere() {
    let a = scratch_dir("merge-a");
    let b = scratch_dir("merge-b");
    let fork = fakes().prog("prog_fork");
    let out = run_cupool(&["run", "-q", "--log-dir", path_str(&a), "--", path_str(&fork)], &a);
    assert_eq!(code(&out), 0, "{}", show(&out));
    std::fs::write(b.join("cupool.4242.json"), python_log(4242)).unwrap();

    let out = run_cupool(&["merge", path_str(&a), path_str(&b)], &a);
    assert_eq!(code(&out), 23, "{}", show(&out));
    let err = stderr_of(&out);
    assert!(err.contains("cupool: 3 process(es) checked\n"), "{err}");
    let want = "Direct leak of 3000 byte(s) in 1 allocation(s) allocated from:\n    \
                #0 prefetch /src/loader.py:40 [python]\n    #1 main /src/train.py:9 [python]\n  \
                in pid 4242 (rank 2): python train.py\n";
    assert!(err.contains(want), "{err}");
    assert!(err.contains("SUMMARY: cupool: 18443 byte(s) leaked in 4 allocation(s).\n"), "{err}");

    // A suppressions file of the user's: matched against Python files and
    // functions too, counted, and what it matches no longer fails the job.
    let supp = b.join("ci.supp");
    std::fs::write(&supp, "leak:loader.py\nleak:^main$\n").unwrap();
    let out = run_cupool(&["merge", "--suppressions", path_str(&supp), path_str(&b)], &b);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let err = stderr_of(&out);
    let used = format!(
        "Suppressions used:\n  count      bytes template\n      1       3000 loader.py ({0})\n      \
         1       1000 ^main$ ({0})\n",
        supp.display()
    );
    assert!(err.contains(&used) && err.contains("cupool: no leaks\n"), "{err}");

    // A foreign file and a log cut short beside the good one: the rest is
    // checked, the foreign file is named and the merge could not check it all.
    std::fs::write(b.join("cupool.1.json"), "this is not a log\n").unwrap();
    let text = python_log(4343);
    std::fs::write(b.join("cupool.4343.json"), &text[..text.find(",{\"seq\":2").unwrap()]).unwrap();
    let out = run_cupool(&["merge", "-o", "fail_on=none", path_str(&b)], &b);
    assert_eq!(code(&out), COULD_NOT_CHECK, "{}", show(&out));
    assert!(stderr_of(&out).contains("cupool merge: 1 log(s) could not be read (named above)"), "{}", show(&out));
    let err = stderr_of(&out);
    let foreign = format!("cupool: note: {}: not a cupool log", b.join("cupool.1.json").display());
    assert!(err.contains(&foreign) && err.contains("; not checked\n"), "{err}");
    assert!(err.contains("cupool: note: pid 4343: the log has no end record"), "{err}");
    assert!(err.contains("cupool: 2 process(es) checked\n"), "{err}");
}

#[test]
fn merge_without_anything_to_check_says_so() {
    let empty = scratch_dir("merge-empty");
    let junk = scratch_dir("merge-junk");
    std::fs::write(junk.join("cupool.5.json"), "{\"schema\":\"something-else\"}\n").unwrap();
    for (args, says) in [
        (vec!["merge", path_str(&empty)], "no cupool logs in this directory"),
        (vec!["merge", "/nonexistent/cupool-logs"], "/nonexistent/cupool-logs: No such file or directory (os error 2)"),
        (vec!["merge", path_str(&junk)], "1 log(s) could not be read (named above)"),
        (vec!["merge", "-o", "mode=pool", path_str(&junk)], "takes only the check's options"),
    ] {
        let out = run_cupool(&args, &empty);
        let want = if args[1] == "-o" { 2 } else { COULD_NOT_CHECK };
        assert_eq!(code(&out), want, "{args:?}: {}", show(&out));
        assert!(stderr_of(&out).contains(says), "{args:?}: {}", show(&out));
    }
}

#[test]
fn bad_input_is_refused_before_the_program_runs() {
    let dir = scratch_dir("check-bad");
    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());
    let bad_supp = dir.join("bad.supp");
    std::fs::write(&bad_supp, "leak:ok\nrace:whatever\n").unwrap();
    let missing = dir.join("missing.supp");
    let a_dir = dir.join("a-directory");
    std::fs::create_dir_all(&a_dir).unwrap();
    let cases: Vec<(Vec<String>, i32, String)> = vec![
        (
            vec!["--suppressions".into(), path_str(&missing).into()],
            COULD_NOT_CHECK,
            format!("cupool check: {}: cannot read the suppressions file", missing.display()),
        ),
        (
            vec!["--suppressions".into(), path_str(&bad_supp).into()],
            COULD_NOT_CHECK,
            format!("cupool check: {}:2: unsupported suppression type 'race'", bad_supp.display()),
        ),
        (
            vec!["--json".into(), "/nonexistent/dir/findings.json".into()],
            COULD_NOT_CHECK,
            "cupool check: /nonexistent/dir/findings.json: cannot write the report there".into(),
        ),
        (
            vec!["--sarif".into(), path_str(&a_dir).into()],
            COULD_NOT_CHECK,
            format!("cupool check: {}: is a directory", a_dir.display()),
        ),
        (vec!["-o".into(), "fail_on=leaks".into()], 2, "cupool check: -o fail_on=leaks: bad value 'leaks'".into()),
        (vec!["-o".into(), "log=0".into()], 2, "cupool check: log=0 writes no log".into()),
    ];
    for (flags, want, says) in cases {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let out = check(&dir, &flags, &["sh", "-c", &touch]);
        assert_eq!(code(&out), want, "{flags:?}: {}", show(&out));
        let err = stderr_of(&out);
        assert!(err.starts_with(&says) && err.lines().count() == 1, "{flags:?}: {err}");
        assert!(!marker.exists(), "{flags:?}: the program ran");
    }
    // A report path that works is not left behind as an empty file.
    let json = dir.join("findings.json");
    let out = check(&dir, &["--json", path_str(&json)], &["sh", "-c", &touch]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert!(marker.exists());
}

#[test]
fn a_log_that_cannot_be_read_fails_the_check() {
    let fork = path_str(&fakes().prog("prog_fork")).to_string();
    let dir = scratch_dir("check-unreadable");
    // Into the run's own directory, which the program finds in its CUPOOL_OPTIONS.
    let run_dir_of_program = r#"$(echo "$CUPOOL_OPTIONS" | tr : '\n' | sed -n 's/^log_dir=//p')"#;
    let script = format!("echo garbage > {run_dir_of_program}/cupool.1.json && {fork}");
    let out = check(&dir, &[], &["sh", "-c", &script]);
    assert_eq!(code(&out), COULD_NOT_CHECK, "the logs read are judged, but the check is incomplete: {}", show(&out));
    let junk = run_dir(&dir).canonicalize().unwrap().join("cupool.1.json");
    let err = stderr_of(&out);
    assert!(err.contains(&format!("cupool: note: {}: not a cupool log", junk.display())), "{err}");
    assert!(err.contains("cupool: 2 process(es) checked"), "{err}");
    assert!(err.contains("1 log(s) of this run could not be read (named above)"), "{err}");

    let dir = scratch_dir("check-unreadable-only");
    let out = check(&dir, &[], &["sh", "-c", &format!("echo garbage > {run_dir_of_program}/cupool.1.json")]);
    assert_eq!(code(&out), COULD_NOT_CHECK, "{}", show(&out));
    let err = stderr_of(&out);
    assert!(err.contains("1 log(s) of this run could not be read"), "{}", show(&out));
    assert!(!err.contains("no leaks"), "nothing was read, so nothing passes: {err}");

    // Files older than the run are not this run's (and another run's directory is not read at all).
    let junk = run_dir(&dir).join("cupool.1.json");
    let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options().write(true).open(&junk).unwrap().set_modified(an_hour_ago).unwrap();
    let out = check(&dir, &[], &[path_str(check_loop()), "10", "clean"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert!(!stderr_of(&out).contains("not a cupool log"), "an old file is not this run's: {}", show(&out));
}

#[test]
fn a_program_without_cuda_passes_and_says_so() {
    let dir = scratch_dir("check-nocuda");
    let out = check(&dir, &[], &[path_str(&fakes().prog("prog_nocuda")), "0"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let err = stderr_of(&out);
    assert!(
        err.contains("1 process(es) ran under cupool and none used CUDA memory, so there was nothing to check"),
        "{err}"
    );
    assert!(!err.contains("no leaks"), "{err}");
    assert!(std::fs::read_dir(&dir).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("cupool-ran")));
}

/// A program the shim never reached (here one that starts its work with
/// `LD_PRELOAD` taken out of the environment, as some launchers do) is not
/// a pass: nothing was checked.
#[test]
fn a_check_where_the_shim_never_loaded_could_not_check() {
    let dir = scratch_dir("check-not-loaded");
    let prog = path_str(check_loop());
    let out = check(&dir, &[], &["env", "-u", "LD_PRELOAD", prog, "10", "leak"]);
    assert_eq!(code(&out), COULD_NOT_CHECK, "{}", show(&out));
    let err = stderr_of(&out);
    assert!(err.contains("the shim was not loaded in any process of the program"), "{err}");
    assert!(!err.contains("no leaks"), "{err}");
    // `cupool run` says the same in its summary.
    let out =
        run_cupool(&["run", "--log-dir", path_str(&dir), "--", "env", "-u", "LD_PRELOAD", prog, "10", "clean"], &dir);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert!(stderr_of(&out).contains("cupool: the shim was not loaded in any process"), "{}", show(&out));
}

/// A gzipped log cut short (damaged on its way from another machine) is
/// named as such and fails the merge, rather than reading as a process
/// killed mid-run whose part of a log has no leaks.
#[test]
fn merge_names_a_truncated_gzipped_log_and_fails() {
    use std::io::Write as _;
    let dir = scratch_dir("merge-truncated");
    let out = check(&dir, &[], &[path_str(check_loop()), "10", "clean"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let run = run_dir(&dir);
    let log = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&std::fs::read(&log).unwrap()).unwrap();
    let bytes = gz.finish().unwrap();
    std::fs::remove_file(&log).unwrap();
    let dir = run;
    let cut = dir.join("cupool.77.json.gz");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let out = run_cupool(&["merge", path_str(&dir)], &dir);
    assert_eq!(code(&out), COULD_NOT_CHECK, "{}", show(&out));
    let err = stderr_of(&out);
    assert!(err.contains("cupool.77.json.gz") && err.contains("cut short"), "{err}");
    assert!(!err.contains("no leaks"), "{err}");
}

#[test]
fn python_processes_load_the_pytest_plugin() {
    let dir = scratch_dir("check-plugin");
    let mut cmd = cupool_command(
        &[
            "check",
            "--log-dir",
            path_str(&dir),
            "--",
            "sh",
            "-c",
            "echo \"plugins=$PYTEST_PLUGINS\"; echo \"path=$PYTHONPATH\"",
        ],
        &dir,
    );
    let out = cmd.env("PYTHONPATH", "/keep/me").env("PYTEST_PLUGINS", "xdist.plugin").output().unwrap();
    assert_eq!(code(&out), 0, "{}", show(&out));
    let stdout = stdout_of(&out);
    assert!(stdout.contains("plugins=xdist.plugin,cupool.pytest_plugin\n"), "{stdout}");
    let path = stdout.lines().find_map(|l| l.strip_prefix("path=")).unwrap().to_string();
    let parts: Vec<&str> = path.split(':').collect();
    let [site, first, rest] = parts[..] else { panic!("{path}") };
    assert_eq!(rest, "/keep/me");
    assert!(Path::new(site).join("sitecustomize.py").is_file(), "{site}: PyTorch's history (torch_history)");
    assert!(Path::new(first).join("cupool/pytest_plugin.py").is_file(), "{first}");
    assert!(Path::new(first).join("cupool/__init__.py").is_file(), "{first}");
    // Without any framework's history, no sitecustomize: the package alone goes first.
    let mut cmd = cupool_command(
        &[
            "check",
            "--log-dir",
            path_str(&dir),
            "-o",
            "torch_history=0",
            "-o",
            "jax_history_ms=0",
            "-o",
            "cupy_history=0",
            "--",
            "sh",
            "-c",
            "echo \"path=$PYTHONPATH\"",
        ],
        &dir,
    );
    let out = cmd.env("PYTHONPATH", "/keep/me").output().unwrap();
    assert_eq!(stdout_of(&out), format!("path={first}:/keep/me\n"), "{}", show(&out));

    if std::process::Command::new("python3").arg("--version").output().is_err() {
        eprintln!("no python3: the import itself is not tried");
        return;
    }
    // The package cupool check carries is the one Python imports (the plugin
    // module itself needs pytest, which loads it; tests/pytest_plugin.rs runs it).
    let out = check(&dir, &[], &["python3", "-c", "import cupool; print('package=' + cupool.__file__)"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert!(stdout_of(&out).contains(&format!("package={first}/cupool/__init__.py")), "{}", show(&out));
}

/// Needs allocation sites, which the shim records once native stack
/// capture is in: the leak is shown at its function, and what a library
/// named like PyTorch's keeps until exit is a known cache, not a leak.
#[test]
fn with_allocation_sites_leaks_show_their_frames_and_known_caches_pass() {
    let dir = scratch_dir("check-frames");
    let out = check(&dir, &[], &[path_str(check_loop()), "12", "leak"]);
    assert_eq!(code(&out), 23, "{}", show(&out));
    if !has_stacks(&dir) {
        eprintln!("the shim records no allocation sites yet: frames and known caches are not checked here");
        return;
    }
    let err = stderr_of(&out);
    let head =
        "Direct leak of 49152 byte(s) in 12 allocation(s) allocated from:\n    #0 leak_one_buffer (check_loop+0x";
    assert!(err.contains(head), "{err}");
    assert!(err.contains("Growing leak of 4096 byte(s) per phase") && err.contains("#0 leak_one_buffer"), "{err}");

    let lib_dir = scratch_dir("check-cache-lib");
    let mut args = vec!["-shared".to_string(), "-fPIC".to_string()];
    args.extend(link_fake_cudart());
    let lib = compile_c_file("libtorch_cuda.so", &fake_source_dir().join("check_cache_lib.c"), &args);
    let lib_dir_of = lib.parent().unwrap_or(&lib_dir).display().to_string();
    let mut args = vec![format!("-L{lib_dir_of}"), "-l:libtorch_cuda.so".into(), format!("-Wl,-rpath,{lib_dir_of}")];
    args.extend(link_fake_cudart());
    let prog = compile_fake_program("check_cache", "check_cache.c", &args);
    let dir = scratch_dir("check-cache");
    let out = check(&dir, &[], &[path_str(&prog)]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let err = stderr_of(&out);
    assert!(
        err.contains("cupool: held at exit by known caches: 2097152 byte(s) (2.0 MiB) in 1 allocation(s)"),
        "{err}"
    );
    assert!(err.contains("libtorch_cuda.so (default)"), "{err}");

    // `cupool run` lists the cache's memory as not freed, and says whose it is.
    let logs = dir.join("run-logs");
    let out = run_cupool(&["run", "--log-dir", path_str(&logs), "--", path_str(&prog)], &dir);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let err = stderr_of(&out);
    assert!(
        err.contains(
            "    of which 2.0 MiB in 1 allocation(s) held by known caches (libtorch_cuda.so): not leaks, and cupool \
             check leaves them out"
        ),
        "{err}"
    );
}

/// Native frames as the shim will record them, written by hand: the sites
/// are named from the module files on disk, grouped, matched by function
/// and by module, and a library named like PyTorch's is a known cache.
#[test]
fn merge_names_native_frames_from_the_module_files() {
    let prog = check_loop();
    let mut args = vec!["-shared".to_string(), "-fPIC".to_string()];
    args.extend(link_fake_cudart());
    let lib = compile_c_file("libtorch_cuda.so", &fake_source_dir().join("check_cache_lib.c"), &args);
    let (prog_base, lib_base) = (0x5555_0000_0000u64, 0x7f00_0000_0000u64);
    let at = |base: u64, file: &Path, f: &str| format!("\"{:#x}\"", base + symbol(file, f) + 5);
    let defs = vec![
        module(1, prog, prog_base),
        module(2, &lib, lib_base),
        format!(
            "{{\"def\":\"stack\",\"id\":1,\"native\":[{},{}],\"python\":[]}}",
            at(prog_base, prog, "leak_one_buffer"),
            at(prog_base, prog, "main")
        ),
        format!(
            "{{\"def\":\"stack\",\"id\":2,\"native\":[{},{}],\"python\":[]}}",
            at(lib_base, &lib, "cache_reserve"),
            at(prog_base, prog, "main")
        ),
    ];
    let dir = scratch_dir("merge-native");
    let leaks = [(0x1000, 4096, 1), (0x3000, 2 << 20, 2)];
    std::fs::write(dir.join("cupool.7.json"), hand_log(7, 0, &defs, &leaks)).unwrap();
    std::fs::write(dir.join("cupool.8.json"), hand_log(8, 1, &defs, &leaks)).unwrap();

    let out = run_cupool(&["merge", path_str(&dir)], &dir);
    assert_eq!(code(&out), 23, "{}", show(&out));
    let err = stderr_of(&out);
    let head = "Direct leak of 8192 byte(s) in 2 allocation(s) allocated from:\n    #0 leak_one_buffer (check_loop+0x";
    assert!(err.contains(head), "{err}");
    assert!(err.contains("    #1 main (check_loop+0x"), "{err}");
    assert!(err.contains("  in pid 7 (rank 0): python train.py\n  in pid 8 (rank 1): python train.py\n"), "{err}");
    let caches =
        "cupool: held at exit by known caches: 4194304 byte(s) (4.0 MiB) in 2 allocation(s) (libtorch_cuda.so); \
                  not leaks\n";
    assert!(err.contains(caches), "{err}");
    assert!(!err.contains("cache_reserve"), "a known cache is not listed: {err}");

    let supp = dir.join("mine.supp");
    std::fs::write(&supp, "leak:^leak_one_buffer$\n").unwrap();
    let out = run_cupool(&["merge", "--suppressions", path_str(&supp), path_str(&dir)], &dir);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert!(stderr_of(&out).contains(&format!("      2       8192 ^leak_one_buffer$ ({})\n", supp.display())));
}

#[test]
fn help_names_the_check_options_and_statuses() {
    for (command, program) in [("check", true), ("merge", false)] {
        let out = run_cupool(&[command, "--help"], &scratch_dir("check-help"));
        assert_eq!(code(&out), 0, "{}", show(&out));
        let help = stdout_of(&out);
        for option in ["exitcode", "max_leak_bytes", "fail_on", "growth_phases", "--suppressions", "--json", "--sarif"]
        {
            assert!(help.contains(option), "{command} --help lacks {option}: {help}");
        }
        assert!(help.contains("66 when cupool could not check"), "{help}");
        assert_eq!(help.contains("the program's own when it failed"), program, "{help}");
    }
}

/// The number in SUMMARY, the `--json` summary, the GitHub step summary and
/// the annotations' total are one number: each leaked allocation once,
/// although a loop that keeps a buffer per step is both a growth leak and an
/// exit leak of the same allocations.
#[test]
fn every_output_gives_the_same_number_for_a_leak_that_is_also_growth() {
    let dir = scratch_dir("check-one-number");
    let json = dir.join("findings.json");
    let step_summary = dir.join("step-summary.md");
    let prog = path_str(check_loop());
    let out = cupool_command(
        &[
            "check",
            "--log-dir",
            path_str(&dir.join("logs")),
            "--json",
            path_str(&json),
            "--",
            prog,
            "40",
            "leak",
            "mark",
        ],
        &dir,
    )
    .env("GITHUB_ACTIONS", "true")
    .env("GITHUB_STEP_SUMMARY", &step_summary)
    .env("GITHUB_WORKSPACE", &dir)
    .output()
    .expect("run cupool check");
    assert_eq!(code(&out), 23, "{}", show(&out));
    let err = stderr_of(&out);
    assert!(err.contains("Growing leak of 4096 byte(s) per phase"), "both kinds are reported: {err}");
    assert!(err.contains("Direct leak of 163840 byte(s) in 40 allocation(s)"), "{err}");
    // 40 steps keep 4 KiB each: 163,840 bytes in 40 allocations, counted once.
    assert!(err.contains("SUMMARY: cupool: 163840 byte(s) leaked in 40 allocation(s).\n"), "{err}");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let s = &doc["summary"];
    assert_eq!((s["failing_bytes"].as_u64(), s["failing_allocations"].as_u64()), (Some(163_840), Some(40)), "{s}");
    assert_eq!(s["fails"], true);
    let md = std::fs::read_to_string(&step_summary).unwrap();
    assert!(md.starts_with("### cupool check: 2 leak finding(s), 160.0 KiB\n"), "{md}");
    // Under the threshold the same number lets the job pass, and says so.
    let dir = scratch_dir("check-one-number-tolerated");
    let out = check(&dir, &["-o", "max_leak_bytes=163840"], &[prog, "40", "leak", "mark"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert!(
        stderr_of(&out).contains("cupool: 163840 byte(s) leaked, no more than max_leak_bytes=163840"),
        "{}",
        show(&out)
    );
}
