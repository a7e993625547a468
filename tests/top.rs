//! `cupool top` watching programs that run under the shim against the fake
//! CUDA runtime: in a real terminal (tmux), read back from the screen as a
//! person sees it, and through a pipe.
//! `cargo test --release --test top`
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;
use support::*;

/// `tests/fake/top_grow.c`: 1 MiB every STEP_MS, kept, then 4 KiB and a sleep.
fn top_grow() -> &'static Path {
    static PROG: OnceLock<PathBuf> = OnceLock::new();
    PROG.get_or_init(|| compile_fake_program("top_grow", "top_grow.c", &link_fake_cudart()))
}

/// Whether tmux is here; without it the terminal test is skipped, unless
/// `CUPOOL_REQUIRE_BROWSER_AND_TERMINAL=1` (what `.ci/run` sets, having
/// installed it) makes that a failure.
fn have_tmux() -> bool {
    let ok = Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CUPOOL_REQUIRE_BROWSER_AND_TERMINAL").is_none_or(|v| v != "1"),
            "tmux is not installed (apt-get install -y tmux)"
        );
        eprintln!("SKIPPED: tmux is not installed here (apt-get install -y tmux); the terminal test did not run");
    }
    ok
}

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).stdin(Stdio::null()).output().expect("run tmux");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The screen of tmux session `s` as text.
fn screen(s: &str) -> String {
    tmux(&["capture-pane", "-p", "-t", s])
}

/// Waits up to `limit` for the screen of `s` to satisfy `ok`; the screen seen last.
fn screen_until(s: &str, limit: Duration, ok: impl Fn(&str) -> bool) -> (bool, String) {
    let mut last = String::new();
    let found = poll_for(limit, || {
        last = screen(s);
        ok(&last).then_some(())
    });
    (found.is_some(), last)
}

/// The row of device 0 in the figures of `pid` on a screen, as its columns:
/// device, live, rate, reserved, rate, peak live, peak reserved, live
/// allocations, refused (a figure and its unit are one column).
fn device_row(text: &str, pid: u32) -> Option<Vec<String>> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with(&format!("pid {pid} ")));
    lines.next()?;
    let row = lines.find(|l| l.trim_start().starts_with("0 "))?;
    let mut columns: Vec<String> = Vec::new();
    for word in row.split_whitespace() {
        let unit = ["B", "KiB", "MiB", "GiB", "TiB"].iter().any(|u| word == *u || word == format!("{u}/s"));
        match columns.last_mut() {
            Some(last) if unit => {
                last.push(' ');
                last.push_str(word);
            }
            _ => columns.push(word.to_string()),
        }
    }
    Some(columns)
}

/// Kills the tmux session when the test ends, however it ends.
struct Session(String);

impl Drop for Session {
    fn drop(&mut self) {
        tmux(&["kill-session", "-t", &self.0]);
    }
}

#[test]
fn top_in_a_terminal_follows_a_growing_program_sees_it_killed_and_quits_cleanly() {
    if !have_tmux() {
        return;
    }
    let dir = scratch_dir("top-tmux");
    let logs = dir.join("logs");
    // 40 steps of 1 MiB, 100 ms apart: 10 MiB/s for 4 s.
    let mut cmd = preloaded_command(top_grow(), &["40", "100", "60"], &logs, "flush_ms=50");
    cmd.stdout(Stdio::piped());
    let mut child = cmd.spawn().expect("start top_grow");
    let pid = child.id();
    let name = format!("cupool-top-test-{}", std::process::id());
    let session = Session(name.clone());
    let command = format!("{} top -d 0.3 {}; echo TOP-EXITED $?; sleep 60", cli().display(), logs.display());
    tmux(&["new-session", "-d", "-s", &name, "-x", "130", "-y", "40", &command]);

    // While it grows: live memory climbs at about 10 MiB/s.
    let (seen, text) = screen_until(&name, Duration::from_secs(20), |t| {
        device_row(t, pid).is_some_and(|r| r.len() == 9 && r[2].starts_with('+') && r[2].ends_with("MiB/s"))
    });
    assert!(seen, "no growing figures for pid {pid} on the screen:\n{text}");
    let row = device_row(&text, pid).unwrap();
    let rate: f64 = row[2].trim_start_matches('+').trim_end_matches(" MiB/s").parse().unwrap_or(0.0);
    assert!((4.0..=16.0).contains(&rate), "10 MiB/s expected, the screen says {}:\n{text}", row[2]);
    assert!(text.contains("running"), "{text}");
    assert!(text.contains("grow_buffers (top_grow)"), "the site holding the most:\n{text}");

    // When it is done growing: 40 MiB and 4 KiB live, 41 allocations.
    let want_live = "40.0 MiB";
    let (seen, text) = screen_until(&name, Duration::from_secs(30), |t| {
        device_row(t, pid).is_some_and(|r| r[1] == "40.0 MiB" && r[2] == "0 B/s")
    });
    assert!(seen, "no {want_live} live, steady, on the screen:\n{text}");
    let row = device_row(&text, pid).unwrap();
    assert_eq!(row[7], "41", "live allocations: {row:?}");
    let sites: Vec<&str> =
        text.lines().skip_while(|l| !l.contains("top sites by live bytes")).skip(1).take(2).collect();
    assert!(
        sites[0].contains("40.0 MiB") && sites[0].contains("40x") && sites[0].contains("grow_buffers"),
        "{sites:?}"
    );
    assert!(sites[1].contains("4.0 KiB") && sites[1].contains("keep_small"), "{sites:?}");

    // Killed: the log has no end, the process is gone.
    send_signal(pid, libc::SIGKILL);
    let status = child.wait().unwrap();
    assert!(!status.success());
    let (seen, text) = screen_until(&name, Duration::from_secs(10), |t| t.contains("without an end record (killed)"));
    assert!(seen, "the killed process is not shown as such:\n{text}");
    assert!(device_row(&text, pid).is_some_and(|r| r[1] == "40.0 MiB"), "its last figures stay:\n{text}");

    // q quits at once, with status 0, and gives back the screen it found.
    tmux(&["send-keys", "-t", &name, "q"]);
    let (seen, text) = screen_until(&name, Duration::from_secs(5), |t| t.contains("TOP-EXITED"));
    assert!(seen, "top did not quit on q:\n{text}");
    assert!(text.contains("TOP-EXITED 0"), "{text}");
    assert!(!text.contains("cupool top:"), "the other screen was left:\n{text}");
    drop(session);
}

#[test]
fn top_through_a_pipe_prints_plain_frames_of_what_is_live() {
    let dir = scratch_dir("top-pipe");
    let logs = dir.join("logs");
    let cmd = preloaded_command(fakes().prog("prog_sleep").as_path(), &["60"], &logs, "flush_ms=50");
    let (mut child, _) = spawn_until(cmd, "ready");
    let pid = child.id();
    assert!(wait_for_flushed(&logs, "alloc", 50), "the log has its 50 allocations");
    // A second process whose log ended before top started is an old run's: not shown.
    let old = dir.join("logs/old");
    run_preloaded(&fakes().prog("prog_runtime"), &[], &old, "");
    let past = std::time::SystemTime::now() - Duration::from_secs(600);
    for f in std::fs::read_dir(&old).unwrap().flatten() {
        let file = std::fs::File::options().append(true).open(f.path()).unwrap();
        file.set_modified(past).unwrap();
    }
    let out = run_cupool(&["top", "-n", "2", "-d", "0.2", path_str(&logs)], &dir);
    send_signal(pid, libc::SIGKILL);
    let _ = child.wait();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let text = stdout_of(&out);
    assert!(!text.contains('\u{1b}'), "no escapes through a pipe: {text:?}");
    let frames: Vec<&str> = text.split("cupool top: ").skip(1).collect();
    assert_eq!(frames.len(), 2, "{text}");
    for f in &frames {
        assert!(f.contains("1 process(es), 1 running"), "{f}");
        let f = &format!("cupool top: {f}");
        let row = device_row(f, pid).unwrap_or_else(|| panic!("no figures of pid {pid}:\n{f}"));
        assert_eq!(row[1], "200.0 KiB", "50 x 4 KiB live: {f}");
        assert_eq!(row[7], "50", "{f}");
        assert!(f.contains("200.0 KiB     50x  main prog_sleep.c:"), "{f}");
    }
    // Rates need two looks: the second frame has them, and nothing changed.
    assert_eq!(device_row(frames[0], pid).unwrap()[2], "-", "{}", frames[0]);
    assert_eq!(device_row(frames[1], pid).unwrap()[2], "0 B/s", "{}", frames[1]);

    // With --all, the old run is there too; a path that does not exist is an error.
    let out = run_cupool(&["top", "-n", "1", "--all", path_str(&logs)], &dir);
    assert!(stdout_of(&out).contains("2 process(es), 0 running"), "{}", stdout_of(&out));
    let out = run_cupool(&["top", "-n", "1", path_str(&dir.join("nope"))], &dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_of(&out).contains("No such file or directory (os error 2)"), "{}", stderr_of(&out));
}
