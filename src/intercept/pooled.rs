//! A device allocation the pool serves: the current context's pool carves a
//! block (or a thread's magazine hands one out), and the observers hear of
//! it as of any allocation.

use super::call::{allocation_record, is_runtime, AllocCall, Outcome};
use super::passthrough::passthrough;
use super::work::{BOUND_THREAD, DRIVER_THREADS};
use super::{context, last_error, limit, retire};
use crate::cuda::{Status, OUT_OF_MEMORY, SUCCESS};
use crate::observe::{self, Pooled, Space};
use crate::runtime::{diag, guard::Guard, options};
use crate::{lifecycle, pool};
use cupool_core::log::MultiStreamBecause;
use cupool_core::options::Mode;
use std::sync::atomic::{AtomicU64, Ordering};

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
        match diag::shielded(|| from_pool(call)) {
            Some(FromPool::Served(ptr)) => {
                write(ptr);
                return SUCCESS;
            }
            Some(FromPool::OutOfMemory) => return last_error::runtime_error(call.api, OUT_OF_MEMORY),
            Some(FromPool::PassThrough) | None => {}
        }
    }
    passthrough(call, real)
}

/// What became of a request offered to the pool.
enum FromPool {
    /// A pooled block at this address serves it.
    Served(u64),
    /// The pool has no room for it: the call fails with CUDA's out-of-memory error.
    OutOfMemory,
    /// The pool cannot be used for it (no context, a memory checker that
    /// cannot see pooled blocks, a large request, a device that refused a
    /// page mapping): the real call answers.
    PassThrough,
}

#[inline]
fn from_pool(call: AllocCall) -> FromPool {
    let bytes = call.request;
    lifecycle::recording();
    let id = match context::current_id() {
        Some(id) => id,
        None if context::start(call) => match context::current_id() {
            Some(id) => id,
            None => return FromPool::PassThrough,
        },
        None => return FromPool::PassThrough,
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
        return FromPool::PassThrough;
    }
    // The handle and device are asked only when a new context is met.
    let (pool, stale) = pool::pool_of(id, context::current);
    if let Some(ctx) = stale {
        retire::context_reborn(ctx, id);
    }
    if bytes >= pool.direct_min {
        // Pages are mapped one by one, tens of microseconds each: a request
        // of a gigabyte costs the pool tens of milliseconds the first time,
        // where `cuMemAlloc` takes well under one (BENCHMARKS.md §12).
        return FromPool::PassThrough;
    }
    let ctx = pool.ctx;
    let cap = |own| limit::cap().map_or(u64::MAX, |cap| limit::pool_cap(cap, pool.device, own));
    match pool::allocate(pool, bytes, cap, &mut observe::reserved_changed) {
        pool::Carved::Block(block) => {
            pool::tools::block_handed_out(block.addr, bytes);
            let pooled =
                Pooled { pool: pool::PoolHandle::of(pool), block: block.id.to_raw(), buffer_id: next_buffer_id() };
            observe::allocated(
                Space::Pointer,
                block.addr,
                allocation_record(call, ctx, pool.device, bytes, Some(pooled)),
            );
            FromPool::Served(block.addr)
        }
        pool::Carved::OutOfMemory => {
            observe::alloc_failed(call.api, call.kind, pool.device, bytes, OUT_OF_MEMORY);
            observe::out_of_memory(call.api, pool.device, bytes, || pool::records::at_oom(pool));
            FromPool::OutOfMemory
        }
        pool::Carved::PoolUnusable => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                observe::remark(
                    "backing=vmm: the driver refused a page mapping: allocations of that context go to CUDA",
                )
            });
            FromPool::PassThrough
        }
    }
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
