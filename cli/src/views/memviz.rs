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

use super::model::{build_watching, Watch};
use super::pickle::{Memo, Pickler};
use super::pool::{PoolReplay, Step};
use crate::sites::{Resolver, ShownFrame};
use cupool_core::log::{EventRecord, Log, MemKind};
use cupool_core::pool::BlockState;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

/// One entry of a device trace.
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

/// Follows one log's allocations and frees.
struct Tracer {
    start_us: u64,
    traces: BTreeMap<i32, Vec<Entry>>,
    /// Live pooled blocks: replay address -> (requested size, stack).
    blocks: HashMap<u64, (u64, Option<u32>)>,
    /// Real pointer -> replay address of its block.
    pooled: HashMap<u64, u64>,
    own: BTreeMap<u64, Own>,
    limit: u64,
    /// Pool-mode reserved bytes per device, for an OOM entry's `device_free`.
    reserved: HashMap<i32, u64>,
}

fn memory_kind(e: &EventRecord) -> Option<MemKind> {
    e.kind.as_ref().and_then(|k| k.known())
}

impl Tracer {
    fn push(&mut self, device: i32, entry: Entry) {
        self.traces.entry(device).or_default().push(entry);
    }

    fn entry(&self, action: &'static str, addr: u64, size: u64, e: &EventRecord, replayed: bool) -> Entry {
        Entry {
            action,
            addr,
            size,
            stream: e.stream.unwrap_or(0),
            t_us: self.start_us + e.t_ns / 1000,
            stack: e.stack,
            replayed,
            device_free: None,
        }
    }

    fn segments(&mut self, device: i32, step: &Step, e: &EventRecord) {
        for s in &step.segments {
            let action = if s.alloc { "segment_alloc" } else { "segment_free" };
            let mut entry = self.entry(action, s.addr, s.size, e, true);
            entry.stack = None;
            let r = self.reserved.entry(device).or_default();
            *r = if s.alloc { *r + s.size } else { r.saturating_sub(s.size) };
            self.push(device, entry);
        }
    }

    /// Memory this view leaves out.
    fn skipped(e: &EventRecord) -> bool {
        matches!(memory_kind(e), Some(MemKind::Host | MemKind::Vmm)) || e.ptr.is_none()
    }
}

impl Watch for Tracer {
    fn alloc(&mut self, e: &EventRecord, step: Option<&Step>) {
        if Self::skipped(e) {
            return;
        }
        let device = e.device.unwrap_or(-1);
        let (ptr, size) = (e.ptr.unwrap_or(0), e.size.unwrap_or(0));
        match step {
            Some(step) => {
                self.segments(device, step, e);
                if let Some(b) = step.block {
                    self.blocks.insert(b.addr, (size, e.stack));
                    self.pooled.insert(ptr, b.addr);
                    let entry = self.entry("alloc", b.addr, size, e, true);
                    self.push(device, entry);
                }
            }
            None => {
                let stream = e.stream.unwrap_or(0);
                self.own.insert(ptr, Own { device, size, stream, stack: e.stack });
                let mut seg = self.entry("segment_alloc", ptr, size, e, false);
                seg.stack = None;
                self.push(device, seg);
                let entry = self.entry("alloc", ptr, size, e, false);
                self.push(device, entry);
            }
        }
    }

    fn free(&mut self, e: &EventRecord, step: Option<&Step>) {
        if Self::skipped(e) {
            return;
        }
        let device = e.device.unwrap_or(-1);
        let ptr = e.ptr.unwrap_or(0);
        match (step, self.pooled.remove(&ptr)) {
            (Some(step), Some(addr)) => {
                let (size, stack) = self.blocks.remove(&addr).unwrap_or((e.size.unwrap_or(0), None));
                for action in ["free_requested", "free_completed"] {
                    let mut entry = self.entry(action, addr, size, e, true);
                    entry.stack = stack;
                    self.push(device, entry);
                }
                self.segments(device, step, e);
            }
            _ => {
                let Some(own) = self.own.remove(&ptr) else { return };
                for action in ["free_requested", "free_completed"] {
                    let mut entry = self.entry(action, ptr, own.size, e, false);
                    entry.stack = own.stack;
                    self.push(own.device, entry);
                }
                let seg = Entry { stack: None, ..self.entry("segment_free", ptr, own.size, e, false) };
                self.push(own.device, seg);
            }
        }
    }

    fn oom(&mut self, e: &EventRecord, step: &Step) {
        let device = e.device.unwrap_or(-1);
        let reserved = self.reserved.get(&device).copied().unwrap_or(0);
        let mut entry = self.entry("oom", 0, e.size.unwrap_or(0), e, false);
        entry.stack = None;
        // What CUDA had free is not in the log; under a `limit`, what the cap left.
        entry.device_free = Some(self.limit.saturating_sub(reserved));
        self.push(device, entry);
        self.segments(device, step, e);
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

/// Writes the snapshot of `log` into `out`; `tick(done)` hears how many events are read.
pub fn write(log: &Log, out: impl Write, tick: &mut dyn FnMut(u64)) -> io::Result<Written> {
    let opts = &log.header.options;
    let mut tracer = Tracer {
        start_us: log.header.process.start_unix_ms.saturating_mul(1000),
        traces: BTreeMap::new(),
        blocks: HashMap::new(),
        pooled: HashMap::new(),
        own: BTreeMap::new(),
        limit: opts.limit,
        reserved: HashMap::new(),
    };
    let (_, replay) = build_watching(log, &mut tracer, tick);
    let real = |addr: u64, replayed: bool| match (&replay, replayed) {
        (Some(r), true) => r.real(addr),
        _ => addr,
    };
    let mut frames = Frames { resolver: Resolver::new(log), written: HashMap::new(), empty: None };
    let mut p = Pickler::new(io::BufWriter::new(out))?;
    let mut written =
        Written { segments: 0, entries: 0, at_real_addresses: replay.as_ref().is_none_or(PoolReplay::consistent) };
    p.begin_dict()?;

    p.key("segments")?;
    p.begin_list()?;
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
            segment_head(&mut p, device, real(seg.addr, true), seg.size, 0, if seg.small { "small" } else { "large" })?;
            p.key("allocated_size")?;
            p.uint(sum(&|b| if b.state == BlockState::Allocated { b.size } else { 0 }))?;
            p.key("active_size")?;
            p.uint(sum(&|b| if b.state == BlockState::Free { 0 } else { b.size }))?;
            p.key("requested_size")?;
            p.uint(sum(&|b| b.requested))?;
            p.key("blocks")?;
            p.begin_list()?;
            for b in &seg.blocks {
                let stack = tracer.blocks.get(&b.addr).and_then(|x| x.1);
                p.begin_dict()?;
                p.key("address")?;
                p.uint(real(b.addr, true))?;
                p.key("size")?;
                p.uint(b.size)?;
                p.key("requested_size")?;
                p.uint(if b.state == BlockState::Free { 0 } else { b.requested })?;
                p.key("state")?;
                p.str(state(b.state))?;
                p.key("frames")?;
                frames.write(&mut p, if b.state == BlockState::Free { None } else { stack })?;
                p.end()?;
            }
            p.end()?;
            p.end()?;
        }
    }
    for (&ptr, own) in &tracer.own {
        if own.device < 0 {
            continue;
        }
        written.segments += 1;
        segment_head(&mut p, own.device, ptr, own.size, own.stream, "large")?;
        for key in ["allocated_size", "active_size", "requested_size"] {
            p.key(key)?;
            p.uint(own.size)?;
        }
        p.key("blocks")?;
        p.begin_list()?;
        p.begin_dict()?;
        p.key("address")?;
        p.uint(ptr)?;
        p.key("size")?;
        p.uint(own.size)?;
        p.key("requested_size")?;
        p.uint(own.size)?;
        p.key("state")?;
        p.str("active_allocated")?;
        p.key("frames")?;
        frames.write(&mut p, own.stack)?;
        p.end()?;
        p.end()?;
        p.end()?;
    }
    p.end()?;

    // One trace per device ordinal from 0, as memory_viz indexes them.
    p.key("device_traces")?;
    p.begin_list()?;
    let last = tracer.traces.keys().copied().chain(pool_devices.iter().copied()).max().unwrap_or(-1);
    for device in 0..=last {
        p.begin_list()?;
        for e in tracer.traces.get(&device).map(Vec::as_slice).unwrap_or(&[]) {
            written.entries += 1;
            p.begin_dict()?;
            p.key("action")?;
            p.str(e.action)?;
            p.key("addr")?;
            p.uint(real(e.addr, e.replayed))?;
            p.key("size")?;
            p.uint(e.size)?;
            p.key("stream")?;
            p.uint(e.stream)?;
            p.key("time_us")?;
            p.uint(e.t_us)?;
            if let Some(free) = e.device_free {
                p.key("device_free")?;
                p.uint(free)?;
            }
            p.key("frames")?;
            frames.write(&mut p, e.stack)?;
            p.end()?;
        }
        p.end()?;
    }
    p.end()?;

    // Settings as PyTorch names them, and where the snapshot came from.
    p.key("allocator_settings")?;
    p.begin_dict()?;
    p.key("cupool_mode")?;
    p.str(match opts.mode {
        cupool_core::options::Mode::Pool => "pool",
        cupool_core::options::Mode::Passthrough => "passthrough",
    })?;
    p.end()?;
    p.key("cupool")?;
    p.begin_dict()?;
    p.key("pid")?;
    p.uint(u64::from(log.header.process.pid))?;
    p.key("log")?;
    p.str(&log.path.display().to_string())?;
    p.key("segments_rebuilt")?;
    p.bool(replay.is_some())?;
    p.key("at_real_addresses")?;
    p.bool(written.at_real_addresses)?;
    p.end()?;
    p.end()?;
    p.finish()?;
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
