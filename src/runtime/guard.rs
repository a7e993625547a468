//! Per-thread state: the reentrancy guard and a cached thread id.
//!
//! The guard marks "cupool is already handling a CUDA call on this thread".
//! A runtime hook sets it before calling the real runtime, so the driver
//! calls the runtime makes underneath are passed through unrecorded: one
//! allocation is counted once, at the outermost layer it entered through.

use std::cell::Cell;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    static TID: Cell<u32> = const { Cell::new(0) };
}

/// Holds the guard for its lifetime.
pub struct Guard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Guard {
    /// Enters the guard; returns `None` if this thread is already inside
    /// cupool (the caller must then pass the call straight through).
    #[inline]
    pub fn enter() -> Option<Guard> {
        DEPTH.with(|d| {
            let depth = d.get();
            d.set(depth + 1);
            if depth == 0 {
                Some(Guard { _not_send: std::marker::PhantomData })
            } else {
                d.set(depth);
                None
            }
        })
    }
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// True while this thread is inside a cupool hook.
#[inline]
pub fn inside() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// The kernel thread id, fetched once per thread (a syscall is too slow for every event).
#[inline]
pub fn tid() -> u32 {
    TID.with(|t| {
        let mut id = t.get();
        if id == 0 {
            id = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
            t.set(id);
        }
        id
    })
}

/// After `fork` the surviving thread has a new id and is not inside any hook.
pub fn reset_after_fork() {
    TID.with(|t| t.set(0));
    DEPTH.with(|d| d.set(0));
}
