//! Batches of counter changes, for threads that allocate at once.
//!
//! A thread with a magazine adds its small allocations and frees (up to
//! [`MAX_SIZE`] each) to a batch of its own and adds the batch to the shared
//! counters every [`OPS`] calls, or sooner once its net change reaches
//! [`NET_BYTES`], with one read-modify-write per counter instead of one per
//! call. A batch keeps the highest point its own running total reached, so
//! the peak it adds is exact for an order of events in which each batch
//! happens at once, where it is added; that order differs from the order of
//! the calls only by what other threads still hold in their batches: less
//! than [`NET_BYTES`] + [`MAX_SIZE`] (the call that passes `NET_BYTES` adds
//! the batch) and [`OPS`] allocations each. Threads without a magazine, and
//! larger allocations, count at once.
//!
//! Readers (the end record, phases, `cupool_memory_stats`, peak resets, a
//! refused free) add every batch first ([`flush_all`]); a thread that exits
//! adds its own.

use super::Counters;
use crate::runtime::bias::BiasedMutex;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Largest allocation counted in a batch (the magazines' own limit).
const MAX_SIZE: u64 = 64 << 10;
/// Calls a batch holds at most.
const OPS: u32 = 64;
/// Net bytes at which a batch is added at once.
const NET_BYTES: i64 = 64 << 10;

#[derive(Default)]
struct Batch {
    /// The counters the batch is for (one device's): another device's call
    /// adds the batch first.
    counters: Option<&'static Counters>,
    allocs: u64,
    frees: u64,
    bytes: i64,
    count: i64,
    /// Highest points of the running `bytes` and `count` (0 at the start).
    top_bytes: i64,
    top_count: i64,
    ops: u32,
    /// Its thread exited: the batch was added and is dropped at the next flush.
    gone: bool,
}

/// Some thread batches (never reset): the hot path of every other program
/// asks this one load.
static ANY: AtomicBool = AtomicBool::new(false);
static ALL: Mutex<Vec<Arc<ThreadBatchLock>>> = Mutex::new(Vec::new());

/// A thread's batch, which its thread locks without an atomic
/// read-modify-write while no other thread has flushed it (`runtime::bias`):
/// an ordinary lock and unlock would be two of them per call, a seventh of
/// eight threads' pair time under `perf` on the GPU host. A flush from another
/// thread (a phase, the memory statistics) makes it an ordinary lock.
type ThreadBatchLock = BiasedMutex<Batch>;

fn new_batch() -> Arc<ThreadBatchLock> {
    Arc::new(BiasedMutex::new(Batch::default()))
}

struct ThreadBatch(RefCell<Option<Arc<ThreadBatchLock>>>);

impl Drop for ThreadBatch {
    fn drop(&mut self) {
        if let Some(b) = self.0.get_mut().take() {
            let mut b = b.lock();
            b.add_to_counters();
            b.gone = true;
        }
    }
}

thread_local! {
    static MINE: ThreadBatch = const { ThreadBatch(RefCell::new(None)) };
}

/// This thread keeps a magazine: from now on its small allocations and frees
/// are counted in batches.
pub fn batch_on_this_thread() {
    let _ = MINE.try_with(|m| {
        let Ok(mut slot) = m.0.try_borrow_mut() else { return };
        if slot.is_none() {
            let b = new_batch();
            ALL.lock().push(b.clone());
            *slot = Some(b);
            ANY.store(true, Ordering::Release);
        }
    });
}

/// Counts an allocation (`alloc`) or a free of `bytes` in this thread's
/// batch, if it has one; `false`: the caller counts it at once.
#[inline]
pub(super) fn batched(c: &'static Counters, bytes: u64, alloc: bool) -> bool {
    if !ANY.load(Ordering::Relaxed) {
        return false;
    }
    batched_here(c, bytes, alloc)
}

#[inline(never)]
fn batched_here(c: &'static Counters, bytes: u64, alloc: bool) -> bool {
    MINE.try_with(|m| {
        let Ok(slot) = m.0.try_borrow() else { return false };
        let Some(batch) = slot.as_ref() else { return false };
        // Taken only by a flush from another thread, briefly, or by a
        // signal handler that interrupted this thread inside it.
        let Some(mut b) = batch.try_lock() else { return false };
        if bytes > MAX_SIZE {
            b.add_to_counters(); // this thread's calls reach the counters in order
            return false;
        }
        b.count_one(c, bytes as i64, alloc);
        true
    })
    .unwrap_or(false)
}

/// How long a flush waits for a lock: the end record may be written from a
/// fatal signal's handler, on a thread that interrupted another one holding it.
const FLUSH_PATIENCE: Duration = Duration::from_millis(200);

/// Adds every thread's batch to the counters. A batch whose lock cannot be
/// had in time (its thread was stopped inside it) is left out.
pub fn flush_all() {
    if !ANY.load(Ordering::Acquire) {
        return;
    }
    let Some(mut all) = ALL.try_lock_for(FLUSH_PATIENCE) else { return };
    all.retain(|b| match b.try_lock_for(FLUSH_PATIENCE) {
        Some(mut b) => {
            b.add_to_counters();
            !b.gone
        }
        None => true,
    });
}

/// A forked child starts from zero: its parent's batches are not its own
/// (their threads are not in the child, and may have held their locks). The
/// forking thread gets a new, empty batch (owned by nobody yet: the old one's
/// owner was the thread's id in the parent).
pub(super) fn forget_all() {
    let mut all = ALL.lock();
    all.clear();
    let _ = MINE.try_with(|m| {
        if let Ok(mut slot) = m.0.try_borrow_mut() {
            if slot.is_some() {
                let b = new_batch();
                all.push(b.clone());
                *slot = Some(b);
            }
        }
    });
}

pub fn lock_for_fork() {
    std::mem::forget(ALL.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork() {
    ALL.force_unlock();
}

impl Batch {
    #[inline]
    fn count_one(&mut self, c: &'static Counters, bytes: i64, alloc: bool) {
        if !self.counters.is_some_and(|mine| std::ptr::eq(mine, c)) {
            self.add_to_counters();
            self.counters = Some(c);
        }
        if alloc {
            self.allocs += 1;
            self.count += 1;
            self.bytes += bytes;
        } else {
            self.frees += 1;
            self.count -= 1;
            self.bytes -= bytes;
        }
        self.top_bytes = self.top_bytes.max(self.bytes);
        self.top_count = self.top_count.max(self.count);
        self.ops += 1;
        if self.ops >= OPS || self.bytes.abs() >= NET_BYTES {
            self.add_to_counters();
        }
    }

    fn add_to_counters(&mut self) {
        let Some(c) = self.counters else { return };
        if self.ops == 0 {
            return;
        }
        let relaxed = Ordering::Relaxed;
        let _section = crate::runtime::bias::BOOKS.access();
        if self.allocs > 0 {
            c.allocs.fetch_add(self.allocs, relaxed);
        }
        if self.frees > 0 {
            c.frees.fetch_add(self.frees, relaxed);
        }
        // Two's complement: a net decrease wraps the addition around.
        let before = c.current_bytes.fetch_add(self.bytes as u64, relaxed);
        super::raise_peak(&c.peak_bytes, before.wrapping_add(self.top_bytes as u64));
        let before = c.current_count.fetch_add(self.count as u64, relaxed);
        super::raise_peak(&c.peak_count, before.wrapping_add(self.top_count as u64));
        *self = Batch { counters: self.counters, gone: self.gone, ..Batch::default() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn leaked() -> &'static Counters {
        Box::leak(Box::default())
    }

    fn get(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }

    #[test]
    fn a_batch_adds_its_calls_and_its_own_peak() {
        let c = leaked();
        let mut b = Batch::default();
        // 3 allocations of 4 KiB, then 3 frees: nothing reaches the counters
        // until the batch is added, and then its peak does.
        for _ in 0..3 {
            b.count_one(c, 4096, true);
        }
        for _ in 0..3 {
            b.count_one(c, 4096, false);
        }
        assert_eq!(get(&c.allocs), 0);
        b.add_to_counters();
        assert_eq!((get(&c.allocs), get(&c.frees)), (3, 3));
        assert_eq!((get(&c.current_bytes), get(&c.current_count)), (0, 0));
        assert_eq!((get(&c.peak_bytes), get(&c.peak_count)), (3 * 4096, 3));
    }

    #[test]
    fn a_batch_is_added_after_its_calls_or_its_bytes_and_on_another_device() {
        let (c, d) = (leaked(), leaked());
        let mut b = Batch::default();
        for _ in 0..OPS - 1 {
            b.count_one(c, 512, true);
            assert_eq!(get(&c.allocs), 0);
        }
        b.count_one(c, 512, false);
        assert_eq!((get(&c.allocs), get(&c.frees)), (u64::from(OPS) - 1, 1));
        // Net bytes: 16 × 4 KiB reaches NET_BYTES.
        for _ in 0..16 {
            b.count_one(c, 4096, true);
        }
        assert_eq!(get(&c.current_bytes), u64::from(OPS - 2) * 512 + 16 * 4096);
        b.count_one(c, 4096, true);
        b.count_one(d, 4096, true);
        assert_eq!(get(&c.allocs), u64::from(OPS) - 1 + 17, "another device's call adds the batch");
        b.add_to_counters();
        assert_eq!(get(&d.allocs), 1);
    }

    #[test]
    fn frees_added_before_their_allocations_make_no_peak() {
        let c = leaked();
        let (mut frees, mut allocs) = (Batch::default(), Batch::default());
        for _ in 0..4 {
            frees.count_one(c, 4096, false);
            allocs.count_one(c, 4096, true);
        }
        frees.add_to_counters();
        assert_eq!(get(&c.peak_bytes), 0, "below zero is no peak");
        allocs.add_to_counters();
        assert_eq!((get(&c.current_bytes), get(&c.current_count)), (0, 0));
        assert_eq!(get(&c.peak_bytes), 0);
        assert_eq!(get(&c.peak_count), 0);
    }

    fn books() -> crate::runtime::bias::Access<'static> {
        crate::runtime::bias::BOOKS.access()
    }

    #[test]
    fn a_threads_batch_is_added_when_it_exits_and_by_flush_all() {
        let c = leaked();
        std::thread::spawn(move || {
            batch_on_this_thread();
            c.add_in(&books(), 4096);
            assert_eq!(get(&c.allocs), 0, "batched");
            c.add_in(&books(), MAX_SIZE + 1);
            assert_eq!(get(&c.allocs), 2, "a large call adds the batch and counts at once");
            c.sub_in(&books(), 4096);
        })
        .join()
        .unwrap();
        assert_eq!(get(&c.frees), 1, "added at exit");
        let c2 = leaked();
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            batch_on_this_thread();
            c2.add_in(&books(), 4096);
            tx.send(()).unwrap();
            done_rx.recv().unwrap();
        });
        rx.recv().unwrap();
        assert_eq!(get(&c2.allocs), 0);
        flush_all();
        assert_eq!((get(&c2.allocs), get(&c2.current_bytes), get(&c2.peak_bytes)), (1, 4096, 4096));
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }
}
