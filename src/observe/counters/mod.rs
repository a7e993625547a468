//! Per-device counters (and one set for pinned host memory): calls, bytes
//! and allocations now and at peak, and the bytes held from CUDA (reserved:
//! the pools' segments plus allocations CUDA made directly). Lock-free.
//!
//! Pooled allocations and frees reach them in batches, from the book of the
//! thread that made the call (`observe::books`, [`Batch`]): threads that
//! allocate at once would otherwise meet on these cache lines at every call,
//! which costs them more than the rest of the call. Readers add every
//! book's batch first (`observe::flush_batches`).

mod batch;

use crate::runtime::bias::{self, Access};
pub use batch::Batch;
use cupool_core::log::MemKind;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

#[derive(Default)]
pub struct Counters {
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    pub failures: AtomicU64,
    pub current_bytes: AtomicU64,
    pub peak_bytes: AtomicU64,
    pub current_count: AtomicU64,
    pub peak_count: AtomicU64,
    pub reserved_bytes: AtomicU64,
    pub peak_reserved_bytes: AtomicU64,
}

impl Counters {
    /// Counts an allocation of `bytes`, in the caller's access to the books
    /// (`runtime::bias`): one access serves the live table and the counters.
    #[inline]
    pub fn add_in(&'static self, books: &Access, bytes: u64) {
        if let Access::Owned(_) = books {
            bump(&self.allocs, 1);
            let now = bump(&self.current_bytes, bytes);
            raise_owned_peak(&self.peak_bytes, now);
            let n = bump(&self.current_count, 1);
            raise_owned_peak(&self.peak_count, n);
            return;
        }
        self.allocs.fetch_add(1, Ordering::Relaxed);
        self.hold(bytes);
    }

    /// Counts a free of `bytes`, as [`Counters::add_in`] an allocation.
    #[inline]
    pub fn sub_in(&'static self, books: &Access, bytes: u64) {
        if let Access::Owned(_) = books {
            bump(&self.frees, 1);
            bump(&self.current_bytes, bytes.wrapping_neg());
            bump(&self.current_count, u64::MAX);
            return;
        }
        self.frees.fetch_add(1, Ordering::Relaxed);
        self.let_go(bytes);
    }

    /// Memory that is gone without the program freeing it (its context died).
    pub fn forget(&self, bytes: u64) {
        let _section = bias::SHARED_BOOKS.access();
        self.let_go(bytes);
    }

    /// Takes back a `sub` whose free CUDA refused: the allocation is still
    /// live. The caller adds the batches first: the `sub` may wait in one,
    /// and the bytes would count twice meanwhile (and a peak would keep them).
    pub fn unfree(&self, bytes: u64) {
        let _section = bias::SHARED_BOOKS.access();
        self.frees.fetch_sub(1, Ordering::Relaxed);
        self.hold(bytes);
    }

    /// The bytes held from CUDA changed by `delta`.
    #[inline]
    pub fn reserve(&self, delta: i64) {
        if delta != 0 {
            self.reserve_in(&bias::SHARED_BOOKS.access(), delta);
        }
    }

    /// [`Counters::reserve`] in the caller's access to the books.
    #[inline]
    pub fn reserve_in(&self, _books: &Access, delta: i64) {
        if delta > 0 {
            let now = self.reserved_bytes.fetch_add(delta as u64, Ordering::Relaxed) + delta as u64;
            raise_peak(&self.peak_reserved_bytes, now);
        } else if delta < 0 {
            self.reserved_bytes.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }

    /// Peaks start again from what is held now (the caller adds the batches first).
    pub fn reset_peaks(&self) {
        let _section = bias::SHARED_BOOKS.access();
        self.peak_bytes.store(self.current_bytes.load(Ordering::Relaxed), Ordering::Relaxed);
        self.peak_count.store(self.current_count.load(Ordering::Relaxed), Ordering::Relaxed);
        self.peak_reserved_bytes.store(self.reserved_bytes.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    pub fn failed(&self) {
        let _section = bias::SHARED_BOOKS.access();
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    fn hold(&self, bytes: u64) {
        let now = self.current_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        raise_peak(&self.peak_bytes, now);
        let n = self.current_count.fetch_add(1, Ordering::Relaxed) + 1;
        raise_peak(&self.peak_count, n);
    }

    /// `hold`'s undoing: one allocation of `bytes` is no longer held.
    #[inline]
    fn let_go(&self, bytes: u64) {
        self.current_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.current_count.fetch_sub(1, Ordering::Relaxed);
    }

    fn clear(&self) {
        let _section = bias::SHARED_BOOKS.access();
        for c in [
            &self.allocs,
            &self.frees,
            &self.failures,
            &self.current_bytes,
            &self.peak_bytes,
            &self.current_count,
            &self.peak_count,
            &self.reserved_bytes,
            &self.peak_reserved_bytes,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// Adds `delta` (wrapping: a two's complement subtracts) with a plain load
/// and store, returning the new value: only for the owner of the books
/// (`runtime::bias`), which no other thread writes meanwhile.
#[inline]
fn bump(a: &AtomicU64, delta: u64) -> u64 {
    let now = a.load(Ordering::Relaxed).wrapping_add(delta);
    a.store(now, Ordering::Relaxed);
    now
}

#[inline]
fn raise_owned_peak(peak: &AtomicU64, now: u64) {
    if (now as i64) > 0 && now > peak.load(Ordering::Relaxed) {
        peak.store(now, Ordering::Relaxed);
    }
}

/// A peak rarely moves once a program runs steadily: a plain load first spares
/// the hot path a read-modify-write (a contended cache line) per allocation.
/// A figure below zero (as `i64`: a batch of frees added before the batch of
/// the allocations they free) is no peak.
#[inline]
fn raise_peak(peak: &AtomicU64, now: u64) {
    if (now as i64) > 0 && now > peak.load(Ordering::Relaxed) {
        peak.fetch_max(now, Ordering::Relaxed);
    }
}

pub const MAX_DEVICES: usize = 64;
static DEVICES: LazyLock<[Counters; MAX_DEVICES + 1]> = LazyLock::new(|| std::array::from_fn(|_| Counters::default()));
static HOST: LazyLock<Counters> = LazyLock::new(Counters::default);

/// The counters for an allocation of `kind` on `device`; the last slot collects unknown devices.
#[inline]
pub fn of(kind: MemKind, device: i32) -> &'static Counters {
    if !kind.is_device() {
        return &HOST;
    }
    &DEVICES[usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES).unwrap_or(MAX_DEVICES)]
}

/// Bytes held from CUDA on `device`: pool segments plus direct allocations.
pub fn reserved_bytes(device: i32) -> u64 {
    of(MemKind::Device, device).reserved_bytes.load(Ordering::Relaxed)
}

/// As [`devices`], the caller adds the batches first.
pub fn host() -> &'static Counters {
    &HOST
}

/// (device ordinal or -1, counters) for every device that saw any activity:
/// readers add every book's batch first (`observe::flush_batches`).
pub fn devices() -> impl Iterator<Item = (i32, &'static Counters)> {
    DEVICES
        .iter()
        .enumerate()
        .filter(|(_, c)| c.allocs.load(Ordering::Relaxed) + c.failures.load(Ordering::Relaxed) > 0)
        .map(|(i, c)| (if i == MAX_DEVICES { -1 } else { i as i32 }, c))
}

/// A forked child starts from zero.
pub fn clear() {
    for c in DEVICES.iter().chain(std::iter::once(&*HOST)) {
        c.clear();
    }
}
