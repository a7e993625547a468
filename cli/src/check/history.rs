//! A framework's own record of its objects beside the logs
//! (docs/log-schema.md), written at exit by the Python processes of a
//! `cupool check` run: PyTorch's allocation history of its tensors
//! (`cupool-torch.<pid>.json`, `python/cupool/torch_history.py`), JAX's
//! live arrays, sampled (`cupool-jax.<pid>.json`, `python/cupool/jax_history.py`),
//! and CuPy's arrays, from its allocator (`cupool-cupy.<pid>.json`,
//! `python/cupool/cupy_history.py`).
//!
//! Inside a framework's cache or arena cupool sees the arena, not the
//! objects: the arena grows while the program warms up, and it grows the
//! same whether the program keeps objects or not. The history records the
//! objects handed out and taken back, each with its Python stack. Made into
//! a timeline of the same shape as a log's (allocations, frees, and the
//! log's phase edges placed by time) and read into the same model, it goes
//! through the same growth rule, and its findings name the line that made
//! the objects kept.

use crate::sites::ShownFrame;
use cupool_core::log::{EventKind, EventRecord, Log, Named};
use cupool_core::model::{Allocation, Process, What};
use cupool_core::options::Mode;
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// The version of either schema this build reads.
pub const VERSION: u32 = 1;

/// The framework a history is of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Framework {
    #[default]
    Torch,
    Jax,
    Cupy,
}

impl Framework {
    const ALL: [Framework; 3] = [Framework::Torch, Framework::Jax, Framework::Cupy];

    /// The `schema` of its files, and their names' stem.
    pub fn schema(self) -> &'static str {
        match self {
            Framework::Torch => "cupool-torch",
            Framework::Jax => "cupool-jax",
            Framework::Cupy => "cupool-cupy",
        }
    }

    /// API and kind of an object in the timeline made from a history: what
    /// a finding shows as `PyTorch (tensor)` or `JAX (array)`.
    pub fn api(self) -> &'static str {
        match self {
            Framework::Torch => "PyTorch",
            Framework::Jax => "JAX",
            Framework::Cupy => "CuPy",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Framework::Torch => "tensor",
            Framework::Jax | Framework::Cupy => "array",
        }
    }

    /// Whether a module (a file name) is the framework's cache or arena,
    /// whose growth its objects explain. None for CuPy: the modules of its
    /// pool also make the allocations of a program that turned the pool
    /// off, which no array in its record explains; its pool is known by the
    /// arrays inside ([`History::holders`]).
    pub fn arena(self, module: &str) -> bool {
        match self {
            Framework::Torch => module.starts_with("libc10_cuda"),
            Framework::Jax => {
                ["xla_cuda", "jaxlib", "libxla", "xla_extension", "_jax."].iter().any(|m| module.contains(m))
            }
            Framework::Cupy => false,
        }
    }

    /// Whether the log's allocations that held the record's objects are
    /// the arena ([`History::holders`]): CuPy's alone, whose pool's modules
    /// also make a pool-off program's allocations. PyTorch's cache is known
    /// by its segments and module; JAX's arrays do not say where they lie.
    fn arena_by_holders(self) -> bool {
        self == Framework::Cupy
    }

    /// The option that bounds the record's events per device.
    pub fn size_option(self) -> &'static str {
        match self {
            Framework::Torch => "torch_history",
            Framework::Jax => "jax_history",
            Framework::Cupy => "cupy_history",
        }
    }

    /// Whether the record is sampled: its times are those of the samples,
    /// not of the allocations, so phase edges cannot be placed among its
    /// events and its growth is judged by its own repetition alone.
    pub fn sampled(self) -> bool {
        self == Framework::Jax
    }

    fn of_schema(schema: &str) -> Option<Framework> {
        Framework::ALL.into_iter().find(|f| f.schema() == schema)
    }
}

/// One history file, as read.
#[derive(Clone, Debug, Deserialize)]
pub struct History {
    pub schema: String,
    pub version: u32,
    #[serde(skip)]
    pub framework: Framework,
    pub pid: u32,
    /// The `run_id` option the process ran with.
    #[serde(default)]
    pub run_id: String,
    /// `torch.__version__` (for people reading the file).
    #[allow(dead_code)]
    #[serde(default)]
    pub torch: String,
    /// The ring buffer's size per device (`torch_history`).
    #[serde(default)]
    pub max_entries: u64,
    /// Each distinct Python stack: `(function, file, line)`, innermost first.
    #[serde(default)]
    pub stacks: Vec<Vec<(String, String, u32)>>,
    #[serde(default)]
    pub devices: Vec<DeviceTrace>,
    /// The cache's segments at exit: `(device, address, size)`.
    #[serde(default)]
    pub segments: Vec<(i32, u64, u64)>,
    /// A sampled record's own phase edges, made with cupool's Python API and
    /// stamped in the samples' clock: `(edge, name, time_us)`, `edge` being
    /// `begin`, `end` or `mark`.
    #[serde(default)]
    pub phases: Vec<(String, String, i64)>,
    #[serde(skip)]
    pub path: PathBuf,
}

/// The history of one device, in the order PyTorch recorded it.
#[derive(Clone, Debug, Deserialize)]
pub struct DeviceTrace {
    pub device: i32,
    pub events: Vec<TraceEvent>,
    /// The ring buffer was full: older events were dropped.
    #[serde(default)]
    pub full: bool,
}

/// `[action, addr, size, time_us, stack]`.
#[derive(Clone, Debug, Deserialize)]
pub struct TraceEvent(pub String, pub u64, pub u64, pub i64, pub Option<u32>);

/// `cupool-torch.<pid>.json` and `cupool-jax.<pid>.json` (and `.<pid>.<n>.json`) in `dir`, sorted.
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> =
        Framework::ALL.iter().flat_map(|f| crate::summary::sidecar_files(dir, f.schema())).collect();
    files.sort();
    files
}

/// Whether `name` is that of a history file (`cupool-torch.<pid>.json`, ...).
pub fn is_history_name(name: &str) -> bool {
    Framework::ALL.iter().any(|f| crate::summary::is_sidecar_name(name, f.schema()))
}

/// Reads one history file (written whole, then renamed into place).
pub fn read(path: &Path) -> Result<History, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut h: History = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let Some(framework) = Framework::of_schema(&h.schema) else {
        return Err(format!(
            "{}: not a cupool framework history (schema {:?}, expected \"cupool-torch\", \"cupool-jax\" or \
             \"cupool-cupy\")",
            path.display(),
            h.schema
        ));
    };
    if h.version != VERSION {
        return Err(format!(
            "{}: {} version {}; this cupool reads version {VERSION}",
            path.display(),
            h.schema,
            h.version
        ));
    }
    h.framework = framework;
    h.path = path.to_path_buf();
    Ok(h)
}

/// The histories of the process that wrote `log` (one per framework it used).
pub fn of<'a>(histories: &'a [History], log: &Log) -> impl Iterator<Item = &'a History> {
    let (pid, run_id) = (log.header.process.pid, log.header.options.run_id.clone());
    histories.iter().filter(move |h| h.pid == pid && (h.run_id.is_empty() || h.run_id == run_id))
}

impl History {
    /// Whether a device's ring buffer overflowed (its oldest events are gone).
    pub fn wrapped(&self) -> bool {
        self.devices.iter().any(|d| d.full)
    }

    /// Addresses of the cache's segments: every segment the history saw
    /// allocated or mapped, and those held at exit. A cupool allocation at
    /// one of them is PyTorch's cache, whose growth the tensors explain.
    pub fn segment_addresses(&self) -> HashSet<u64> {
        let mut set: HashSet<u64> = self.segments.iter().map(|s| s.1).collect();
        for d in &self.devices {
            set.extend(d.events.iter().filter(|e| e.0 == "segment_alloc" || e.0 == "segment_map").map(|e| e.1));
        }
        set
    }

    /// The allocations of `p`'s log (by event) that some object of the
    /// record was made in while they were live: the framework's pool,
    /// whose growth the objects explain. An allocation made later at an
    /// address an object once had is not the pool's for that.
    pub fn holders(&self, p: &Process) -> HashSet<usize> {
        if !self.framework.arena_by_holders() {
            return HashSet::new();
        }
        let offset = self.offset_ns(p);
        let mut objects: Vec<(u64, i128)> = self
            .devices
            .iter()
            .flat_map(|d| {
                // `cached`: an array a known cache held at exit (CuPy's cuFFT plans), in the pool all the same.
                let made = d.events.iter().filter(|e| e.0 == "alloc" || e.0 == "cached");
                made.map(|e| (e.1, i128::from(e.3) * 1000 + offset))
            })
            .collect();
        objects.sort_unstable();
        // The record's clock is placed within about a millisecond of the
        // log's (`offset_ns`): an object handed out from a chunk made for it
        // may seem that much older than the chunk, one made just before the
        // chunk went back that much younger.
        const SLACK_NS: i128 = 2_000_000;
        let holds = |a: &Allocation| {
            let (born, gone) =
                (i128::from(a.t_ns) - SLACK_NS, a.end.map_or(i128::MAX, |e| i128::from(e.t_ns) + SLACK_NS));
            let first = objects.partition_point(|&(addr, _)| addr < a.addr);
            objects[first..]
                .iter()
                .take_while(|&&(addr, _)| addr - a.addr < a.size.max(1))
                .any(|&(_, t)| born <= t && t <= gone)
        };
        p.allocations.iter().filter(|a| holds(a)).map(|a| a.event).collect()
    }

    /// The frames of stack `id`, as the report shows Python frames.
    pub fn frames(&self, id: u32) -> Vec<ShownFrame> {
        self.stacks
            .get(id as usize)
            .map(|s| {
                s.iter()
                    .map(|(function, file, line)| ShownFrame::python(function.as_str(), file.as_str(), *line))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The tensors of process `p` as a process of their own: their
    /// allocations and frees in its log's clock, with its phases, in the
    /// model every rule reads.
    pub fn process(&self, p: &Process) -> Process {
        let mut header = p.log.header.clone();
        header.options.mode = Mode::Passthrough;
        Process::new(Log {
            path: self.path.clone(),
            header,
            events: self.timeline(p),
            definitions: Vec::new(),
            end: None,
        })
    }

    /// The tensors' allocations and frees as a timeline in `log`'s clock,
    /// with `log`'s phase edges placed among them by time. A tensor is taken back at PyTorch's
    /// `free_requested` (the program let go of it); the `free_completed`
    /// that may follow is then a free of nothing, which the replay ignores.
    pub fn timeline(&self, p: &Process) -> Vec<EventRecord> {
        let offset = self.offset_ns(p);
        let at = |t_us: i64| (i128::from(t_us) * 1000 + offset).clamp(0, i128::from(u64::MAX)) as u64;
        let mut lists: Vec<Vec<EventRecord>> = Vec::new();
        for d in &self.devices {
            let mut list = Vec::with_capacity(d.events.len());
            for e in &d.events {
                let ev = match e.0.as_str() {
                    "alloc" => EventKind::Alloc,
                    "free_requested" | "free_completed" => EventKind::Free,
                    _ => continue,
                };
                let mut r = EventRecord::new(0, at(e.3), ev);
                r.api = Some(Named::Unknown(self.framework.api().into()));
                r.kind = Some(Named::Unknown(self.framework.kind().into()));
                r.ptr = Some(e.1);
                r.size = Some(e.2);
                r.device = Some(d.device);
                r.stack = if ev == EventKind::Alloc { e.4.filter(|&s| (s as usize) < self.stacks.len()) } else { None };
                list.push(r);
            }
            lists.push(list);
        }
        if self.framework.sampled() {
            lists.push(self.own_edges(at));
        } else {
            let phases = p.changes.iter().filter(|c| matches!(c.what, What::PhaseBegin(_) | What::PhaseEnd(_)));
            lists.push(phases.map(|c| p.log.events[c.event].clone()).collect());
        }
        let mut merged = merge_by_time(lists);
        for (i, e) in merged.iter_mut().enumerate() {
            e.seq = i as u64;
        }
        merged
    }

    /// A sampled record's phase edges as a log's, at `at(time_us)`: the
    /// recorder sampled at each, so its arrays lie on the right side of them.
    fn own_edges(&self, at: impl Fn(i64) -> u64) -> Vec<EventRecord> {
        let edge = |ev: EventKind, api: &str, name: &str, t_us: i64| {
            let mut r = EventRecord::new(0, at(t_us), ev);
            r.api = Some(Named::from_name(api));
            r.name = Some(name.to_string());
            r.device = Some(0);
            r.tid = Some(0);
            r
        };
        let (mut out, mut open, mut mark) = (Vec::new(), Vec::<String>::new(), None::<String>);
        for (kind, name, t_us) in &self.phases {
            match kind.as_str() {
                "mark" => {
                    if let Some(prev) = mark.replace(name.clone()) {
                        out.push(edge(EventKind::PhaseEnd, "cupool_mark", &prev, *t_us));
                    }
                    out.push(edge(EventKind::PhaseBegin, "cupool_mark", name, *t_us));
                }
                "begin" => {
                    out.push(edge(EventKind::PhaseBegin, "cupool_phase_begin", name, *t_us));
                    open.push(name.clone());
                }
                "end" => {
                    if let Some(name) = open.pop() {
                        out.push(edge(EventKind::PhaseEnd, "cupool_phase_end", &name, *t_us));
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// Batches of a sampled record: at least `min_count` objects made at one
    /// site, first seen in one sample and never freed, as `(stack, count)`.
    /// The record cannot tell a batch made at once (a model's parameters)
    /// from a loop faster than its sampling that kept one a step.
    pub fn batches_kept(&self, min_count: usize) -> Vec<(u32, usize)> {
        let mut freed: HashSet<u64> = HashSet::new();
        let mut batches: HashMap<(u32, i64), usize> = HashMap::new();
        for d in &self.devices {
            freed.extend(d.events.iter().filter(|e| e.0 != "alloc").map(|e| e.1));
        }
        for d in &self.devices {
            for e in d.events.iter().filter(|e| e.0 == "alloc" && !freed.contains(&e.1)) {
                if let Some(stack) = e.4 {
                    *batches.entry((stack, e.3)).or_default() += 1;
                }
            }
        }
        let mut by_stack: HashMap<u32, usize> = HashMap::new();
        for ((stack, _), n) in batches.into_iter().filter(|&(_, n)| n >= min_count) {
            let most = by_stack.entry(stack).or_default();
            *most = (*most).max(n);
        }
        let mut out: Vec<(u32, usize)> = by_stack.into_iter().collect();
        out.sort_unstable_by_key(|&(stack, n)| (std::cmp::Reverse(n), stack));
        out
    }

    /// What to add to PyTorch's time stamps (µs) times 1000 to get the
    /// log's `t_ns`. PyTorch stamps its history in Unix time, and the log's
    /// clock started at `start_unix_ms`: that places them within about a
    /// millisecond. The cache's segments are in both records, so where that
    /// estimate is off by more than a second (a PyTorch whose stamps are not
    /// Unix time) the segments' own times are used instead.
    fn offset_ns(&self, p: &Process) -> i128 {
        let unix = -i128::from(p.log.header.process.start_unix_ms) * 1_000_000;
        let mut torch_first: HashMap<u64, i64> = HashMap::new();
        for d in &self.devices {
            for e in d.events.iter().filter(|e| e.0 == "segment_alloc") {
                torch_first.entry(e.1).or_insert(e.3);
            }
        }
        let mut seen = HashSet::new();
        let mut diffs: Vec<i128> = p
            .allocations
            .iter()
            .filter_map(|a| {
                let t_us = *torch_first.get(&a.addr)?;
                seen.insert(a.addr).then(|| i128::from(a.t_ns) - i128::from(t_us) * 1000)
            })
            .collect();
        if diffs.is_empty() {
            return unix;
        }
        diffs.sort_unstable();
        let median = diffs[diffs.len() / 2];
        if (median - unix).abs() > 1_000_000_000 {
            median
        } else {
            unix
        }
    }
}

/// The events of `lists` in one list by time, each list's own order kept
/// (a list whose stamps go backwards is never reordered); at equal times
/// the earlier list first.
fn merge_by_time(lists: Vec<Vec<EventRecord>>) -> Vec<EventRecord> {
    let total = lists.iter().map(Vec::len).sum();
    let mut iters: Vec<std::iter::Peekable<std::vec::IntoIter<EventRecord>>> =
        lists.into_iter().map(|l| l.into_iter().peekable()).collect();
    let mut out = Vec::with_capacity(total);
    loop {
        let mut best: Option<(usize, u64)> = None;
        for (i, it) in iters.iter_mut().enumerate() {
            if let Some(e) = it.peek() {
                if best.is_none_or(|(_, t)| e.t_ns < t) {
                    best = Some((i, e.t_ns));
                }
            }
        }
        let Some((i, _)) = best else { break };
        out.extend(iters[i].next());
    }
    out
}

#[cfg(test)]
#[path = "history_tests.rs"]
mod tests;
