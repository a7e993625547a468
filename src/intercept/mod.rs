//! Interception: what every hook calls. Each entry point takes the
//! reentrancy guard (one allocation is counted once, at the outermost layer
//! it entered through), serves the call from the pool or passes it to the
//! real CUDA function, and tells the observers what happened.

mod capture;
mod context;
pub mod ipc;
mod last_error;
pub use last_error::as_last_error;
mod limit;
pub mod phases;
pub mod stats;

use crate::cuda::{Status, CAPTURE_ERRORS, INVALID_CONTEXT, INVALID_VALUE, OUT_OF_MEMORY, SUCCESS};
use crate::observe::{self, Allocation, Pooled, Space};
use crate::runtime::{clock, diag, guard::Guard, options};
use crate::{lifecycle, pool, real, sink};
use cupool_core::log::{Api, EventKind, MemKind, MultiStreamBecause};
use cupool_core::options::Mode;
use cupool_core::pool::BlockId;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};

/// An allocating call: the entry point, the kind of memory it makes, the
/// bytes asked for, its stream (stream-ordered calls) and its device when the
/// call names one (VMM); else the current context's device is asked.
#[derive(Clone, Copy)]
pub struct AllocCall {
    pub api: Api,
    pub kind: MemKind,
    pub request: u64,
    pub stream: u64,
    pub device: Option<i32>,
}

impl AllocCall {
    pub const fn new(api: Api, kind: MemKind, request: u64) -> AllocCall {
        AllocCall { api, kind, request, stream: 0, device: None }
    }

    pub const fn on_stream(self, stream: u64) -> AllocCall {
        AllocCall { stream, ..self }
    }

    pub const fn on_device(self, device: Option<i32>) -> AllocCall {
        AllocCall { device, ..self }
    }
}

/// What the real call did: (CUDA result, pointer or handle, bytes occupied).
pub type Outcome = (Status, u64, u64);

/// Reads the pointer a successful allocation wrote to its out-parameter.
///
/// # Safety
/// `out` is null or valid for reads.
#[inline]
pub unsafe fn out_ptr<T: Copy + Into<u64>>(out: *const T, result: Status) -> u64 {
    if result == SUCCESS && !out.is_null() {
        (*out).into()
    } else {
        0
    }
}

pub use capture::{begin as capture_begin, end as capture_end};

/// An allocation CUDA makes itself.
#[inline]
pub fn allocation(call: AllocCall, mut real: impl FnMut() -> Outcome) -> Status {
    let Some(_guard) = Guard::enter() else {
        return real().0;
    };
    if call.kind == MemKind::Async && capture::into_graph(call.stream, call.api.as_str().ends_with("_ptsz")) {
        return real().0;
    }
    passthrough(call, real)
}

fn passthrough(call: AllocCall, mut real: impl FnMut() -> Outcome) -> Status {
    if let Some(cap) = limit::cap().filter(|_| call.kind.is_device()) {
        if let Some(Some(device)) = diag::shielded(|| refused_by_cap(call, cap)) {
            lifecycle::recording();
            observe::alloc_failed(call.api, call.kind, device, call.request, OUT_OF_MEMORY);
            return last_error::runtime_error(call.api, OUT_OF_MEMORY);
        }
    }
    let may_retry = call.kind.is_device() && options::get().mode == Mode::Pool && no_error_pending(call.api);
    let (mut result, mut ptr, mut bytes) = real();
    if result == OUT_OF_MEMORY && may_retry && diag::shielded(|| gave_back_for(call)).unwrap_or(false) {
        (result, ptr, bytes) = real();
        if result == SUCCESS && is_runtime(call.api) {
            // The first attempt's error is still the thread's last one (a
            // success does not clear it), where without cupool the call
            // just succeeded: PyTorch checks `cudaGetLastError` after
            // every kernel launch.
            unsafe { real!(cudaGetLastError()) };
        }
    }
    diag::shielded(|| {
        lifecycle::recording(); // starts the clock before the first allocation is stamped
        let (ctx, dev) = context::current();
        let device = call.device.unwrap_or(dev);
        if result != SUCCESS {
            observe::alloc_failed(call.api, call.kind, device, bytes, result);
        } else if ptr != 0 {
            // A 0-byte request succeeds with a NULL pointer: nothing was allocated.
            observe::allocated(Space::of(call.kind), ptr, allocation_record(call, ctx, device, bytes, None));
        }
    });
    result
}

/// May a runtime call be made twice? Only while the thread has no error
/// left unread: clearing the failed attempt's error would clear that one
/// too. (Driver calls keep no last error.)
fn no_error_pending(api: Api) -> bool {
    !is_runtime(api) || unsafe { real!(cudaPeekAtLastError()) } == SUCCESS
}

/// CUDA refused memory that the pool does not serve (stream-ordered, VMM,
/// managed, or anything while the pool stands aside): the pools give back
/// what they hold unused on that device, waiting for the GPU where freed
/// blocks still wait for it, so that memory the program freed is there for
/// the call again, as after a plain `cudaFree`. True: something went back;
/// make the call again. Not during a capture, which a wait would break.
#[cold]
fn gave_back_for(call: AllocCall) -> bool {
    if pool::any_capture() {
        return false;
    }
    let device = call.device.unwrap_or_else(|| context::current().1);
    if beyond_reach(call, device) {
        return false;
    }
    let released = pool::give_back_all_free(device, &mut observe::reserved_changed);
    if released > 0 {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            observe::remark(
                "CUDA refused memory the pool does not serve (stream-ordered, VMM or managed): the pools gave back \
                 what no block used, and the call was made again",
            )
        });
    }
    released > 0
}

/// Would `call` fail even with everything the pools hold on `device` given
/// back? Then it fails at once, as without cupool, instead of after a wait
/// for the GPU (a request past the device's memory). Asked of the current
/// context's device only; false when unsure.
fn beyond_reach(call: AllocCall, device: i32) -> bool {
    if context::current().1 != device {
        return false;
    }
    let (mut free, mut total) = (0usize, 0usize);
    if unsafe { real!(cuMemGetInfo_v2(&mut free, &mut total)) } != SUCCESS {
        return false;
    }
    call.request > (free as u64).saturating_add(pool::reserved_on(device))
}

/// The device, when `request` more bytes on it would pass the cap.
fn refused_by_cap(call: AllocCall, cap: u64) -> Option<i32> {
    let device = call.device.unwrap_or_else(|| current_device(call));
    limit::exceeded(cap, device, call.request).then_some(device)
}

fn current_device(call: AllocCall) -> i32 {
    ensure_context(call);
    context::current().1
}

/// The current context; for a runtime call, created first if need be,
/// exactly as the runtime call being made would. 0 when none.
fn ensure_context(call: AllocCall) -> u64 {
    let ctx = context::current_only();
    if ctx != 0 || !start_context(call) {
        return ctx;
    }
    context::current_only()
}

/// A runtime call with no usable context starts one first, as the real call
/// would (`cudaFree(NULL)`, the runtime's idiom; after a reset too); a driver
/// call does not. Returns whether it tried.
fn start_context(call: AllocCall) -> bool {
    if !is_runtime(call.api) {
        return false;
    }
    unsafe { real!(cudaFree(std::ptr::null_mut())) };
    true
}

#[inline]
fn is_runtime(api: Api) -> bool {
    api.as_str().starts_with("cuda")
}

fn allocation_record(call: AllocCall, ctx: u64, device: i32, size: u64, pooled: Option<Pooled>) -> Allocation {
    Allocation {
        size,
        t_ns: clock::now_coarse_ns(),
        ctx,
        device,
        kind: call.kind,
        api: call.api,
        tid: crate::runtime::guard::tid(),
        stream: call.stream,
        pooled,
        stack: observe::sites::capture(),
    }
}

/// A device allocation that the pool may serve. `call.request` is what the
/// call occupies (pitch × rows for pitched memory; 0 when the pool must not
/// serve it); `write` stores the pointer (and pitch) into the caller's
/// out-parameters; `real` is the real CUDA call, used in passthrough mode,
/// for 0 bytes, and whenever the pool cannot help.
#[inline]
pub fn pooled_allocation(call: AllocCall, write: impl FnOnce(u64), mut real: impl FnMut() -> Outcome) -> Status {
    let Some(_guard) = Guard::enter() else {
        return real().0;
    };
    // During a capture the real call answers (`capture.rs`).
    if options::get().mode == Mode::Pool && call.request > 0 && !pool::any_capture() {
        if let Some(Some(result)) = diag::shielded(|| from_pool(call)) {
            return match result {
                Ok(ptr) => {
                    write(ptr);
                    SUCCESS
                }
                Err(code) => last_error::runtime_error(call.api, code),
            };
        }
    }
    passthrough(call, real)
}

/// `None`: the pool cannot be used here (no context); the caller passes through.
#[inline]
fn from_pool(call: AllocCall) -> Option<Result<u64, Status>> {
    let bytes = call.request;
    lifecycle::recording();
    let id = match context::current_id() {
        Some(id) => id,
        None if start_context(call) => context::current_id()?,
        None => return None,
    };
    if !is_runtime(call.api) {
        match pool::driver_allocation(crate::runtime::guard::tid() as u64) {
            Some(MultiStreamBecause::DriverThreads) => observe::remark(DRIVER_THREADS),
            Some(MultiStreamBecause::BoundThread) => observe::remark(BOUND_THREAD),
            _ => {}
        }
    } else {
        pool::runtime_allocation();
    }
    if pool::tools::blind_checker() {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            observe::remark(
                "a memory checker (compute-sanitizer without --nvtx yes) cannot see pooled blocks: allocations go to CUDA",
            )
        });
        return None;
    }
    // The handle and device are asked only when a new context is met.
    let (pool, stale) = pool::pool_of(id, context::current);
    if let Some(ctx) = stale {
        context_reborn(ctx, id);
    }
    if bytes >= pool.direct_min {
        // Pages are mapped one by one, tens of microseconds each: a request
        // of a gigabyte costs the pool tens of milliseconds the first time,
        // where `cuMemAlloc` takes well under one (BENCHMARKS.md §12).
        return None;
    }
    let ctx = pool.ctx;
    let cap = |own| limit::cap().map_or(u64::MAX, |cap| limit::pool_cap(cap, pool.device, own));
    let result = pool::allocate(pool, bytes, cap, &mut observe::reserved_changed);
    let Ok(result) = result else {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            observe::remark("backing=vmm: the driver refused a page mapping: allocations of that context go to CUDA")
        });
        return None;
    };
    match result {
        Ok(block) => {
            pool::tools::block_handed_out(block.addr, bytes);
            let pooled = Pooled {
                pool: NonZeroUsize::new(pool as *const _ as usize)?,
                block: block.id.to_raw(),
                buffer_id: next_buffer_id(),
            };
            observe::allocated(
                Space::Pointer,
                block.addr,
                allocation_record(call, ctx, pool.device, bytes, Some(pooled)),
            );
            Some(Ok(block.addr))
        }
        Err(_) => {
            observe::alloc_failed(call.api, call.kind, pool.device, bytes, OUT_OF_MEMORY);
            observe::out_of_memory(call.api, pool.device, bytes, || pool::records::at_oom(pool));
            Some(Err(OUT_OF_MEMORY))
        }
    }
}

/// A freeing call on a pointer.
#[inline]
pub fn free(api: Api, ptr: u64, real: impl FnOnce() -> Status) -> Status {
    release(api, Space::Pointer, ptr, real)
}

/// `cuMemRelease` of a VMM handle.
#[inline]
pub fn release_handle(api: Api, handle: u64, real: impl FnOnce() -> Status) -> Status {
    release(api, Space::VmmHandle, handle, real)
}

#[inline]
fn release(api: Api, space: Space, key: u64, real: impl FnOnce() -> Status) -> Status {
    if key == 0 {
        return real(); // cudaFree(NULL) is the runtime's initialisation idiom, not a free
    }
    let Some(_guard) = Guard::enter() else {
        return real();
    };
    lifecycle::recording();
    let known = diag::shielded(|| observe::releasing(space, key)).flatten();
    let stamp = sink::stamp_for(EventKind::Free);
    let result = match known.and_then(|a| Some((a.pooled?, a.size))) {
        Some((p, size)) => match refused_by_capture(api, p.pool.get()) {
            Some(code) => code,
            None => {
                pool::tools::block_freed(key); // before the pool may hand it out again
                diag::shielded(|| {
                    pool::free(p.pool.get(), BlockId::from_raw(p.block), key, size, &mut observe::reserved_changed)
                });
                SUCCESS
            }
        },
        // Not a live allocation but inside a pool segment (a double free):
        // CUDA must not see it, or it would free the whole segment.
        // When cupool cannot tell (an internal failure), CUDA must not see it either.
        None if known.is_none() && space == Space::Pointer && diag::shielded(|| pool::owns(key)).unwrap_or(true) => {
            last_error::runtime_error(api, INVALID_VALUE)
        }
        None => real(),
    };
    diag::shielded(|| match (known, result) {
        (Some(a), SUCCESS) => observe::freed(api, key, &a, stamp),
        (Some(a), _) => observe::free_refused(space, key, a), // CUDA kept it: so do we
        (None, SUCCESS) => {} // allocated before cupool could see it (e.g. inside another hook's init)
        (None, r) => observe::invalid_free(api, key, r, stamp),
    });
    result
}

/// During a stream capture a pooled free must fail exactly where `cuMemFree`
/// would, and break the capture as it would. The driver refuses `cuMemAlloc`
/// by the same rule (an unsafe call under a global-mode capture, even one
/// already invalidated, or under this thread's own thread-local one; allowed
/// under a relaxed capture or another thread's thread-local one), so a small
/// allocation asks it. A synchronisation would not do: it fails while any
/// stream of the context is capturing, in every mode, and breaks that
/// capture, where `cuMemFree` succeeds and leaves it whole (measured on an
/// H200, `scripts/gpu/graph.cu`; numba-cuda's suite met it). For a runtime
/// call the runtime's own `cudaMalloc` asks, so that a refusal is the
/// thread's last error too, as `cudaFree`'s would be. `pool` served the block.
#[inline]
fn refused_by_capture(api: Api, pool: usize) -> Option<Status> {
    if !pool::any_capture() {
        return None;
    }
    capture_probe(api, pool)
}

/// The probe itself, out of the free's way.
#[cold]
#[inline(never)]
fn capture_probe(api: Api, pool: usize) -> Option<Status> {
    // Only with no error unread: the probe's own failure would replace it.
    let r = if is_runtime(api) && no_error_pending(api) {
        runtime_probe()
    } else {
        let r = driver_probe();
        // `cuMemFree` needs no current context, and from a thread without
        // one it is refused under a global capture of the block's context
        // (H200, `scripts/gpu/graph.cu` no-context-free), where the probe
        // would only answer that there is no context.
        if r == INVALID_CONTEXT && context::current_only() == 0 {
            pool::in_context_of(pool, driver_probe).unwrap_or(r)
        } else {
            r
        }
    };
    CAPTURE_ERRORS.contains(&r).then_some(r)
}

/// A one-byte `cudaMalloc`, freed at once; a refusal other than a
/// capture's is taken back from the thread's last error.
fn runtime_probe() -> Status {
    let mut probe = std::ptr::null_mut();
    let r = unsafe { real!(cudaMalloc(&mut probe, 1)) };
    if r == SUCCESS {
        unsafe { real!(cudaFree(probe)) };
    } else if !CAPTURE_ERRORS.contains(&r) {
        unsafe { real!(cudaGetLastError()) }; // a full device: the free goes ahead, as plainly
    }
    r
}

/// A one-byte `cuMemAlloc` in the current context, freed at once.
fn driver_probe() -> Status {
    let mut probe = 0;
    let r = unsafe { real!(cuMemAlloc_v2(&mut probe, 1)) };
    if r == SUCCESS {
        unsafe { real!(cuMemFree_v2(probe)) };
    }
    r
}

/// A VMM map or unmap that happened.
pub fn mapping(kind: EventKind, api: Api, ptr: u64, size: u64, handle: u64, result: Status) {
    if result != SUCCESS || crate::runtime::guard::inside() {
        return;
    }
    diag::shielded(|| {
        lifecycle::recording();
        observe::mapping(kind, api, ptr, size, handle)
    });
}

/// `cuCtxDestroy`: the context and everything it held die.
pub fn context_destroy(ctx: u64, real: impl FnOnce() -> Status) -> Status {
    let Some(_guard) = Guard::enter() else {
        return real();
    };
    let r = real();
    if r == SUCCESS {
        diag::shielded(|| context_died(Api::CuCtxDestroy, -1, ctx));
    }
    r
}

/// A reset of `device`'s primary context (`cudaDeviceReset`,
/// `cuDevicePrimaryCtxReset`): the context and everything it held die.
pub fn primary_reset(api: Api, device: impl FnOnce() -> i32, real: impl FnOnce() -> Status) -> Status {
    let Some(_guard) = Guard::enter() else {
        return real();
    };
    let device = device();
    let primary = diag::shielded(|| context::primary(device)).flatten();
    let r = real();
    if let (SUCCESS, Some(ctx)) = (r, primary) {
        diag::shielded(|| context_died(api, device, ctx));
    }
    r
}

/// Context `ctx` died, and with it its pool and everything it held.
fn context_died(api: Api, device: i32, ctx: u64) {
    retire_context(api, device, ctx, |p| p.ctx == ctx);
}

/// Handle `ctx` now names a new context (id `id`): the one it named before
/// died without a call cupool sees, which only the static runtime's
/// `cudaDeviceReset` does. Its pool and allocations die now, reported as
/// dying in that reset.
#[cold]
fn context_reborn(ctx: u64, id: u64) {
    // The new context has no segment yet: every heap of `ctx` is the dead one's.
    retire_context(Api::CudaDeviceReset, -1, ctx, |p| p.ctx == ctx && p.id != id);
    observe::remark("a context was destroyed and created again behind cupool's back (a static runtime's cudaDeviceReset): its pool was dropped when the new one was first used");
}

/// The memory of context `ctx` died at `api`: the tools hear first, the
/// pools that `dies` picks are retired, and its allocations die.
fn retire_context(api: Api, device: i32, ctx: u64, dies: impl Fn(&pool::ContextPool) -> bool) {
    pool::tools::context_died(ctx);
    pool::ipc::pages::forget_context(ctx);
    for (device, reserved) in pool::drop_context(dies) {
        observe::reserved_changed(device, -(reserved as i64));
    }
    observe::context_died(api, device, |a| a.ctx == ctx);
}

/// `cudaMemGetInfo`/`cuMemGetInfo`: the real answer, seen through the `limit`.
/// Applied once, at the outermost call (the runtime's calls the driver's).
///
/// # Safety
/// `free` and `total` are null or valid for writes.
pub unsafe fn mem_info(free: *mut usize, total: *mut usize, real: impl FnOnce() -> Status) -> Status {
    let Some(_guard) = Guard::enter() else {
        return real();
    };
    // A program that measures free memory sees what it would see without
    // cupool: cached segments that are wholly free go back first (what is
    // free inside partly used segments still counts as used). Not during a
    // stream capture, which a `cuMemFree` could break.
    if options::get().mode == Mode::Pool && !pool::any_capture() {
        diag::shielded(|| {
            pool::settle(false, &mut observe::reserved_changed);
            for (device, released) in pool::give_back_free_segments(context::current().1) {
                observe::reserved_changed(device, -(released as i64));
            }
        });
    }
    let r = real();
    if r == SUCCESS {
        diag::shielded(|| limit::apply(free, total));
    }
    r
}

/// A stream was created in the current context.
pub fn stream_created(stream: u64) {
    diag::shielded(|| pool::stream_created(context::current().0, stream));
}

pub fn stream_destroyed(stream: u64) {
    diag::shielded(|| pool::stream_destroyed(stream));
}

/// The calling thread made a context current. With the runtime linked
/// statically, another thread's kernels run on streams cupool never sees
/// (`--default-stream per-thread`), and binding a context is the one sign of
/// that thread: once one shows while pooled allocations come only through
/// the driver API and no launch is visible, freed blocks wait for fences.
pub fn context_bound() {
    if crate::runtime::guard::inside() {
        // A shared runtime binding beneath one of cupool's runtime hooks
        // (cupool's own bindings call the driver directly, never this).
        return;
    }
    if pool::context_bound(crate::runtime::guard::tid() as u64) {
        observe::remark(BOUND_THREAD);
    }
}

const DRIVER_THREADS: &str = "pooled allocations through the driver API from several threads (a static runtime's \
    launches are invisible, so their kernels may run side by side on per-thread default streams): freed blocks wait for \
    fences";
const BOUND_THREAD: &str = "a second thread made a context current where no kernel launch is visible (a static \
    runtime, whose launches on per-thread default streams no hook sees): freed blocks wait for fences";

/// What a hook that queues GPU work queued.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// A kernel: a program whose kernel launches are seen has none unseen.
    Launch,
    /// Anything else (copies, memsets, host functions, graphs, memory operations).
    Other,
}

/// GPU work was queued on `stream` (`per_thread_api`: through a `_ptsz`
/// entry point, where stream 0 is the calling thread's default stream).
#[inline]
pub fn work_queued(stream: u64, per_thread_api: bool, work: Work) {
    if work == Work::Launch {
        pool::launch_seen();
    }
    pool::note_work(stream, per_thread_api);
}

/// Buffer ids of pooled allocations, far above the driver's own (which count
/// its allocations from 1). Each thread takes a range of them at a time, so
/// that allocating threads do not share one counter's cache line.
static NEXT_BUFFER_IDS: AtomicU64 = AtomicU64::new(1 << 48);
const BUFFER_IDS_AT_A_TIME: u64 = 1 << 16;

crate::runtime::tls::static_tls! {
    /// (next id, end of this thread's range).
    BUFFER_IDS: std::cell::Cell<(u64, u64)>;
}

#[inline]
fn next_buffer_id() -> u64 {
    BUFFER_IDS.with(|ids| {
        let (mut next, mut end) = ids.get();
        if next == end {
            next = NEXT_BUFFER_IDS.fetch_add(BUFFER_IDS_AT_A_TIME, Ordering::Relaxed);
            end = next + BUFFER_IDS_AT_A_TIME;
        }
        ids.set((next + 1, end));
        next
    })
}

/// What a pointer is to the pools: pooled blocks answer pointer queries as
/// the allocations they are to the program.
pub enum PooledPointer {
    /// Inside a live pooled block: its (start, size, buffer id), and for a
    /// block on VMM pages whether cupool can export it through IPC (the
    /// driver's answer for a segment's block stands).
    Block(u64, u64, u64, Option<bool>),
    /// Inside a pool segment but in no live block: freed, as far as the
    /// program can tell, and CUDA would not know it.
    Freed,
    NotPooled,
}

/// What `ptr` is to the pools, with the program's allocation there when it
/// lies in a block. A block the pool counts as allocated that the program
/// does not hold sits in a thread's magazine (freed, or never handed out):
/// the magazines give their blocks back, and the pools are asked again.
pub fn find_as_the_program_sees_it(ptr: u64) -> (pool::Found, Option<Allocation>) {
    let ask = || {
        let found = pool::find(ptr);
        let live = match &found {
            pool::Found::Block(b) => observe::live::get(Space::Pointer, b.addr),
            _ => None,
        };
        (found, live)
    };
    match ask() {
        // Not during a capture: a segment going back could break it.
        (pool::Found::Block(_), None) if !pool::any_capture() => {
            let _guard = Guard::enter(); // the pools may call CUDA: not through the hooks
            pool::settle(false, &mut observe::reserved_changed);
            ask()
        }
        found => found,
    }
}

pub fn pooled_pointer(ptr: u64) -> PooledPointer {
    if crate::runtime::guard::inside() {
        // cupool's own calls (and the runtime's under a hook) get the driver's answers.
        return PooledPointer::NotPooled;
    }
    let found = diag::shielded(|| match find_as_the_program_sees_it(ptr) {
        (pool::Found::Block(b), live) => {
            // The size the program asked for: a magazine's block was taken for its size class.
            let id = live.and_then(|a| a.pooled).map_or(0, |p| p.buffer_id);
            let size = live.map_or(b.size, |a| a.size);
            PooledPointer::Block(b.addr, size, id, b.vmm.then_some(b.shareable))
        }
        (pool::Found::Freed, _) => PooledPointer::Freed,
        (pool::Found::Outside, _) => PooledPointer::NotPooled,
    });
    found.unwrap_or(PooledPointer::NotPooled)
}
