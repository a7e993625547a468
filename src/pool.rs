//! Pool mode: device allocations served from `cupool_core::pool::Pool`, one
//! pool per CUDA context, over the real driver.
//!
//! Reuse safety: a `cudaFree` waits for queued GPU work that may still touch
//! the buffer; the pool does not. While the process has created no stream and
//! all work it queued through the driver API went to one stream
//! (`hooks::work`), work runs in the order it was queued, so a block freed and
//! handed out again is only touched by work queued after the old work:
//! immediate reuse is safe. After that, freed blocks wait for a *fence* (an event on every
//! live stream of the context, recorded after the free) to complete; the pool
//! synchronises the context only when memory is short, and never while a
//! stream is being captured.

use crate::call_real;
use crate::ffi::*;
use crate::real::{Lib, Slot};
use cupool_core::pool::{Backend, Block, BlockId, Pool, PoolConfig};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static CU_MEM_ALLOC: Slot = Slot::new(c"cuMemAlloc_v2", Lib::Driver);
static CU_MEM_FREE: Slot = Slot::new(c"cuMemFree_v2", Lib::Driver);
static CU_EVENT_CREATE: Slot = Slot::new(c"cuEventCreate", Lib::Driver);
static CU_EVENT_RECORD: Slot = Slot::new(c"cuEventRecord", Lib::Driver);
static CU_STREAM_WAIT_EVENT: Slot = Slot::new(c"cuStreamWaitEvent", Lib::Driver);
static CU_EVENT_SYNCHRONIZE: Slot = Slot::new(c"cuEventSynchronize", Lib::Driver);
static CU_EVENT_QUERY: Slot = Slot::new(c"cuEventQuery", Lib::Driver);
static CU_CTX_SYNCHRONIZE: Slot = Slot::new(c"cuCtxSynchronize", Lib::Driver);
static CU_STREAM_IS_CAPTURING: Slot = Slot::new(c"cuStreamIsCapturing", Lib::Driver);

/// Set once the process creates a stream, or once work submitted through the
/// driver API has gone to a second stream (per-thread default streams of two
/// threads): from then on reuse waits for fences.
pub static MULTI_STREAM: AtomicBool = AtomicBool::new(false);

/// The one stream all work went to so far, as a `stream_key`; `NO_STREAM` before any.
static ONLY_STREAM: AtomicU64 = AtomicU64::new(NO_STREAM);
const NO_STREAM: u64 = u64::MAX;
const LEGACY_STREAM: u64 = 0;
const CU_STREAM_LEGACY: u64 = 1;
const CU_STREAM_PER_THREAD: u64 = 2;

/// Names a stream the way the GPU orders work: the legacy default stream is
/// one stream for the whole process, a per-thread default stream is one per
/// thread, and a created stream is itself.
fn stream_key(stream: u64, per_thread_api: bool) -> u64 {
    match stream {
        0 if !per_thread_api => LEGACY_STREAM,
        CU_STREAM_LEGACY => LEGACY_STREAM,
        0 | CU_STREAM_PER_THREAD => {
            PER_THREAD_STREAMS.store(true, Ordering::Relaxed);
            (1 << 63) | crate::guard::tid() as u64
        }
        s => s,
    }
}

/// Work was queued on `stream` (`per_thread_api`: through a `_ptsz` entry point,
/// where stream 0 means the calling thread's default stream).
#[inline]
pub fn note_work(stream: u64, per_thread_api: bool) {
    if MULTI_STREAM.load(Ordering::Relaxed) {
        return;
    }
    let key = stream_key(stream, per_thread_api);
    match ONLY_STREAM.compare_exchange(NO_STREAM, key, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(only) if only == key => {}
        Err(_) => MULTI_STREAM.store(true, Ordering::Release),
    }
}

/// Live streams as (context, stream).
static STREAMS: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

pub fn stream_created(ctx: u64, stream: u64) {
    // The runtime launches its kernels through private driver entry points
    // that no hook sees (measured: a kernel on a created stream was never
    // reported to `note_work`), so a created stream is taken as a second
    // stream in use.
    MULTI_STREAM.store(true, Ordering::Release);
    STREAMS.lock().push((ctx, stream));
    // A new stream must also wait behind the last GPU-side barrier, or its
    // work could touch a block handed out early while old work still runs.
    if let Some(pool) = all().into_iter().find(|p| p.ctx == ctx) {
        let pool = pool.pool.lock();
        for &e in &pool.backend().barrier {
            unsafe {
                call_real!(CU_STREAM_WAIT_EVENT, fn(u64, u64, u32) -> CUresult, (stream, e, 0), CUDA_ERROR_UNKNOWN)
            };
        }
    }
}

pub fn stream_destroyed(stream: u64) {
    STREAMS.lock().retain(|&(_, s)| s != stream);
}

const CU_EVENT_DISABLE_TIMING: u32 = 2;
const CU_STREAM_CAPTURE_STATUS_NONE: i32 = 0;

/// The device side of one context's pool.
pub struct CudaBackend {
    ctx: u64,
    /// Epoch that frees are tagged with now; a fence closes it.
    epoch: u64,
    /// Every tag up to this is safe to reuse.
    completed: u64,
    fences: VecDeque<(u64, Vec<u64>)>,
    spare_events: Vec<u64>,
    /// When the last fence was recorded (monotonic ns).
    last_fence_ns: u64,
    /// Events of the last GPU-side barrier: every stream then live waits on
    /// them, and a stream created later is made to wait on them too.
    barrier: Vec<u64>,
    pub counters: FenceCounters,
}

/// How the reuse fences fared, for the end record.
#[derive(Clone, Copy, Default, Debug)]
pub struct FenceCounters {
    pub recorded: u64,
    pub completed: u64,
    pub skipped_for_capture: u64,
    pub record_errors: u64,
    pub gpu_barriers: u64,
    pub waits: u64,
    pub syncs: u64,
}

/// A GPU-side barrier makes every stream wait on every event of a fence: past
/// this many streams the host waits instead.
const MAX_BARRIER_STREAMS: usize = 8;

/// Set once a per-thread default stream is seen in use: other threads' default
/// streams cannot be made to wait, so barriers give way to host waits.
static PER_THREAD_STREAMS: AtomicBool = AtomicBool::new(false);

impl CudaBackend {
    fn new(ctx: u64) -> CudaBackend {
        CudaBackend {
            ctx,
            epoch: 1,
            completed: 0,
            fences: VecDeque::new(),
            spare_events: Vec::new(),
            last_fence_ns: 0,
            barrier: Vec::new(),
            counters: FenceCounters::default(),
        }
    }

    /// Is a capture active on any of this context's streams? Asked with the
    /// stream list locked, so no stream is destroyed under the question.
    fn any_capturing(&self) -> bool {
        let list = STREAMS.lock();
        self.streams_in(&list).into_iter().any(Self::capturing)
    }

    /// This context's live streams in `list` (held locked by the caller),
    /// plus the legacy default stream.
    fn streams_in(&self, list: &[(u64, u64)]) -> Vec<u64> {
        list.iter().filter(|(c, _)| *c == self.ctx).map(|&(_, s)| s).chain(std::iter::once(0)).collect()
    }

    /// Only an active or invalidated capture counts; an error (a stream that
    /// died behind cupool's back) does not block fencing the others.
    fn capturing(stream: u64) -> bool {
        let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
        let r = unsafe {
            call_real!(CU_STREAM_IS_CAPTURING, fn(u64, *mut i32) -> CUresult, (stream, &mut status), CUDA_ERROR_UNKNOWN)
        };
        r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE
    }

    fn event(&mut self) -> Option<u64> {
        if let Some(e) = self.spare_events.pop() {
            return Some(e);
        }
        let mut e = 0u64;
        let r = unsafe {
            call_real!(
                CU_EVENT_CREATE,
                fn(*mut u64, u32) -> CUresult,
                (&mut e, CU_EVENT_DISABLE_TIMING),
                CUDA_ERROR_UNKNOWN
            )
        };
        (r == CUDA_SUCCESS).then_some(e)
    }

    /// Closes the current epoch with an event on every live stream.
    fn record_fence(&mut self) -> bool {
        let list = STREAMS.lock();
        let streams = self.streams_in(&list);
        if streams.iter().any(|&s| Self::capturing(s)) {
            self.counters.skipped_for_capture += 1;
            return false; // recording into a capture would change the captured graph
        }
        let mut events = Vec::with_capacity(streams.len());
        let mut dead = Vec::new();
        for s in streams {
            let Some(e) = self.event() else { return false };
            let r = unsafe { call_real!(CU_EVENT_RECORD, fn(u64, u64) -> CUresult, (e, s), CUDA_ERROR_UNKNOWN) };
            if r == CUDA_SUCCESS {
                events.push(e);
            } else {
                self.counters.record_errors += 1;
                self.spare_events.push(e);
                if s != 0 {
                    dead.push(s); // not a live stream of ours after all
                }
            }
        }
        drop(list);
        for s in dead {
            stream_destroyed(s);
        }
        self.counters.recorded += 1;
        self.fences.push_back((self.epoch, events));
        self.epoch += 1;
        self.last_fence_ns = crate::state::monotonic_ns();
        true
    }

    /// Makes every live stream of the context wait, on the GPU, for the
    /// fence at `index`: from then on no work can touch a block freed before
    /// that fence ahead of the work that was queued before the free, so those
    /// blocks may be handed out at once, without the host waiting.
    fn gpu_barrier(&mut self, index: usize) -> bool {
        if PER_THREAD_STREAMS.load(Ordering::Relaxed) {
            return false;
        }
        let list = STREAMS.lock();
        let streams = self.streams_in(&list);
        if streams.len() > MAX_BARRIER_STREAMS || streams.iter().any(|&s| Self::capturing(s)) {
            return false;
        }
        let (epoch, events) = (self.fences[index].0, self.fences[index].1.clone());
        // The legacy stream waits for every stream's part of the fence; one
        // event after those waits then orders every other stream behind it
        // (2S-1 dependencies instead of S²).
        let wait = |s: u64, e: u64| unsafe {
            call_real!(CU_STREAM_WAIT_EVENT, fn(u64, u64, u32) -> CUresult, (s, e, 0), CUDA_ERROR_UNKNOWN)
                == CUDA_SUCCESS
        };
        if !events.iter().all(|&e| wait(0, e)) {
            return false; // the waits already queued only delay work; the host waits instead
        }
        let Some(joined) = self.event() else { return false };
        let recorded = unsafe {
            call_real!(CU_EVENT_RECORD, fn(u64, u64) -> CUresult, (joined, 0), CUDA_ERROR_UNKNOWN) == CUDA_SUCCESS
        };
        if !recorded || !streams.iter().filter(|&&s| s != 0).all(|&s| wait(s, joined)) {
            self.spare_events.push(joined);
            return false;
        }
        self.spare_events.extend(events);
        let events = vec![joined];
        drop(list);
        // Fences up to this one are passed; keep its events alive as the barrier.
        for _ in 0..index {
            if let Some((_, old)) = self.fences.pop_front() {
                self.spare_events.extend(old);
            }
        }
        self.fences.pop_front();
        let previous = std::mem::replace(&mut self.barrier, events);
        self.spare_events.extend(previous);
        self.completed = self.completed.max(epoch);
        self.counters.gpu_barriers += 1;
        true
    }

    fn poll(&mut self) {
        while let Some((epoch, events)) = self.fences.front() {
            let done = events.iter().all(|&e| unsafe {
                call_real!(CU_EVENT_QUERY, fn(u64) -> CUresult, (e), CUDA_ERROR_UNKNOWN) == CUDA_SUCCESS
            });
            if !done {
                return;
            }
            self.completed = self.completed.max(*epoch);
            self.counters.completed += 1;
            let (_, events) = self.fences.pop_front().unwrap_or_default();
            self.spare_events.extend(events);
        }
    }
}

impl Backend for CudaBackend {
    fn allocate_segment(&mut self, size: u64) -> Option<u64> {
        let mut p: CUdeviceptr = 0;
        let r = unsafe {
            call_real!(
                CU_MEM_ALLOC,
                fn(*mut CUdeviceptr, usize) -> CUresult,
                (&mut p, size as usize),
                CUDA_ERROR_UNKNOWN
            )
        };
        (r == CUDA_SUCCESS).then_some(p)
    }

    fn release_segment(&mut self, addr: u64, _size: u64) {
        unsafe { call_real!(CU_MEM_FREE, fn(CUdeviceptr) -> CUresult, (addr), CUDA_ERROR_UNKNOWN) };
    }

    fn free_tag(&mut self) -> Option<u64> {
        if !MULTI_STREAM.load(Ordering::Acquire) {
            return None;
        }
        let tag = self.epoch;
        // Fence eagerly (rate-limited): by the time memory runs short, the
        // fences of earlier frees have mostly completed and their blocks are
        // reusable, instead of every pending block waiting on a fence recorded
        // only at the miss (behind all the work queued since).
        // A fence costs an event record per stream; blocks freed within one
        // interval (`fence_us`) share it.
        if crate::state::monotonic_ns().saturating_sub(self.last_fence_ns) >= crate::state::options().fence_us * 1000 {
            self.record_fence();
        }
        Some(tag)
    }

    fn is_complete(&mut self, tag: u64) -> bool {
        self.poll();
        if tag > self.completed && self.fences.back().is_none_or(|(e, _)| *e < tag) && self.record_fence() {
            self.poll();
        }
        tag <= self.completed
    }

    fn wait_for(&mut self, tag: u64) -> bool {
        self.poll();
        if tag <= self.completed {
            return true;
        }
        if self.fences.back().is_none_or(|(e, _)| *e < tag) && !self.record_fence() {
            return false; // a capture is active: waiting could deadlock it
        }
        let Some(index) = self.fences.iter().position(|(e, _)| *e >= tag) else { return false };
        if self.gpu_barrier(index) {
            return true;
        }
        let events = self.fences[index].1.clone();
        for e in events {
            unsafe { call_real!(CU_EVENT_SYNCHRONIZE, fn(u64) -> CUresult, (e), CUDA_ERROR_UNKNOWN) };
        }
        self.counters.waits += 1;
        self.poll();
        tag <= self.completed
    }

    fn synchronize(&mut self) -> bool {
        if self.any_capturing() {
            return false;
        }
        let r = unsafe { call_real!(CU_CTX_SYNCHRONIZE, fn() -> CUresult, (), CUDA_ERROR_UNKNOWN) };
        if r != CUDA_SUCCESS {
            return false;
        }
        self.counters.syncs += 1;
        self.completed = self.epoch;
        self.epoch += 1;
        while let Some((_, events)) = self.fences.pop_front() {
            self.spare_events.extend(events);
        }
        true
    }
}

/// One context's pool.
pub struct ContextPool {
    pub ctx: u64,
    pub device: i32,
    pub pool: Mutex<Pool<CudaBackend>>,
}

/// Pools are leaked on purpose: a thread may still hold a reference while a
/// context dies, and there are few contexts in a process.
static POOLS: Mutex<Vec<&'static ContextPool>> = Mutex::new(Vec::new());
/// Bumped when pools are dropped (context death, fork): invalidates thread caches.
static GENERATION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static CACHED: Cell<(u64, u64, *const ContextPool)> = const { Cell::new((0, 0, std::ptr::null())) };
}

fn config() -> PoolConfig {
    let opts = crate::state::options();
    PoolConfig { limit: if opts.limit == 0 { u64::MAX } else { opts.limit }, ..PoolConfig::shim_default() }
}

/// The pool of context `ctx` (on `device`), created on first use.
pub fn pool_of(ctx: u64, device: impl FnOnce() -> i32) -> &'static ContextPool {
    let gen = GENERATION.load(Ordering::Acquire);
    let (c, g, p) = CACHED.with(Cell::get);
    if c == ctx && g == gen && !p.is_null() {
        return unsafe { &*p };
    }
    let mut pools = POOLS.lock();
    let found = pools.iter().copied().find(|p| p.ctx == ctx);
    let pool = found.unwrap_or_else(|| {
        let p: &'static ContextPool = Box::leak(Box::new(ContextPool {
            ctx,
            device: device(),
            pool: Mutex::new(Pool::new(CudaBackend::new(ctx), config())),
        }));
        pools.push(p);
        p
    });
    CACHED.with(|c| c.set((ctx, gen, pool)));
    pool
}

pub fn allocate(pool: &ContextPool, size: u64) -> Result<Block, cupool_core::pool::OutOfMemory> {
    pool.pool.lock().allocate(size)
}

/// Returns `block` to the pool at `pool` (a `ContextPool` address from `Live`).
/// A pool whose context died still takes it: the memory is gone, the books stay straight.
pub fn free(pool: usize, block: BlockId) {
    let pool = unsafe { &*(pool as *const ContextPool) };
    pool.pool.lock().free(block);
}
/// Pools of contexts that died, kept for the end record.
static RETIRED: Mutex<Vec<&'static ContextPool>> = Mutex::new(Vec::new());

/// The context died: its memory went with it; retire its pool.
pub fn drop_context(dies: impl Fn(&ContextPool) -> bool) {
    let mut pools = POOLS.lock();
    let mut retired = RETIRED.lock();
    pools.retain(|p| {
        let dead = dies(p);
        if dead {
            retired.push(p);
        }
        !dead
    });
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Pools whose context died, for the end record.
pub fn retired() -> Vec<&'static ContextPool> {
    RETIRED.lock().clone()
}

/// Is `ptr` inside memory a live pool holds?
pub fn owns(ptr: u64) -> bool {
    all().into_iter().any(|p| p.pool.lock().owns(ptr))
}

/// Every pool, for the end report and `cuMemGetInfo`.
pub fn all() -> Vec<&'static ContextPool> {
    POOLS.lock().clone()
}

pub fn lock_all() {
    std::mem::forget(POOLS.lock());
    std::mem::forget(STREAMS.lock());
}

/// # Safety
/// Only after `lock_all`, in the same thread or its forked child.
pub unsafe fn unlock_all(in_child: bool) {
    STREAMS.force_unlock();
    POOLS.force_unlock();
    if in_child {
        // The child has no CUDA context of its parent's: start with no pools.
        POOLS.lock().clear();
        RETIRED.lock().clear();
        STREAMS.lock().clear();
        MULTI_STREAM.store(false, Ordering::Release);
        ONLY_STREAM.store(NO_STREAM, Ordering::Release);
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
}

/// The pooled block containing `ptr`, as (start, size), if any.
pub fn block_range(ptr: u64) -> Option<(u64, u64)> {
    all().into_iter().find_map(|p| p.pool.lock().lookup(ptr).map(|b| (b.addr, b.requested)))
}

/// Bytes this process holds on `device`: the pools' reserved segments plus
/// live allocations made outside the pool.
pub fn held_bytes(device: i32) -> u64 {
    let (mut reserved, mut pooled_live) = (0, 0);
    for p in all().into_iter().filter(|p| p.device == device) {
        let pool = p.pool.lock();
        reserved += pool.stats().reserved_bytes.current;
        pooled_live += pool.stats().requested_bytes.current;
    }
    reserved + crate::tracker::device_bytes(device).saturating_sub(pooled_live)
}
