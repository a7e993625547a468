//! Observers of what the program does with CUDA memory, each one concern in
//! RMM's manner: the live-allocation table (`live`), per-device counters
//! (`counters`), the event timeline (`timeline`) and incidents kept for the
//! end record (`incidents`). The functions here tell each of them, in the
//! order that keeps their books consistent with each other.

mod allocation;
mod books;
pub mod counters;
pub mod incidents;
mod live;
pub mod phases;
pub mod sites;
mod timeline;

pub use allocation::{Allocation, Pooled, Space};
pub use incidents::remark;

use crate::runtime::bias;
use crate::sink::Stamp;
use cupool_core::log::{Api, EventKind, MemKind};
use cupool_core::pool::Fragmentation;

/// A pooled allocation goes into the calling thread's own book (`books`);
/// one that CUDA made, with its counts, into the shared table, in one access
/// to the shared books (a thread-local lookup and two stores while one
/// thread owns them).
#[inline]
pub fn allocated(space: Space, key: u64, a: Allocation) {
    if !(space == Space::Pointer && a.pooled.is_some() && books::insert(key, a)) {
        books::flush_own(); // this thread's calls reach the counters in order
        let books = bias::SHARED_BOOKS.access();
        if let Some(old) = live::insert_in(&books, space, key, a) {
            // CUDA handed out an address we still thought live: an allocation we
            // did not see the end of. Keep the books balanced.
            let c = counters::of(old.kind, old.device);
            c.sub_in(&books, old.size);
            c.reserve_in(&books, -held_from_cuda(&old));
        }
        let c = counters::of(a.kind, a.device);
        c.add_in(&books, a.size);
        c.reserve_in(&books, held_from_cuda(&a));
    }
    timeline::allocated(key, &a);
}

/// Adds every thread's batch of counts: readers of the counters first call this.
pub fn flush_batches() {
    books::flush_all();
}

/// Bytes an allocation holds from CUDA itself: all of it when CUDA made it,
/// nothing when a pool block serves it (the pool's segments are counted as
/// they come and go, `reserved_changed`).
#[inline]
fn held_from_cuda(a: &Allocation) -> i64 {
    if a.pooled.is_some() {
        0
    } else {
        a.size as i64
    }
}

/// A pool of `device` reserved (or gave back) `delta` bytes of segments.
#[inline]
pub fn reserved_changed(device: i32, delta: i64) {
    if delta != 0 {
        counters::of(MemKind::Device, device).reserve(delta);
        timeline::reserved_changed(device, delta);
    }
}

#[inline]
pub fn alloc_failed(api: Api, kind: MemKind, device: i32, bytes: u64, result: i32) {
    counters::of(kind, device).failed();
    timeline::alloc_failed(api, kind, device, bytes, result);
}

/// Takes `key` off the books before the real free: another thread that is
/// handed the same address right after cannot have its record removed by us.
/// The calling thread's own book first, then the shared table, then the
/// other threads' books.
#[inline]
pub fn releasing(space: Space, key: u64) -> Option<Allocation> {
    if space == Space::Pointer {
        if let Some(a) = books::remove_own(key) {
            return Some(a);
        }
    }
    let shared = {
        books::flush_own();
        let books = bias::SHARED_BOOKS.access();
        live::remove_in(&books, space, key).inspect(|a| {
            let c = counters::of(a.kind, a.device);
            c.sub_in(&books, a.size);
            c.reserve_in(&books, -held_from_cuda(a));
        })
    };
    match shared {
        None if space == Space::Pointer => books::remove_elsewhere(key),
        shared => shared,
    }
}

/// The live allocation at `key`, if any.
pub fn live_at(space: Space, key: u64) -> Option<Allocation> {
    match space {
        Space::Pointer => books::get(key).or_else(|| live::get(space, key)),
        Space::VmmHandle => live::get(space, key),
    }
}

/// Every live allocation, for the report at exit; false where a table or a
/// book could not be had in time.
pub fn live_snapshot() -> (Vec<(u64, Allocation)>, bool) {
    let (mut all, shared_complete) = live::snapshot();
    let books_complete = books::snapshot(&mut all);
    (all, shared_complete && books_complete)
}

#[inline]
pub fn freed(api: Api, key: u64, a: &Allocation, at: Option<Stamp>) {
    timeline::freed(api, key, a, at);
}

/// CUDA refused to free `a`: it is still live, and so it is again here.
pub fn free_refused(space: Space, key: u64, a: Allocation) {
    books::flush_all(); // the free may wait in a batch
    let c = counters::of(a.kind, a.device);
    c.unfree(a.size);
    c.reserve(held_from_cuda(&a));
    live::insert_in(&bias::SHARED_BOOKS.access(), space, key, a);
}

pub fn invalid_free(api: Api, ptr: u64, result: i32, at: Option<Stamp>) {
    timeline::invalid_free(api, ptr, result, at);
}

pub fn mapping(kind: EventKind, api: Api, ptr: u64, size: u64, handle: u64) {
    timeline::mapping(kind, api, ptr, size, handle);
}

/// A context (or a device's primary context) died, with whatever it still
/// held: those allocations leaked. `device` -1: take it from what died.
pub fn context_died(at: Api, device: i32, mut dies: impl FnMut(&Allocation) -> bool) {
    books::flush_all(); // their allocations' counts, before the counts of their end
    let mut died = live::take_where(&mut dies);
    books::take_where(&mut dies, &mut died);
    for (_, a) in &died {
        let c = counters::of(a.kind, a.device);
        c.forget(a.size);
        c.reserve(-held_from_cuda(a));
    }
    if died.is_empty() {
        return; // a context that died clean is no news
    }
    let device = if device >= 0 { device } else { died[0].1.device };
    timeline::checkpoint(at, device, died.iter().map(|(_, a)| a.size).sum(), died.len());
    incidents::checkpoint(at, &died);
}

/// The pool could not serve `bytes` even after releasing its cache.
pub fn out_of_memory(api: Api, device: i32, bytes: u64, snapshot: impl FnOnce() -> (Fragmentation, Vec<u64>, u64)) {
    timeline::out_of_memory(api, device, bytes);
    incidents::out_of_memory(device, bytes, snapshot);
}

pub fn lock_for_fork() {
    sites::lock_for_fork();
    live::lock_all();
    incidents::lock_for_fork();
    phases::lock_for_fork();
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    phases::unlock_after_fork(in_child);
    incidents::unlock_after_fork(in_child);
    live::unlock_all();
    sites::unlock_after_fork(in_child);
    if in_child {
        // A forked child owns none of its parent's allocations.
        live::clear();
        books::forget_in_child();
        counters::clear();
        // One thread is left: it may own the books again.
        crate::runtime::bias::SHARED_BOOKS.reset_in_child();
    }
}
