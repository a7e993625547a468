//! Every live allocation, keyed by pointer, and per-device counters.
//!
//! Sharded by pointer so that threads allocating at once rarely meet on a
//! lock, and no lock is ever held across a CUDA call.

use cupool_core::log::{Api, MemKind};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

/// What is known of one live allocation.
#[derive(Clone, Copy, Debug)]
pub struct Live {
    pub size: u64,
    pub t_ns: u64,
    /// The CUDA context current when it was made: context destruction frees it.
    pub ctx: u64,
    pub device: i32,
    pub kind: MemKind,
    pub api: Api,
    pub tid: u32,
    pub stream: u64,
    /// The pool block serving it, or `NO_BLOCK` when CUDA allocated it directly.
    pub block: u32,
    /// The `ContextPool` that owns `block` (pools live for the whole process).
    pub pool: usize,
}

pub const NO_BLOCK: u32 = u32::MAX;

/// Device pointers and pinned host pointers share one address space (UVA);
/// VMM handles are opaque numbers and get a table of their own.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Space {
    Pointer,
    VmmHandle,
}

impl Space {
    /// Where allocations of `kind` are keyed.
    pub const fn of(kind: MemKind) -> Space {
        if matches!(kind, MemKind::Vmm) {
            Space::VmmHandle
        } else {
            Space::Pointer
        }
    }
}

#[derive(Default)]
pub struct PtrHasher(u64);
impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys")
    }
    fn write_u64(&mut self, k: u64) {
        // Allocations are 256-byte aligned or more: fold the high bits in.
        self.0 = (k ^ (k >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}
type Table = HashMap<u64, Live, BuildHasherDefault<PtrHasher>>;

const SHARDS: usize = 64;
static POINTERS: LazyLock<[Mutex<Table>; SHARDS]> =
    LazyLock::new(|| std::array::from_fn(|_| Mutex::new(Table::with_capacity_and_hasher(256, Default::default()))));
static HANDLES: LazyLock<Mutex<Table>> = LazyLock::new(|| Mutex::new(Table::default()));

fn table(space: Space, key: u64) -> &'static Mutex<Table> {
    match space {
        Space::Pointer => &POINTERS[((key >> 9) as usize ^ (key >> 21) as usize) % SHARDS],
        Space::VmmHandle => &HANDLES,
    }
}

/// Counters of one device (or of pinned host memory).
#[derive(Default)]
pub struct Counters {
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    pub failures: AtomicU64,
    pub current_bytes: AtomicU64,
    pub peak_bytes: AtomicU64,
    pub current_count: AtomicU64,
    pub peak_count: AtomicU64,
}

impl Counters {
    fn add(&self, bytes: u64) {
        self.allocs.fetch_add(1, Ordering::Relaxed);
        let now = self.current_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak_bytes.fetch_max(now, Ordering::Relaxed);
        let n = self.current_count.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_count.fetch_max(n, Ordering::Relaxed);
    }
    fn sub(&self, bytes: u64) {
        self.frees.fetch_add(1, Ordering::Relaxed);
        self.current_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.current_count.fetch_sub(1, Ordering::Relaxed);
    }
    /// Memory that is gone without the program freeing it (its context died).
    fn forget(&self, bytes: u64) {
        self.current_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.current_count.fetch_sub(1, Ordering::Relaxed);
    }
    fn clear(&self) {
        for c in [
            &self.allocs,
            &self.frees,
            &self.failures,
            &self.current_bytes,
            &self.peak_bytes,
            &self.current_count,
            &self.peak_count,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

pub const MAX_DEVICES: usize = 64;
static DEVICES: LazyLock<[Counters; MAX_DEVICES + 1]> = LazyLock::new(|| std::array::from_fn(|_| Counters::default()));
static HOST: LazyLock<Counters> = LazyLock::new(Counters::default);

/// The counters for an allocation of `kind` on `device`; the last slot collects unknown devices.
pub fn counters(kind: MemKind, device: i32) -> &'static Counters {
    if !kind.is_device() {
        return &HOST;
    }
    &DEVICES[usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES).unwrap_or(MAX_DEVICES)]
}

/// Device-memory bytes live on `device` (pooled or not), for the memory cap.
pub fn device_bytes(device: i32) -> u64 {
    counters(MemKind::Device, device).current_bytes.load(Ordering::Relaxed)
}

pub fn host_counters() -> &'static Counters {
    &HOST
}

/// (device ordinal or -1, counters) for every device that saw any activity.
pub fn device_counters() -> impl Iterator<Item = (i32, &'static Counters)> {
    DEVICES
        .iter()
        .enumerate()
        .filter(|(_, c)| c.allocs.load(Ordering::Relaxed) + c.failures.load(Ordering::Relaxed) > 0)
        .map(|(i, c)| (if i == MAX_DEVICES { -1 } else { i as i32 }, c))
}

pub fn insert(space: Space, key: u64, live: Live) {
    counters(live.kind, live.device).add(live.size);
    if let Some(old) = table(space, key).lock().insert(key, live) {
        // CUDA handed out an address we still thought live: an allocation we
        // did not see the end of. Keep the books balanced.
        counters(old.kind, old.device).sub(old.size);
    }
}

pub fn remove(space: Space, key: u64) -> Option<Live> {
    let live = table(space, key).lock().remove(&key)?;
    counters(live.kind, live.device).sub(live.size);
    Some(live)
}

pub fn failed(kind: MemKind, device: i32) {
    counters(kind, device).failures.fetch_add(1, Ordering::Relaxed);
}

/// Removes and returns every live allocation that `dies` selects (context destruction).
pub fn take_where(mut dies: impl FnMut(&Live) -> bool) -> Vec<(u64, Live)> {
    let mut out = Vec::new();
    for t in POINTERS.iter().chain(std::iter::once(&*HANDLES)) {
        t.lock().retain(|&k, l| {
            if dies(l) {
                out.push((k, *l));
                false
            } else {
                true
            }
        });
    }
    for (_, l) in &out {
        counters(l.kind, l.device).forget(l.size);
    }
    out
}

/// Puts back an allocation whose free CUDA refused: it is still live.
pub fn restore(space: Space, key: u64, live: Live) {
    let c = counters(live.kind, live.device);
    c.frees.fetch_sub(1, Ordering::Relaxed);
    let now = c.current_bytes.fetch_add(live.size, Ordering::Relaxed) + live.size;
    c.peak_bytes.fetch_max(now, Ordering::Relaxed);
    c.current_count.fetch_add(1, Ordering::Relaxed);
    table(space, key).lock().insert(key, live);
}

/// Every live allocation, for the report at exit. Gives up on a shard whose
/// lock cannot be had in time (a thread stopped by a signal may hold it).
pub fn snapshot() -> (Vec<(u64, Live)>, bool) {
    let mut out = Vec::new();
    let mut complete = true;
    for t in POINTERS.iter().chain(std::iter::once(&*HANDLES)) {
        match t.try_lock_for(std::time::Duration::from_millis(200)) {
            Some(g) => out.extend(g.iter().map(|(&k, &l)| (k, l))),
            None => complete = false,
        }
    }
    (out, complete)
}

pub fn lock_all() {
    for t in POINTERS.iter().chain(std::iter::once(&*HANDLES)) {
        std::mem::forget(t.lock());
    }
}

/// # Safety
/// Only after `lock_all`, by the same thread (or its forked child).
pub unsafe fn unlock_all() {
    for t in POINTERS.iter().chain(std::iter::once(&*HANDLES)) {
        t.force_unlock();
    }
}

/// A forked child owns none of its parent's allocations.
pub fn clear() {
    for t in POINTERS.iter().chain(std::iter::once(&*HANDLES)) {
        t.lock().clear();
    }
    for c in DEVICES.iter().chain(std::iter::once(&*HOST)) {
        c.clear();
    }
}
