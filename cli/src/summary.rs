//! One-screen summaries of cupool logs.

use crate::units::human_bytes;
use cupool_core::log::{read_log, ExitRecord, FenceCounters, MagazineRecord, MultiStreamBecause};
use cupool_core::model::{self, Process, Summary};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Every log in `dir` written by the run tagged `run_id`, ranks first, then
/// the other processes as they started.
pub fn logs_of_run(dir: &Path, run_id: &str) -> Vec<Process> {
    let logs = log_files(dir).into_iter().filter_map(|p| read_log(p).ok());
    model::processes(logs.filter(|l| l.header.options.run_id == run_id).collect())
}

/// The files in `dir` whose names `keep` accepts, sorted.
pub fn files_in(dir: &Path, keep: impl Fn(&str) -> bool) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && keep(p.file_name().and_then(|n| n.to_str()).unwrap_or("")))
        .collect();
    files.sort();
    Ok(files)
}

/// Whether `name` is that of a file a process writes beside its log,
/// `<stem>.<pid>.json` or `<stem>.<pid>.<n>.json`.
pub fn is_sidecar_name(name: &str, stem: &str) -> bool {
    name.strip_prefix(stem)
        .and_then(|r| r.strip_prefix('.'))
        .and_then(|r| r.strip_suffix(".json"))
        .is_some_and(|r| !r.is_empty() && r.split('.').all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())))
}

/// The files a process writes beside its log with names of `stem` in `dir`,
/// sorted (none when `dir` cannot be read).
pub fn sidecar_files(dir: &Path, stem: &str) -> Vec<PathBuf> {
    files_in(dir, |name| is_sidecar_name(name, stem)).unwrap_or_default()
}

/// "`path`: No such file or directory (os error 2)", as the system words
/// it for a path it was given to read.
pub fn not_found(path: &Path) -> String {
    format!("{}: {}", path.display(), std::io::Error::from_raw_os_error(libc::ENOENT))
}

pub fn is_log_name(name: &str) -> bool {
    name.starts_with("cupool.") && (name.ends_with(".json") || name.ends_with(".json.gz"))
}

fn log_files(dir: &Path) -> Vec<PathBuf> {
    files_in(dir, is_log_name).unwrap_or_default()
}

fn exit_text(s: &Summary) -> String {
    match &s.exit {
        _ if !s.complete => "killed, replaced by exec, or still running (the log has no end)".into(),
        Some(ExitRecord::Signal { name, .. }) => format!("killed by {name}"),
        Some(ExitRecord::Exit { status: Some(st) }) => format!("exit {st}"),
        Some(ExitRecord::Exit { status: None }) => "exit".into(),
        None => "?".into(),
    }
}

/// `argv` in at most `width` characters: the program's file name, then its
/// arguments, cut in the middle when too long so that the program name and
/// the last arguments both stay.
pub fn short_cmdline(argv: &[String], width: usize) -> String {
    let prog = argv.first().map(|a| a.rsplit('/').next().unwrap_or(a)).filter(|p| !p.is_empty()).unwrap_or("?");
    let full: String =
        std::iter::once(prog).chain(argv.iter().skip(1).map(String::as_str)).collect::<Vec<_>>().join(" ");
    let chars: Vec<char> = full.chars().collect();
    if chars.len() <= width {
        return full;
    }
    let keep = width.saturating_sub(3);
    let head = prog.chars().count().max(keep / 2).min(keep);
    let tail = keep - head;
    let mut s: String = chars[..head].iter().collect();
    s.push_str("...");
    s.extend(&chars[chars.len() - tail..]);
    s
}

/// When a leaked allocation was found live, in words.
fn when_text(at: &str) -> String {
    match at {
        "exit" => "live at exit".into(),
        "not finished" => "still live when the log stopped".into(),
        api => format!("live when {api} destroyed its context"),
    }
}

/// The text summary; `dir` is the log directory of a run (named when it holds logs).
pub fn print_text(processes: &[Process], dir: Option<&Path>, out: &mut dyn Write) {
    let summaries: Vec<(Summary, String)> =
        processes.iter().map(|p| (p.summary(), short_cmdline(&p.log.header.process.cmdline, 40))).collect();
    if summaries.is_empty() {
        let _ = writeln!(out, "cupool: no CUDA memory activity recorded, so no log was written");
        return;
    }
    let _ = write!(out, "cupool: {} process(es) used CUDA memory", summaries.len());
    match dir.filter(|d| d.is_dir()) {
        Some(d) => writeln!(out, "; logs in {}", d.display()),
        None => writeln!(out),
    }
    .ok();
    for ((s, cmd), p) in summaries.iter().zip(processes) {
        let log = &p.log;
        let _ = writeln!(out, "  pid {:<8} {:<40} {}", s.pid, cmd, exit_text(s));
        for d in &s.devices {
            if d.device < 0 && d.allocs == 0 && d.frees == 0 {
                if d.failures > 0 {
                    let _ = writeln!(
                        out,
                        "    {} allocation call(s) failed before reaching any device (no current context); \
                         nothing was allocated",
                        d.failures
                    );
                }
                continue;
            }
            let device = if d.device < 0 { "device  ?".to_string() } else { format!("device {:>2}", d.device) };
            let mut line =
                format!("    {device}: peak {:>10}  {} allocs, {} frees", human_bytes(d.peak_bytes), d.allocs, d.frees);
            if d.failures > 0 {
                line.push_str(&format!(
                    ", {} allocation(s) refused by CUDA (out of memory or a bad request)",
                    d.failures
                ));
            }
            let _ = writeln!(out, "{line}");
        }
        if s.host.allocs > 0 || s.host.failures > 0 {
            let mut line =
                format!("    pinned host: peak {:>10}  {} allocs", human_bytes(s.host.peak_bytes), s.host.allocs);
            if s.host.failures > 0 {
                line.push_str(&format!(", {} refused by CUDA", s.host.failures));
            }
            let _ = writeln!(out, "{line}");
        }
        for p in log.end.as_ref().map_or(&[][..], |e| &e.pools[..]) {
            if let Some(line) = wait_line(p.device, &p.fences, p.multi_stream_because) {
                let _ = writeln!(out, "{line}");
            }
            // A VMM-backed pool's driver work: the cost that backing adds.
            let Some(pg) = &p.pages else { continue };
            let c = &pg.costs;
            let ms = |ns: u64| ns as f64 / 1e6;
            let all = c.create_ns + c.map_ns + c.access_ns + c.unmap_ns + c.release_ns;
            let _ = writeln!(
                out,
                "    device {:>2} VMM pages: {} made, {} released, {} maps ({} moves), {} unmaps, {} grants",
                p.device, pg.creates, pg.releases, pg.maps, pg.remaps, pg.unmaps, pg.grants
            );
            let _ = writeln!(
                out,
                "    device {:>2} VMM cuMem*: {:.1} ms (create {:.1}, map {:.1}, access {:.1}, unmap {:.1}, release {:.1})",
                p.device,
                ms(all),
                ms(c.create_ns),
                ms(c.map_ns),
                ms(c.access_ns),
                ms(c.unmap_ns),
                ms(c.release_ns)
            );
            let b = &pg.at_peak;
            if b.reserved > 0 {
                let _ = write!(out, "{}", peak_line(p.device, b));
            }
        }
        if let Some(line) = log.end.as_ref().and_then(|e| e.magazines.as_ref()).and_then(magazine_line) {
            let _ = writeln!(out, "{line}");
        }
        // What cupool did differently in this process (a pool fallback, graph
        // allocations left untracked, Python it could not read).
        for note in log.end.as_ref().map_or(&[][..], |e| &e.notes[..]) {
            let _ = writeln!(out, "    note: {note}");
        }
    }
    let total: u64 = summaries.iter().map(|(s, _)| s.leak_bytes).sum();
    let count: usize = summaries.iter().map(|(s, _)| s.leaks.len()).sum();
    if count == 0 {
        let _ = writeln!(out, "cupool: no leaks");
        return;
    }
    let _ = writeln!(out, "cupool: {} in {count} allocation(s) not freed:", human_bytes(total));
    // Identical leaks are grouped, LeakSanitizer style: "N bytes in M allocations".
    let mut groups: Vec<(u64, usize, String)> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (s, _) in &summaries {
        for l in &s.leaks {
            let size = l.size;
            let device = if l.device < 0 { "?".to_string() } else { l.device.to_string() };
            let what = format!(
                "{:<8} {:<22} device {device:<2} pid {:<8} {}",
                l.kind.as_str(),
                l.api.as_str(),
                s.pid,
                when_text(&l.at)
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

/// The status of `cupool report` and `cupool replay` when there is nothing to
/// read or a file cannot be read as what it should be.
pub const EXIT_BAD_INPUT: u8 = 2;

/// Log files named by `path`: the file itself, or the cupool logs in a directory.
pub fn logs_named_by(path: &Path) -> Result<Vec<PathBuf>, String> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]); // reading it says what is wrong with it
    }
    let files =
        files_in(path, is_log_name).map_err(|e| format!("{}: cannot list the directory: {e}", path.display()))?;
    if files.is_empty() {
        return Err(format!("{}: no cupool logs in this directory (cupool.<pid>.json or .json.gz)", path.display()));
    }
    Ok(files)
}

/// Where a VMM pool's pages were at their peak, as one line, or two where
/// the figures make one too long for 100 columns. Parts that are 0 are left out.
fn peak_line(device: i32, b: &cupool_core::log::PagesAtPeak) -> String {
    let mut parts = vec![format!("{} in blocks", human_bytes(b.allocated))];
    if b.pending > 0 {
        parts.push(format!("{} freed, awaiting the GPU", human_bytes(b.pending)));
    }
    if b.idle > 0 {
        let cooling = if b.cooling > 0 { format!(" ({} cooling)", human_bytes(b.cooling)) } else { String::new() };
        parts.push(format!("{} idle{cooling}", human_bytes(b.idle)));
    }
    let head = format!("    device {device:>2} VMM peak {}: ", human_bytes(b.reserved));
    let one = format!("{head}{}\n", parts.join(", "));
    if one.chars().count() <= 101 {
        return one;
    }
    let last = parts.pop().unwrap_or_default();
    format!("{head}{},\n        {last}\n", parts.join(", "))
}

/// How long a pool held the program's threads back, waiting for the GPU
/// (`None`: it never did), and what made its freed blocks wait for fences.
fn wait_line(device: i32, f: &FenceCounters, because: Option<MultiStreamBecause>) -> Option<String> {
    // Time in a wait that failed counts too, though the wait does not.
    (f.waits + f.syncs > 0 || f.wait_ns > 0).then(|| {
        let why = because.map_or(String::new(), |b| format!("; freed blocks wait for fences: {}", because_text(b)));
        format!(
            "    device {device:>2} pool waited for the GPU: {:.1} ms ({} waits, {} synchronizations{why})",
            f.wait_ns as f64 / 1e6,
            f.waits,
            f.syncs
        )
    })
}

fn because_text(b: MultiStreamBecause) -> &'static str {
    match b {
        MultiStreamBecause::StreamCreated => "the program created a stream",
        MultiStreamBecause::SecondStream => "work went to a second stream",
        MultiStreamBecause::DriverThreads => "a second thread allocated through the driver API",
        MultiStreamBecause::BoundThread => "a second thread made a context current, no kernel launch seen",
        MultiStreamBecause::Unknown => "a reason this cupool does not know (a newer shim's log)",
    }
}

/// What threads' magazines did; said only where some served blocks. Frees
/// that overflowed are named: many of them mean fences complete too late
/// for the threads' pace (docs/options.md, option `magazines`).
fn magazine_line(m: &MagazineRecord) -> Option<String> {
    let served = m.own_frees_reused + m.stock_handed_out;
    if served == 0 {
        return None;
    }
    let mut line = format!(
        "    magazines: {} thread(s) served {served} small blocks, {:.1} % from their own frees, {} refills",
        m.threads,
        100.0 * m.own_frees_reused as f64 / served as f64,
        m.refills
    );
    if m.overflowed > 0 {
        line.push_str(&format!(", {} frees back to the pool before their fence completed", m.overflowed));
    }
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cupool_core::log::PagesAtPeak;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn command_lines_keep_the_program_name_and_the_end() {
        assert_eq!(short_cmdline(&argv(&["/usr/bin/python3", "train.py"]), 40), "python3 train.py");
        let long =
            argv(&["/opt/venv/bin/python", "train.py", "--epochs", "100", "--learning-rate", "0.001", "--out", "run7"]);
        let s = short_cmdline(&long, 40);
        assert_eq!(s.chars().count(), 40, "{s}");
        assert!(s.starts_with("python train.py") && s.ends_with("--out run7") && s.contains("..."), "{s}");
        let huge_name = argv(&["a-program-with-a-name-longer-than-the-whole-column-allows", "x"]);
        let s = short_cmdline(&huge_name, 40);
        assert!(s.starts_with("a-program-with-a-name-longer-than-the") && s.chars().count() == 40, "{s}");
        assert_eq!(short_cmdline(&[], 40), "?");
    }

    #[test]
    fn leak_times_are_worded() {
        assert_eq!(when_text("exit"), "live at exit");
        assert_eq!(when_text("not finished"), "still live when the log stopped");
        assert_eq!(when_text("cudaDeviceReset"), "live when cudaDeviceReset destroyed its context");
    }

    #[test]
    fn the_wait_line_gives_the_time_blocked_and_only_when_the_pool_waited() {
        let idle = FenceCounters { recorded: 9, gpu_barriers: 3, ..Default::default() };
        assert_eq!(wait_line(0, &idle, Some(MultiStreamBecause::StreamCreated)), None);
        let f = FenceCounters { waits: 7, syncs: 1, wait_ns: 12_345_678, ..Default::default() };
        assert_eq!(
            wait_line(3, &f, None).as_deref(),
            Some("    device  3 pool waited for the GPU: 12.3 ms (7 waits, 1 synchronizations)")
        );
        assert_eq!(
            wait_line(3, &f, Some(MultiStreamBecause::BoundThread)).as_deref(),
            Some(
                "    device  3 pool waited for the GPU: 12.3 ms (7 waits, 1 synchronizations; freed blocks wait for \
                 fences: a second thread made a context current, no kernel launch seen)"
            )
        );
        // Only a wait that failed: its time still shows.
        let failed = FenceCounters { wait_ns: 2_000_000, ..Default::default() };
        assert!(wait_line(0, &failed, None).is_some_and(|l| l.contains("2.0 ms (0 waits")));
    }

    #[test]
    fn the_magazine_line_names_overflow_only_when_there_was_some() {
        assert_eq!(magazine_line(&MagazineRecord { threads: 2, ..Default::default() }), None);
        let m = MagazineRecord { threads: 8, own_frees_reused: 900, stock_handed_out: 100, refills: 7, overflowed: 0 };
        assert_eq!(
            magazine_line(&m).as_deref(),
            Some("    magazines: 8 thread(s) served 1000 small blocks, 90.0 % from their own frees, 7 refills")
        );
        let late = MagazineRecord { overflowed: 40, ..m };
        assert!(magazine_line(&late)
            .is_some_and(|l| l.ends_with(", 40 frees back to the pool before their fence completed")));
    }

    #[test]
    fn the_peak_line_leaves_out_zeros_and_wraps_before_100_columns() {
        let mib = 1 << 20;
        let quiet = PagesAtPeak { reserved: 8 * mib, allocated: 8 * mib, ..Default::default() };
        assert_eq!(peak_line(0, &quiet), "    device  0 VMM peak 8.0 MiB: 8.0 MiB in blocks\n");
        let odd = 1000 * mib + 12345;
        let busy = PagesAtPeak { reserved: odd, allocated: odd, pending: odd, idle: odd, cooling: odd };
        let text = peak_line(12, &busy);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.lines().all(|l| l.chars().count() <= 100), "{text}");
        assert!(text.contains("freed, awaiting the GPU") && text.contains("cooling)"), "{text}");
    }
}
