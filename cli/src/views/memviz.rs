//! `cupool export --memory-viz`: a snapshot in PyTorch's schema
//! (`torch.cuda.memory._snapshot()`), pickled with only the opcodes memory_viz
//! reads (`pickle`), for pytorch.org/memory_viz or
//! `python -m torch.cuda._memory_viz`.
//!
//! `segments`: what was held at the end of the log. In pool mode, the pool's
//! segments and blocks, rebuilt by replaying the program's requests
//! (`super::pool`; at the program's own addresses when the replay put every
//! block where the program had it, else at the replay's); allocations the pool
//! did not serve, and every allocation in passthrough mode, are each a segment
//! of their own. `device_traces`: one list per device of `segment_alloc`,
//! `alloc`, `free_requested`, `free_completed`, `segment_free` and `oom`
//! entries in order, with `time_us`. Frames come from the allocation sites:
//! Python frames, then the native ones, named from the module files on disk.
//! VMM memory (`cuMemCreate`) and pinned host memory are left out.

use super::pickle::{Memo, Pickler};
use crate::sites::{Resolver, ShownFrame};
use cupool_core::log::MemKind;
use cupool_core::model::rebuild::{PoolReplay, Step};
use cupool_core::model::{AllocId, Allocation, PoolWatch, Process, What};
use cupool_core::pool::BlockState;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

/// One entry of a device trace.
#[derive(Clone, Copy)]
struct Entry {
    action: &'static str,
    addr: u64,
    size: u64,
    stream: u64,
    t_us: u64,
    stack: Option<u32>,
    /// The address is the replay's (translated at the end when it agrees with the log).
    replayed: bool,
    device_free: Option<u64>,
}

/// A live allocation the pool did not serve: a segment of its own.
struct Own {
    device: i32,
    size: u64,
    stream: u64,
    stack: Option<u32>,
}

/// Follows one process's allocations and their ends.
struct Tracer<'a> {
    p: &'a Process,
    start_us: u64,
    traces: BTreeMap<i32, Vec<Entry>>,
    /// Live pooled blocks: replay address -> (requested size, stack).
    blocks: HashMap<u64, (u64, Option<u32>)>,
    /// Allocation -> replay address of its block.
    pooled: HashMap<AllocId, u64>,
    /// Live allocations the pool did not serve, by address.
    own: BTreeMap<u64, Own>,
    limit: u64,
    /// Pool-mode reserved bytes per device, for an OOM entry's `device_free`.
    reserved: HashMap<i32, u64>,
}

impl Tracer<'_> {
    fn push(&mut self, device: i32, entry: Entry) {
        self.traces.entry(device).or_default().push(entry);
    }

    fn entry(&self, action: &'static str, addr: u64, size: u64, a: &Allocation, t_ns: u64, replayed: bool) -> Entry {
        Entry {
            action,
            addr,
            size,
            stream: a.stream.unwrap_or(0),
            t_us: self.start_us + t_ns / 1000,
            stack: a.stack,
            replayed,
            device_free: None,
        }
    }

    fn segments(&mut self, device: i32, step: &Step, a: &Allocation, t_ns: u64) {
        for s in &step.segments {
            let action = if s.alloc { "segment_alloc" } else { "segment_free" };
            let mut entry = self.entry(action, s.addr, s.size, a, t_ns, true);
            entry.stack = None;
            let r = self.reserved.entry(device).or_default();
            *r = if s.alloc { *r + s.size } else { r.saturating_sub(s.size) };
            self.push(device, entry);
        }
    }

    /// Memory this view leaves out.
    fn skipped(a: &Allocation) -> bool {
        matches!(a.kind.known(), Some(MemKind::Host | MemKind::Vmm))
    }
}

impl PoolWatch for Tracer<'_> {
    fn allocated(&mut self, id: AllocId, step: Option<&Step>) {
        let a = &self.p.allocations[id];
        if Self::skipped(a) {
            return;
        }
        let (device, ptr, size, t) = (a.device, a.addr, a.size, a.t_ns);
        match step {
            Some(step) => {
                self.segments(device, step, a, t);
                if let Some(b) = step.block {
                    self.blocks.insert(b.addr, (size, a.stack));
                    self.pooled.insert(id, b.addr);
                    let entry = self.entry("alloc", b.addr, size, a, t, true);
                    self.push(device, entry);
                }
            }
            None => {
                let stream = a.stream.unwrap_or(0);
                self.own.insert(ptr, Own { device, size, stream, stack: a.stack });
                let mut seg = self.entry("segment_alloc", ptr, size, a, t, false);
                seg.stack = None;
                self.push(device, seg);
                let entry = self.entry("alloc", ptr, size, a, t, false);
                self.push(device, entry);
            }
        }
    }

    fn ended(&mut self, id: AllocId, step: Option<&Step>) {
        let a = &self.p.allocations[id];
        if Self::skipped(a) {
            return;
        }
        let (device, ptr) = (a.device, a.addr);
        let t = a.end.map_or(a.t_ns, |e| e.t_ns);
        match (step, self.pooled.remove(&id)) {
            (Some(step), Some(addr)) => {
                let (size, stack) = self.blocks.remove(&addr).unwrap_or((a.size, None));
                for action in ["free_requested", "free_completed"] {
                    let mut entry = self.entry(action, addr, size, a, t, true);
                    entry.stack = stack;
                    self.push(device, entry);
                }
                self.segments(device, step, a, t);
            }
            _ => {
                let Some(own) = self.own.remove(&ptr) else { return };
                for action in ["free_requested", "free_completed"] {
                    let mut entry = self.entry(action, ptr, own.size, a, t, false);
                    entry.stack = own.stack;
                    self.push(own.device, entry);
                }
                let seg = Entry { stack: None, ..self.entry("segment_free", ptr, own.size, a, t, false) };
                self.push(own.device, seg);
            }
        }
    }

    fn out_of_memory(&mut self, change: usize, step: &Step) {
        let c = self.p.changes[change];
        let What::OutOfMemory { device, size } = c.what else { return };
        let reserved = self.reserved.get(&device).copied().unwrap_or(0);
        let entry = Entry {
            action: "oom",
            addr: 0,
            size,
            stream: 0,
            t_us: self.start_us + c.t_ns / 1000,
            stack: None,
            replayed: false,
            // What CUDA had free is not in the log; under a `limit`, what the cap left.
            device_free: Some(self.limit.saturating_sub(reserved)),
        };
        self.push(device, entry);
        for s in &step.segments {
            let action = if s.alloc { "segment_alloc" } else { "segment_free" };
            let r = self.reserved.entry(device).or_default();
            *r = if s.alloc { *r + s.size } else { r.saturating_sub(s.size) };
            let e = Entry { action, addr: s.addr, size: s.size, replayed: true, device_free: None, ..entry };
            self.push(device, e);
        }
    }
}

/// Frames in memory_viz's form, written once per stack and then taken from the memo.
struct Frames {
    resolver: Resolver,
    written: HashMap<u32, Memo>,
    empty: Option<Memo>,
}

impl Frames {
    fn write<W: Write>(&mut self, p: &mut Pickler<W>, stack: Option<u32>) -> io::Result<()> {
        let memo = match stack {
            Some(id) => self.written.get(&id).copied(),
            None => self.empty,
        };
        if let Some(m) = memo {
            return p.get(m);
        }
        let frames: Vec<ShownFrame> = stack.map(|id| self.resolver.frames(id)).unwrap_or_default();
        p.begin_list()?;
        for f in &frames {
            let filename = match (&f.file, &f.module) {
                (Some(file), _) => file.clone(),
                (None, Some(module)) => format!("{module}+0x{:x}", f.offset.unwrap_or(0)),
                (None, None) => "??".to_string(),
            };
            p.begin_dict()?;
            p.key("filename")?;
            p.str(&filename)?;
            p.key("line")?;
            p.uint(u64::from(f.line.unwrap_or(0)))?;
            p.key("name")?;
            p.str(f.function.as_deref().unwrap_or("??"))?;
            p.end()?;
        }
        p.end()?;
        let m = p.memoize()?;
        match stack {
            Some(id) => {
                self.written.insert(id, m);
            }
            None => self.empty = Some(m),
        }
        Ok(())
    }
}

/// What one export wrote, for the line `cupool export` prints.
pub struct Written {
    pub segments: usize,
    pub entries: usize,
    /// Pool mode: the replay put every block where the program had it.
    pub at_real_addresses: bool,
}

/// Writes the snapshot of process `p` into `out`.
pub fn write(p: &Process, out: impl Write) -> io::Result<Written> {
    let log = &p.log;
    let opts = &log.header.options;
    let mut tracer = Tracer {
        p,
        start_us: log.header.process.start_unix_ms.saturating_mul(1000),
        traces: BTreeMap::new(),
        blocks: HashMap::new(),
        pooled: HashMap::new(),
        own: BTreeMap::new(),
        limit: opts.limit,
        reserved: HashMap::new(),
    };
    let replay = p.replay_pool(&mut tracer);
    let real = |addr: u64, replayed: bool| match (&replay, replayed) {
        (Some(r), true) => r.real(addr),
        _ => addr,
    };
    let mut frames = Frames { resolver: Resolver::new(log), written: HashMap::new(), empty: None };
    let mut pk = Pickler::new(io::BufWriter::new(out))?;
    let mut written =
        Written { segments: 0, entries: 0, at_real_addresses: replay.as_ref().is_none_or(PoolReplay::consistent) };
    pk.begin_dict()?;

    pk.key("segments")?;
    pk.begin_list()?;
    let pool_devices = replay.as_ref().map(PoolReplay::devices).unwrap_or_default();
    for &device in &pool_devices {
        let Some(r) = &replay else { break };
        for seg in r.snapshot(device) {
            written.segments += 1;
            let state = |s: BlockState| match s {
                BlockState::Allocated => "active_allocated",
                BlockState::PendingFree => "active_pending_free",
                BlockState::Free => "inactive",
            };
            let sum =
                |pick: &dyn Fn(&cupool_core::pool::BlockSnapshot) -> u64| seg.blocks.iter().map(pick).sum::<u64>();
            segment_head(
                &mut pk,
                device,
                real(seg.addr, true),
                seg.size,
                0,
                if seg.small { "small" } else { "large" },
            )?;
            pk.key("allocated_size")?;
            pk.uint(sum(&|b| if b.state == BlockState::Allocated { b.size } else { 0 }))?;
            pk.key("active_size")?;
            pk.uint(sum(&|b| if b.state == BlockState::Free { 0 } else { b.size }))?;
            pk.key("requested_size")?;
            pk.uint(sum(&|b| b.requested))?;
            pk.key("blocks")?;
            pk.begin_list()?;
            for b in &seg.blocks {
                let stack = tracer.blocks.get(&b.addr).and_then(|x| x.1);
                pk.begin_dict()?;
                pk.key("address")?;
                pk.uint(real(b.addr, true))?;
                pk.key("size")?;
                pk.uint(b.size)?;
                pk.key("requested_size")?;
                pk.uint(if b.state == BlockState::Free { 0 } else { b.requested })?;
                pk.key("state")?;
                pk.str(state(b.state))?;
                pk.key("frames")?;
                frames.write(&mut pk, if b.state == BlockState::Free { None } else { stack })?;
                pk.end()?;
            }
            pk.end()?;
            pk.end()?;
        }
    }
    for (&ptr, own) in &tracer.own {
        if own.device < 0 {
            continue;
        }
        written.segments += 1;
        segment_head(&mut pk, own.device, ptr, own.size, own.stream, "large")?;
        for key in ["allocated_size", "active_size", "requested_size"] {
            pk.key(key)?;
            pk.uint(own.size)?;
        }
        pk.key("blocks")?;
        pk.begin_list()?;
        pk.begin_dict()?;
        pk.key("address")?;
        pk.uint(ptr)?;
        pk.key("size")?;
        pk.uint(own.size)?;
        pk.key("requested_size")?;
        pk.uint(own.size)?;
        pk.key("state")?;
        pk.str("active_allocated")?;
        pk.key("frames")?;
        frames.write(&mut pk, own.stack)?;
        pk.end()?;
        pk.end()?;
        pk.end()?;
    }
    pk.end()?;

    // One trace per device ordinal from 0, as memory_viz indexes them.
    pk.key("device_traces")?;
    pk.begin_list()?;
    let last = tracer.traces.keys().copied().chain(pool_devices.iter().copied()).max().unwrap_or(-1);
    for device in 0..=last {
        pk.begin_list()?;
        for e in tracer.traces.get(&device).map(Vec::as_slice).unwrap_or(&[]) {
            written.entries += 1;
            pk.begin_dict()?;
            pk.key("action")?;
            pk.str(e.action)?;
            pk.key("addr")?;
            pk.uint(real(e.addr, e.replayed))?;
            pk.key("size")?;
            pk.uint(e.size)?;
            pk.key("stream")?;
            pk.uint(e.stream)?;
            pk.key("time_us")?;
            pk.uint(e.t_us)?;
            if let Some(free) = e.device_free {
                pk.key("device_free")?;
                pk.uint(free)?;
            }
            pk.key("frames")?;
            frames.write(&mut pk, e.stack)?;
            pk.end()?;
        }
        pk.end()?;
    }
    pk.end()?;

    // Settings as PyTorch names them, and where the snapshot came from.
    pk.key("allocator_settings")?;
    pk.begin_dict()?;
    pk.key("cupool_mode")?;
    pk.str(match opts.mode {
        cupool_core::options::Mode::Pool => "pool",
        cupool_core::options::Mode::Passthrough => "passthrough",
    })?;
    pk.end()?;
    pk.key("cupool")?;
    pk.begin_dict()?;
    pk.key("pid")?;
    pk.uint(u64::from(log.header.process.pid))?;
    pk.key("log")?;
    pk.str(&log.path.display().to_string())?;
    pk.key("segments_rebuilt")?;
    pk.bool(replay.is_some())?;
    pk.key("at_real_addresses")?;
    pk.bool(written.at_real_addresses)?;
    pk.end()?;
    pk.end()?;
    pk.finish()?;
    Ok(written)
}

/// The keys every segment starts with.
fn segment_head<W: Write>(
    p: &mut Pickler<W>,
    device: i32,
    address: u64,
    size: u64,
    stream: u64,
    kind: &str,
) -> io::Result<()> {
    p.begin_dict()?;
    p.key("device")?;
    p.int(i128::from(device))?;
    p.key("address")?;
    p.uint(address)?;
    p.key("total_size")?;
    p.uint(size)?;
    p.key("stream")?;
    p.uint(stream)?;
    p.key("segment_type")?;
    p.str(kind)?;
    p.key("is_expandable")?;
    p.bool(false)?;
    p.key("frames")?;
    p.begin_list()?;
    p.end()
}
