//! `cupool run -- CMD ARGS...`

use crate::summary;
use clap::Args;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};

#[derive(Args)]
pub struct RunArgs {
    /// Directory for the logs (one cupool.<pid>.json per process).
    #[arg(long, default_value = "cupool-logs")]
    log_dir: PathBuf,
    /// pool | passthrough.
    #[arg(long)]
    mode: Option<String>,
    /// Keep only failures, checkpoints and the leak report, not every alloc/free.
    #[arg(long)]
    no_trace: bool,
    /// Per-device byte cap, e.g. 16g.
    #[arg(long)]
    limit: Option<String>,
    /// Any other option as key=value (see below); may be repeated.
    #[arg(short = 'o', long = "option", value_name = "KEY=VALUE")]
    options: Vec<String>,
    /// Print no summary at the end.
    #[arg(short, long)]
    quiet: bool,
    /// Say which libcupool.so is preloaded and where it was found.
    #[arg(short, long)]
    verbose: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

pub fn options_help() -> String {
    let mut s = String::from("Options travel to the shim in CUPOOL_OPTIONS=key=value:key=value (flags override it):\n");
    for (key, default, what) in cupool_core::options::OPTION_HELP {
        s.push_str(&format!("  {key:<10} default {default:<12} {what}\n"));
    }
    s
}

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        unsafe { libc::kill(pid, sig) };
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_owned()
    } else {
        std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_owned())
    }
}

pub fn run(args: RunArgs) -> ExitCode {
    let shim = match crate::shim::locate() {
        Ok(s) => {
            if args.verbose {
                eprintln!("cupool: preloading {} ({})", s.path.display(), s.origin);
            }
            s.path
        }
        Err(e) => {
            eprintln!("cupool: {e}");
            return ExitCode::from(125);
        }
    };
    let log_dir = absolute(&args.log_dir);
    let run_id = format!("{:x}-{:x}", std::process::id(), cupool_core_time_ns());
    let mut opts: Vec<String> = std::env::var("CUPOOL_OPTIONS").ok().into_iter().filter(|s| !s.is_empty()).collect();
    opts.push(format!("log_dir={}", log_dir.display()));
    opts.push(format!("run_id={run_id}"));
    if let Some(m) = &args.mode {
        opts.push(format!("mode={m}"));
    }
    if args.no_trace {
        opts.push("trace=0".into());
    }
    if let Some(l) = &args.limit {
        opts.push(format!("limit={l}"));
    }
    opts.extend(args.options.iter().cloned());
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(existing) if !existing.trim().is_empty() => {
            format!("{existing}:{}", absolute(&shim).display())
        }
        _ => absolute(&shim).display().to_string(),
    };

    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]).env("LD_PRELOAD", preload).env("CUPOOL_OPTIONS", opts.join(":"));
    unsafe {
        // The terminal's ^C reaches the child directly; cupool waits and reports.
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, forward as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGHUP, forward as extern "C" fn(libc::c_int) as libc::sighandler_t);
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
    // A SIGTERM that arrives before the child's pid is known must wait, not be lost.
    let mut forwarded: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut forwarded);
        libc::sigaddset(&mut forwarded, libc::SIGTERM);
        libc::sigaddset(&mut forwarded, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &forwarded, std::ptr::null_mut());
    }
    let spawned = cmd.spawn();
    if let Ok(c) = &spawned {
        CHILD.store(c.id() as i32, Ordering::Relaxed);
    }
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &forwarded, std::ptr::null_mut()) };
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cupool: cannot run {}: {e}", args.command[0]);
            return ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 });
        }
    };
    let status = loop {
        match child.wait() {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("cupool: waiting for the child failed: {e}");
                return ExitCode::from(125);
            }
        }
    };
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    if !args.quiet {
        let logs = summary::logs_of_run(&log_dir, &run_id);
        summary::print_text(&logs, &log_dir, &mut std::io::stderr());
    }
    ExitCode::from(code as u8)
}

fn cupool_core_time_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}
