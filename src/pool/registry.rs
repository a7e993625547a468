//! One pool per CUDA context, found from any thread without a lock on the
//! hot path (a per-thread cache invalidated by a generation counter).

use super::engine::{Carved, Engine};
use super::fence;
use super::handle::{ContextPool, PoolHandle};
use super::magazine::{self, Returns};
use super::progress::Reuse;
use super::streams;
use crate::runtime::bias::{BiasedGuard, BiasedMutex};
use crate::runtime::clock;
use cupool_core::pool::{Block, BlockId, Timeline};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Pools are leaked on purpose: a thread may still hold a reference while a
/// context dies, and there are few contexts in a process.
static POOLS: Mutex<Vec<&'static ContextPool>> = Mutex::new(Vec::new());
/// Pools of contexts that died, kept for the end record.
static RETIRED: Mutex<Vec<&'static ContextPool>> = Mutex::new(Vec::new());
/// Bumped when pools are dropped (context death, fork): invalidates thread caches.
static GENERATION: AtomicU64 = AtomicU64::new(1);

crate::runtime::tls::static_tls! {
    /// The pool this thread used last: (context id, `GENERATION`, pool).
    CACHED: Cell<(u64, u64, Option<PoolHandle>)>;
}

/// The pool of the context with unique id `id`, created on first use with
/// the context's handle and device from `current`. With it, the handle of a
/// context that died unseen: a live pool of a context with another id but
/// the same handle (the static runtime's `cudaDeviceReset` tears a context
/// down through private entry points, and it comes back under its handle);
/// the caller retires that pool.
#[inline]
pub fn pool_of(id: u64, current: impl FnOnce() -> (u64, i32)) -> (&'static ContextPool, Option<u64>) {
    let gen = GENERATION.load(Ordering::Acquire);
    if let (i, g, Some(p)) = CACHED.with(Cell::get) {
        if i == id && g == gen {
            return (p.get(), None);
        }
    }
    let mut pools = POOLS.lock();
    let (pool, stale) = match pools.iter().copied().find(|p| p.id == id) {
        Some(p) => (p, None),
        None => {
            let (ctx, device) = current();
            let stale = pools.iter().any(|p| p.ctx == ctx).then_some(ctx);
            let engine = Engine::new(ctx, device);
            let progress = engine.timeline().progress.clone();
            let direct_min = match crate::runtime::options::get().direct_min {
                n if n > 0 && engine.is_vmm() => n,
                _ => u64::MAX,
            };
            let pool = BiasedMutex::new(engine);
            let p: &'static ContextPool = Box::leak(Box::new(ContextPool {
                ctx,
                id,
                device,
                pool,
                direct_min,
                progress,
                waits: Default::default(),
            }));
            pools.push(p);
            (p, stale)
        }
    };
    CACHED.with(|c| c.set((id, gen, Some(PoolHandle::of(pool)))));
    (pool, stale)
}

/// A block of `size` bytes from `pool`, which may reserve at most
/// `cap(what it reserves now)` bytes in all. Every change of a pool's
/// reserved bytes on the way goes to `on_reserved(device, delta)`.
/// `Carved::PoolUnusable`: the call goes to CUDA.
#[inline]
pub fn allocate(
    pool: &'static ContextPool,
    size: u64,
    cap: impl Fn(u64) -> u64,
    on_reserved: &mut dyn FnMut(i32, i64),
) -> Carved {
    let addr = PoolHandle::of(pool);
    magazine::start_if_always();
    if magazine::active() {
        if let Some(block) =
            magazine::take(addr, size, &pool.progress).or_else(|| refill(pool, size, &cap, on_reserved))
        {
            return Carved::Block(block);
        }
    }
    if magazine::orphans() {
        settle(true, on_reserved);
    }
    let result = allocate_now(pool, size, &cap, on_reserved);
    if matches!(result, Carved::OutOfMemory) && magazine::any() {
        // Blocks kept by threads' magazines count as allocated: give them back first.
        settle(false, on_reserved);
        return allocate_now(pool, size, &cap, on_reserved);
    }
    result
}

/// The pool's lock; found taken, it is counted toward this thread's magazine.
#[inline(always)]
fn lock(pool: &ContextPool) -> BiasedGuard<'_, Engine> {
    match pool.pool.try_lock() {
        Some(guard) => guard,
        None => lock_contended(pool),
    }
}

#[cold]
#[inline(never)]
fn lock_contended(pool: &ContextPool) -> BiasedGuard<'_, Engine> {
    pool.waits.count.fetch_add(1, Ordering::Relaxed);
    magazine::contended();
    let asked = clock::monotonic_ns();
    let guard = pool.pool.lock();
    pool.waits.ns.fetch_add(clock::monotonic_ns().saturating_sub(asked), Ordering::Relaxed);
    guard
}

#[inline(always)]
fn allocate_now(
    pool: &ContextPool,
    size: u64,
    cap: &impl Fn(u64) -> u64,
    on_reserved: &mut dyn FnMut(i32, i64),
) -> Carved {
    let mut p = lock(pool);
    let before = capped(&mut p, cap);
    let result = p.allocate(size);
    report(pool.device, before, p.reserved(), on_reserved);
    result
}

/// Fills this thread's magazine (if it has one and serves `size`) under one
/// lock, after giving back what it must; returns the first block taken. When
/// the pool's fences have meanwhile completed the oldest block this thread
/// freed of that class (asked first of the published oldest fence without
/// the lock, then under it where that could not say), it is taken instead.
#[cold]
fn refill(
    pool: &'static ContextPool,
    size: u64,
    cap: &impl Fn(u64) -> u64,
    on_reserved: &mut dyn FnMut(i32, i64),
) -> Option<Block> {
    let addr = PoolHandle::of(pool);
    let mut returns = magazine::spare_returns();
    let (class, want) = magazine::refill(addr, size, &mut returns)?;
    give_back(&returns, on_reserved);
    // Not under the pool's lock (see magazine.rs). The fence that the
    // oldest free waits for is asked about first without it too: every
    // thread's frees wait for the same fences.
    let oldest = magazine::oldest_waiting(addr, size);
    let unlocked = oldest.map(|tag| pool.progress.poll_unlocked(tag, fence::query));
    if unlocked == Some(Reuse::Ready) {
        return magazine::take(addr, size, &pool.progress);
    }
    let mut taken = [Block { id: BlockId::from_raw(0), addr: 0, size: 0 }; magazine::REFILL];
    let mut n = 0;
    {
        let mut p = lock(pool);
        if unlocked == Some(Reuse::Unknown) && oldest.is_some_and(|tag| p.timeline_mut().reuse_ready(tag)) {
            drop(p);
            return magazine::take(addr, size, &pool.progress);
        }
        let before = capped(&mut p, cap);
        while n < want {
            match p.allocate(class) {
                Carved::Block(b) => taken[n] = b,
                _ => break, // the caller asks again, alone, and gets the pool's answer
            }
            n += 1;
        }
        report(pool.device, before, p.reserved(), on_reserved);
    }
    let (first, rest) = taken[..n].split_first()?;
    let unkept = &mut returns;
    unkept.clear();
    magazine::store(addr, class, rest, unkept);
    give_back(unkept, on_reserved);
    Some(*first)
}

/// Applies the cap `cap(reserved now)` to the locked pool; returns its reserved bytes.
#[inline]
fn capped(p: &mut Engine, cap: &impl Fn(u64) -> u64) -> u64 {
    let reserved = p.reserved();
    let cap = cap(reserved);
    if p.limit() != cap {
        p.set_limit(cap);
    }
    reserved
}

#[inline]
fn report(device: i32, before: u64, after: u64, on_reserved: &mut dyn FnMut(i32, i64)) {
    if after != before {
        on_reserved(device, after as i64 - before as i64);
    }
}

/// Returns `block` (`bytes` asked) to `pool` (kept with the allocation), now or, from a thread with a
/// magazine, with its next batch. A pool whose context died still takes
/// it: the memory is gone, the books stay straight. A block exported
/// through IPC is never handed out again: another process may still read
/// it through its handle. Bytes a pool gives back to its device (a free may
/// empty a segment or a page) go to `on_reserved`.
#[inline]
pub fn free(pool: PoolHandle, block: BlockId, addr: u64, bytes: u64, on_reserved: &mut dyn FnMut(i32, i64)) {
    if kept_exported(pool, block.to_raw()) {
        return;
    }
    let progress = &pool.get().progress;
    match magazine::keep_freed(pool, block, addr, bytes, progress) {
        magazine::Kept::No => {
            if bytes <= magazine::MAX_SIZE && progress.tag_now() != 0 {
                magazine::fenced_small_free(bytes);
            }
            free_now(pool, block, on_reserved)
        }
        magazine::Kept::Yes => {}
        magazine::Kept::BatchFull => give_back_batch(on_reserved),
    }
}

#[cold]
#[inline(never)]
fn give_back_batch(on_reserved: &mut dyn FnMut(i32, i64)) {
    let mut returns = magazine::spare_returns();
    magazine::take_frees(&mut returns);
    give_back(&returns, on_reserved);
}

#[inline]
fn free_now(pool: PoolHandle, block: BlockId, on_reserved: &mut dyn FnMut(i32, i64)) {
    let pool_ref = pool.get();
    let mut p = lock(pool_ref);
    if p.timeline().is_dead() {
        return; // its context died, and the block's memory with it
    }
    let before = p.reserved();
    let wait = p.free(block);
    report(pool_ref.device, before, p.reserved(), on_reserved);
    if wait {
        wait_unlocked(pool_ref, p, on_reserved);
    }
}

/// Waits for the GPU, as the pool asked at a free, with its lock let go:
/// frees that leave much memory behind queued work wait for it as
/// `cudaFree` does, but a thread whose queued work waits on another thread
/// must never find that thread stuck on the pool's lock (nor do the other
/// threads' allocations wait out the GPU). The blocks freed before the
/// wait are then reclaimed under the lock.
#[cold]
#[inline(never)]
fn wait_unlocked<'a>(pool: &'a ContextPool, mut p: BiasedGuard<'a, Engine>, on_reserved: &mut dyn FnMut(i32, i64)) {
    // Pages of the blocks the first wait reclaims go idle after it, so they
    // cool behind whatever was queued meanwhile: a second wait (on a GPU
    // just drained, short) lets them go back before the free returns too.
    // A wait that cannot be made (a capture, a context in error) leaves what
    // waited listed in the pool: a later wait gives it back.
    for _ in 0..2 {
        let Some(closing) = p.timeline_mut().begin_wait() else { return };
        drop(p);
        let t = crate::runtime::clock::monotonic_ns();
        if !fence::drain(pool.ctx) {
            return;
        }
        let waited = crate::runtime::clock::monotonic_ns() - t;
        p = lock(pool);
        p.timeline_mut().finish_wait(closing, waited);
        // A capture begun during the wait: the work is done, but nothing goes
        // back to CUDA now (a `cuMemFree` or unmap would break the capture).
        if super::any_capture() {
            return;
        }
        let before = p.reserved();
        let again = p.after_gpu_wait();
        report(pool.device, before, p.reserved(), on_reserved);
        if !again {
            return;
        }
    }
}

/// Is this block exported through IPC? Then it is never freed into the pool
/// (another process may still read it through its handle): it is marked
/// freed for the program instead.
#[inline]
fn kept_exported(pool: PoolHandle, block: u32) -> bool {
    if !ANY_EXPORTED.load(Ordering::Acquire) {
        return false;
    }
    // Still allocated in the pool, but freed for the program: pointer
    // queries and exports answer as for freed memory (`find`).
    EXPORTED.lock().get_mut(&(pool, block)).map(|freed| *freed = true).is_some()
}

/// Frees blocks a magazine gave back, under each pool's lock once per run
/// of blocks of one pool.
fn give_back(returns: &Returns, on_reserved: &mut dyn FnMut(i32, i64)) {
    let mut rest = returns.as_slice();
    while let Some(&(pool, _)) = rest.first() {
        let run = rest.iter().take_while(|&&(p, _)| p == pool).count();
        give_back_run(pool, &rest[..run], on_reserved);
        rest = &rest[run..];
    }
}

/// Frees `blocks`, all of `pool`, under one lock.
fn give_back_run(pool: PoolHandle, blocks: &[(PoolHandle, u32)], on_reserved: &mut dyn FnMut(i32, i64)) {
    let pool_ref = pool.get();
    let mut p = lock(pool_ref);
    if p.timeline().is_dead() {
        return; // blocks a magazine held when their context died: gone with it
    }
    let before = p.reserved();
    let mut wait = false;
    for &(_, block) in blocks {
        if !kept_exported(pool, block) {
            wait |= p.free(BlockId::from_raw(block));
        }
    }
    report(pool_ref.device, before, p.reserved(), on_reserved);
    if wait {
        wait_unlocked(pool_ref, p, on_reserved);
    }
}

/// Gives every block kept by threads' magazines (only exited threads' when
/// `only_orphans`) back to its pool: before anything that must see the
/// pools as the program does (pointer queries, IPC, free memory, the end).
pub fn settle(only_orphans: bool, on_reserved: &mut dyn FnMut(i32, i64)) {
    magazine::settle(only_orphans, |returns| give_back(returns, on_reserved));
}

/// Blocks exported through IPC, as (pool, block id).
/// With whether the program freed them since (they stay allocated).
static EXPORTED: Mutex<BTreeMap<(PoolHandle, u32), bool>> = Mutex::new(BTreeMap::new());
static ANY_EXPORTED: AtomicBool = AtomicBool::new(false);

/// An allocated pooled block, as `find` sees it.
pub struct PooledBlock {
    pub addr: u64,
    /// The size the program asked for.
    pub size: u64,
    pub segment: u64,
    /// Carved from VMM pages (legacy IPC cannot name it: cupool shares them).
    pub vmm: bool,
    /// Its pages can be shared (always, for a segment's block).
    pub shareable: bool,
    pool: PoolHandle,
    block: u32,
}

/// What an address is to the pools.
pub enum Found {
    Block(PooledBlock),
    /// Inside a pool segment, in a free or pending block.
    Freed,
    Outside,
}

/// What `ptr` is to the pools, in one pass (the pools locked in turn, under
/// the pool list's lock: the order `drop_context` takes them in).
pub fn find(ptr: u64) -> Found {
    for &p in POOLS.lock().iter() {
        let pool = p.pool.lock();
        if let Some(b) = pool.lookup(ptr) {
            let pool_addr = PoolHandle::of(p);
            if ANY_EXPORTED.load(Ordering::Acquire)
                && EXPORTED.lock().get(&(pool_addr, b.id.to_raw())).copied().unwrap_or(false)
            {
                return Found::Freed; // exported, then freed: kept for its receivers only
            }
            return Found::Block(PooledBlock {
                addr: b.addr,
                size: b.requested,
                segment: b.segment_addr,
                vmm: pool.is_vmm(),
                shareable: pool.shareable(),
                pool: pool_addr,
                block: b.id.to_raw(),
            });
        }
        if pool.owns(ptr) {
            return Found::Freed;
        }
    }
    Found::Outside
}

/// Publishes the pages under a VMM block to this process's IPC broker;
/// returns the ticket its handle carries (`pool::ipc`).
pub fn publish_pages(b: &PooledBlock) -> Result<super::ipc::Ticket, crate::cuda::Status> {
    let pages = b.pool.get().pool.lock().block_pages(b.addr).ok_or(crate::cuda::INVALID_VALUE)?;
    let first = pages.first().ok_or(crate::cuda::INVALID_VALUE)?;
    let offset = b.addr - first.addr;
    // A descriptor of every page now (closed at once), so that an export a
    // receiver could never open fails here, with the driver's error.
    for p in &pages {
        super::ipc::pages::export_fd(p.handle)?;
    }
    let pages = pages.iter().map(|p| (p.handle, p.size)).collect();
    super::ipc::broker::publish(b.pool, b.addr, pages, offset, super::ipc::pages::export_fd)
}

/// The block's IPC handle went out: keep it out of reuse for the rest of the run.
pub fn exported(b: &PooledBlock) {
    ANY_EXPORTED.store(true, Ordering::Release);
    EXPORTED.lock().entry((b.pool, b.block)).or_insert(false);
}

/// A stream was created in `ctx`. It must also wait behind the last GPU-side
/// barrier, or its work could touch a block handed out early while old work
/// still runs.
pub fn stream_created(ctx: u64, stream: u64) {
    let first = streams::add(ctx, stream);
    if let Some(pool) = all().into_iter().find(|p| p.ctx == ctx) {
        let mut p = pool.pool.lock();
        for &e in &p.timeline().barrier {
            fence::wait(stream, e);
        }
        if first {
            // Blocks freed before any stream existed were reusable at once:
            // all work went to one stream. A non-blocking stream is not
            // ordered behind that work by itself.
            p.timeline_mut().order_behind_queued_work(stream);
        } else {
            p.timeline_mut().order_behind_work_before_streams(stream);
        }
    }
}

/// `stream` is about to be destroyed: its pool's next fence covers the work
/// still queued on it (`CudaBackend::retire_stream`), then it leaves the list.
pub fn stream_destroyed(stream: u64) {
    let pool = streams::context_of(stream).and_then(|ctx| all().into_iter().find(|p| p.ctx == ctx));
    if let Some(pool) = pool {
        pool.pool.lock().timeline_mut().retire_stream(stream);
    }
    streams::remove(stream);
}

/// The context died: its memory went with it; retire its pool. Returns the
/// pools retired, as (device, bytes they had reserved).
pub fn drop_context(dies: impl Fn(&ContextPool) -> bool) -> Vec<(i32, u64)> {
    let mut pools = POOLS.lock();
    let mut retired = RETIRED.lock();
    let mut gone = Vec::new();
    pools.retain(|p| {
        let dead = dies(p);
        if dead {
            retired.push(p);
            let mut pool = p.pool.lock();
            gone.push((p.device, pool.reserved()));
            pool.context_died();
            super::ipc::broker::forget_pool(PoolHandle::of(p));
        }
        !dead
    });
    GENERATION.fetch_add(1, Ordering::AcqRel);
    gone
}

/// Gives every completely free segment of `device`'s pools back to the
/// device; returns (device, bytes released) per pool that released some.
pub fn give_back_free_segments(device: i32) -> Vec<(i32, u64)> {
    all()
        .into_iter()
        .filter(|p| p.device == device)
        .map(|p| {
            let mut pool = p.pool.lock();
            (p.device, released_by(&mut pool, Engine::empty_cache))
        })
        .filter(|&(_, released)| released > 0)
        .collect()
}

/// CUDA refused an allocation the pool does not serve (stream-ordered
/// memory, VMM, managed memory) on `device`: gives back everything the
/// pools there hold and no block uses, waiting for the GPU where freed blocks
/// still wait for it, as a program that freed that memory with `cudaFree`
/// would have it back. Every change goes to `on_reserved`; returns the
/// bytes `device` got back (threads' magazines included).
pub fn give_back_all_free(device: i32, on_reserved: &mut dyn FnMut(i32, i64)) -> u64 {
    let mut released = 0;
    settle(false, &mut |d, delta| {
        if d == device && delta < 0 {
            released += delta.unsigned_abs();
        }
        on_reserved(d, delta)
    });
    for (d, bytes) in empty_pools(|p| p.device == device) {
        if bytes > 0 {
            on_reserved(d, -(bytes as i64));
            released += bytes;
        }
    }
    released
}

/// Bytes the pools on `device` hold from it.
pub fn reserved_on(device: i32) -> u64 {
    all().into_iter().filter(|p| p.device == device).map(|p| p.pool.lock().reserved()).sum()
}

/// Empties the pools that `which` selects: blocks still waiting for the GPU
/// would keep their pages or segments, so it is waited for first. Returns
/// (device, bytes released) per pool.
fn empty_pools(which: impl Fn(&ContextPool) -> bool) -> Vec<(i32, u64)> {
    all()
        .into_iter()
        .filter(|p| which(p))
        .map(|p| {
            if p.pool.lock().pending_blocks() > 0 {
                fence::drain(p.ctx);
            }
            let mut pool = p.pool.lock();
            let released = released_by(&mut pool, |pool| {
                if pool.pending_blocks() > 0 {
                    pool.timeline_mut().synchronize();
                }
                pool.empty_cache()
            });
            (p.device, released)
        })
        .collect()
}

/// What `give_back` released, by the pool's reserved bytes: pages of blocks
/// whose fences completed on the way go back inside it too, beside the idle
/// ones `empty_cache` counts.
fn released_by(pool: &mut Engine, give_back: impl FnOnce(&mut Engine) -> u64) -> u64 {
    let before = pool.reserved();
    give_back(pool);
    before.saturating_sub(pool.reserved())
}

/// The program is done. A tool's leak check at exit would report every
/// segment the pool still caches, so with a tool attached the wholly free
/// ones go back to CUDA now, before the runtime's exit handlers tear the
/// context down. A segment holding a block the program never freed stays,
/// registered: compute-sanitizer then reports that block at its own size,
/// not the segment (BENCHMARKS.md, section 10).
/// Returns (device, bytes given back) per pool.
pub fn release_idle_for_tools() -> Vec<(i32, u64)> {
    if !super::tools::attached() {
        return Vec::new();
    }
    empty_pools(|_| true)
}

/// Peaks of `device`'s pools start again from now.
pub fn reset_peaks(device: i32) {
    for p in all().into_iter().filter(|p| p.device == device) {
        p.pool.lock().reset_peak_stats();
    }
}

/// Every live pool.
pub fn all() -> Vec<&'static ContextPool> {
    POOLS.lock().clone()
}

/// Pools whose context died.
pub fn retired() -> Vec<&'static ContextPool> {
    RETIRED.lock().clone()
}

/// Runs `f` with the context of `pool` (a `Pooled::pool`) current,
/// restoring the thread's own after; `None` when it cannot be made current.
pub fn in_context_of<R>(pool: PoolHandle, f: impl FnOnce() -> R) -> Option<R> {
    let ctx = pool.get().ctx;
    let _current = super::fence::InContext::enter(ctx)?;
    Some(f())
}

/// Is `ptr` inside memory a live pool holds?
pub fn owns(ptr: u64) -> bool {
    !matches!(find(ptr), Found::Outside)
}

pub fn lock_for_fork() {
    magazine::lock_for_fork();
    std::mem::forget(POOLS.lock());
    std::mem::forget(RETIRED.lock());
    std::mem::forget(EXPORTED.lock());
    streams::lock_for_fork();
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    streams::unlock_after_fork(in_child);
    EXPORTED.force_unlock();
    RETIRED.force_unlock();
    POOLS.force_unlock();
    magazine::unlock_after_fork(in_child);
    if in_child {
        EXPORTED.lock().clear();
        // The child has no CUDA context of its parent's: start with no pools.
        POOLS.lock().clear();
        RETIRED.lock().clear();
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
}
