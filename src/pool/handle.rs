//! A context's pool (`ContextPool`, made and found by `registry`) and the
//! handle by which allocations, magazines and IPC exports keep it: the
//! pool's address, turned back into the pool here alone.

use super::engine::Engine;
use super::progress::Progress;
use crate::runtime::bias::BiasedMutex;
use std::num::NonZeroUsize;

/// One context's pool.
pub struct ContextPool {
    pub ctx: u64,
    /// The context's unique id (`cuCtxGetId`): the handle outlives a reset.
    pub id: u64,
    pub device: i32,
    /// Biased: a program that allocates from one thread takes it with no
    /// atomic operation (`runtime::bias`).
    pub pool: BiasedMutex<Engine>,
    /// Requests of at least this many bytes go to CUDA as they are
    /// (`direct_min`; pages only: a segment pool takes them in one call).
    pub direct_min: u64,
    /// Its fences' progress, read without the lock by threads' magazines.
    pub(super) progress: std::sync::Arc<Progress>,
    /// Times an allocation or a free found the lock taken.
    pub(super) waits: LockWaits,
}

/// Times an allocation or a free (a magazine's refill or give-back
/// included) found a pool's lock taken and waited for it, and the
/// nanoseconds those waits took (the end record's `lock_waits` and
/// `lock_wait_ns`): counted only then, off the uncontended path. On a cache
/// line of their own: every allocation reads the pool's other fields, and
/// a count beside them would turn each wait into a miss for every other
/// thread.
#[repr(align(128))]
#[derive(Default)]
pub struct LockWaits {
    pub(super) count: std::sync::atomic::AtomicU64,
    pub(super) ns: std::sync::atomic::AtomicU64,
}

/// One context's pool, kept by address: `Copy` and `Send` (it travels in
/// the live table, in threads' magazines and to the IPC broker's thread),
/// compared and ordered by identity, never null (an `Option<PoolHandle>` is
/// one word). Made only from a `&'static ContextPool`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub struct PoolHandle(NonZeroUsize);

impl PoolHandle {
    /// The handle of `pool`.
    #[inline(always)]
    pub fn of(pool: &'static ContextPool) -> PoolHandle {
        match NonZeroUsize::new(std::ptr::from_ref(pool).expose_provenance()) {
            Some(addr) => PoolHandle(addr),
            None => unreachable!("a reference is never null"),
        }
    }

    /// The pool the handle was made of.
    #[inline(always)]
    pub fn get(self) -> &'static ContextPool {
        // SAFETY: outside tests a `PoolHandle` is made only by `of`, from a
        // `&'static ContextPool` whose provenance it exposed (tests make
        // handles that are only compared, never passed here: `for_test`).
        // Every pool is made by `registry::pool_of` with `Box::leak` and is
        // never freed or moved: a pool whose context dies moves to the
        // retired list, and a fork child forgets the lists, not the memory.
        // So the address is that of a live, initialised `ContextPool` for the
        // rest of the process, and only shared references to it are ever made
        // (what changes in it sits behind its lock and atomics).
        unsafe { &*std::ptr::with_exposed_provenance::<ContextPool>(self.0.get()) }
    }

    /// A handle to no pool, for tests of code that only compares handles.
    ///
    /// # Safety
    /// The handle must never reach [`PoolHandle::get`].
    #[cfg(test)]
    pub unsafe fn for_test(id: NonZeroUsize) -> PoolHandle {
        PoolHandle(id)
    }
}
