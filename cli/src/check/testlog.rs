//! Logs made by hand for the check's unit tests: what the shim would write
//! for a program that allocates, frees and names phases, with allocation
//! sites of Python frames (which need no module file to be shown).

use cupool_core::log::{
    Definition, DeviceCounters, End, EventKind, EventRecord, ExitRecord, Header, Leak, LeakSummary, Log, ModuleRecord,
    Named, ProcessInfo, PyFrameRecord, StackRecord, StringRecord,
};
use cupool_core::options::Options;
use std::collections::BTreeMap;

pub struct LogBuilder {
    log: Log,
    seq: u64,
    next_ptr: u64,
    next_string: u32,
    /// ptr -> (alloc event index)
    live: BTreeMap<u64, usize>,
    mark: Option<String>,
    /// Time spent outside events (see `idle`).
    idle_ns: u64,
    /// The thread of the events to come (see `thread`).
    tid: u32,
}

impl LogBuilder {
    pub fn new(pid: u32, cmdline: &str) -> LogBuilder {
        let header = Header {
            schema: cupool_core::log::SCHEMA.into(),
            version: cupool_core::log::VERSION,
            process: ProcessInfo {
                pid,
                ppid: 1,
                cmdline: cmdline.split(' ').map(String::from).collect(),
                exe: String::new(),
                start_unix_ms: u64::from(pid),
                rank: None,
            },
            options: Options::default(),
        };
        let log = Log {
            path: format!("cupool.{pid}.json").into(),
            header,
            events: Vec::new(),
            definitions: Vec::new(),
            end: None,
        };
        LogBuilder {
            log,
            seq: 1,
            next_ptr: 0x7f00_0000_0000,
            next_string: 1,
            live: BTreeMap::new(),
            mark: None,
            idle_ns: 0,
            tid: 1,
        }
    }

    pub fn rank(mut self, rank: u32) -> LogBuilder {
        self.log.header.process.rank = Some(rank);
        self
    }

    pub fn options(mut self, f: impl FnOnce(&mut Options)) -> LogBuilder {
        f(&mut self.log.header.options);
        self
    }

    fn string(&mut self, text: &str) -> u32 {
        let id = self.next_string;
        self.next_string += 1;
        self.log.definitions.push(Definition::String(StringRecord { id, text: text.into() }));
        id
    }

    /// Stack `id`: Python frames `(file, function, line)`, innermost first.
    pub fn python_site(mut self, id: u32, frames: &[(&str, &str, u32)]) -> LogBuilder {
        let python =
            frames.iter().map(|(file, f, line)| PyFrameRecord(self.string(file), self.string(f), *line)).collect();
        self.log.definitions.push(Definition::Stack(StackRecord { id, native: Vec::new(), python }));
        self
    }

    /// Stack `id`: one native frame in a module at `path` (not on disk, so
    /// shown as module+offset only).
    pub fn module_site(mut self, id: u32, path: &str) -> LogBuilder {
        let start = 0x1000_0000 * u64::from(id);
        self.log.definitions.push(Definition::Module(ModuleRecord {
            id,
            path: path.into(),
            base: start,
            start,
            end: start + 0x10_0000,
            build_id: String::new(),
        }));
        self.log.definitions.push(Definition::Stack(StackRecord { id, native: vec![start + 0x1235], python: vec![] }));
        self
    }

    fn event(&mut self, ev: EventKind) -> EventRecord {
        let mut e = EventRecord::new(self.seq, self.seq * 1000 + self.idle_ns, ev);
        e.tid = Some(self.tid);
        self.seq += 1;
        e
    }

    /// A moment of its own, after every event so far and before every later
    /// one: its `t_ns` (for records made beside the log, such as PyTorch's history).
    pub fn now_ns(&mut self) -> u64 {
        self.seq += 1;
        (self.seq - 1) * 1000 + self.idle_ns
    }

    /// The program computes for `ns` without allocating or freeing.
    pub fn idle(&mut self, ns: u64) {
        self.idle_ns += ns;
    }

    pub fn alloc(&mut self, size: u64, stack: Option<u32>) -> u64 {
        self.alloc_as("cudaMalloc", "device", size, stack)
    }

    pub fn alloc_as(&mut self, api: &str, kind: &str, size: u64, stack: Option<u32>) -> u64 {
        let ptr = self.next_ptr;
        self.next_ptr += size.div_ceil(512) * 512 + 512;
        let mut e = self.event(EventKind::Alloc);
        e.api = Some(Named::from_name(api));
        e.kind = Some(Named::from_name(kind));
        e.ptr = Some(ptr);
        e.size = Some(size);
        e.device = Some(0);
        e.stack = stack;
        self.live.insert(ptr, self.log.events.len());
        self.log.events.push(e);
        ptr
    }

    pub fn free(&mut self, ptr: u64) {
        let i = self.live.remove(&ptr).expect("free of a live pointer");
        let a = self.log.events[i].clone();
        let mut e = self.event(EventKind::Free);
        e.api = Some(Named::from_name("cudaFree"));
        e.kind = a.kind;
        e.ptr = Some(ptr);
        e.size = a.size;
        e.device = Some(0);
        self.log.events.push(e);
    }

    fn edge(&mut self, ev: EventKind, api: &str, name: &str) {
        self.edge_on(ev, api, name, 0);
    }

    fn edge_on(&mut self, ev: EventKind, api: &str, name: &str, device: i32) {
        let mut e = self.event(ev);
        e.api = Some(Named::from_name(api));
        e.name = Some(name.into());
        e.device = Some(device);
        e.live = Some(0);
        e.reserved = Some(0);
        self.log.events.push(e);
    }

    /// `cupool_mark(name)`: ends the previous mark's phase, begins its own.
    pub fn mark(&mut self, name: &str) {
        if let Some(prev) = self.mark.replace(name.to_string()) {
            self.edge(EventKind::PhaseEnd, "cupool_mark", &prev);
        }
        self.edge(EventKind::PhaseBegin, "cupool_mark", name);
    }

    /// The events to come are made on thread `tid` (1 at first).
    pub fn thread(&mut self, tid: u32) {
        self.tid = tid;
    }

    /// An NVTX push on the current thread, for ranges that interleave with
    /// another thread's (see `nvtx` otherwise).
    pub fn nvtx_push(&mut self, name: &str) {
        self.edge(EventKind::PhaseBegin, "nvtxRangePushA", name);
    }

    pub fn nvtx_pop(&mut self, name: &str) {
        self.edge(EventKind::PhaseEnd, "nvtxRangePop", name);
    }

    /// An NVTX push/pop range around `body`.
    pub fn nvtx(&mut self, name: &str, body: impl FnOnce(&mut LogBuilder)) {
        self.nvtx_push(name);
        body(self);
        self.nvtx_pop(name);
    }

    /// An NVTX push/pop range around `body`, its edges written once for each
    /// of `devices`, as the shim writes them.
    pub fn nvtx_on(&mut self, name: &str, devices: &[i32], body: impl FnOnce(&mut LogBuilder)) {
        for &d in devices {
            self.edge_on(EventKind::PhaseBegin, "nvtxRangePushA", name, d);
        }
        body(self);
        for &d in devices {
            self.edge_on(EventKind::PhaseEnd, "nvtxRangePop", name, d);
        }
    }

    /// The process exits with `status`: the end record lists what is live.
    pub fn exit(mut self, status: i32) -> Log {
        let leaks: Vec<Leak> = self
            .live
            .values()
            .map(|&i| {
                let e = &self.log.events[i];
                Leak {
                    ptr: e.ptr,
                    handle: None,
                    size: e.size.unwrap_or(0),
                    device: 0,
                    kind: e.kind.clone().unwrap(),
                    api: e.api.clone().unwrap(),
                    age_ms: 1,
                    tid: 1,
                    at: "exit".into(),
                    stream: None,
                    stack: e.stack,
                }
            })
            .collect();
        let bytes = leaks.iter().map(|l| l.size).sum();
        self.log.end = Some(End {
            end_unix_ms: 2,
            duration_ms: 1,
            exit: ExitRecord::Exit { status: Some(status) },
            devices: vec![DeviceCounters::new(0)],
            host: DeviceCounters::new(-1),
            leak_summary: LeakSummary { bytes, count: leaks.len() as u64 },
            leaks,
            dropped_events: 0,
            pools: vec![],
            magazines: None,
            ooms: vec![],
            complete: true,
            notes: vec![],
        });
        self.log
    }

    /// The process was killed: no end record.
    pub fn killed(self) -> Log {
        self.log
    }
}
