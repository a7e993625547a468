//! The one pass over a log's timeline that makes its [`Process`].

use super::phases::{Family, PhaseSpan, SpanId};
use super::rebuild::{self, PoolReplay};
use super::{
    Allocation, Change, CheckpointView, DeviceSeries, Ended, EndedBy, ExitLeak, OomView, Peak, Process, Rebuilt,
    ReservedFrom, Sample, SizeBucket, Space, What,
};
use crate::log::{Api, End, EventKind, EventRecord, Header, Leak, Log, MemKind, Named};
use crate::options::{Backing, Mode};
use std::collections::{BTreeMap, HashMap};

/// CUDA's out-of-memory code, the same in the runtime and the driver.
const OUT_OF_MEMORY: i32 = 2;

/// The first log version whose pool records what it reserves and which allocations it serves.
const POOL_RECORDS_SINCE: u32 = 4;

pub(super) fn build(log: Log) -> Process {
    let mut order: Vec<usize> = (0..log.events.len()).collect();
    if !log.events.is_sorted_by_key(|e| e.seq) {
        order.sort_by_key(|&i| log.events[i].seq);
    }
    let mut b = Builder::new(&log.header, log.end.as_ref(), log.events.len(), true);
    for i in order {
        b.event(i, &log.events[i]);
    }
    b.finish(log)
}

/// One device's (or host memory's) figures while the pass runs.
#[derive(Default)]
struct DeviceState {
    series: DeviceSeries,
    now: Sample,
    /// Bytes of live allocations CUDA made itself (not pool blocks).
    direct: u64,
    /// Bytes the pool holds from CUDA, from its records.
    pool: u64,
}

/// The phase edge a thread is writing: one line per device.
struct Edge {
    begin: bool,
    name: String,
    api: String,
    span: SpanId,
    devices: Vec<i32>,
}

pub(super) struct Builder {
    changes: Vec<super::Change>,
    allocations: Vec<Allocation>,
    spans: Vec<PhaseSpan>,
    live: HashMap<(Space, u64), usize>,
    /// Live VMM mappings: address -> (device, size).
    mappings: HashMap<u64, (i32, u64)>,
    devices: BTreeMap<i32, DeviceState>,
    host: DeviceState,
    /// Phases open now, in the order they began.
    open: Vec<SpanId>,
    edges: HashMap<u32, Edge>,
    sizes: BTreeMap<u32, SizeBucket>,
    ooms: Vec<OomView>,
    checkpoints: Vec<CheckpointView>,
    reserved_from: ReservedFrom,
    replay: Option<PoolReplay>,
    /// Allocations the end record says a checkpoint found live: (API, key) -> how many.
    dying: HashMap<(String, Space, u64), u32>,
    /// What could not be used: a line -> (records, first seq).
    problems: BTreeMap<String, (u64, u64)>,
    last_t: u64,
    /// Every change is kept (`changes`, every sample, every allocation and
    /// phase). Without: only what is live and open now, the last sample of
    /// each device and the peaks, so a model that follows a running
    /// program stays as small as what the program holds.
    history: bool,
    /// Changes so far (the length of `changes` when it is kept).
    n_changes: usize,
    /// Without history: allocations that ended, whose places can be taken.
    free_ids: Vec<usize>,
}

fn space_of(kind: &Named<MemKind>) -> Space {
    if *kind == MemKind::Vmm {
        Space::VmmHandle
    } else {
        Space::Pointer
    }
}

fn leak_key(l: &Leak) -> Option<(Space, u64)> {
    match (l.handle, l.ptr) {
        (Some(h), _) => Some((Space::VmmHandle, h)),
        (None, Some(p)) => Some((Space::Pointer, p)),
        _ => None,
    }
}

impl Builder {
    pub(super) fn new(header: &Header, end: Option<&End>, events: usize, history: bool) -> Builder {
        let opts = &header.options;
        let reserved_from = match (opts.mode, header.version >= POOL_RECORDS_SINCE, opts.backing) {
            (Mode::Passthrough, _, _) => ReservedFrom::Allocations,
            (Mode::Pool, true, _) => ReservedFrom::PoolRecords,
            (Mode::Pool, false, Backing::Segments) => ReservedFrom::RebuiltSegments,
            (Mode::Pool, false, Backing::Vmm) => ReservedFrom::NotRecorded,
        };
        let replay = (reserved_from == ReservedFrom::RebuiltSegments).then(|| PoolReplay::new(opts)).flatten();
        let mut dying = HashMap::new();
        for l in end.iter().flat_map(|e| &e.leaks) {
            if l.at != "exit" {
                if let Some((space, addr)) = leak_key(l) {
                    *dying.entry((l.at.clone(), space, addr)).or_insert(0) += 1;
                }
            }
        }
        Builder {
            changes: Vec::with_capacity(if history { events } else { 0 }),
            allocations: Vec::new(),
            spans: Vec::new(),
            live: HashMap::new(),
            mappings: HashMap::new(),
            devices: BTreeMap::new(),
            host: DeviceState { series: DeviceSeries { device: -1, ..Default::default() }, ..Default::default() },
            open: Vec::new(),
            edges: HashMap::new(),
            sizes: BTreeMap::new(),
            ooms: Vec::new(),
            checkpoints: Vec::new(),
            reserved_from,
            replay,
            dying,
            problems: BTreeMap::new(),
            last_t: 0,
            history,
            n_changes: 0,
            free_ids: Vec::new(),
        }
    }

    fn problem(&mut self, e: &EventRecord, line: String) {
        let p = self.problems.entry(line).or_insert((0, e.seq));
        p.0 += 1;
    }

    fn push(&mut self, i: usize, e: &EventRecord, what: What) -> usize {
        if self.history {
            self.changes.push(Change { event: i, seq: e.seq, t_ns: e.t_ns, tid: e.tid.unwrap_or(0), what });
        }
        self.n_changes += 1;
        self.n_changes - 1
    }

    pub(super) fn event(&mut self, i: usize, e: &EventRecord) {
        self.last_t = self.last_t.max(e.t_ns);
        let Some(kind) = e.ev.known() else {
            self.problem(e, format!("events of a kind this cupool does not know (\"{}\")", e.ev.as_str()));
            return;
        };
        let tid = e.tid.unwrap_or(0);
        if !matches!(kind, EventKind::PhaseBegin | EventKind::PhaseEnd) {
            self.edges.remove(&tid);
        }
        let device = e.device.unwrap_or(-1);
        match kind {
            EventKind::Start => {}
            EventKind::Alloc => self.alloc(i, e),
            EventKind::Free => self.free(i, e),
            EventKind::AllocFailed => {
                let host = e.kind.as_ref().is_some_and(|k| *k == MemKind::Host);
                let size = e.size.unwrap_or(0);
                let result = e.result.unwrap_or(0);
                self.push(i, e, What::Refused { device, size, result, host });
                if host {
                    self.host.series.failures += 1;
                } else {
                    self.change(device, e.t_ns, |st| st.series.failures += 1);
                    if result == OUT_OF_MEMORY {
                        self.ooms.push(OomView {
                            t_ns: e.t_ns,
                            device,
                            api: api_text(e),
                            requested: size,
                            phase: self.phase_now(),
                            snapshot: None,
                        });
                    }
                }
            }
            EventKind::Oom => {
                self.push(i, e, What::OutOfMemory { device, size: e.size.unwrap_or(0) });
                if let Some(r) = &mut self.replay {
                    r.out_of_memory(device, e.t_ns);
                    self.change(device, e.t_ns, |_| {});
                }
            }
            EventKind::InvalidFree => {
                self.push(i, e, What::InvalidFree { device });
            }
            EventKind::Map => {
                let (Some(addr), Some(size)) = (e.ptr, e.size) else {
                    return self.problem(e, "map events without a pointer or size".into());
                };
                self.push(i, e, What::Map { device, addr, size });
                self.mappings.insert(addr, (device, size));
                self.change(device, e.t_ns, |st| st.now.mapped += size);
            }
            EventKind::Unmap => {
                let Some(addr) = e.ptr else {
                    return self.problem(e, "unmap events without a pointer".into());
                };
                let (d, size) = self.mappings.remove(&addr).unwrap_or((device, 0));
                self.push(i, e, What::Unmap { device: d, addr, size });
                if size > 0 {
                    self.change(d, e.t_ns, |st| st.now.mapped = st.now.mapped.saturating_sub(size));
                }
            }
            EventKind::Reserve | EventKind::Release => {
                let bytes = e.size.unwrap_or(0);
                let reserve = kind == EventKind::Reserve;
                self.push(
                    i,
                    e,
                    if reserve { What::Reserve { device, bytes } } else { What::Release { device, bytes } },
                );
                self.change(device, e.t_ns, |st| {
                    st.pool = if reserve { st.pool + bytes } else { st.pool.saturating_sub(bytes) };
                });
            }
            EventKind::Checkpoint => self.checkpoint(i, e),
            EventKind::PhaseBegin | EventKind::PhaseEnd => self.phase_edge(i, e, kind == EventKind::PhaseBegin),
        }
    }

    fn alloc(&mut self, i: usize, e: &EventRecord) {
        let (Some(addr), Some(kind)) = (e.ptr, e.kind.clone()) else {
            return self.problem(e, "alloc events without a pointer or kind".into());
        };
        let pooled = match self.reserved_from {
            ReservedFrom::PoolRecords => e.pooled,
            ReservedFrom::RebuiltSegments | ReservedFrom::NotRecorded => rebuild::pooled(e),
            ReservedFrom::Allocations => false,
        };
        let at = self.n_changes;
        let a = Allocation {
            event: i,
            at,
            seq: e.seq,
            t_ns: e.t_ns,
            tid: e.tid.unwrap_or(0),
            api: e.api.clone().unwrap_or(Named::Known(Api::None)),
            space: space_of(&kind),
            kind,
            addr,
            size: e.size.unwrap_or(0),
            device: e.device.unwrap_or(-1),
            stream: e.stream,
            stack: e.stack,
            pooled,
            phase: if self.history { self.open.last().copied() } else { None },
            end: None,
        };
        let (key, size, device, host, direct) = ((a.space, addr), a.size, a.device, a.is_host(), a.direct_bytes());
        let id = match self.free_ids.pop() {
            Some(id) => {
                self.allocations[id] = a;
                id
            }
            None => {
                self.allocations.push(a);
                self.allocations.len() - 1
            }
        };
        self.push(i, e, What::Alloc(id));
        if let Some(old) = self.live.insert(key, id) {
            self.end(old, at, e.t_ns, EndedBy::AddressReused);
        }
        if host {
            let st = &mut self.host;
            st.series.allocs += 1;
            st.now.allocated += size;
            st.series.live_count += 1;
            st.series.peak_count = st.series.peak_count.max(st.series.live_count);
            st.now.t_ns = e.t_ns;
            let now = st.now;
            st.series.peak_allocated.offer(now.allocated, now.t_ns, || None);
            record(&mut st.series.samples, now, self.history);
            return;
        }
        if let (Some(r), true) = (&mut self.replay, pooled) {
            r.alloc(id, device, addr, size, e.t_ns);
        }
        let bucket = 64 - size.leading_zeros();
        let b = self.sizes.entry(bucket).or_insert_with(|| SizeBucket {
            low: if bucket == 0 { 0 } else { 1 << (bucket - 1) },
            ..Default::default()
        });
        b.count += 1;
        b.bytes += size;
        self.change(device, e.t_ns, |st| {
            st.series.allocs += 1;
            st.series.live_count += 1;
            st.series.peak_count = st.series.peak_count.max(st.series.live_count);
            st.now.allocated += size;
            st.direct += direct;
        });
    }

    fn free(&mut self, i: usize, e: &EventRecord) {
        let (Some(addr), Some(kind)) = (e.ptr, e.kind.as_ref()) else {
            return self.problem(e, "free events without a pointer or kind".into());
        };
        let device = e.device.unwrap_or(-1);
        match self.live.remove(&(space_of(kind), addr)) {
            Some(id) => {
                let at = self.push(i, e, What::Free(id));
                let d = self.allocations[id].device;
                if self.allocations[id].is_host() {
                    self.host.series.frees += 1;
                } else {
                    self.change(d, e.t_ns, |st| st.series.frees += 1);
                }
                self.end(id, at, e.t_ns, EndedBy::Free);
            }
            None => {
                self.push(i, e, What::FreeOfUnknown { device, size: e.size.unwrap_or(0) });
                if *kind == MemKind::Host {
                    self.host.series.frees += 1;
                } else {
                    self.change(device, e.t_ns, |st| st.series.frees += 1);
                }
            }
        }
    }

    /// Allocation `id` ended at change `at`: off the books.
    fn end(&mut self, id: usize, at: usize, t_ns: u64, by: EndedBy) {
        if !self.history && self.replay.is_none() {
            self.free_ids.push(id);
        }
        let a = &mut self.allocations[id];
        a.end = Some(Ended { at, t_ns, by });
        let (size, device, direct, pooled) = (a.size, a.device, a.direct_bytes(), a.pooled);
        if a.is_host() {
            let st = &mut self.host;
            st.now.allocated = st.now.allocated.saturating_sub(size);
            st.series.live_count = st.series.live_count.saturating_sub(1);
            st.now.t_ns = t_ns;
            record(&mut st.series.samples, st.now, self.history);
            return;
        }
        if let (Some(r), true) = (&mut self.replay, pooled) {
            r.free(id, device, t_ns);
        }
        self.change(device, t_ns, |st| {
            st.now.allocated = st.now.allocated.saturating_sub(size);
            st.direct = st.direct.saturating_sub(direct);
            st.series.live_count = st.series.live_count.saturating_sub(1);
        });
    }

    fn checkpoint(&mut self, i: usize, e: &EventRecord) {
        let device = e.device.unwrap_or(-1);
        let (bytes, count) = (e.leaked_bytes.unwrap_or(0), e.leaked_count.unwrap_or(0));
        let at = self.push(i, e, What::Checkpoint { device, bytes, count });
        let api = api_text(e);
        self.checkpoints.push(CheckpointView {
            t_ns: e.t_ns,
            device,
            api: api.clone(),
            leaked_bytes: bytes,
            leaked_count: count,
        });
        // The allocations the end record names as found here died with their context.
        let mut died: Vec<((Space, u64), usize)> = self
            .live
            .iter()
            .filter(|&(&(space, addr), &id)| {
                self.allocations[id].device == device
                    && self.dying.get(&(api.clone(), space, addr)).is_some_and(|n| *n > 0)
            })
            .map(|(&k, &id)| (k, id))
            .collect();
        died.sort_by_key(|&(_, id)| id);
        for (key, id) in died {
            if let Some(n) = self.dying.get_mut(&(api.clone(), key.0, key.1)) {
                *n -= 1;
            }
            self.live.remove(&key);
            self.end(id, at, e.t_ns, EndedBy::ContextDestroyed);
        }
    }

    /// The innermost phase open now.
    fn phase_now(&self) -> Option<String> {
        self.open.last().map(|&s| self.spans[s].name.clone())
    }

    /// Applies `f` to `device`'s figures at `t_ns`, then records the sample and the peaks.
    fn change(&mut self, device: i32, t_ns: u64, f: impl FnOnce(&mut DeviceState)) {
        let rebuilt = self.replay.as_ref().map(|r| r.reserved(device));
        let phase = self.open.last().map(|&s| &self.spans[s].name);
        let st = self.devices.entry(device).or_insert_with(|| DeviceState {
            series: DeviceSeries { device, ..Default::default() },
            ..Default::default()
        });
        f(st);
        st.now.t_ns = t_ns;
        st.now.reserved = st.direct + rebuilt.unwrap_or(st.pool);
        let now = st.now;
        let samples = &mut st.series.samples;
        match samples.last_mut() {
            Some(last) if last.t_ns == now.t_ns || !self.history => *last = now,
            Some(last) if (last.allocated, last.reserved, last.mapped) == (now.allocated, now.reserved, now.mapped) => {
            }
            _ => samples.push(now),
        }
        st.series.peak_allocated.offer(now.allocated, t_ns, || phase.cloned());
        st.series.peak_reserved.offer(now.reserved, t_ns, || phase.cloned());
        st.series.peak_mapped.offer(now.mapped, t_ns, || phase.cloned());
        for &s in &self.open {
            let d = self.spans[s].device(device);
            d.peak_allocated = d.peak_allocated.max(now.allocated);
            d.peak_reserved = d.peak_reserved.max(now.reserved);
        }
    }

    /// A line of a phase edge: the shim writes one per device, one after
    /// the other on the thread that made the edge.
    fn phase_edge(&mut self, i: usize, e: &EventRecord, begin: bool) {
        let name = e.name.clone().unwrap_or_default();
        let api = api_text(e);
        let tid = e.tid.unwrap_or(0);
        let device = e.device.unwrap_or(-1);
        let same_edge = self.edges.get_mut(&tid).filter(|g| g.begin == begin && g.name == name && g.api == api);
        let span = match same_edge {
            Some(g) if !g.devices.contains(&device) => {
                g.devices.push(device);
                g.span
            }
            _ => {
                let family = Family::of(e.api.as_ref().and_then(Named::known));
                let span = self.new_edge(i, e, begin, family, &name);
                self.edges.insert(tid, Edge { begin, name, api, span, devices: vec![device] });
                span
            }
        };
        if device < 0 {
            return; // no device had memory activity yet
        }
        let now = self.devices.get(&device).map(|d| d.now).unwrap_or_default();
        let d = self.spans[span].device(device);
        if begin {
            d.allocated_begin = e.live;
            d.reserved_begin = e.reserved;
            d.peak_allocated = d.peak_allocated.max(now.allocated);
            d.peak_reserved = d.peak_reserved.max(now.reserved);
        } else {
            d.allocated_end = e.live;
            d.reserved_end = e.reserved;
        }
    }

    /// A new edge: a span begins, or the open span it ends ends (one that
    /// began before the log did, when none is open).
    fn new_edge(&mut self, i: usize, e: &EventRecord, begin: bool, family: Family, name: &str) -> SpanId {
        let tid = e.tid.unwrap_or(0);
        let change = self.n_changes;
        if !self.history && self.spans.len() >= FORGET_SPANS {
            self.forget_spans();
        }
        if begin {
            let id = self.spans.len();
            let mut span = PhaseSpan {
                name: name.to_string(),
                family,
                tid,
                begin_ns: e.t_ns,
                end_ns: None,
                begin: Some(change),
                end: None,
                parent: self.open.last().copied(),
                devices: Vec::new(),
            };
            // What is live now, on every device, counts towards its peak.
            for (&device, st) in &self.devices {
                let d = span.device(device);
                d.peak_allocated = st.now.allocated;
                d.peak_reserved = st.now.reserved;
            }
            self.spans.push(span);
            self.open.push(id);
            self.push(i, e, What::PhaseBegin(id));
            return id;
        }
        let spans = &self.spans;
        let id = match self.open.iter().rposition(|&s| spans[s].ends_with(family, name, tid)) {
            Some(at) => self.open.remove(at),
            None => {
                self.spans.push(PhaseSpan {
                    name: name.to_string(),
                    family,
                    tid,
                    begin_ns: 0,
                    end_ns: None,
                    begin: None,
                    end: None,
                    parent: None,
                    devices: Vec::new(),
                });
                self.spans.len() - 1
            }
        };
        self.spans[id].end_ns = Some(e.t_ns);
        self.spans[id].end = Some(change);
        self.push(i, e, What::PhaseEnd(id));
        id
    }

    fn finish(mut self, log: Log) -> Process {
        let end = log.end.as_ref();
        let mut duration = self.last_t;
        if let Some(end) = end {
            duration = duration.max(end.duration_ms.saturating_mul(1_000_000));
            // Each snapshot goes to the refusal it was taken for.
            for snap in &end.ooms {
                let best = self
                    .ooms
                    .iter_mut()
                    .filter(|o| o.device == snap.device && o.snapshot.is_none() && o.requested == snap.requested)
                    .min_by_key(|o| o.t_ns.abs_diff(snap.t_ns));
                match best {
                    Some(o) => o.snapshot = Some(snap.clone()),
                    None => self.ooms.push(OomView {
                        t_ns: snap.t_ns,
                        device: snap.device,
                        api: String::new(),
                        requested: snap.requested,
                        phase: None,
                        snapshot: Some(snap.clone()),
                    }),
                }
            }
            self.ooms.sort_by_key(|o| o.t_ns);
        }
        let leaks = self.exit_leaks(&log);
        let recorded: HashMap<i32, u64> =
            end.map(|e| e.devices.iter().map(|d| (d.device, d.peak_reserved_bytes)).collect()).unwrap_or_default();
        let devices = self
            .devices
            .into_values()
            .map(|mut st| {
                st.series.recorded_peak_reserved = recorded.get(&st.series.device).copied();
                st.series
            })
            .collect();
        let mut host = self.host.series;
        host.recorded_peak_reserved = end.map(|e| e.host.peak_reserved_bytes);
        let problems = self
            .problems
            .into_iter()
            .map(|(line, (n, seq))| format!("{n} record(s) skipped: {line} (the first at seq {seq})"))
            .collect();
        Process {
            changes: self.changes,
            allocations: self.allocations,
            spans: self.spans,
            devices,
            host,
            sizes: self.sizes.into_values().collect(),
            ooms: self.ooms,
            checkpoints: self.checkpoints,
            leaks,
            reserved_from: self.reserved_from,
            rebuilt: self.replay.as_ref().map(|r| Rebuilt { placed: r.placed, misplaced: r.misplaced }),
            duration_ns: duration,
            problems,
            log,
        }
    }

    /// The end record's leaks, each matched to its allocation; for a log
    /// cut short, what the timeline leaves live.
    fn exit_leaks(&self, log: &Log) -> Vec<ExitLeak> {
        if let Some(end) = &log.end {
            // An allocation a checkpoint found: the last one ended there at that key.
            let mut died: HashMap<(Space, u64), Vec<usize>> = HashMap::new();
            for (id, a) in self.allocations.iter().enumerate() {
                if a.end.is_some_and(|e| e.by == EndedBy::ContextDestroyed) {
                    died.entry((a.space, a.addr)).or_default().push(id);
                }
            }
            return end
                .leaks
                .iter()
                .map(|l| {
                    let alloc = leak_key(l).and_then(|key| {
                        if l.at == "exit" {
                            self.live.get(&key).copied()
                        } else {
                            died.get_mut(&key).and_then(Vec::pop)
                        }
                    });
                    let alloc = alloc.filter(|&id| self.allocations[id].size == l.size);
                    ExitLeak { leak: l.clone(), alloc }
                })
                .collect();
        }
        let mut live: Vec<usize> = self.live.values().copied().collect();
        live.sort_by_key(|&id| (std::cmp::Reverse(self.allocations[id].size), self.allocations[id].seq));
        live.into_iter()
            .map(|id| {
                let a = &self.allocations[id];
                let leak = Leak {
                    ptr: (a.space == Space::Pointer).then_some(a.addr),
                    handle: (a.space == Space::VmmHandle).then_some(a.addr),
                    size: a.size,
                    device: a.device,
                    kind: a.kind.clone(),
                    api: a.api.clone(),
                    age_ms: self.last_t.saturating_sub(a.t_ns) / 1_000_000,
                    tid: a.tid,
                    at: "not finished".into(),
                    stream: a.stream,
                    stack: a.stack,
                };
                ExitLeak { leak, alloc: Some(id) }
            })
            .collect()
    }
}

/// What a model without history shows of the program now.
impl Builder {
    /// Each device's series: the figures now (the last sample), the counts and the peaks.
    pub(super) fn device_series(&self) -> impl Iterator<Item = &DeviceSeries> {
        self.devices.values().map(|d| &d.series)
    }

    pub(super) fn host_series(&self) -> &DeviceSeries {
        &self.host.series
    }

    /// The allocations live now.
    pub(super) fn live(&self) -> impl Iterator<Item = &Allocation> {
        self.live.values().map(|&id| &self.allocations[id])
    }

    /// The innermost phase open now.
    pub(super) fn phase_name(&self) -> Option<&str> {
        self.open.last().map(|&s| self.spans[s].name.as_str())
    }

    /// The latest time an event had.
    pub(super) fn last_t(&self) -> u64 {
        self.last_t
    }

    /// Allocations the model holds (live ones, and ended ones whose places are not yet taken).
    pub(super) fn held(&self) -> (usize, usize) {
        (self.allocations.len(), self.spans.len())
    }
}

/// Without history, closed phases are forgotten once this many are kept.
const FORGET_SPANS: usize = 4096;

impl Builder {
    /// Drops the phases that are closed and no thread is writing an edge
    /// of (without history nothing else names a phase).
    fn forget_spans(&mut self) {
        let mut keep: Vec<SpanId> = self.open.iter().chain(self.edges.values().map(|e| &e.span)).copied().collect();
        keep.sort_unstable();
        keep.dedup();
        let new_id = |old: SpanId| keep.binary_search(&old).ok();
        self.spans = keep.iter().map(|&s| self.spans[s].clone()).collect();
        for s in &mut self.spans {
            s.parent = s.parent.and_then(new_id);
        }
        for s in &mut self.open {
            *s = new_id(*s).expect("kept");
        }
        for e in self.edges.values_mut() {
            e.span = new_id(e.span).expect("kept");
        }
    }
}

/// Records `now` after the samples so far: every change with history,
/// else only the last.
fn record(samples: &mut Vec<Sample>, now: Sample, history: bool) {
    match samples.last_mut() {
        Some(last) if !history => *last = now,
        _ => samples.push(now),
    }
}

fn api_text(e: &EventRecord) -> String {
    e.api.as_ref().map(|a| a.as_str().to_string()).unwrap_or_default()
}

impl Peak {
    fn offer(&mut self, bytes: u64, t_ns: u64, phase: impl FnOnce() -> Option<String>) {
        if bytes > self.bytes {
            *self = Peak { bytes, t_ns, phase: phase() };
        }
    }
}
