//! The device side of one context's pool: reuse fences and GPU-side barriers.
//!
//! A `cudaFree` waits for queued GPU work that may still touch the buffer;
//! the pool does not. Once a second stream is in use (`streams.rs`), freed
//! blocks wait for a *fence* (an event on every live stream of the context,
//! recorded after the free) to complete; the pool synchronises the context
//! only when memory is short, and never while a stream is being captured.
//!
//! A block may be freed while another device is current (`cudaFree` takes
//! any device's pointer), or on a thread with no current context. Events
//! belong to a context and record only on its streams, and the legacy stream,
//! `cuCtxSynchronize` and `cuMemAlloc` are the current context's: so every
//! step that records, waits on the GPU, synchronises or allocates or releases
//! a segment runs with the pool's own context current (querying and waiting
//! for an event works from any context).

use super::progress::Progress;
use super::{streams, tools};
use crate::cuda::{CUcontext, CUdeviceptr, CUevent, CUstream, CUstreamCaptureStatus, SUCCESS};
use crate::real;
use crate::runtime::{clock, options};
use cupool_core::log::FenceCounters;
use cupool_core::pool::{Backend, Timeline};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The device side of one context's pool.
pub struct CudaBackend {
    ctx: u64,
    /// The GPU finished every tag up to this (a GPU-side barrier makes
    /// blocks safe to reuse, not pages safe to unmap).
    finished: u64,
    fences: VecDeque<(u64, Vec<u64>)>,
    spare_events: Vec<u64>,
    /// When the last fence was recorded (monotonic ns).
    last_fence_ns: u64,
    /// When `order_behind` last tried a barrier (monotonic ns).
    last_order_ns: u64,
    /// Events of the last GPU-side barrier: every stream then live waits on
    /// them, and a stream created later is made to wait on them too.
    pub barrier: Vec<u64>,
    /// Events recorded on streams as they were destroyed, work perhaps still
    /// queued behind them: the next fence carries them, so that no block
    /// freed before or after is reused ahead of that work.
    retired: Vec<u64>,
    /// The retired events that fences carry, by the epoch of their fence,
    /// until it completes: a GPU-side barrier on a later fence waits on
    /// them too, as that fence has no event on their streams.
    retired_in_fences: Vec<(u64, u64)>,
    /// The context died: its handle may name a new context now, so nothing
    /// is freed through it any more (`context_died`).
    dead: bool,
    /// An event recorded on the legacy stream when the context's first
    /// stream was created, while it may not have completed.
    before_streams: Option<u64>,
    pub counters: FenceCounters,
    pub progress: Arc<Progress>,
}

/// Events of destroyed streams kept for the next fence before one is
/// recorded for them.
const MAX_RETIRED: usize = 64;

/// Shortest time between fences recorded for magazines' frees
/// (`reuse_ready`), as a share of `fence_us`: half of it. A thread takes back
/// its own frees only once their fence completes, and takes new blocks from
/// the pool until then, so it asks for fences more often than the pool
/// records them for its own frees (fences every 200 µs instead of 50 µs made
/// eight threads about 13 % slower on an H200; BENCHMARKS.md §12). Still a
/// share of the option, so that a longer `fence_us` also spaces these out
/// (and a refused record is tried again that much later).
const REUSE_FENCE_SHARE: u64 = 2;

/// A GPU-side barrier makes every stream wait on every event of a fence: past
/// this many streams the host waits instead.
const MAX_BARRIER_STREAMS: usize = 8;

impl CudaBackend {
    pub fn new(ctx: u64) -> CudaBackend {
        CudaBackend {
            ctx,
            finished: 0,
            fences: VecDeque::new(),
            spare_events: Vec::new(),
            last_fence_ns: 0,
            last_order_ns: 0,
            barrier: Vec::new(),
            retired: Vec::new(),
            retired_in_fences: Vec::new(),
            dead: false,
            before_streams: None,
            counters: FenceCounters::default(),
            progress: Arc::new(Progress::at(1, 0)),
        }
    }

    /// Opens the next epoch; returns the one it closes. Published before the
    /// caller records or synchronises anything (see [`Progress`]).
    fn next_epoch(&mut self) -> u64 {
        self.progress.next_epoch()
    }

    fn complete_up_to(&mut self, epoch: u64) {
        self.progress.complete_up_to(epoch);
    }

    fn epoch(&self) -> u64 {
        self.progress.epoch()
    }

    fn completed(&self) -> u64 {
        self.progress.completed()
    }

    /// Publishes the oldest queued fence for threads that poll it without
    /// the pool's lock (`Progress::poll_unlocked`). Called wherever the
    /// queue's front changes; a dead context publishes none.
    fn publish_oldest(&self) {
        let front = self.fences.front().filter(|_| !self.dead);
        self.progress.publish_oldest(front.map(|(epoch, events)| (*epoch, &events[..])));
    }

    /// Is a capture active on any of this context's streams? Asked with the
    /// stream list locked, so no stream is destroyed under the question.
    fn any_capturing(&self) -> bool {
        let list = streams::locked();
        streams::of_context(&list, self.ctx).into_iter().any(capturing)
    }

    fn event(&mut self) -> Option<u64> {
        self.spare_events.pop().or_else(create_event)
    }

    /// Closes the current epoch with an event on every live stream.
    fn record_fence(&mut self) -> bool {
        let started = clock::monotonic_ns();
        let recorded = self.record_fence_events();
        self.counters.record_ns += clock::monotonic_ns().saturating_sub(started);
        recorded
    }

    fn record_fence_events(&mut self) -> bool {
        // Not while any capture is under way, also on a stream cupool does
        // not list (a per-thread default one): a record on the legacy stream
        // would depend on it and break it.
        if streams::any_capture() {
            self.counters.skipped_for_capture += 1;
            return false;
        }
        let Some(_current) = InContext::enter(self.ctx) else { return false };
        let list = streams::locked();
        let streams = streams::of_context(&list, self.ctx);
        if streams.iter().any(|&s| capturing(s)) {
            self.counters.skipped_for_capture += 1;
            return false; // recording into a capture would change the captured graph
        }
        let closing = self.next_epoch();
        let mut events = Vec::with_capacity(streams.len());
        let mut dead = Vec::new();
        let mut whole = true;
        for s in streams {
            let Some(e) = self.event() else {
                whole = false;
                break;
            };
            if record(e, s) {
                events.push(e);
                continue;
            }
            self.counters.record_errors += 1;
            self.spare_events.push(e);
            if s != 0 && !is_live(s) {
                dead.push(s); // destroyed behind cupool's back
                continue;
            }
            // A fence without this stream would complete before its work:
            // no fence now; the blocks wait for the next one.
            whole = false;
            break;
        }
        drop(list);
        for s in dead {
            streams::remove(s);
        }
        // A refused fence is tried again a `fence_us` later, not on every free.
        self.last_fence_ns = clock::pace_ns();
        if !whole {
            self.spare_events.extend(events);
            return false;
        }
        self.retired_in_fences.extend(self.retired.iter().map(|&e| (closing, e)));
        events.append(&mut self.retired);
        self.counters.recorded += 1;
        self.fences.push_back((closing, events));
        if self.fences.len() == 1 {
            self.publish_oldest();
        }
        true
    }

    /// The context died with its memory. Its handle may already name a new
    /// context (a primary context reset), where a `cuMemFree` of an old
    /// address would free the new context's memory: blocks of this pool
    /// that come back later (from threads' magazines) are dropped instead.
    pub fn context_died(&mut self) {
        self.dead = true;
        self.publish_oldest();
    }

    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// `stream`, of this context, is about to be destroyed. CUDA lets its
    /// queued work run on, but the fences no longer see the stream: an
    /// event recorded on it now joins the next fence. Without an event (none
    /// to be had, a refused record) the host waits for the stream instead.
    /// Not during a capture of the stream, which the record would join (its
    /// destruction ends the capture).
    pub fn retire_stream(&mut self, stream: u64) {
        if stream == 0 || !streams::MULTI_STREAM.load(Ordering::Acquire) {
            return;
        }
        let Some(_current) = InContext::enter(self.ctx) else { return };
        if capturing(stream) {
            return;
        }
        match self.event() {
            Some(e) if record(e, stream) => self.retired.push(e),
            other => {
                self.spare_events.extend(other);
                // SAFETY: the driver's `cuStreamSynchronize` (prototype in `cuda/table.rs`) on a stream of
                // this context that the program has not destroyed: `stream_destroyed` retires it before the
                // real destroy runs.
                unsafe { real!(cuStreamSynchronize(stream as CUstream)) };
            }
        }
        // A program that makes and destroys streams without freeing: their
        // events go into a fence now and then, not into a list without end.
        if self.retired.len() >= MAX_RETIRED {
            self.record_fence();
        }
    }

    /// Makes every live stream of the context wait, on the GPU, for the
    /// fence at `index`: from then on no work can touch a block freed before
    /// that fence ahead of the work that was queued before the free, so those
    /// blocks may be handed out at once, without the host waiting.
    fn gpu_barrier(&mut self, index: usize) -> bool {
        if streams::PER_THREAD_STREAMS.load(Ordering::Relaxed) {
            return false;
        }
        let Some(_current) = InContext::enter(self.ctx) else { return false };
        let list = streams::locked();
        let streams = streams::of_context(&list, self.ctx);
        if streams.len() > MAX_BARRIER_STREAMS || streams.iter().any(|&s| capturing(s)) {
            return false;
        }
        let (epoch, events) = &self.fences[index];
        let epoch = *epoch;
        // The legacy stream waits for every stream's part of the fence, and
        // for the streams destroyed since earlier fences (this one has no
        // event on them); one event after those waits then orders every
        // other stream behind it (2S-1 dependencies instead of S²).
        let destroyed = self.retired_in_fences.iter().filter(|&&(e, _)| e < epoch).map(|&(_, event)| event);
        if !events.iter().copied().chain(destroyed).all(|e| wait(0, e)) {
            return false; // the waits already queued only delay work; the host waits instead
        }
        let Some(joined) = self.event() else { return false };
        if !record(joined, 0) || !streams.iter().filter(|&&s| s != 0).all(|&s| wait(s, joined)) {
            self.spare_events.push(joined);
            return false;
        }
        drop(list);
        // Reuse up to this fence is ordered now, but its pages may be
        // unmapped only once the GPU *finished* the work, which only the
        // fences' own events tell (`poll`): they stay queued until then. A
        // barrier comes every `fence_us` while the GPU runs far behind, so
        // dropping them would leave the pool unaware of finished work: idle
        // pages would stay cooling while new pages were made beside them.
        let previous = std::mem::replace(&mut self.barrier, vec![joined]);
        self.spare_events.extend(previous);
        self.complete_up_to(epoch);
        self.counters.gpu_barriers += 1;
        true
    }

    /// The tag of a free (or an idle page) now. Fences eagerly
    /// (rate-limited): by the time memory runs short, the fences of earlier
    /// frees have mostly completed and their blocks are reusable, instead of
    /// every pending block waiting on a fence recorded only at the miss
    /// (behind all the work queued since). A fence costs an event record per
    /// stream; frees within one interval (`fence_us`) share it.
    fn tag_now(&mut self) -> u64 {
        let tag = self.epoch();
        if clock::at_least_since(self.last_fence_ns, options::get().fence_us * 1000) {
            self.record_fence();
        }
        tag
    }

    /// Is `tag` up to the `mark` (completed or finished) yet? Polls, and
    /// records a fence for it when none covers it.
    fn reached(&mut self, tag: u64, mark: fn(&CudaBackend) -> u64) -> bool {
        self.poll();
        if tag > mark(self) && !self.covered(tag) && self.record_fence() {
            self.poll();
        }
        tag <= mark(self)
    }

    /// Makes `stream`, just created, wait on the GPU for the work queued so
    /// far in the context: an event on the legacy stream completes after
    /// the work of every blocking stream queued before it (per-thread
    /// default streams included), and before the first created stream
    /// there is no other. Not during a capture, which the record would join.
    pub fn order_behind_queued_work(&mut self, stream: u64) {
        if streams::any_capture() {
            return;
        }
        let Some(_current) = InContext::enter(self.ctx) else { return };
        if capturing(0) {
            return; // a capture cupool did not see begin: the record would join it
        }
        let Some(e) = self.event() else { return };
        if record(e, 0) && wait(stream, e) {
            // Kept: streams created later wait on it too, while it runs.
            self.before_streams = Some(e);
        } else {
            self.spare_events.push(e);
        }
    }

    /// Makes `stream`, created after the context's first, wait on the GPU for
    /// the work queued before that first stream, while it may still run:
    /// blocks freed then were reusable at once, and `stream` may be given
    /// one of them (a non-blocking stream is not ordered behind that work
    /// by itself).
    pub fn order_behind_work_before_streams(&mut self, stream: u64) {
        let Some(e) = self.before_streams else { return };
        let Some(_current) = InContext::enter(self.ctx) else { return };
        // Asked only outside captures (a query there is not asked of the driver).
        if !streams::any_capture() && query(e) {
            self.before_streams = None;
            self.spare_events.push(e);
        } else if !wait(stream, e) {
            // Cannot be ordered on the GPU: the host waits for that work.
            // SAFETY: the driver's `cuEventSynchronize` on `e`, an event this backend created
            // (`create_event`); cupool never destroys its events.
            unsafe { real!(cuEventSynchronize(e as CUevent)) };
        }
    }

    /// Has the GPU passed `tag`, the oldest free a thread's magazine waits
    /// to take back? Records a fence for it only when none was recorded in
    /// the last half `fence_us` ([`REUSE_FENCE_SHARE`]): with several
    /// threads each asking every few dozen frees, a fence per question (an
    /// event on every stream, under the pool's lock) would serialise them
    /// again. Until then the magazine takes new blocks from the pool.
    pub fn reuse_ready(&mut self, tag: u64) -> bool {
        self.poll();
        if tag > self.completed()
            && !self.covered(tag)
            && clock::at_least_since(self.last_fence_ns, options::get().fence_us * 1000 / REUSE_FENCE_SHARE)
            && self.record_fence()
        {
            self.poll();
        }
        tag <= self.completed()
    }

    /// Does a queued fence close `tag`'s epoch or a later one?
    fn covered(&self, tag: u64) -> bool {
        self.fences.back().is_some_and(|(e, _)| *e >= tag)
    }

    /// The oldest fence that covers `tag`, recorded now if none does;
    /// None when none can be (a capture is active).
    fn fence_covering(&mut self, tag: u64) -> Option<usize> {
        if !self.covered(tag) && !self.record_fence() {
            return None;
        }
        self.fences.iter().position(|(e, _)| *e >= tag)
    }

    fn poll(&mut self) {
        while let Some((epoch, events)) = self.fences.front() {
            if !events.iter().all(|&e| query(e)) {
                return;
            }
            let epoch = *epoch;
            self.complete_up_to(epoch);
            self.finished = self.finished.max(epoch);
            self.counters.completed += 1;
            self.drop_oldest_fence();
        }
    }

    /// Drops the oldest fence, whose work is done: its events go back to the
    /// spares, and the destroyed streams' events it carried leave the list
    /// that barriers wait on.
    fn drop_oldest_fence(&mut self) {
        if let Some((epoch, events)) = self.fences.pop_front() {
            // Spare (recorded again later) only once `completed` passed the
            // fence, and never while published (see `progress.rs`).
            debug_assert!(self.completed() >= epoch);
            self.publish_oldest();
            self.spare_events.extend(events);
            self.retired_in_fences.retain(|&(e, _)| e > epoch);
        }
    }
}

impl Backend for CudaBackend {
    fn allocate_segment(&mut self, size: u64) -> Option<u64> {
        if self.dead {
            return None;
        }
        let _current = InContext::enter(self.ctx)?;
        let mut p: CUdeviceptr = 0;
        // SAFETY: the driver's `cuMemAlloc_v2` writes the address into `p`, a live local; the pool's context
        // is current (`_current`).
        if unsafe { real!(cuMemAlloc_v2(&mut p, size as usize)) } != SUCCESS {
            return None;
        }
        tools::segment_added(self.ctx, p, size);
        Some(p)
    }

    fn release_segment(&mut self, addr: u64, _size: u64) {
        if self.dead {
            return; // its memory went with the context
        }
        // A pooled free may come from a thread with no current context (the
        // shim answers `cudaFree` before the runtime binds one).
        let _current = InContext::enter(self.ctx);
        tools::segment_released(addr);
        // SAFETY: the driver's `cuMemFree_v2` on `addr`, a segment this backend allocated and the pool gives
        // back once (the core's pool releases each segment once); a dead context's segments never come here
        // (`dead`).
        unsafe { real!(cuMemFree_v2(addr)) };
    }
}

impl Timeline for CudaBackend {
    fn free_tag(&mut self) -> Option<u64> {
        if !streams::MULTI_STREAM.load(Ordering::Acquire) {
            return None;
        }
        Some(self.tag_now())
    }

    /// Unmapping is not ordered behind queued work on any stream, the legacy
    /// one included: every page that goes idle waits for a fence, with one
    /// stream or many.
    fn unmap_tag(&mut self) -> Option<u64> {
        Some(self.tag_now())
    }

    fn is_complete(&mut self, tag: u64) -> bool {
        self.reached(tag, CudaBackend::completed)
    }

    fn is_finished(&mut self, tag: u64) -> bool {
        self.reached(tag, |b| b.finished)
    }

    fn wait_for(&mut self, tag: u64) -> bool {
        self.poll();
        if tag <= self.completed() {
            return true;
        }
        // None: a capture is active, and waiting could deadlock it.
        let Some(index) = self.fence_covering(tag) else { return false };
        if self.gpu_barrier(index) {
            return true;
        }
        let events = self.fences[index].1.clone();
        let t = clock::monotonic_ns();
        for e in events {
            // SAFETY: the driver's `cuEventSynchronize` on events of a queued fence, all created by this
            // backend (`create_event`) and never destroyed.
            unsafe { real!(cuEventSynchronize(e as CUevent)) };
        }
        self.counters.wait_ns += clock::monotonic_ns() - t;
        self.counters.waits += 1;
        self.poll();
        tag <= self.completed()
    }

    /// Waits on the events of the fences up to the one covering `tag` (no
    /// barrier: a barrier orders, it does not finish). An older fence may
    /// hold an event of a stream destroyed since, which the covering one
    /// does not: `finished` moves only past fences whose events are all done.
    fn wait_finished(&mut self, tag: u64) -> bool {
        self.poll();
        if tag <= self.finished {
            return true;
        }
        // Waiting inside a capture could deadlock it, and is illegal in a
        // global-mode one.
        if self.any_capturing() {
            return false;
        }
        let Some(index) = self.fence_covering(tag) else { return false };
        let t = clock::monotonic_ns();
        let waited = (0..=index).all(|f| {
            (0..self.fences[f].1.len())
                // SAFETY: the driver's `cuEventSynchronize` on events of a queued fence, all created by this
                // backend (`create_event`) and never destroyed.
                .all(|i| unsafe { real!(cuEventSynchronize(self.fences[f].1[i] as CUevent)) } == SUCCESS)
        });
        self.counters.wait_ns += clock::monotonic_ns() - t;
        if !waited {
            return false;
        }
        self.counters.waits += 1;
        self.poll();
        tag <= self.finished
    }

    /// At most once per `fence_us`: a barrier costs the program's thread an
    /// event record and a wait per stream, and a program that frees and
    /// allocates in turn would otherwise pay them on every allocation.
    fn order_behind(&mut self, tag: u64) -> bool {
        if !clock::at_least_since(self.last_order_ns, options::get().fence_us * 1000) {
            return false;
        }
        self.last_order_ns = clock::pace_ns();
        self.poll();
        if tag <= self.completed() {
            return true;
        }
        self.fence_covering(tag).is_some_and(|index| self.gpu_barrier(index))
    }

    /// The pools time windows of seconds (the VMM high-water mark, segments
    /// given back and grown again): the coarse clock is precise enough, and
    /// a VMM free reads it every time.
    fn now_ns(&mut self) -> u64 {
        clock::now_coarse_ns()
    }

    fn synchronize(&mut self) -> bool {
        // Any capture in the process, not only this context's streams (a
        // per-thread default stream, another context): a synchronisation
        // during a global capture invalidates it.
        if streams::any_capture() {
            return false;
        }
        let Some(_current) = InContext::enter(self.ctx) else { return false };
        if self.any_capturing() {
            return false;
        }
        let closing = self.next_epoch();
        let t = clock::monotonic_ns();
        // SAFETY: the driver's `cuCtxSynchronize` takes no arguments; the pool's context is current
        // (`_current`).
        let synced = unsafe { real!(cuCtxSynchronize()) } == SUCCESS;
        self.counters.wait_ns += clock::monotonic_ns() - t;
        if !synced {
            return false;
        }
        self.finish_wait(closing, 0);
        true
    }
}

impl CudaBackend {
    /// The first half of a synchronisation made with the pool's lock let go
    /// (`registry::wait_unlocked`): closes the epoch and returns it, or
    /// `None` during a capture, which a synchronisation would break.
    pub fn begin_wait(&mut self) -> Option<u64> {
        if streams::any_capture() || self.any_capturing() {
            return None;
        }
        Some(self.next_epoch())
    }

    /// The second half, once [`drain`] has waited `wait_ns` for the GPU:
    /// every tag up to `closing` is finished. Fences recorded since the
    /// first half (by other threads, while the lock was free) may not be.
    pub fn finish_wait(&mut self, closing: u64, wait_ns: u64) {
        self.counters.wait_ns += wait_ns;
        self.counters.syncs += 1;
        self.complete_up_to(closing);
        self.finished = self.finished.max(closing);
        while self.fences.front().is_some_and(|&(epoch, _)| epoch <= closing) {
            self.drop_oldest_fence();
        }
    }
}

/// Waits, with no lock of cupool's held, for the work queued in `ctx` (not
/// during a capture, which a synchronisation would break): the pool's own
/// synchronisation under its lock then finds the GPU done, and a thread
/// that queued work waiting on another thread never waits on that lock.
/// True when it waited.
pub fn drain(ctx: u64) -> bool {
    if streams::any_capture() {
        return false;
    }
    let Some(_current) = InContext::enter(ctx) else { return false };
    // SAFETY: the driver's `cuCtxSynchronize` takes no arguments; `ctx` is current (`_current`).
    unsafe { real!(cuCtxSynchronize()) == SUCCESS }
}

/// Makes a context current for as long as it lives (when it is not already)
/// and then restores the caller's.
pub(super) struct InContext(bool);

impl InContext {
    /// `None` when `ctx` cannot be made current (it died).
    pub(super) fn enter(ctx: u64) -> Option<InContext> {
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: the driver's `cuCtxGetCurrent` writes only into `current`, a live local.
        if unsafe { real!(cuCtxGetCurrent(&mut current)) } == SUCCESS && current as u64 == ctx {
            return Some(InContext(false));
        }
        // Lazily: an InContext made and dropped for a failed push would pop
        // the caller's context.
        // SAFETY: the driver's `cuCtxPushCurrent_v2` takes the context handle by value and checks it; a
        // pushed context is popped by `Drop`.
        (unsafe { real!(cuCtxPushCurrent_v2(ctx as CUcontext)) } == SUCCESS).then(|| InContext(true))
    }
}

impl Drop for InContext {
    fn drop(&mut self) {
        if self.0 {
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: only an `InContext` that pushed a context pops one, and the driver's
            // `cuCtxPopCurrent_v2` writes only into `popped`, a live local.
            unsafe { real!(cuCtxPopCurrent_v2(&mut popped)) };
        }
    }
}

// Events and streams are kept as integers (`Send`, comparable) and turned
// back into CUDA handles at the call.

fn create_event() -> Option<u64> {
    const DISABLE_TIMING: u32 = cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    let mut e: CUevent = std::ptr::null_mut();
    // SAFETY: the driver's `cuEventCreate` writes only into `e`, a live local.
    (unsafe { real!(cuEventCreate(&mut e, DISABLE_TIMING)) } == SUCCESS).then_some(e as u64)
}

fn record(event: u64, stream: u64) -> bool {
    // SAFETY: the driver's `cuEventRecord` takes both handles by value: an event this backend created
    // (`create_event`; cupool never destroys its events) and a stream of the context's list, the legacy
    // stream (0), or one about to be destroyed (`retire_stream` runs before the real destroy). Streams
    // destroyed through cupool's hooks leave the list first.
    unsafe { real!(cuEventRecord(event as CUevent, stream as CUstream)) == SUCCESS }
}

/// Makes `stream` wait, on the GPU, for `event`.
pub fn wait(stream: u64, event: u64) -> bool {
    // SAFETY: the driver's `cuStreamWaitEvent` takes both handles by value: an event this backend created
    // (never destroyed) and a stream of the context's list, the legacy stream (0) or one just created.
    unsafe { real!(cuStreamWaitEvent(stream as CUstream, event as CUevent, 0)) == SUCCESS }
}

/// Has `event` completed? Asked without the pool's lock too
/// (`Progress::poll_unlocked`).
pub fn query(event: u64) -> bool {
    // SAFETY: the driver's `cuEventQuery` on an event this backend created (`create_event`, never destroyed);
    // it takes it by value.
    unsafe { real!(cuEventQuery(event as CUevent)) == SUCCESS }
}

/// The driver's capture status of `stream`; None when it does not answer,
/// as for a stream destroyed behind cupool's back.
fn capture_status(stream: u64) -> Option<i32> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE as i32;
    // SAFETY: the driver's `cuStreamIsCapturing` writes only into `status`, a live local; the stream is taken
    // by value and an unknown one is answered with an error.
    let r = unsafe { real!(cuStreamIsCapturing(stream as CUstream, &mut status)) };
    (r == SUCCESS).then_some(status)
}

/// Does `stream` still exist?
fn is_live(stream: u64) -> bool {
    capture_status(stream).is_some()
}

/// Only an active or invalidated capture counts; an error (a stream that
/// died behind cupool's back) does not block fencing the others.
fn capturing(stream: u64) -> bool {
    capture_status(stream).is_some_and(|s| s != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE as i32)
}
