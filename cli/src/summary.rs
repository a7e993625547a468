//! One-screen summaries of cupool logs.

use cupool_core::log::{read_log, summarize, ExitRecord, Log, Summary};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Every log in `dir` written by the run tagged `run_id`, oldest process first.
pub fn logs_of_run(dir: &Path, run_id: &str) -> Vec<Log> {
    let mut logs: Vec<Log> =
        log_files(dir).iter().filter_map(|p| read_log(p).ok()).filter(|l| l.header.options.run_id == run_id).collect();
    logs.sort_by_key(|l| l.header.process.start_unix_ms);
    logs
}

fn log_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("cupool.") && (name.ends_with(".json") || name.ends_with(".json.gz"))
        })
        .collect();
    files.sort();
    files
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn exit_text(s: &Summary) -> String {
    match &s.exit {
        _ if !s.complete => "log cut short (killed?)".into(),
        Some(ExitRecord::Signal { name, .. }) => format!("killed by {name}"),
        Some(ExitRecord::Exit { status: Some(st) }) => format!("exit {st}"),
        Some(ExitRecord::Exit { status: None }) => "exit".into(),
        None => "?".into(),
    }
}

pub fn print_text(logs: &[Log], dir: &Path, out: &mut dyn Write) {
    let summaries: Vec<Summary> = logs.iter().map(summarize).collect();
    if summaries.is_empty() {
        let _ = writeln!(out, "cupool: no CUDA memory activity recorded (logs: {})", dir.display());
        return;
    }
    let _ = writeln!(out, "cupool: {} process(es) used CUDA memory; logs in {}", summaries.len(), dir.display());
    for s in &summaries {
        let mut cmd = s.cmdline.clone();
        if cmd.chars().count() > 40 {
            cmd = cmd.chars().take(37).collect::<String>() + "...";
        }
        let _ = writeln!(out, "  pid {:<8} {:<40} {}", s.pid, cmd, exit_text(s));
        for d in &s.devices {
            let _ = writeln!(
                out,
                "    device {:>2}: peak {:>10}  {} allocs, {} frees, {} failed",
                d.device,
                human_bytes(d.peak_bytes),
                d.allocs,
                d.frees,
                d.failures
            );
        }
        if s.host.allocs > 0 {
            let _ =
                writeln!(out, "    pinned host: peak {:>10}  {} allocs", human_bytes(s.host.peak_bytes), s.host.allocs);
        }
    }
    let total: u64 = summaries.iter().map(|s| s.leak_bytes).sum();
    let count: usize = summaries.iter().map(|s| s.leaks.len()).sum();
    if count == 0 {
        let _ = writeln!(out, "cupool: no leaks");
        return;
    }
    let _ = writeln!(out, "cupool: {} in {count} allocation(s) not freed:", human_bytes(total));
    // Identical leaks are grouped, LeakSanitizer style: "N bytes in M allocations".
    let mut groups: Vec<(u64, usize, String)> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for s in &summaries {
        for l in &s.leaks {
            let size = l.size;
            let at = match l.at.as_str() {
                "not finished" => "alive when killed",
                other => other,
            };
            let what = format!(
                "{:<8} {:<22} device {:<2} pid {:<8} at {at}",
                l.kind.as_str(),
                l.api.as_str(),
                l.device,
                s.pid
            );
            let key = format!("{size}|{what}");
            match index.get(&key) {
                Some(&i) => groups[i].1 += 1,
                None => {
                    index.insert(key, groups.len());
                    groups.push((size, 1, what));
                }
            }
        }
    }
    groups.sort_by_key(|(size, n, _)| std::cmp::Reverse(size * *n as u64));
    for (size, n, what) in groups.iter().take(8) {
        let amount = if *n == 1 { human_bytes(*size) } else { format!("{} x {n}", human_bytes(*size)) };
        let _ = writeln!(out, "    {amount:>16}  {what}");
    }
    if groups.len() > 8 {
        let _ = writeln!(out, "    ... and {} more kinds of leak (see the logs)", groups.len() - 8);
    }
}

pub fn report(paths: &[PathBuf], as_json: bool) -> ExitCode {
    let mut logs = Vec::new();
    let mut failed = false;
    for p in paths {
        let files = if p.is_dir() { log_files(p) } else { vec![p.clone()] };
        for f in files {
            match read_log(&f) {
                Ok(l) => logs.push(l),
                Err(e) => {
                    eprintln!("cupool: {e}");
                    failed = true;
                }
            }
        }
    }
    if as_json {
        let v: Vec<Summary> = logs.iter().map(summarize).collect();
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        let dir = paths.first().cloned().unwrap_or_default();
        print_text(&logs, &dir, &mut std::io::stdout());
    }
    if failed {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}
