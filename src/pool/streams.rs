//! Which streams the process uses. Pool mode reuses a freed block at once
//! only while every piece of work so far went to one stream (work then runs
//! in the order it was queued); once a second stream is in use, freed blocks
//! wait for fences (`fence.rs`).

use crate::runtime::guard;
use cupool_core::log::MultiStreamBecause;
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Set once work may run on more than one stream (`MultiStreamBecause`:
/// a created stream, work seen on a second stream, or a second thread of a
/// program whose launches are unseen): from then on reuse waits for fences.
pub static MULTI_STREAM: AtomicBool = AtomicBool::new(false);
/// What set `MULTI_STREAM` first (`MultiStreamBecause::code`; 0 before).
static BECAUSE: AtomicU8 = AtomicU8::new(0);

/// Sets `MULTI_STREAM`; true when this call is the first. The reason is
/// kept before the flag is set, so a record that sees the flag has it.
fn go_multi_stream(because: MultiStreamBecause) -> bool {
    let first = BECAUSE.compare_exchange(0, because.code(), Ordering::AcqRel, Ordering::Acquire).is_ok();
    MULTI_STREAM.store(true, Ordering::Release);
    first
}

/// What first made reuse wait for fences, once it does.
pub fn multi_stream_because() -> Option<MultiStreamBecause> {
    MultiStreamBecause::from_code(BECAUSE.load(Ordering::Acquire))
}

/// Set once a per-thread default stream is seen in use: other threads'
/// default streams cannot be made to wait, so barriers give way to host waits.
pub static PER_THREAD_STREAMS: AtomicBool = AtomicBool::new(false);

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
            (1 << 63) | guard::tid() as u64
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
        Err(_) => {
            go_multi_stream(MultiStreamBecause::SecondStream);
        }
    }
}

/// The first thread that allocated from the pool through the driver API.
static DRIVER_THREAD: AtomicU64 = AtomicU64::new(0);
/// The first thread seen using CUDA (binding a context or allocating
/// through the driver API), and whether another has been seen since.
static FIRST_THREAD: AtomicU64 = AtomicU64::new(0);
static OTHER_THREAD: AtomicBool = AtomicBool::new(false);
/// A pooled allocation came through the runtime API (the runtime is shared,
/// and its launches are seen), or a kernel launch was seen.
static RUNTIME_POOLED: AtomicBool = AtomicBool::new(false);
static LAUNCH_SEEN: AtomicBool = AtomicBool::new(false);

/// A pooled allocation came through the driver API (a driver-API program, or
/// one with the runtime linked statically, whose kernel launches no hook
/// sees) on thread `tid`. Built with `--default-stream per-thread`, such a
/// program's threads run their kernels side by side on streams cupool never
/// learns of; so once a second thread allocates, or binds a context (see
/// `context_bound`), freed blocks wait for fences (an event on the legacy
/// stream completes only after the work of every per-thread default stream
/// queued before it). Says why the first time that happens.
#[inline]
pub fn driver_allocation(tid: u64) -> Option<MultiStreamBecause> {
    if MULTI_STREAM.load(Ordering::Relaxed) {
        return None;
    }
    let because = match first_of(&DRIVER_THREAD, tid) {
        Some(first) if first != tid => MultiStreamBecause::DriverThreads,
        _ if another_thread(tid) && launches_unseen() => MultiStreamBecause::BoundThread,
        _ => return None,
    };
    go_multi_stream(because).then_some(because)
}

/// Thread `tid` made a context current. The static runtime does so on each
/// thread's first call (measured on an H200: the primary context through
/// `cuCtxSetCurrent`, which it takes from `cuGetProcAddress`), while that
/// thread's launches stay invisible. True the first time this makes reuse
/// wait for fences: a second thread, pooled allocations through the driver
/// API only, and no launch seen.
pub fn context_bound(tid: u64) -> bool {
    if MULTI_STREAM.load(Ordering::Relaxed) || !another_thread(tid) {
        return false;
    }
    // SeqCst against `driver_allocation`, which records its thread and then
    // asks `another_thread`: of the two, at least one sees the other.
    DRIVER_THREAD.load(Ordering::SeqCst) != 0 && launches_unseen() && go_multi_stream(MultiStreamBecause::BoundThread)
}

/// A pooled allocation came through the runtime API.
#[inline]
pub fn runtime_allocation() {
    set_once(&RUNTIME_POOLED);
}

/// A kernel launch was seen: launches are not hidden from the hooks.
#[inline]
pub fn launch_seen() {
    set_once(&LAUNCH_SEEN);
}

/// Stores only while unset: every thread reads the line, none keeps writing it.
#[inline]
fn set_once(flag: &AtomicBool) {
    if !flag.load(Ordering::Relaxed) {
        flag.store(true, Ordering::Release);
    }
}

/// Has a thread other than `tid` been seen using CUDA, or is `tid` the
/// first after another?
fn another_thread(tid: u64) -> bool {
    if OTHER_THREAD.load(Ordering::SeqCst) {
        return true;
    }
    match first_of(&FIRST_THREAD, tid) {
        Some(first) if first != tid => {
            OTHER_THREAD.store(true, Ordering::SeqCst);
            true
        }
        _ => false,
    }
}

/// The thread recorded in `slot` before `tid`, which is recorded if none
/// was (`None`). A plain load first: allocating threads share the line.
/// SeqCst: a thread binding a context and the first thread allocating each
/// record themselves and then read what the other recorded (`context_bound`);
/// on x86-64 these loads are plain loads.
#[inline]
fn first_of(slot: &AtomicU64, tid: u64) -> Option<u64> {
    match slot.load(Ordering::SeqCst) {
        0 => slot.compare_exchange(0, tid, Ordering::SeqCst, Ordering::SeqCst).err(),
        first => Some(first),
    }
}

/// Could kernels be running that no hook saw? Only while the runtime's
/// allocations are not seen (it is linked statically) and no kernel launch
/// has been seen either (a driver-API program's are). A static runtime's
/// copies and memsets may be seen, its kernel launches never.
fn launches_unseen() -> bool {
    !RUNTIME_POOLED.load(Ordering::Acquire) && !LAUNCH_SEEN.load(Ordering::Acquire)
}

/// Live streams as (context, stream).
static STREAMS: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// A stream was created. The runtime launches its kernels through private
/// driver entry points that no hook sees (measured: a kernel on a created
/// stream was never reported to `note_work`), so a created stream is taken
/// as a second stream in use. Returns whether it is the context's first:
/// frees made before a stream existed were reusable at once, and the
/// caller orders the new stream behind the work queued so far.
pub fn add(ctx: u64, stream: u64) -> bool {
    go_multi_stream(MultiStreamBecause::StreamCreated);
    let mut list = STREAMS.lock();
    let first = !list.iter().any(|&(c, _)| c == ctx);
    list.push((ctx, stream));
    first
}

/// The context `stream` was created in, if cupool saw it created.
pub fn context_of(stream: u64) -> Option<u64> {
    STREAMS.lock().iter().find(|&&(_, s)| s == stream).map(|&(c, _)| c)
}

pub fn remove(stream: u64) {
    STREAMS.lock().retain(|&(_, s)| s != stream);
    capture_ended(stream, false); // destroying a capturing stream ends its capture
}

/// Streams being captured, as `stream_key`s, and how many: every allocation
/// asks "is any capture under way?" with one load.
static CAPTURING: Mutex<Vec<u64>> = Mutex::new(Vec::new());
static CAPTURES: AtomicUsize = AtomicUsize::new(0);

/// A capture began on `stream`. The runtime's call and the driver's beneath
/// it may both report one capture: the list holds each stream once.
pub fn capture_begun(stream: u64, per_thread_api: bool) {
    let key = stream_key(stream, per_thread_api);
    let mut list = CAPTURING.lock();
    if !list.contains(&key) {
        list.push(key);
        CAPTURES.store(list.len(), Ordering::Release);
    }
}

/// The capture on `stream` ended (or was never there).
pub fn capture_ended(stream: u64, per_thread_api: bool) {
    if !any_capture() {
        return;
    }
    let key = stream_key(stream, per_thread_api);
    let mut list = CAPTURING.lock();
    list.retain(|&k| k != key);
    CAPTURES.store(list.len(), Ordering::Release);
}

/// Is a stream capture under way anywhere in the process?
#[inline]
pub fn any_capture() -> bool {
    CAPTURES.load(Ordering::Acquire) != 0
}

/// Is `stream` being captured?
pub fn is_capturing(stream: u64, per_thread_api: bool) -> bool {
    any_capture() && CAPTURING.lock().contains(&stream_key(stream, per_thread_api))
}

/// The stream list, locked: fences record and check captures with it held,
/// so no stream is destroyed under them.
pub fn locked() -> MutexGuard<'static, Vec<(u64, u64)>> {
    STREAMS.lock()
}

/// `ctx`'s live streams in `list` (held locked by the caller), plus the legacy default stream.
pub fn of_context(list: &[(u64, u64)], ctx: u64) -> Vec<u64> {
    list.iter().filter(|(c, _)| *c == ctx).map(|&(_, s)| s).chain(std::iter::once(0)).collect()
}

pub fn lock_for_fork() {
    std::mem::forget(STREAMS.lock());
    std::mem::forget(CAPTURING.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    CAPTURING.force_unlock();
    STREAMS.force_unlock();
    if in_child {
        // A capture is its thread's, and the child has only the forking thread.
        CAPTURING.lock().clear();
        CAPTURES.store(0, Ordering::Release);
        STREAMS.lock().clear();
        MULTI_STREAM.store(false, Ordering::Release);
        BECAUSE.store(0, Ordering::Release);
        ONLY_STREAM.store(NO_STREAM, Ordering::Release);
        DRIVER_THREAD.store(0, Ordering::Release);
        FIRST_THREAD.store(0, Ordering::Release);
        OTHER_THREAD.store(false, Ordering::Release);
        // RUNTIME_POOLED and LAUNCH_SEEN stay: they describe the program.
    }
}
