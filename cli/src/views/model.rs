//! One process's memory over time, from its log, in one pass over the
//! timeline: what every view (`cupool report`, the Perfetto and memory_viz
//! exports) is drawn from.
//!
//! Per device: bytes allocated (live in the program's allocations), reserved
//! (held from CUDA: the pool's segments, rebuilt by [`super::pool`], plus what
//! CUDA allocated directly) and mapped (VMM mappings), after every change;
//! their peaks, with when and in which phase. The phases of the run as spans
//! (NVTX ranges, `cupool_mark`, `cupool_phase_begin`/`_end`) with their peak
//! and growth; the sizes allocated; out-of-memory refusals with the pool's
//! snapshot; context checkpoints; the end record's notes.

use super::pool::{self, PoolReplay, Step};
use cupool_core::log::{Api, EventKind, EventRecord, Log, MemKind, OomRecord};
use cupool_core::options::Mode;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

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

impl Peak {
    fn offer(&mut self, bytes: u64, t_ns: u64, phase: impl FnOnce() -> Option<String>) {
        if bytes > self.bytes {
            *self = Peak { bytes, t_ns, phase: phase() };
        }
    }
}

/// One device of one process over the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DeviceView {
    /// The ordinal; -1 for allocations whose device was unknown.
    pub device: i32,
    pub allocs: u64,
    pub frees: u64,
    /// Allocations CUDA (or the pool) refused.
    pub failures: u64,
    pub peak_allocated: Peak,
    pub peak_reserved: Peak,
    pub peak_mapped: Peak,
    /// The end record's peak of reserved bytes, to compare a rebuilt pool with.
    pub recorded_peak_reserved: Option<u64>,
    /// Every change, in time order (not in `--json`: see `fragmentation`).
    #[serde(skip)]
    pub samples: Vec<Sample>,
}

/// Where a phase came from, which decides how its edges pair up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// `cupool_mark`: one at a time, process-wide.
    Mark,
    /// `cupool_phase_begin`/`_end`: a process-wide stack.
    Phase,
    /// NVTX push/pop: a stack per thread.
    NvtxPush,
    /// NVTX start/end: ranges that may overlap anyhow.
    NvtxRange,
}

impl Family {
    fn of(api: Option<Api>) -> Family {
        match api {
            Some(Api::CupoolMark) => Family::Mark,
            Some(
                Api::NvtxRangePushA
                | Api::NvtxRangePushW
                | Api::NvtxRangePushEx
                | Api::NvtxRangePop
                | Api::NvtxDomainRangePushEx
                | Api::NvtxDomainRangePop,
            ) => Family::NvtxPush,
            Some(
                Api::NvtxRangeStartA
                | Api::NvtxRangeStartW
                | Api::NvtxRangeStartEx
                | Api::NvtxRangeEnd
                | Api::NvtxDomainRangeStartEx
                | Api::NvtxDomainRangeEnd,
            ) => Family::NvtxRange,
            _ => Family::Phase,
        }
    }
}

/// A phase's figures on one device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PhaseDevice {
    pub device: i32,
    /// Bytes allocated and reserved when it began and ended, as the shim
    /// recorded them (`None` for an edge the log does not have).
    pub allocated_begin: Option<u64>,
    pub allocated_end: Option<u64>,
    pub reserved_begin: Option<u64>,
    pub reserved_end: Option<u64>,
    /// The most allocated and reserved while it ran.
    pub peak_allocated: u64,
    pub peak_reserved: u64,
}

impl PhaseDevice {
    /// Bytes allocated at its end less at its beginning.
    pub fn growth(&self) -> Option<i64> {
        Some(self.allocated_end? as i64 - self.allocated_begin? as i64)
    }
}

/// One phase of the run.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseSpan {
    pub name: String,
    pub family: Family,
    /// The thread that began it.
    pub tid: u32,
    pub begin_ns: u64,
    /// `None`: still open when the log ends.
    pub end_ns: Option<u64>,
    pub devices: Vec<PhaseDevice>,
}

impl PhaseSpan {
    fn device(&mut self, device: i32) -> &mut PhaseDevice {
        match self.devices.iter().position(|d| d.device == device) {
            Some(i) => &mut self.devices[i],
            None => {
                self.devices.push(PhaseDevice { device, ..Default::default() });
                self.devices.last_mut().expect("just pushed")
            }
        }
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
#[derive(Clone, Debug, Serialize)]
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
#[derive(Clone, Debug, Serialize)]
pub struct CheckpointView {
    pub t_ns: u64,
    pub device: i32,
    pub api: String,
    pub leaked_bytes: u64,
    pub leaked_count: u64,
}

/// How well the rebuilt pool agrees with the log (pool mode).
#[derive(Clone, Debug, Serialize)]
pub struct Rebuilt {
    /// Blocks the replay put where the program saw them, and elsewhere.
    pub placed: u64,
    pub misplaced: u64,
}

/// One process.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessView {
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    pub start_unix_ms: u64,
    /// Nanoseconds from the start to the last event (or the end record).
    pub duration_ns: u64,
    pub mode: Mode,
    pub devices: Vec<DeviceView>,
    pub phases: Vec<PhaseSpan>,
    /// Device allocations by size, smallest first (empty buckets left out).
    pub sizes: Vec<SizeBucket>,
    pub ooms: Vec<OomView>,
    pub checkpoints: Vec<CheckpointView>,
    pub notes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rebuilt: Option<Rebuilt>,
}

/// CUDA's out-of-memory code, the same in the runtime and the driver.
const OUT_OF_MEMORY: i32 = 2;

/// What a view drawn from the same pass needs besides the figures: the memory_viz
/// export follows the pool's segments and blocks event by event.
pub trait Watch {
    fn alloc(&mut self, _e: &EventRecord, _step: Option<&Step>) {}
    fn free(&mut self, _e: &EventRecord, _step: Option<&Step>) {}
    fn oom(&mut self, _e: &EventRecord, _step: &Step) {}
}

impl Watch for () {}

/// Builds the view of `log`; `tick(done)` hears how many events are done now and then.
pub fn build(log: &Log, tick: &mut dyn FnMut(u64)) -> ProcessView {
    build_watching(log, &mut (), tick).0
}

/// Events between two ticks.
const TICK: usize = 1 << 16;

/// Builds the view of `log`, telling `watch` each allocation and free with
/// what it did to the rebuilt pool; the replay is handed back for a last look.
pub fn build_watching(
    log: &Log,
    watch: &mut dyn Watch,
    tick: &mut dyn FnMut(u64),
) -> (ProcessView, Option<PoolReplay>) {
    let mut b = Builder::new(log);
    let mut order: Vec<&EventRecord> = log.events.iter().collect();
    if !order.is_sorted_by_key(|e| e.seq) {
        order.sort_by_key(|e| e.seq);
    }
    for (i, e) in order.into_iter().enumerate() {
        if i % TICK == 0 {
            tick(i as u64);
        }
        b.event(e, watch);
    }
    tick(log.events.len() as u64);
    b.finish(log)
}

struct Builder {
    view: ProcessView,
    devices: BTreeMap<i32, DeviceState>,
    /// Live allocations: (is VMM, pointer or handle) -> (device, size, pooled).
    live: HashMap<(bool, u64), (i32, u64, bool)>,
    /// Live mappings: address -> (device, size).
    mappings: HashMap<u64, (i32, u64)>,
    replay: Option<PoolReplay>,
    /// Indices of the phases open now, in the order they began.
    open: Vec<usize>,
    /// The phase edge being read: one line per device (kind, name, api, tid, span, devices seen).
    edge: Option<(EventKind, String, String, u32, usize, Vec<i32>)>,
    sizes: BTreeMap<u32, SizeBucket>,
    last_t: u64,
}

#[derive(Default)]
struct DeviceState {
    view: DeviceView,
    now: Sample,
    /// Bytes of allocations CUDA made directly (not pooled).
    direct: u64,
}

impl Builder {
    fn new(log: &Log) -> Builder {
        let p = &log.header.process;
        Builder {
            view: ProcessView {
                pid: p.pid,
                rank: p.rank,
                start_unix_ms: p.start_unix_ms,
                duration_ns: 0,
                mode: log.header.options.mode,
                devices: Vec::new(),
                phases: Vec::new(),
                sizes: Vec::new(),
                ooms: Vec::new(),
                checkpoints: Vec::new(),
                notes: Vec::new(),
                rebuilt: None,
            },
            devices: BTreeMap::new(),
            live: HashMap::new(),
            mappings: HashMap::new(),
            replay: PoolReplay::new(&log.header.options),
            open: Vec::new(),
            edge: None,
            sizes: BTreeMap::new(),
            last_t: 0,
        }
    }

    /// The innermost phase open now.
    fn phase_now(&self) -> Option<String> {
        self.open.last().map(|&i| self.view.phases[i].name.clone())
    }

    fn event(&mut self, e: &EventRecord, watch: &mut dyn Watch) {
        self.last_t = self.last_t.max(e.t_ns);
        let kind = e.ev.known();
        if !matches!(kind, Some(EventKind::PhaseBegin | EventKind::PhaseEnd)) {
            self.edge = None;
        }
        let device = e.device.unwrap_or(-1);
        let mem = e.kind.as_ref().and_then(|k| k.known());
        match kind {
            Some(EventKind::Alloc) if mem != Some(MemKind::Host) => {
                let size = e.size.unwrap_or(0);
                let Some(ptr) = e.ptr else { return };
                let pooled = self.replay.is_some() && pool::pooled(e);
                let step = match (&mut self.replay, pooled) {
                    (Some(r), true) => Some(r.alloc(device, ptr, size, e.t_ns)),
                    _ => None,
                };
                watch.alloc(e, step.as_ref());
                let key = (mem == Some(MemKind::Vmm), ptr);
                if let Some((d, s, p)) = self.live.insert(key, (device, size, pooled)) {
                    self.change(d, e.t_ns, |st| {
                        st.now.allocated = st.now.allocated.saturating_sub(s);
                        if !p {
                            st.direct = st.direct.saturating_sub(s);
                        }
                    });
                }
                let bucket = 64 - size.leading_zeros();
                let b = self.sizes.entry(bucket).or_insert_with(|| SizeBucket {
                    low: if bucket == 0 { 0 } else { 1 << (bucket - 1) },
                    ..Default::default()
                });
                b.count += 1;
                b.bytes += size;
                self.change(device, e.t_ns, |st| {
                    st.view.allocs += 1;
                    st.now.allocated += size;
                    if !pooled {
                        st.direct += size;
                    }
                });
            }
            Some(EventKind::Free) if mem != Some(MemKind::Host) => {
                let Some(ptr) = e.ptr else { return };
                let key = (mem == Some(MemKind::Vmm), ptr);
                let (d, size, pooled) = self.live.remove(&key).unwrap_or((device, e.size.unwrap_or(0), false));
                let step = match (&mut self.replay, pooled) {
                    (Some(r), true) => r.free(d, ptr, e.t_ns),
                    _ => None,
                };
                watch.free(e, step.as_ref());
                self.change(d, e.t_ns, |st| {
                    st.view.frees += 1;
                    st.now.allocated = st.now.allocated.saturating_sub(size);
                    if !pooled {
                        st.direct = st.direct.saturating_sub(size);
                    }
                });
            }
            Some(EventKind::AllocFailed) if mem != Some(MemKind::Host) => {
                self.change(device, e.t_ns, |st| st.view.failures += 1);
                if e.result == Some(OUT_OF_MEMORY) {
                    self.view.ooms.push(OomView {
                        t_ns: e.t_ns,
                        device,
                        api: e.api.as_ref().map(|a| a.as_str().to_string()).unwrap_or_default(),
                        requested: e.size.unwrap_or(0),
                        phase: self.phase_now(),
                        snapshot: None,
                    });
                }
            }
            Some(EventKind::Oom) => {
                if let Some(r) = &mut self.replay {
                    let step = r.out_of_memory(device, e.t_ns);
                    watch.oom(e, &step);
                    self.change(device, e.t_ns, |_| {});
                }
            }
            Some(EventKind::Map) => {
                let (Some(ptr), Some(size)) = (e.ptr, e.size) else { return };
                self.mappings.insert(ptr, (device, size));
                self.change(device, e.t_ns, |st| st.now.mapped += size);
            }
            Some(EventKind::Unmap) => {
                let Some(ptr) = e.ptr else { return };
                if let Some((d, size)) = self.mappings.remove(&ptr) {
                    self.change(d, e.t_ns, |st| st.now.mapped = st.now.mapped.saturating_sub(size));
                }
            }
            Some(EventKind::Checkpoint) => self.view.checkpoints.push(CheckpointView {
                t_ns: e.t_ns,
                device,
                api: e.api.as_ref().map(|a| a.as_str().to_string()).unwrap_or_default(),
                leaked_bytes: e.leaked_bytes.unwrap_or(0),
                leaked_count: e.leaked_count.unwrap_or(0),
            }),
            Some(k @ (EventKind::PhaseBegin | EventKind::PhaseEnd)) => self.phase_edge(k, e),
            _ => {}
        }
    }

    /// Applies `f` to `device`'s figures at `t_ns`, then records the sample and the peaks.
    fn change(&mut self, device: i32, t_ns: u64, f: impl FnOnce(&mut DeviceState)) {
        let pool_reserved = self.replay.as_ref().map_or(0, |r| r.reserved(device));
        let phase = self.open.last().map(|&i| &self.view.phases[i].name);
        let st = self
            .devices
            .entry(device)
            .or_insert_with(|| DeviceState { view: DeviceView { device, ..Default::default() }, ..Default::default() });
        f(st);
        st.now.t_ns = t_ns;
        st.now.reserved = st.direct + pool_reserved;
        let now = st.now;
        match st.view.samples.last_mut() {
            Some(last) if last.t_ns == now.t_ns => *last = now,
            Some(last) if (last.allocated, last.reserved, last.mapped) == (now.allocated, now.reserved, now.mapped) => {
            }
            _ => st.view.samples.push(now),
        }
        st.view.peak_allocated.offer(now.allocated, t_ns, || phase.cloned());
        st.view.peak_reserved.offer(now.reserved, t_ns, || phase.cloned());
        st.view.peak_mapped.offer(now.mapped, t_ns, || phase.cloned());
        for &i in &self.open {
            let d = self.view.phases[i].device(device);
            d.peak_allocated = d.peak_allocated.max(now.allocated);
            d.peak_reserved = d.peak_reserved.max(now.reserved);
        }
    }

    /// A line of a phase edge (one per device).
    fn phase_edge(&mut self, kind: EventKind, e: &EventRecord) {
        let name = e.name.clone().unwrap_or_default();
        let api = e.api.as_ref().map(|a| a.as_str().to_string()).unwrap_or_default();
        let tid = e.tid.unwrap_or(0);
        let device = e.device.unwrap_or(-1);
        // Another line of the edge being read: same kind, name, API and
        // thread, a device not seen yet in it.
        let span = match &mut self.edge {
            Some((k, n, a, t, span, seen)) if *k == kind && *n == name && *a == api && *t == tid => {
                if seen.contains(&device) {
                    None
                } else {
                    seen.push(device);
                    Some(*span)
                }
            }
            _ => None,
        };
        let span = match span {
            Some(s) => Some(s),
            None => {
                let s = self.new_edge(kind, &name, e);
                if let Some(s) = s {
                    self.edge = Some((kind, name, api, tid, s, vec![device]));
                }
                s
            }
        };
        let Some(span) = span else { return };
        if device < 0 {
            return; // no device had memory activity yet
        }
        let now = self.devices.get(&device).map(|d| d.now).unwrap_or_default();
        let d = self.view.phases[span].device(device);
        if kind == EventKind::PhaseBegin {
            d.allocated_begin = e.live;
            d.reserved_begin = e.reserved;
            d.peak_allocated = d.peak_allocated.max(now.allocated);
            d.peak_reserved = d.peak_reserved.max(now.reserved);
        } else {
            d.allocated_end = e.live;
            d.reserved_end = e.reserved;
        }
    }

    /// A new phase edge: a span begins, or the open span it ends. `None`
    /// for an end that matches no open span.
    fn new_edge(&mut self, kind: EventKind, name: &str, e: &EventRecord) -> Option<usize> {
        let family = Family::of(e.api.as_ref().and_then(|a| a.known()));
        let tid = e.tid.unwrap_or(0);
        if kind == EventKind::PhaseBegin {
            self.view.phases.push(PhaseSpan {
                name: name.to_string(),
                family,
                tid,
                begin_ns: e.t_ns,
                end_ns: None,
                devices: Vec::new(),
            });
            let i = self.view.phases.len() - 1;
            // What is live now, on every device, counts towards its peak.
            let nows: Vec<(i32, Sample)> = self.devices.iter().map(|(&d, s)| (d, s.now)).collect();
            for (device, now) in nows {
                let d = self.view.phases[i].device(device);
                d.peak_allocated = now.allocated;
                d.peak_reserved = now.reserved;
            }
            self.open.push(i);
            return Some(i);
        }
        let phases = &self.view.phases;
        let at = self.open.iter().rposition(|&i| {
            let p = &phases[i];
            p.family == family && p.name == name && (family != Family::NvtxPush || p.tid == tid)
        })?;
        let i = self.open.remove(at);
        self.view.phases[i].end_ns = Some(e.t_ns);
        Some(i)
    }

    fn finish(mut self, log: &Log) -> (ProcessView, Option<PoolReplay>) {
        let end = log.end.as_ref();
        let mut duration = self.last_t;
        if let Some(end) = end {
            duration = duration.max(end.duration_ms.saturating_mul(1_000_000));
            self.view.notes = end.notes.clone();
            // Each snapshot goes to the refusal it was taken for.
            for snap in &end.ooms {
                let best = self
                    .view
                    .ooms
                    .iter_mut()
                    .filter(|o| o.device == snap.device && o.snapshot.is_none() && o.requested == snap.requested)
                    .min_by_key(|o| o.t_ns.abs_diff(snap.t_ns));
                match best {
                    Some(o) => o.snapshot = Some(snap.clone()),
                    None => self.view.ooms.push(OomView {
                        t_ns: snap.t_ns,
                        device: snap.device,
                        api: String::new(),
                        requested: snap.requested,
                        phase: None,
                        snapshot: Some(snap.clone()),
                    }),
                }
            }
            self.view.ooms.sort_by_key(|o| o.t_ns);
        }
        self.view.duration_ns = duration;
        self.view.sizes = self.sizes.into_values().collect();
        let recorded: HashMap<i32, u64> =
            end.map(|e| e.devices.iter().map(|d| (d.device, d.peak_reserved_bytes)).collect()).unwrap_or_default();
        self.view.devices = self
            .devices
            .into_values()
            .map(|mut st| {
                st.view.recorded_peak_reserved = recorded.get(&st.view.device).copied();
                st.view
            })
            .collect();
        self.view.rebuilt = self.replay.as_ref().map(|r| Rebuilt { placed: r.placed, misplaced: r.misplaced });
        (self.view, self.replay)
    }
}

/// At most about `max` points of a step series `(t, value)`, in time order:
/// the points split into `max / 2` runs of equal length, each run kept as its
/// lowest and its highest point (the first ones when several tie), and the
/// last point of the series. So every run's maximum survives, and with it
/// the series' own peak.
pub fn downsample<T: Copy>(points: &[T], max: usize, value: impl Fn(&T) -> u64) -> Vec<T> {
    if points.len() <= max.max(3) {
        return points.to_vec();
    }
    let runs = (max / 2).max(1);
    let per = points.len().div_ceil(runs);
    let mut out = Vec::with_capacity(2 * runs + 1);
    for chunk in points.chunks(per) {
        let (mut lo, mut hi) = (0, 0);
        for (i, p) in chunk.iter().enumerate() {
            if value(p) < value(&chunk[lo]) {
                lo = i;
            }
            if value(p) > value(&chunk[hi]) {
                hi = i;
            }
        }
        out.push(chunk[lo.min(hi)]);
        if lo != hi {
            out.push(chunk[lo.max(hi)]);
        }
    }
    if let Some(&last) = points.last() {
        out.push(last);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cupool_core::log::{Header, Named, ProcessInfo};
    use cupool_core::options::Options;

    /// A passthrough log made of `events` (seq and t_ns from their order).
    fn log_of(events: Vec<EventRecord>) -> Log {
        let header = Header {
            schema: cupool_core::log::SCHEMA.into(),
            version: cupool_core::log::VERSION,
            process: ProcessInfo { pid: 7, ..Default::default() },
            options: Options { mode: Mode::Passthrough, ..Options::default() },
        };
        let events = events
            .into_iter()
            .enumerate()
            .map(|(i, mut e)| {
                e.seq = i as u64;
                e.t_ns = 1000 * i as u64;
                e
            })
            .collect();
        Log { path: "cupool.7.json".into(), header, events, definitions: Vec::new(), end: None }
    }

    fn mem(ev: EventKind, device: i32, ptr: u64, size: u64) -> EventRecord {
        let mut e = EventRecord::new(0, 0, ev);
        e.api = Some(Named::from_name("cudaMalloc"));
        e.kind = Some(Named::from_name("device"));
        (e.device, e.ptr, e.size, e.tid) = (Some(device), Some(ptr), Some(size), Some(1));
        e
    }

    /// One line of a phase edge, on `device`.
    fn edge(ev: EventKind, api: &str, name: &str, tid: u32, device: i32, live: u64) -> EventRecord {
        let mut e = EventRecord::new(0, 0, ev);
        e.api = Some(Named::from_name(api));
        (e.name, e.device, e.live, e.reserved, e.tid) =
            (Some(name.into()), Some(device), Some(live), Some(live), Some(tid));
        e
    }

    #[test]
    fn a_phase_edge_is_one_line_per_device_and_its_figures_are_per_device() {
        use EventKind::*;
        let log = log_of(vec![
            mem(Alloc, 0, 0x10, 100),
            mem(Alloc, 1, 0x20, 1000),
            edge(PhaseBegin, "cupool_phase_begin", "train", 1, 0, 100),
            edge(PhaseBegin, "cupool_phase_begin", "train", 1, 1, 1000),
            mem(Alloc, 0, 0x30, 50),
            mem(Free, 0, 0x30, 50),
            mem(Alloc, 1, 0x40, 7),
            // NVTX ranges pushed on two threads, popped in the other order.
            edge(PhaseBegin, "nvtxRangePushA", "fwd", 2, 0, 100),
            edge(PhaseBegin, "nvtxRangePushA", "fwd", 2, 1, 1007),
            edge(PhaseBegin, "nvtxRangePushA", "bwd", 3, 0, 100),
            edge(PhaseBegin, "nvtxRangePushA", "bwd", 3, 1, 1007),
            edge(PhaseEnd, "nvtxRangePop", "fwd", 2, 0, 100),
            edge(PhaseEnd, "nvtxRangePop", "fwd", 2, 1, 1007),
            edge(PhaseEnd, "cupool_phase_end", "train", 1, 0, 100),
            edge(PhaseEnd, "cupool_phase_end", "train", 1, 1, 1007),
        ]);
        let v = build(&log, &mut |_| {});
        let names: Vec<(&str, Family, Option<u64>)> =
            v.phases.iter().map(|p| (p.name.as_str(), p.family, p.end_ns)).collect();
        assert_eq!(
            names,
            vec![
                ("train", Family::Phase, Some(13_000)),
                ("fwd", Family::NvtxPush, Some(11_000)),
                ("bwd", Family::NvtxPush, None)
            ]
        );
        let train = &v.phases[0];
        assert_eq!(train.devices.len(), 2);
        let d0 = train.devices.iter().find(|d| d.device == 0).unwrap();
        assert_eq!(
            (d0.allocated_begin, d0.allocated_end, d0.peak_allocated, d0.growth()),
            (Some(100), Some(100), 150, Some(0))
        );
        let d1 = train.devices.iter().find(|d| d.device == 1).unwrap();
        assert_eq!((d1.peak_allocated, d1.growth()), (1007, Some(7)));
        // The peak of device 0 happened inside "train", before the NVTX ranges.
        let dev0 = &v.devices[0];
        assert_eq!((dev0.peak_allocated.bytes, dev0.peak_allocated.phase.as_deref()), (150, Some("train")));
        assert_eq!(dev0.peak_allocated.t_ns, 4000);
        assert_eq!(
            v.sizes.iter().map(|b| (b.low, b.count)).collect::<Vec<_>>(),
            vec![(4, 1), (32, 1), (64, 1), (512, 1)]
        );
    }

    #[test]
    fn downsampling_keeps_every_runs_maximum() {
        // A saw tooth with one spike: 10,000 points down to about 100.
        let mut points: Vec<(u64, u64)> = (0..10_000u64).map(|t| (t, t % 97)).collect();
        points[4321].1 = 1_000_000;
        let kept = downsample(&points, 100, |p| p.1);
        assert!(kept.len() <= 101, "{}", kept.len());
        assert!(kept.windows(2).all(|w| w[0].0 < w[1].0), "time order");
        assert!(kept.contains(&(4321, 1_000_000)), "the peak survives");
        let per = points.len().div_ceil(50);
        for chunk in points.chunks(per) {
            let max = chunk.iter().map(|p| p.1).max().unwrap();
            assert!(kept.iter().any(|k| chunk.contains(k) && k.1 == max), "each run's maximum survives");
        }
        assert_eq!(kept.last(), points.last());
        // Short series are left alone.
        assert_eq!(downsample(&points[..50], 100, |p| p.1), points[..50].to_vec());
    }
}

/// Every phase of one name (digits read as `#`: `epoch 1`, `epoch 2`, ... are one).
#[derive(Clone, Debug, Serialize)]
pub struct PhaseGroup {
    pub name: String,
    pub family: Family,
    pub device: i32,
    pub count: u64,
    /// The highest peak of allocated bytes in any of them, and that one's name.
    pub peak_allocated: u64,
    pub peak_in: String,
    pub peak_reserved: u64,
    /// Allocated bytes at the end less at the beginning, summed over them, and the largest.
    pub growth: i64,
    pub max_growth: i64,
}

/// `epoch 12` -> `epoch #`.
fn group_name(name: &str) -> String {
    crate::check::growth_phase_name(name)
}

pub fn phase_groups(p: &ProcessView) -> Vec<PhaseGroup> {
    let mut groups: BTreeMap<(String, String, i32), PhaseGroup> = BTreeMap::new();
    for span in &p.phases {
        for d in &span.devices {
            let name = group_name(&span.name);
            let g =
                groups.entry((name.clone(), format!("{:?}", span.family), d.device)).or_insert_with(|| PhaseGroup {
                    name,
                    family: span.family,
                    device: d.device,
                    count: 0,
                    peak_allocated: 0,
                    peak_in: String::new(),
                    peak_reserved: 0,
                    growth: 0,
                    max_growth: i64::MIN,
                });
            g.count += 1;
            if d.peak_allocated > g.peak_allocated || g.peak_in.is_empty() {
                g.peak_allocated = d.peak_allocated;
                g.peak_in = span.name.clone();
            }
            g.peak_reserved = g.peak_reserved.max(d.peak_reserved);
            let growth = d.growth().unwrap_or(0);
            g.growth += growth;
            g.max_growth = g.max_growth.max(growth);
        }
    }
    let mut out: Vec<PhaseGroup> = groups.into_values().collect();
    out.sort_by_key(|g| (std::cmp::Reverse(g.peak_allocated), g.name.clone(), g.device));
    out
}
