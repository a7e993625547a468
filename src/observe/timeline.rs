//! The event timeline: one `Event` per thing that happened, handed to the
//! sink. Events are fixed-size and `Copy`: building one never allocates.

use super::allocation::Allocation;
use super::counters::Counters;
use crate::cuda::OUT_OF_MEMORY;
use crate::sink::{self, Stamp};
use cupool_core::log::{Api, Event, EventKind, MemKind};
use std::sync::atomic::Ordering;

#[inline]
pub fn allocated(ptr: u64, a: &Allocation) {
    if !sink::recorded(EventKind::Alloc) {
        return;
    }
    let mut e = Event::new(EventKind::Alloc, a.api);
    e.mem = a.kind;
    e.device = a.device;
    e.ptr = ptr;
    e.size = a.size;
    e.aux = a.stream;
    e.stack = a.stack;
    e.pooled = a.pooled.is_some();
    sink::record(e);
}

/// A pool of `device` took `delta` bytes from CUDA (segments or pages), or
/// gave `-delta` back.
pub fn reserved_changed(device: i32, delta: i64) {
    let kind = if delta > 0 { EventKind::Reserve } else { EventKind::Release };
    let mut e = Event::new(kind, Api::None);
    e.device = device;
    e.size = delta.unsigned_abs();
    sink::record(e);
}

pub fn alloc_failed(api: Api, kind: MemKind, device: i32, bytes: u64, result: i32) {
    let mut e = Event::new(EventKind::AllocFailed, api);
    e.mem = kind;
    e.device = device;
    e.size = bytes;
    e.result = result;
    sink::record(e);
}

#[inline]
pub fn freed(api: Api, ptr: u64, a: &Allocation, at: Option<Stamp>) {
    if !sink::recorded(EventKind::Free) {
        return;
    }
    let mut e = Event::new(EventKind::Free, api);
    e.mem = a.kind;
    e.device = a.device;
    e.ptr = ptr;
    e.size = a.size;
    sink::record_at(e, at);
}

pub fn invalid_free(api: Api, ptr: u64, result: i32, at: Option<Stamp>) {
    let mut e = Event::new(EventKind::InvalidFree, api);
    e.ptr = ptr;
    e.result = result;
    sink::record_at(e, at);
}

/// A VMM map or unmap: in the timeline, not counted as memory (the physical
/// allocation was counted at `cuMemCreate`).
pub fn mapping(kind: EventKind, api: Api, ptr: u64, size: u64, handle: u64) {
    let mut e = Event::new(kind, api);
    e.mem = MemKind::Vmm;
    e.ptr = ptr;
    e.size = size;
    e.aux = handle;
    sink::record(e);
}

pub fn checkpoint(at: Api, device: i32, bytes: u64, count: usize) {
    let mut e = Event::new(EventKind::Checkpoint, at);
    e.device = device;
    e.size = bytes;
    e.aux = count as u64;
    sink::record(e);
}

pub fn out_of_memory(api: Api, device: i32, bytes: u64) {
    let mut e = Event::new(EventKind::Oom, api);
    e.device = device;
    e.size = bytes;
    e.result = OUT_OF_MEMORY;
    sink::record(e);
}

/// A phase began or ended; `c` holds `device`'s figures now.
pub fn phase(kind: EventKind, api: Api, name: u32, device: i32, c: &Counters) {
    let mut e = Event::new(kind, api);
    e.device = device;
    e.size = c.current_bytes.load(Ordering::Relaxed);
    e.ptr = c.reserved_bytes.load(Ordering::Relaxed);
    e.aux = name as u64;
    sink::record(e);
}
