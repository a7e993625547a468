//! One model of a log, built in one pass, that every reader consumes: the
//! summaries of `cupool run` and `report`, the sites, the check's exit,
//! growth and per-test rules, `merge`, the exports and the HTML page.
//!
//! The log's events are ordered once (by `seq`) and each record is checked
//! once and turned into a typed [`Change`]. Allocations live in one table,
//! keyed as the shim keys them (VMM handles apart from pointers), with the
//! shim's rule for an address that comes back without a logged free: the
//! allocation that held it ended there. Phase edges (one line per device in
//! the log) become [`PhaseSpan`]s, with one definition of their families and
//! of the name phases of one kind share. Per device, the bytes allocated,
//! reserved and mapped after every change, where reserved is the memory of
//! the allocator that actually ran: the pool's own `reserve`/`release`
//! records, or, in logs written before them, its segments rebuilt by
//! replaying the requests through the core's pool; in passthrough mode, what
//! CUDA handed out.
//!
//! Readers are aggregators over this model (heaptrack's accumulated data and
//! memray's aggregators are the pattern): none keeps its own live table,
//! order of events or grouping of phases.

mod build;
mod follow;
mod phases;
pub mod rebuild;
#[cfg(test)]
mod tests;

pub use follow::Following;
pub use phases::{
    group_name, groups as phase_groups, operation_phase, repeated, Family, PhaseDevice, PhaseGroup, PhaseSpan,
    Repeated, SpanId,
};

use crate::log::{Api, DeviceCounters, ExitRecord, Leak, Log, MemKind, Named, OomRecord};
use crate::options::Mode;
use serde::Serialize;

/// An allocation's index in [`Process::allocations`].
pub type AllocId = usize;

/// One process's log, ordered, checked and typed.
#[derive(Debug)]
pub struct Process {
    pub log: Log,
    /// Everything that happened, in `seq` order; each names its record by index.
    pub changes: Vec<Change>,
    /// Every allocation of the timeline, in the order they were made.
    pub allocations: Vec<Allocation>,
    /// Every phase, in the order they began.
    pub spans: Vec<PhaseSpan>,
    /// Device memory per device (pinned host memory is in `host`), by ordinal;
    /// -1 for allocations whose device was unknown.
    pub devices: Vec<DeviceSeries>,
    /// Pinned host memory.
    pub host: DeviceSeries,
    /// Device allocations by size, smallest first (empty buckets left out).
    pub sizes: Vec<SizeBucket>,
    pub ooms: Vec<OomView>,
    pub checkpoints: Vec<CheckpointView>,
    /// Allocations still live when their context died or the process ended.
    pub leaks: Vec<ExitLeak>,
    /// Where the reserved figures come from.
    pub reserved_from: ReservedFrom,
    /// How well a rebuilt pool agrees with the log, when one was rebuilt.
    pub rebuilt: Option<Rebuilt>,
    /// Nanoseconds from the start to the last event (or the end record).
    pub duration_ns: u64,
    /// Records the model could not use, one line per kind of problem.
    pub problems: Vec<String>,
}

/// One thing that happened, at its place in the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// Its record: an index into `log.events`.
    pub event: usize,
    pub seq: u64,
    pub t_ns: u64,
    pub tid: u32,
    pub what: What,
}

/// What a change did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    Alloc(AllocId),
    /// A logged free of a live allocation.
    Free(AllocId),
    /// A logged free of nothing the timeline holds (allocated before it
    /// began, or a second record of one free).
    FreeOfUnknown {
        device: i32,
        size: u64,
    },
    /// CUDA (or the pool) refused an allocation; `result` is CUDA's code.
    Refused {
        device: i32,
        size: u64,
        result: i32,
        host: bool,
    },
    /// The pool ran out even after releasing its cache.
    OutOfMemory {
        device: i32,
        size: u64,
    },
    /// A free of something never allocated, which CUDA refused too.
    InvalidFree {
        device: i32,
    },
    Map {
        device: i32,
        addr: u64,
        size: u64,
    },
    Unmap {
        device: i32,
        addr: u64,
        size: u64,
    },
    /// The pool took bytes from CUDA (segments or pages) or gave them back.
    Reserve {
        device: i32,
        bytes: u64,
    },
    Release {
        device: i32,
        bytes: u64,
    },
    PhaseBegin(SpanId),
    PhaseEnd(SpanId),
    /// A context died holding `count` allocations of `bytes`.
    Checkpoint {
        device: i32,
        bytes: u64,
        count: u64,
    },
}

/// One step of [`Process::moments`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// An allocation ended here (before the change that ended it).
    Ended(AllocId),
    /// Change `i` of the timeline.
    Change(usize),
}

/// The iterator of [`Process::moments`].
pub struct Moments {
    /// Every allocation's end: (change, allocation), in order.
    ends: Vec<(usize, AllocId)>,
    next_end: usize,
    change: usize,
    changes: usize,
}

impl Iterator for Moments {
    type Item = Moment;

    fn next(&mut self) -> Option<Moment> {
        if self.change >= self.changes {
            return None;
        }
        if let Some(&(at, id)) = self.ends.get(self.next_end).filter(|e| e.0 == self.change) {
            debug_assert_eq!(at, self.change);
            self.next_end += 1;
            return Some(Moment::Ended(id));
        }
        self.change += 1;
        Some(Moment::Change(self.change - 1))
    }
}

/// What a view drawn alongside [`Process::replay_pool`] hears.
pub trait PoolWatch {
    fn allocated(&mut self, _id: AllocId, _step: Option<&rebuild::Step>) {}
    fn ended(&mut self, _id: AllocId, _step: Option<&rebuild::Step>) {}
    fn out_of_memory(&mut self, _change: usize, _step: &rebuild::Step) {}
    /// After each moment, with the replayed pool as it stands then (`None`:
    /// no segment pool ran): for a view of the pool at one instant.
    fn after(&mut self, _moment: Moment, _replay: Option<&rebuild::PoolReplay>) {}
}

impl PoolWatch for () {}

/// Where an allocation is keyed: device, managed and host memory by
/// pointer, VMM memory (`cuMemCreate`) by handle, as the shim keys them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Space {
    Pointer,
    VmmHandle,
}

/// One allocation of the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Its record (an index into `log.events`) and change (into `changes`).
    pub event: usize,
    pub at: usize,
    pub seq: u64,
    pub t_ns: u64,
    pub tid: u32,
    pub api: Named<Api>,
    pub kind: Named<MemKind>,
    pub space: Space,
    /// The pointer, or the VMM handle.
    pub addr: u64,
    pub size: u64,
    pub device: i32,
    pub stream: Option<u64>,
    pub stack: Option<u32>,
    /// Served by cupool's pool (from the record, or in older logs, judged as the pool would).
    pub pooled: bool,
    /// The innermost phase open when it was made.
    pub phase: Option<SpanId>,
    pub end: Option<Ended>,
}

impl Allocation {
    /// Pinned host memory, counted apart from device memory.
    pub fn is_host(&self) -> bool {
        self.kind == MemKind::Host
    }

    /// Live right after change `i`.
    pub fn live_after(&self, i: usize) -> bool {
        self.at <= i && self.end.is_none_or(|e| e.at > i)
    }

    /// Bytes it held from CUDA itself: all of them unless a pool block served it.
    fn direct_bytes(&self) -> u64 {
        if self.pooled {
            0
        } else {
            self.size
        }
    }
}

/// How and where an allocation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    /// The change that ended it.
    pub at: usize,
    pub t_ns: u64,
    pub by: EndedBy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndedBy {
    /// A logged free.
    Free,
    /// CUDA handed its address (or handle) out again with no free logged in
    /// between: it ended there (the shim keeps its books the same way).
    AddressReused,
    /// Its context was destroyed (it is also an exit leak, `at` = the API).
    ContextDestroyed,
}

/// An exit leak (the end record's, or what a log cut short leaves live),
/// with the allocation of the timeline it is, when the timeline has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExitLeak {
    pub leak: Leak,
    pub alloc: Option<AllocId>,
}

/// Where a process's reserved figures come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReservedFrom {
    /// What CUDA handed out (passthrough mode).
    Allocations,
    /// The pool's own records of what it took from CUDA and gave back.
    PoolRecords,
    /// The pool's segments, rebuilt by replaying the requests (logs written
    /// before the pool's records; segments backing).
    RebuiltSegments,
    /// Not in the log (a VMM-backed pool's log written before the pool's
    /// records): only the end record's peak is known.
    NotRecorded,
}

/// How well a rebuilt pool agrees with the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rebuilt {
    /// Blocks the replay put where the program saw them, and elsewhere.
    pub placed: u64,
    pub misplaced: u64,
}

/// The figures of one device right after a change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Sample {
    pub t_ns: u64,
    pub allocated: u64,
    pub reserved: u64,
    pub mapped: u64,
}

/// The most of one figure, when, and in which phase (the innermost open one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Peak {
    pub bytes: u64,
    pub t_ns: u64,
    pub phase: Option<String>,
}

/// One device (or pinned host memory) of one process over the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceSeries {
    /// The ordinal; -1 for allocations whose device was unknown (and for host memory).
    pub device: i32,
    pub allocs: u64,
    pub frees: u64,
    /// Allocations CUDA (or the pool) refused.
    pub failures: u64,
    /// Allocations live at the end of the timeline, and the most at once.
    pub live_count: u64,
    pub peak_count: u64,
    pub peak_allocated: Peak,
    pub peak_reserved: Peak,
    pub peak_mapped: Peak,
    /// The end record's peak of reserved bytes.
    pub recorded_peak_reserved: Option<u64>,
    /// Every change, in time order (not serialized: the exports downsample it).
    #[serde(skip)]
    pub samples: Vec<Sample>,
}

impl DeviceSeries {
    /// The figures right now: the last sample.
    pub fn now(&self) -> Sample {
        self.samples.last().copied().unwrap_or_default()
    }
}

/// One power-of-two bucket of allocation sizes: `[low, 2 * low)` bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SizeBucket {
    pub low: u64,
    pub count: u64,
    pub bytes: u64,
}

/// An allocation refused for want of memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OomView {
    pub t_ns: u64,
    pub device: i32,
    pub api: String,
    pub requested: u64,
    pub phase: Option<String>,
    /// The pool's snapshot at that moment (pool mode, the first 16 of a process).
    pub snapshot: Option<OomRecord>,
}

/// A context that died holding allocations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckpointView {
    pub t_ns: u64,
    pub device: i32,
    pub api: String,
    pub leaked_bytes: u64,
    pub leaked_count: u64,
}

/// One process at a glance: the end record's counters when there is one,
/// else the timeline's. Serializes as one entry of `cupool report --json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub pid: u32,
    /// The command line, joined by spaces.
    pub cmdline: String,
    /// The log has its end record.
    pub complete: bool,
    pub exit: Option<ExitRecord>,
    /// Number of events in the timeline.
    pub events: usize,
    pub devices: Vec<DeviceCounters>,
    pub host: DeviceCounters,
    pub leak_bytes: u64,
    /// The end record's leaks, or, for a log cut short, the allocations the
    /// timeline leaves live (`at: "not finished"`, `age_ms` up to the last event).
    pub leaks: Vec<Leak>,
}

impl Process {
    /// Reads `log` into its model.
    pub fn new(log: Log) -> Process {
        build::build(log)
    }

    /// The process's mode (pool or passthrough).
    pub fn mode(&self) -> Mode {
        self.log.header.options.mode
    }

    /// The series of `device` (device memory), if it had any activity.
    pub fn device(&self, device: i32) -> Option<&DeviceSeries> {
        self.devices.iter().find(|d| d.device == device)
    }

    /// The name of phase `span`.
    pub fn phase_name(&self, span: Option<SpanId>) -> Option<&str> {
        span.map(|s| self.spans[s].name.as_str())
    }

    /// The timeline with every allocation's end in its place: at each
    /// change, first the allocations it ended (freed, address reused,
    /// context destroyed), then the change itself.
    pub fn moments(&self) -> Moments {
        let mut ends: Vec<(usize, AllocId)> =
            self.allocations.iter().enumerate().filter_map(|(id, a)| a.end.map(|e| (e.at, id))).collect();
        ends.sort_unstable();
        Moments { ends, next_end: 0, change: 0, changes: self.changes.len() }
    }

    /// Walks the allocations and their ends, running the pooled ones
    /// through the core's pool of segments when a segment pool served them
    /// (pool mode, segments backing), and tells `watch` what each did to it.
    /// The replay is handed back for a last look (`None`: no segment pool ran).
    pub fn replay_pool(&self, watch: &mut dyn PoolWatch) -> Option<rebuild::PoolReplay> {
        let opts = &self.log.header.options;
        let segments = opts.backing == crate::options::Backing::Segments;
        let mut replay = if segments { rebuild::PoolReplay::new(opts) } else { None };
        for m in self.moments() {
            match m {
                Moment::Ended(id) => {
                    let a = &self.allocations[id];
                    let t = a.end.map_or(a.t_ns, |e| e.t_ns);
                    let step = match (&mut replay, a.pooled) {
                        (Some(r), true) => r.free(id, a.device, t),
                        _ => None,
                    };
                    watch.ended(id, step.as_ref());
                }
                Moment::Change(i) => match self.changes[i].what {
                    What::Alloc(id) => {
                        let a = &self.allocations[id];
                        let step = match (&mut replay, a.pooled) {
                            (Some(r), true) => Some(r.alloc(id, a.device, a.addr, a.size, a.t_ns)),
                            _ => None,
                        };
                        watch.allocated(id, step.as_ref());
                    }
                    What::OutOfMemory { device, .. } => {
                        if let Some(r) = &mut replay {
                            let step = r.out_of_memory(device, self.changes[i].t_ns);
                            watch.out_of_memory(i, &step);
                        }
                    }
                    _ => {}
                },
            }
            watch.after(m, replay.as_ref());
        }
        replay
    }

    /// Bytes and allocations of the exit leaks.
    pub fn leak_totals(&self) -> (u64, u64) {
        (self.leaks.iter().map(|l| l.leak.size).sum(), self.leaks.len() as u64)
    }

    /// Per device, the most bytes allocated between `begin_ns` and `end_ns`
    /// above what was allocated at `begin_ns`: what a stretch of the run (a
    /// test, a phase) added at its peak.
    pub fn peak_within(&self, begin_ns: u64, end_ns: u64) -> Vec<(i32, u64)> {
        self.devices
            .iter()
            .map(|d| {
                let from = d.samples.partition_point(|s| s.t_ns <= begin_ns);
                let base = from.checked_sub(1).map_or(0, |i| d.samples[i].allocated);
                let most = d.samples[from..].iter().take_while(|s| s.t_ns <= end_ns).map(|s| s.allocated).max();
                (d.device, most.unwrap_or(base).saturating_sub(base))
            })
            .collect()
    }

    /// One process at a glance (the summaries of `cupool run` and `report`).
    pub fn summary(&self) -> Summary {
        let process = &self.log.header.process;
        let (devices, host) = match &self.log.end {
            Some(end) => (end.devices.clone(), end.host.clone()),
            None => (
                self.devices.iter().map(counters_of).collect(),
                DeviceCounters { device: -1, ..counters_of(&self.host) },
            ),
        };
        let (leak_bytes, _) = self.leak_totals();
        Summary {
            pid: process.pid,
            cmdline: process.cmdline.join(" "),
            complete: self.log.end.is_some(),
            exit: self.log.end.as_ref().map(|e| e.exit.clone()),
            events: self.log.events.len(),
            devices,
            host,
            leak_bytes,
            leaks: self.leaks.iter().map(|l| l.leak.clone()).collect(),
        }
    }

    /// The key readers order processes by: ranks first in rank order, then
    /// the others as they started.
    pub fn order_key(&self) -> (bool, Option<u32>, u64, u32) {
        let p = &self.log.header.process;
        (p.rank.is_none(), p.rank, p.start_unix_ms, p.pid)
    }
}

/// The end-record shape of a series, for a log that has no end record.
fn counters_of(d: &DeviceSeries) -> DeviceCounters {
    let now = d.now();
    DeviceCounters {
        device: d.device,
        allocs: d.allocs,
        frees: d.frees,
        failures: d.failures,
        current_bytes: now.allocated,
        peak_bytes: d.peak_allocated.bytes,
        current_count: d.live_count,
        peak_count: d.peak_count,
        reserved_bytes: now.reserved,
        peak_reserved_bytes: d.peak_reserved.bytes,
    }
}

/// Builds the models of `logs`, ordered as readers show them (ranks first).
pub fn processes(logs: Vec<Log>) -> Vec<Process> {
    let mut out: Vec<Process> = logs.into_iter().map(Process::new).collect();
    out.sort_by_key(Process::order_key);
    out
}
