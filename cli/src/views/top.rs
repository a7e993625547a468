//! `cupool top`: what the programs running under cupool hold now, in the
//! terminal, refreshed while they run (py-spy's `top` and nvtop are the
//! anchors). Per process and device: the bytes live and reserved, how fast
//! each changes, their peaks, and the sites holding the most live bytes.
//!
//! It reads the logs as the shim writes them (a line per event, flushed
//! every `flush_ms`): each file is followed from where the last look ended,
//! only its new whole lines are parsed, and they feed the core's model of a
//! log still being written (`model::Following`: the same live table and
//! figures as every other view, without history). Nothing is sent to the
//! program and nothing waits on it; top runs at a lower CPU priority. It
//! needs no browser: plain text with a few cursor movements, which any
//! terminal over ssh shows. `q` or Ctrl-C quits and gives the terminal back
//! as it was.

use crate::sites::{self, Resolver, ShownFrame};
use crate::summary::{is_log_name, short_cmdline};
use crate::units::human_bytes;
use clap::Args;
use cupool_core::log::{header_line, line_of, ExitRecord, LogLine};
use cupool_core::model::Following;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Seconds between refreshes.
    #[arg(short = 'd', long, value_name = "SECS", default_value_t = 1.0)]
    pub delay: f64,
    /// Draw this many frames, then exit (0: until q or Ctrl-C).
    #[arg(short = 'n', long, value_name = "N", default_value_t = 0)]
    pub iterations: u64,
    /// Sites shown per process and device, by bytes live now.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub sites: usize,
    /// Also show processes whose logs ended before top started.
    #[arg(long)]
    pub all: bool,
    /// Log files or directories to watch (a directory: every cupool log in it
    /// and below it, including those that appear later). Default: ./cupool-logs.
    #[arg(value_name = "PATHS")]
    pub paths: Vec<PathBuf>,
}

/// Subdirectories followed below a directory given (one per run, rank or machine).
const MAX_DEPTH: usize = 4;
/// The most bytes of one log read per refresh: a long log already written
/// is caught up over a few refreshes, and the screen keeps moving.
const READ_PER_REFRESH: u64 = 64 << 20;
/// A log not written to for this long before top started, of a process
/// that is gone, is an old run's: left out unless `--all`.
const STALE: Duration = Duration::from_secs(5);
/// Rates are taken over about this much wall-clock time.
const RATE_WINDOW: Duration = Duration::from_secs(3);

/// How a followed process stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    Running,
    /// The log has its end record.
    Ended(ExitRecord),
    /// No end record, and the process is gone (killed).
    Gone,
}

/// One log being followed.
struct Followed {
    path: PathBuf,
    pid: u32,
    offset: u64,
    /// The bytes after the last whole line read.
    partial: Vec<u8>,
    model: Option<Following>,
    resolver: Option<Resolver>,
    /// Frames of the sites shown, by stack id: a site's frames never change.
    frames: HashMap<u32, Vec<ShownFrame>>,
    /// (when, allocated, reserved) per device at the last refreshes, for the rates.
    history: BTreeMap<i32, VecDeque<(Instant, u64, u64)>>,
    /// Why the file cannot be followed, once that is known.
    problem: Option<String>,
}

impl Followed {
    fn new(path: PathBuf) -> Followed {
        let pid = pid_of(&path).unwrap_or(0);
        Followed {
            path,
            pid,
            offset: 0,
            partial: Vec::new(),
            model: None,
            resolver: None,
            frames: HashMap::new(),
            history: BTreeMap::new(),
            problem: None,
        }
    }

    /// Reads what the log gained since the last look and feeds its whole lines to the model.
    fn read_new(&mut self) {
        if self.problem.is_some() || self.model.as_ref().is_some_and(|m| m.end().is_some()) {
            return;
        }
        let Ok(mut file) = std::fs::File::open(&self.path) else { return };
        let len = file.metadata().map_or(0, |m| m.len());
        if len < self.offset {
            // Written anew under the same name (a pid used again): start over.
            *self = Followed::new(std::mem::take(&mut self.path));
        }
        if len == self.offset || file.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut fresh = Vec::new();
        if (&mut file).take(READ_PER_REFRESH).read_to_end(&mut fresh).is_err() {
            return;
        }
        if self.offset == 0 && fresh.starts_with(&[0x1f, 0x8b]) {
            self.problem = Some("gzipped: a finished log (cupool report reads it)".into());
            return;
        }
        self.offset += fresh.len() as u64;
        self.partial.extend_from_slice(&fresh);
        let Some(last_newline) = self.partial.iter().rposition(|&b| b == b'\n') else { return };
        let whole: Vec<u8> = self.partial.drain(..=last_newline).collect();
        let text = String::from_utf8_lossy(&whole);
        let mut events = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let Some(model) = &mut self.model else {
                match header_line(line) {
                    Ok(header) => {
                        let log = cupool_core::log::Log {
                            path: self.path.clone(),
                            header: header.clone(),
                            events: Vec::new(),
                            definitions: Vec::new(),
                            end: None,
                        };
                        self.resolver = Some(Resolver::new(&log));
                        self.model = Some(Following::new(header));
                    }
                    Err(e) => {
                        self.problem = Some(format!("{e:?}"));
                        return;
                    }
                }
                continue;
            };
            match line_of(line, model.header().version) {
                Ok(LogLine::Event(e)) => events.push(e),
                Ok(LogLine::Definition(d)) => {
                    if let Some(r) = &mut self.resolver {
                        r.add(&d);
                    }
                }
                Ok(LogLine::End(end)) => {
                    feed(model, &mut events);
                    if let Some(end) = end {
                        model.finish(end);
                    }
                    return;
                }
                // A line cut short by a killed process, or one this cupool cannot read: skipped.
                Err(_) => {}
            }
        }
        if let Some(model) = &mut self.model {
            feed(model, &mut events);
        }
    }

    fn state(&self) -> State {
        match self.model.as_ref().and_then(Following::end) {
            Some(end) => State::Ended(end.exit.clone()),
            None if self.pid != 0 && !alive(self.pid) => State::Gone,
            None => State::Running,
        }
    }

    /// Notes the figures now, for the rates.
    fn remember(&mut self, now: Instant) {
        let Some(model) = &self.model else { return };
        for d in model.devices() {
            let s = d.now();
            let h = self.history.entry(d.device).or_default();
            h.push_back((now, s.allocated, s.reserved));
            while h.len() > 2 && h.get(1).is_some_and(|&(t, ..)| now.duration_since(t) >= RATE_WINDOW) {
                h.pop_front();
            }
        }
    }

    /// Bytes per second of allocated and reserved memory on `device`, once there are two looks.
    fn rates(&self, device: i32) -> Option<(f64, f64)> {
        let h = self.history.get(&device)?;
        let (&(t0, a0, r0), &(t1, a1, r1)) = (h.front()?, h.back()?);
        let dt = t1.duration_since(t0).as_secs_f64();
        (dt > 0.0).then(|| ((a1 as f64 - a0 as f64) / dt, (r1 as f64 - r0 as f64) / dt))
    }
}

/// Events of one read, in `seq` order (each flush is; a read may end inside one).
fn feed(model: &mut Following, events: &mut Vec<cupool_core::log::EventRecord>) {
    events.sort_by_key(|e| e.seq);
    for e in events.drain(..) {
        model.event(&e);
    }
}

/// The pid in a log's name, `cupool.<pid>.json` or `cupool.<pid>.<n>.json`.
fn pid_of(path: &Path) -> Option<u32> {
    path.file_name()?.to_str()?.strip_prefix("cupool.")?.split('.').next()?.parse().ok()
}

fn alive(pid: u32) -> bool {
    // Signal 0 checks that the process exists; EPERM says it does, someone else's.
    // SAFETY: kill with signal 0 sends nothing; it only reads the process table.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The log files `path` stands for now.
fn logs_of(path: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if !path.is_dir() {
        if path.is_file() {
            out.push(path.to_owned());
        }
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else { return };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        // A link to a run directory (`latest`) names a run already listed.
        if p.is_symlink() && p.is_dir() {
            continue;
        }
        if p.is_dir() {
            if depth < MAX_DEPTH {
                logs_of(&p, depth + 1, out);
            }
        } else if p.file_name().and_then(|n| n.to_str()).is_some_and(is_log_name) {
            out.push(p);
        }
    }
}

/// Everything top watches.
struct Watch {
    paths: Vec<PathBuf>,
    all: bool,
    started: SystemTime,
    followed: Vec<Followed>,
    /// Files left out as an old run's (looked at again when they change).
    stale: HashMap<PathBuf, SystemTime>,
}

impl Watch {
    fn new(paths: Vec<PathBuf>, all: bool) -> Watch {
        Watch { paths, all, started: SystemTime::now(), followed: Vec::new(), stale: HashMap::new() }
    }

    /// Picks up new logs and reads what every log gained.
    fn refresh(&mut self) {
        let mut files = Vec::new();
        for p in &self.paths {
            logs_of(p, 0, &mut files);
        }
        for f in files {
            if self.followed.iter().any(|x| x.path == f) {
                continue;
            }
            let modified = std::fs::metadata(&f).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
            if self.stale.get(&f) == Some(&modified) {
                continue;
            }
            let old = modified + STALE < self.started;
            if !self.all && old && !pid_of(&f).is_some_and(alive) {
                self.stale.insert(f, modified);
                continue;
            }
            self.stale.remove(&f);
            self.followed.push(Followed::new(f));
        }
        let now = Instant::now();
        for f in &mut self.followed {
            f.read_new();
            f.remember(now);
        }
    }
}

/// One frame of the display, `width` columns at most and about `height` lines.
fn draw(watch: &mut Watch, sites_n: usize, width: usize, height: usize, delay: f64) -> Vec<String> {
    let mut lines = Vec::new();
    let paths: Vec<String> = watch.paths.iter().map(|p| p.display().to_string()).collect();
    let running = watch.followed.iter().filter(|f| f.state() == State::Running).count();
    lines.push(format!(
        "cupool top: {}  {} process(es), {running} running  every {delay:.1} s  q or Ctrl-C quits",
        paths.join(" "),
        watch.followed.iter().filter(|f| f.model.is_some()).count()
    ));
    if watch.followed.is_empty() {
        lines.push(String::new());
        lines.push("no cupool logs being written yet (start a program with cupool run, or name its --log-dir)".into());
    }
    // Running processes first, each group in the order they started.
    let mut order: Vec<usize> = (0..watch.followed.len()).collect();
    order.sort_by_key(|&i| {
        let f = &watch.followed[i];
        let start = f.model.as_ref().map_or(0, |m| m.header().process.start_unix_ms);
        (f.state() != State::Running, start, f.pid)
    });
    let mut hidden = 0;
    for i in order {
        if lines.len() + 3 > height {
            hidden += 1;
            continue;
        }
        process_lines(&mut watch.followed[i], sites_n, width, &mut lines);
    }
    if hidden > 0 {
        lines.push(format!("... and {hidden} more process(es) (a taller terminal shows them)"));
    }
    lines.iter().map(|l| cut(l, width)).collect()
}

fn rate(r: Option<f64>) -> String {
    match r {
        None => "-".into(),
        Some(r) if r.abs() < 0.5 => "0 B/s".into(),
        Some(r) => format!("{}{}/s", if r < 0.0 { "-" } else { "+" }, human_bytes(r.abs() as u64)),
    }
}

fn process_lines(f: &mut Followed, sites_n: usize, width: usize, lines: &mut Vec<String>) {
    let state = f.state();
    let Some(model) = &f.model else {
        if let Some(p) = &f.problem {
            lines.push(String::new());
            lines.push(format!("{}: {p}", f.path.display()));
        }
        return;
    };
    let process = &model.header().process;
    let rank = process.rank.map(|r| format!(" (rank {r})")).unwrap_or_default();
    let now_ms = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let secs = match (&state, model.end()) {
        (State::Running, _) => now_ms.saturating_sub(process.start_unix_ms) as f64 / 1e3,
        (_, Some(end)) => end.duration_ms as f64 / 1e3,
        _ => model.last_t() as f64 / 1e9,
    };
    let how = match &state {
        State::Running => format!("running, {secs:.1} s"),
        State::Ended(ExitRecord::Exit { status: Some(s) }) => format!("exited with status {s} after {secs:.1} s"),
        State::Ended(ExitRecord::Exit { status: None }) => format!("exited after {secs:.1} s"),
        State::Ended(ExitRecord::Signal { name, .. }) => format!("ended by {name} after {secs:.1} s"),
        State::Gone => format!("gone after {secs:.1} s without an end record (killed)"),
    };
    let phase = model.phase().map(|p| format!("  phase: {}", cut(p, 30))).unwrap_or_default();
    lines.push(String::new());
    let head = format!("pid {}{rank}  {how}{phase}  ", process.pid);
    let room = width.saturating_sub(head.chars().count()).max(20);
    lines.push(format!("{head}{}", short_cmdline(&process.cmdline, room)));
    let devices: Vec<_> = model.devices().filter(|d| d.allocs > 0 || d.failures > 0).collect();
    if devices.is_empty() {
        lines.push("  no device memory yet".into());
        return;
    }
    lines.push(format!(
        "  {:<6} {:>11} {:>13} {:>11} {:>13} {:>11} {:>11} {:>8} {:>8}",
        "device", "live", "rate", "reserved", "rate", "peak live", "peak resvd", "live #", "refused"
    ));
    let mut live_by_site: BTreeMap<(i32, Option<u32>), (u64, u64)> = BTreeMap::new();
    for a in model.live().filter(|a| !a.is_host()) {
        let s = live_by_site.entry((a.device, a.stack)).or_default();
        s.0 += a.size;
        s.1 += 1;
    }
    let mut wanted = Vec::new();
    for d in &devices {
        let now = d.now();
        let (ra, rr) = f.rates(d.device).map_or((None, None), |(a, r)| (Some(a), Some(r)));
        let name = if d.device < 0 { "?".to_string() } else { d.device.to_string() };
        lines.push(format!(
            "  {name:<6} {:>11} {:>13} {:>11} {:>13} {:>11} {:>11} {:>8} {:>8}",
            human_bytes(now.allocated),
            rate(ra),
            human_bytes(now.reserved),
            rate(rr),
            human_bytes(d.peak_allocated.bytes),
            human_bytes(d.peak_reserved.bytes),
            d.live_count,
            d.failures
        ));
        let mut top: Vec<(Option<u32>, u64, u64)> =
            live_by_site.range((d.device, None)..=(d.device, Some(u32::MAX))).map(|(k, v)| (k.1, v.0, v.1)).collect();
        top.sort_by_key(|&(stack, bytes, _)| (std::cmp::Reverse(bytes), stack));
        top.truncate(sites_n);
        wanted.push(top);
    }
    if sites_n == 0 {
        return;
    }
    for (d, top) in devices.iter().zip(wanted) {
        if top.is_empty() {
            continue;
        }
        let dev = if devices.len() > 1 { format!(", device {}", d.device) } else { String::new() };
        lines.push(format!("  top sites by live bytes{dev}:"));
        for (stack, bytes, count) in top {
            let place = match (stack, &mut f.resolver) {
                (Some(id), Some(r)) => {
                    let frames = f.frames.entry(id).or_insert_with(|| r.frames(id));
                    site_label(frames)
                }
                _ => "(no site recorded: trace or stack_depth off)".into(),
            };
            lines.push(format!("    {:>11} {:>7}  {place}", human_bytes(bytes), format!("{count}x")));
        }
    }
}

/// A site in one line: the innermost frame of the program's own code, and
/// the innermost frame overall when that is another.
pub fn site_label(frames: &[ShownFrame]) -> String {
    let short = |f: &ShownFrame| {
        let name = f.function.as_deref().unwrap_or("??");
        match (&f.file, f.line, &f.module) {
            (Some(file), Some(line), _) => {
                format!(
                    "{name} {}:{line}",
                    Path::new(file).file_name().map_or(file.clone(), |n| n.to_string_lossy().into())
                )
            }
            (_, _, Some(module)) => format!("{name} ({module})"),
            (Some(file), None, None) => format!("{name} {file}"),
            _ => name.to_string(),
        }
    };
    let Some(first) = frames.first() else { return "(frames not in the log yet)".into() };
    match frames.iter().find(|f| !sites::is_library(f)) {
        Some(mine) if !std::ptr::eq(mine, first) => format!("{}  <- {}", short(mine), short(first)),
        Some(mine) => short(mine),
        None => short(first),
    }
}

/// `text` cut to `width` columns.
fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    text.chars().take(width).collect()
}

static QUIT: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    QUIT.store(true, Ordering::Relaxed);
}

/// The terminal in the state top draws in (no echo, keys one at a time, the
/// other screen, no cursor); put back as it was when dropped.
struct Screen {
    saved: Option<libc::termios>,
}

impl Screen {
    fn enter() -> Screen {
        let mut saved = None;
        if std::io::stdin().is_terminal() {
            // SAFETY: termios is plain integers and arrays, for which all zeros is a valid value.
            let mut t: libc::termios = unsafe { std::mem::zeroed() };
            // SAFETY: `t` is a valid, writable termios for the call to fill.
            if unsafe { libc::tcgetattr(0, &mut t) } == 0 {
                saved = Some(t);
                t.c_lflag &= !(libc::ICANON | libc::ECHO);
                t.c_cc[libc::VMIN] = 0;
                t.c_cc[libc::VTIME] = 0;
                // SAFETY: `t` is the settings tcgetattr filled, changed in plain fields.
                unsafe { libc::tcsetattr(0, libc::TCSANOW, &t) };
            }
        }
        print!("\x1b[?1049h\x1b[?25l");
        let _ = std::io::stdout().flush();
        Screen { saved }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        print!("\x1b[?25h\x1b[?1049l");
        let _ = std::io::stdout().flush();
        if let Some(t) = &self.saved {
            // SAFETY: `t` is the terminal's settings as tcgetattr gave them.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, t) };
        }
    }
}

fn terminal_size() -> (usize, usize) {
    // SAFETY: winsize is four integers, for which all zeros is a valid value.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one winsize into the valid `ws` and nothing else.
    if unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0 && ws.ws_row > 0 {
        (ws.ws_col as usize, ws.ws_row as usize)
    } else {
        (120, 1000)
    }
}

/// Waits up to `delay` for a key; true when it says quit (`q`, `Q`, Ctrl-C as a key).
fn wait_for_key(delay: Duration) -> bool {
    let deadline = Instant::now() + delay;
    while !QUIT.load(Ordering::Relaxed) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut pfd = libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 };
        let ms = left.as_millis().min(200) as i32;
        // SAFETY: one valid pollfd, its count given as 1.
        if unsafe { libc::poll(&mut pfd, 1, ms) } > 0 && pfd.revents & libc::POLLIN != 0 {
            let mut b = [0u8; 16];
            // SAFETY: `b` is writable for the `b.len()` bytes read may write.
            let n = unsafe { libc::read(0, b.as_mut_ptr().cast(), b.len()) };
            if n <= 0 {
                // End of input (not a terminal): only the delay paces us now.
                std::thread::sleep(left.min(Duration::from_millis(200)));
                continue;
            }
            if b[..n as usize].iter().any(|&c| c == b'q' || c == b'Q' || c == 3) {
                return true;
            }
        }
    }
    true
}

/// `cupool top`: exits 0 when told to quit; 2 when a path given does not exist.
pub fn run(args: TopArgs) -> ExitCode {
    let paths = if args.paths.is_empty() { vec![PathBuf::from("cupool-logs")] } else { args.paths };
    let missing: Vec<&PathBuf> = paths.iter().filter(|p| !p.exists()).collect();
    // The default directory may appear when the run starts; a path named must exist.
    if !missing.is_empty() && missing.iter().any(|p| p.as_os_str() != "cupool-logs") {
        for p in missing {
            eprintln!("cupool top: {}", crate::summary::not_found(p));
        }
        return ExitCode::from(crate::summary::EXIT_BAD_INPUT);
    }
    if !args.delay.is_finite() || args.delay < 0.05 {
        eprintln!("cupool top: --delay {}: give at least 0.05 seconds", args.delay);
        return ExitCode::from(crate::summary::EXIT_BAD_INPUT);
    }
    // Reading logs must not take CPU time from the programs that write them.
    // SAFETY: nice changes this process's priority only.
    unsafe { libc::nice(10) };
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGHUP, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
    }
    let tty = std::io::stdout().is_terminal();
    let screen = tty.then(Screen::enter);
    let mut watch = Watch::new(paths, args.all);
    let delay = Duration::from_secs_f64(args.delay);
    let mut drawn = 0u64;
    let mut out = std::io::stdout();
    loop {
        watch.refresh();
        let (width, height) = terminal_size();
        let frame = draw(&mut watch, args.sites, width, height.saturating_sub(1), args.delay);
        let text = if tty {
            // Home, each line cleared to its end, the rest of the screen cleared.
            let mut s = String::from("\x1b[H");
            for l in &frame {
                s.push_str(l);
                s.push_str("\x1b[K\r\n");
            }
            s.push_str("\x1b[J");
            s
        } else {
            let mut s = frame.join("\n");
            s.push_str("\n\n");
            s
        };
        if out.write_all(text.as_bytes()).and_then(|_| out.flush()).is_err() {
            break; // the terminal or pipe went away
        }
        drawn += 1;
        if (args.iterations > 0 && drawn >= args.iterations) || QUIT.load(Ordering::Relaxed) {
            break;
        }
        if wait_for_key(delay) {
            break;
        }
    }
    drop(screen);
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_watched_once_though_latest_names_it_too() {
        let root = std::env::temp_dir().join(format!("cupool-top-logs-{}", std::process::id()));
        let run = root.join("run-20261206T083044Z-2820");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join("cupool.2822.json"), "").unwrap();
        let _ = std::fs::remove_file(root.join("latest"));
        std::os::unix::fs::symlink("run-20261206T083044Z-2820", root.join("latest")).unwrap();
        let mut found = Vec::new();
        logs_of(&root, 0, &mut found);
        assert_eq!(found, [run.join("cupool.2822.json")]);
        let mut through_link = Vec::new();
        logs_of(&root.join("latest"), 0, &mut through_link);
        assert_eq!(through_link.len(), 1, "the link itself, named, is read");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
