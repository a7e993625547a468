//! Where events wait to be written. Each recording thread fills a chunk of
//! its own with plain stores and publishes every event by storing the
//! chunk's length; the writer thread reads up to that length. A thread takes
//! the lock only to trade a full chunk for an empty one, once per [`CHUNK`]
//! events: while one thread records, the hot path has no read-modify-write,
//! where a shared buffer's lock would make two per event (with the sequence
//! number's, a fifth of a traced pair's cost on the CPU).

use crate::runtime::bias::{Access, Bias};
use crate::runtime::{clock, guard};
use cupool_core::log::{Api, Event, EventKind};
use parking_lot::Mutex;
use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

/// Events per chunk (64 KiB).
const CHUNK: usize = 1024;
/// Chunks ever made (room for four million events, 256 MiB): when all are
/// in use, new events are dropped and counted, so memory stays bounded when
/// the disk cannot keep up.
const MAX_CHUNKS: usize = 4096;
/// Events a thread drops without asking for a chunk again once none was
/// left: a full queue must not have every thread queue on its lock.
const DROP_RUN: u32 = 256;
/// Chunks in use (written or waiting) from which the writer is woken
/// before its period is up: 16 Ki events, about a millisecond and a half of a
/// program that does nothing but allocate and free.
const NUDGE_CHUNKS: usize = 16;
/// Events of threads that cannot use a chunk: recording from inside their
/// own push, or exiting (`exit` runs the main thread's thread-local
/// destructors before the handlers and static destructors that may still
/// free memory, and record it).
const MAX_OVERFLOW: usize = 1 << 20;

/// The next sequence number, on cache lines of its own: the recording
/// thread reads and writes it for every event, and a neighbour the writer
/// thread writes (a lock) would make that read a miss (a third of a traced
/// pair's added cost on the CPU).
static SEQ: Aligned<AtomicU64> = Aligned(AtomicU64::new(1));
/// Who may count `SEQ` with a plain load and store: the first thread that
/// records (`runtime::bias`). A domain of its own, not the books': a thread
/// that records without allocating (phases) then takes only this bias away.
static SEQ_OWNER: Bias = Bias::new();
static DROPPED: AtomicU64 = AtomicU64::new(0);

#[repr(align(128))]
struct Aligned<T>(T);

/// On cache lines of its own for the same reason: its writer stores `len`
/// for every event, and the heap would put the writer thread's small
/// allocations beside it.
#[repr(align(128))]
struct Chunk {
    /// Events written so far: stored (release) by the chunk's one writer
    /// after each event, reset only by the reader while nobody writes it.
    len: AtomicUsize,
    events: Box<[Slot]>,
}

/// One event, on a cache line of its own: an event across two lines would
/// cost its writer two line transfers from the thread that read it last.
#[repr(C, align(64))]
struct Slot(UnsafeCell<Event>);

// A run of slots is read as a slice of events: an `Event` grown past a
// cache line stops the build here rather than pad every slot to two.
const _: () = assert!(std::mem::size_of::<Slot>() == std::mem::size_of::<Event>());

/// Slots ahead of the one written that a push asks the CPU to fetch for
/// writing: the line a slot sits on was last read by the writer thread, or
/// never touched, and fetching it only when the event is stored would stall
/// the push.
const PREFETCH_AHEAD: usize = 4;

/// Does the CPU have `prefetchw` (CPUID 0x8000_0001, ECX bit 8)? A read
/// prefetch (all a generic x86-64 build emits for a write hint) brings a
/// line the writer thread read as shared, and the store still waits for
/// the writer's copy to be invalidated: with a writer that keeps up, that
/// wait is on every event. Asked when a thread leases a chunk, until known
/// (threads asking at once get the same answer; nothing waits on another).
static PREFETCHW: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const ABSENT: u8 = 1;
const PRESENT: u8 = 2;

fn detect_prefetchw() {
    if PREFETCHW.load(Ordering::Relaxed) != UNKNOWN {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // Leaf 0x8000_0000 says how far the extended leaves go.
    let has = {
        use std::arch::x86_64::__cpuid;
        __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let has = false;
    PREFETCHW.store(if has { PRESENT } else { ABSENT }, Ordering::Relaxed);
}

// SAFETY: a slot is written by the chunk's one writing thread before `len`
// covers it, and read by the drain only below `len` (acquire): no slot is
// read and written at once.
unsafe impl Sync for Chunk {}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// A thread writes it.
    Writing,
    /// Its thread is done with it: free again once read to its end.
    Retired,
    Free,
}

struct Entry {
    chunk: &'static Chunk,
    /// How far the drain has read.
    read: usize,
    state: State,
}

struct Chunks {
    all: Vec<Entry>,
    free: Vec<usize>,
}

static CHUNKS: Mutex<Chunks> = Mutex::new(Chunks { all: Vec::new(), free: Vec::new() });
static OVERFLOW: Mutex<Vec<Event>> = Mutex::new(Vec::new());

/// The chunk this thread writes (and its index); handed back when the
/// thread exits.
struct Lease {
    chunk: Cell<Option<(&'static Chunk, usize)>>,
    /// Inside `push`: a signal handler recording meanwhile must not write
    /// the slot the interrupted push is filling.
    pushing: Cell<bool>,
    /// Events still to drop before asking for a chunk again.
    dropping: Cell<u32>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some((_, i)) = self.chunk.take() {
            CHUNKS.lock().all[i].state = State::Retired;
        }
    }
}

thread_local! {
    static MINE: Lease =
        const { Lease { chunk: Cell::new(None), pushing: Cell::new(false), dropping: Cell::new(0) } };
}

/// A place in the timeline taken before a call whose outcome is recorded after
/// it: a free is stamped before the memory can be handed out again, so no
/// other thread's allocation of the same address can precede it in `seq`.
#[derive(Clone, Copy)]
pub struct Stamp {
    seq: u64,
    /// `clock::ticks`: the writer turns them into nanoseconds.
    ticks: u64,
}

/// While one thread records, it counts the sequence number with a plain
/// load and store (`SEQ_OWNER`).
#[inline]
pub fn stamp() -> Stamp {
    let seq = match SEQ_OWNER.access() {
        Access::Owned(_section) => {
            let seq = SEQ.0.load(Ordering::Relaxed);
            SEQ.0.store(seq + 1, Ordering::Relaxed);
            seq
        }
        // Busy: a signal handler interrupting the owner may share a number
        // with the event being stamped; the log stays readable.
        Access::Shared | Access::Busy => SEQ.0.fetch_add(1, Ordering::Relaxed),
    };
    Stamp { seq, ticks: clock::ticks() }
}

/// Stamps `e` (now, or at `at`) with time, sequence number and thread, and
/// queues it. Its `t_ns` holds ticks until the writer converts them.
#[inline]
pub fn push(mut e: Event, at: Option<Stamp>) {
    e.tid = guard::tid();
    let s = at.unwrap_or_else(stamp);
    (e.seq, e.t_ns) = (s.seq, s.ticks);
    let queued = MINE.try_with(|lease| {
        if lease.pushing.replace(true) {
            return false;
        }
        let chunk = match lease.chunk.get() {
            Some((chunk, _)) if chunk.len.load(Ordering::Relaxed) < CHUNK => Some(chunk),
            None if lease.dropping.get() > 0 => {
                lease.dropping.set(lease.dropping.get() - 1);
                None
            }
            current => {
                let next = refill(current.map(|(_, i)| i));
                lease.chunk.set(next);
                if next.is_none() {
                    lease.dropping.set(DROP_RUN);
                }
                next.map(|(chunk, _)| chunk)
            }
        };
        if let Some(chunk) = chunk {
            let n = chunk.len.load(Ordering::Relaxed);
            // SAFETY: slot `n` is this thread's alone until `len` covers it.
            unsafe { *chunk.events[n].0.get() = e };
            chunk.len.store(n + 1, Ordering::Release);
            if let Some(ahead) = chunk.events.get(n + PREFETCH_AHEAD) {
                prefetch_for_write(ahead.0.get());
            }
        } else {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        lease.pushing.set(false);
        true
    });
    if queued != Ok(true) {
        overflow(e);
    }
}

/// Retires this thread's full chunk (if any) and leases it an empty one;
/// `None` when all the chunks there may be are in use. No allocation and no
/// syscall under the lock: a thread stopped there by a fatal signal must not
/// keep the writer from finishing the log.
#[cold]
fn refill(mut full: Option<usize>) -> Option<(&'static Chunk, usize)> {
    detect_prefetchw();
    let mut made: Option<&'static Chunk> = None;
    loop {
        let mut chunks = CHUNKS.lock();
        // Once: a drain may recycle it as soon as the lock is let go.
        if let Some(i) = full.take() {
            chunks.all[i].state = State::Retired;
        }
        if let Some(chunk) = made.take() {
            // Threads making chunks at once may pass the bound by a few.
            chunks.all.push(Entry { chunk, read: 0, state: State::Free });
            let last = chunks.all.len() - 1;
            chunks.free.push(last);
        }
        let i = match chunks.free.pop() {
            Some(i) => i,
            None if chunks.all.len() < MAX_CHUNKS => {
                drop(chunks);
                let events =
                    (0..CHUNK).map(|_| Slot(UnsafeCell::new(Event::new(EventKind::Start, Api::None)))).collect();
                made = Some(Box::leak(Box::new(Chunk { len: AtomicUsize::new(0), events })));
                continue;
            }
            None => return None,
        };
        let busy = chunks.all.len() - chunks.free.len() >= NUDGE_CHUNKS;
        let entry = &mut chunks.all[i];
        entry.state = State::Writing;
        let leased = (entry.chunk, i);
        drop(chunks);
        if busy {
            super::wake::nudge();
        }
        return Some(leased);
    }
}

#[inline(always)]
fn prefetch_for_write(p: *const Event) {
    #[cfg(target_arch = "x86_64")]
    if PREFETCHW.load(Ordering::Relaxed) == PRESENT {
        // SAFETY: a prefetch is a hint: it reads nothing the program sees,
        // changes no register or flag and cannot fault; the CPU has the
        // instruction (`PREFETCHW`), and `p` points into a live chunk.
        unsafe { std::arch::asm!("prefetchw [{p}]", p = in(reg) p, options(nostack, preserves_flags, readonly)) };
    } else {
        // SAFETY: as above, a read prefetch, which every x86-64 CPU has.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cold]
fn overflow(e: Event) {
    let mut waiting = OVERFLOW.lock();
    if waiting.len() >= MAX_OVERFLOW {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    } else {
        waiting.push(e);
    }
}

pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// `n` queued events that will not be written (the log stopped).
pub fn count_dropped(n: usize) {
    DROPPED.fetch_add(n as u64, Ordering::Relaxed);
}

/// Moves every queued event into `batch`, in `seq` order. `patience` bounds
/// the wait for a lock: a thread stopped by a fatal signal may hold one forever.
///
/// The events are read outside the lock, so that a thread trading its chunk
/// never waits for a large batch: only the drain recycles chunks, and it
/// does so after reading them.
pub fn drain(batch: &mut Vec<Event>, patience: Duration) {
    let mut streams: Vec<Stream> = Vec::new();
    if let Some(mut waiting) = OVERFLOW.try_lock_for(patience) {
        if !waiting.is_empty() {
            let mut events = std::mem::take(&mut *waiting);
            events.sort_unstable_by_key(|e| e.seq);
            streams.push(Stream { runs: vec![Run::Owned { events, from: 0 }], next: 0 });
        }
    }
    let Some(mut chunks) = CHUNKS.try_lock_for(patience) else {
        merge(streams, batch);
        return;
    };
    // Each chunk's unread events are a run in `seq` order, and one thread's
    // runs follow each other: a stream per thread, merged across threads.
    let mut runs: Vec<(u32, u64, &'static Chunk, usize, usize)> = Vec::new();
    for entry in chunks.all.iter_mut() {
        let len = entry.chunk.len.load(Ordering::Acquire);
        if len > entry.read {
            // SAFETY: slots below `len` are written and no longer change.
            let first = unsafe { *entry.chunk.events[entry.read].0.get() };
            runs.push((first.tid, first.seq, entry.chunk, entry.read, len));
            entry.read = len;
        }
    }
    drop(chunks);
    runs.sort_unstable_by_key(|&(tid, seq, ..)| (tid, seq));
    for (k, &(tid, _, chunk, from, to)) in runs.iter().enumerate() {
        let run = Run::Slots { chunk, from, to };
        match streams.last_mut() {
            Some(stream) if k > 0 && runs[k - 1].0 == tid => stream.runs.push(run),
            _ => streams.push(Stream { runs: vec![run], next: 0 }),
        }
    }
    merge(streams, batch);
    // A thread's events are in its chunks in the order it stamped them,
    // unless it recorded one between stamping another and queueing it: then
    // its run is out of order, and the merge's result with it.
    if !batch.is_sorted_by_key(|e| e.seq) {
        batch.sort_by_key(|e| e.seq);
    }
    // Recycled at the next drain if the lock cannot be had in time.
    let Some(mut chunks) = CHUNKS.try_lock_for(patience) else { return };
    let Chunks { all, free } = &mut *chunks;
    for (i, entry) in all.iter_mut().enumerate() {
        if entry.state == State::Retired && entry.read == entry.chunk.len.load(Ordering::Acquire) {
            entry.chunk.len.store(0, Ordering::Relaxed);
            (entry.read, entry.state) = (0, State::Free);
            free.push(i);
        }
    }
}

/// Events in `seq` order: one thread's unread chunk slices, or the overflow.
struct Stream {
    runs: Vec<Run>,
    /// The run being read.
    next: usize,
}

/// Events in `seq` order from `from` on.
enum Run {
    Slots { chunk: &'static Chunk, from: usize, to: usize },
    Owned { events: Vec<Event>, from: usize },
}

impl Run {
    fn rest(&self) -> &[Event] {
        match self {
            // SAFETY: slots below the `len` read under the lock are written
            // and stay so until this drain recycles the chunk; a `Slot` is
            // its event at offset 0 with nothing after it (`repr(C)` and the
            // size assertion beside it), `UnsafeCell` has its content's layout.
            Run::Slots { chunk, from, to } => unsafe {
                std::slice::from_raw_parts(chunk.events[*from..*to].as_ptr().cast::<Event>(), to - from)
            },
            Run::Owned { events, from } => &events[*from..],
        }
    }

    fn skip(&mut self, n: usize) {
        match self {
            Run::Slots { from, .. } | Run::Owned { from, .. } => *from += n,
        }
    }
}

impl Stream {
    /// What is left of the run being read: empty once the stream is done.
    fn rest(&self) -> &[Event] {
        self.runs.get(self.next).map_or(&[], Run::rest)
    }

    /// Moves past `n` events of the current run (all that is left of it, or fewer).
    fn skip(&mut self, n: usize) {
        self.runs[self.next].skip(n);
        if self.rest().is_empty() {
            self.next += 1;
        }
    }
}

/// Appends the streams' events to `batch` in `seq` order: a k-way merge
/// that copies each stream's events in slices, up to the next stream's
/// head (sorting a million interleaved events takes the writer longer than
/// eight threads take to make them).
fn merge(mut streams: Vec<Stream>, batch: &mut Vec<Event>) {
    use std::cmp::Reverse;
    let mut heads: std::collections::BinaryHeap<Reverse<(u64, usize)>> =
        streams.iter().enumerate().filter_map(|(k, s)| Some(Reverse((s.rest().first()?.seq, k)))).collect();
    while let Some(Reverse((_, k))) = heads.pop() {
        let bound = heads.peek().map_or(u64::MAX, |Reverse((seq, _))| *seq);
        let stream = &mut streams[k];
        loop {
            let rest = stream.rest();
            let n = rest.partition_point(|e| e.seq <= bound);
            batch.extend_from_slice(&rest[..n]);
            let next = rest.get(n).map(|e| e.seq);
            stream.skip(n);
            match next {
                Some(seq) => {
                    heads.push(Reverse((seq, k)));
                    break;
                }
                None if stream.rest().is_empty() => break,
                None => {} // the stream's next run
            }
        }
    }
}

pub fn lock_for_fork() {
    std::mem::forget(CHUNKS.lock());
    std::mem::forget(OVERFLOW.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    OVERFLOW.force_unlock();
    CHUNKS.force_unlock();
    if in_child {
        // The parent's events are its own log's; its other threads are gone.
        let _ = MINE.try_with(|lease| {
            lease.chunk.set(None);
            lease.pushing.set(false);
            lease.dropping.set(0);
        });
        let mut chunks = CHUNKS.lock();
        let Chunks { all, free } = &mut *chunks;
        free.clear();
        for (i, entry) in all.iter_mut().enumerate() {
            entry.chunk.len.store(0, Ordering::Relaxed);
            (entry.read, entry.state) = (0, State::Free);
            free.push(i);
        }
        OVERFLOW.lock().clear();
        SEQ.0.store(1, Ordering::Relaxed);
        SEQ_OWNER.reset_in_child();
        DROPPED.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn tagged(thread: u64, i: u64) -> Event {
        let mut e = Event::new(EventKind::Alloc, Api::CudaMalloc);
        e.ptr = thread << 32 | i;
        e
    }

    /// One test: the queue is the process's own, and tests run side by side.
    #[test]
    fn every_event_arrives_once_in_its_threads_order_and_exited_threads_chunks_are_reused() {
        const THREADS: u64 = 4;
        const EACH: u64 = 20 * CHUNK as u64 + 17;
        let producers: Vec<_> = (0..THREADS)
            .map(|t| std::thread::spawn(move || (0..EACH).for_each(|i| push(tagged(t, i), None))))
            .collect();
        let mut seen = Vec::new();
        let mut batch = Vec::new();
        while !producers.iter().all(|p| p.is_finished()) {
            drain(&mut batch, Duration::from_secs(1));
            assert!(batch.windows(2).all(|w| w[0].seq < w[1].seq), "a batch out of seq order");
            seen.append(&mut batch);
        }
        producers.into_iter().for_each(|p| p.join().unwrap());
        drain(&mut batch, Duration::from_secs(1));
        seen.append(&mut batch);

        assert_eq!(dropped(), 0);
        assert_eq!(seen.len() as u64, THREADS * EACH);
        let mut next: HashMap<u64, u64> = HashMap::new();
        for e in &seen {
            let (thread, i) = (e.ptr >> 32, e.ptr & 0xffff_ffff);
            let expected = next.entry(thread).or_default();
            assert_eq!(i, *expected, "thread {thread}: events out of order or lost");
            *expected += 1;
        }
        let mut seqs: Vec<u64> = seen.iter().map(|e| e.seq).collect();
        seqs.sort_unstable();
        seqs.dedup();
        assert_eq!(seqs.len(), seen.len(), "a sequence number given twice");

        // Threads taking turns: every drained run overlaps the other
        // thread's, so the batch is in order only if the runs are merged.
        let turn = std::sync::Arc::new(AtomicUsize::new(0));
        let alternating: Vec<_> = (0..2u64)
            .map(|t| {
                let turn = turn.clone();
                std::thread::spawn(move || {
                    for i in 0..2 * CHUNK as u64 {
                        while turn.load(Ordering::Acquire) % 2 != t as usize {
                            std::thread::yield_now();
                        }
                        push(tagged(100 + t, i), None);
                        turn.fetch_add(1, Ordering::Release);
                    }
                })
            })
            .collect();
        alternating.into_iter().for_each(|p| p.join().unwrap());
        drain(&mut batch, Duration::from_secs(1));
        assert_eq!(batch.len(), 4 * CHUNK);
        assert!(batch.windows(2).all(|w| w[0].seq < w[1].seq), "two threads' runs not merged");
        assert!(batch.windows(2).all(|w| w[0].ptr >> 32 != w[1].ptr >> 32), "the threads did not alternate");
        batch.clear();

        // Threads that come and go hand their chunks back: more threads than
        // chunks may exist, one after another, and none of their events is lost.
        let made = CHUNKS.lock().all.len();
        for t in 0..(MAX_CHUNKS as u64 + 50) {
            std::thread::spawn(move || push(tagged(THREADS + t, 0), None)).join().unwrap();
            drain(&mut batch, Duration::from_secs(1));
            assert_eq!(batch.len(), 1, "thread {t}'s event");
            batch.clear();
        }
        assert!(CHUNKS.lock().all.len() <= made + 1, "chunks of exited threads were not reused");
        assert_eq!(dropped(), 0);
    }
}
