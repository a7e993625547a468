//! Figures for cupool's own C API (`hooks::api`): one device's memory now
//! and at peak, the way `torch.cuda.memory_stats` names them.

use crate::observe::{self, counters};
use crate::pool;
use crate::runtime::diag;
use cupool_core::log::MemKind;
use std::sync::atomic::Ordering;

/// `struct cupool_memory_stats`, in bytes and counts.
#[repr(C)]
#[derive(Default)]
pub struct MemoryStats {
    /// Device memory live in allocations the program made (pooled or not).
    pub allocated_bytes: u64,
    pub peak_allocated_bytes: u64,
    /// Device memory held from CUDA: the pools' segments plus allocations
    /// CUDA made directly (what `torch.cuda.memory_reserved` means).
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub allocations: u64,
    pub peak_allocations: u64,
    pub num_allocs: u64,
    pub num_frees: u64,
    pub num_alloc_failures: u64,
}

/// `None` for a device number out of range.
pub fn memory(device: i32) -> Option<MemoryStats> {
    if !(0..counters::MAX_DEVICES as i32).contains(&device) {
        return None;
    }
    observe::flush_batches();
    let c = counters::of(MemKind::Device, device);
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    Some(MemoryStats {
        allocated_bytes: get(&c.current_bytes),
        peak_allocated_bytes: get(&c.peak_bytes),
        reserved_bytes: get(&c.reserved_bytes),
        peak_reserved_bytes: get(&c.peak_reserved_bytes),
        allocations: get(&c.current_count),
        peak_allocations: get(&c.peak_count),
        num_allocs: get(&c.allocs),
        num_frees: get(&c.frees),
        num_alloc_failures: get(&c.failures),
    })
}

pub fn reset_peaks(device: i32) {
    if (0..counters::MAX_DEVICES as i32).contains(&device) {
        observe::flush_batches();
        counters::of(MemKind::Device, device).reset_peaks();
        diag::shielded(|| pool::reset_peaks(device));
    }
}
