//! Per-thread state: the reentrancy guard and a cached thread id.
//!
//! The guard marks "cupool is already handling a CUDA call on this thread".
//! A runtime hook sets it before calling the real runtime, so the driver
//! calls the runtime makes underneath are passed through unrecorded: one
//! allocation is counted once, at the outermost layer it entered through.

use std::cell::Cell;

/// This thread's guard depth and kernel thread id: read several times on
/// every hooked call, hence in static TLS (`tls.rs`).
struct Slot {
    depth: Cell<u32>,
    tid: Cell<u32>,
}

super::tls::static_tls!(SLOT: Slot;);

/// Holds the guard for its lifetime.
pub struct Guard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Guard {
    /// Enters the guard; returns `None` if this thread is already inside
    /// cupool (the caller must then pass the call straight through).
    #[inline]
    pub fn enter() -> Option<Guard> {
        SLOT.with(|s| {
            let d = &s.depth;
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
        SLOT.with(|s| s.depth.set(s.depth.get() - 1));
    }
}

/// True while this thread is inside a cupool hook.
#[inline]
pub fn inside() -> bool {
    SLOT.with(|s| s.depth.get() > 0)
}

/// The kernel thread id, fetched once per thread (a syscall is too slow for every event).
#[inline]
pub fn tid() -> u32 {
    SLOT.with(|s| {
        let t = &s.tid;
        let mut id = t.get();
        if id == 0 {
            // SAFETY: `gettid` takes no arguments and cannot fail.
            id = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
            t.set(id);
        }
        id
    })
}

/// After `fork` the surviving thread has a new id and is not inside any hook.
pub fn reset_after_fork() {
    SLOT.with(|s| {
        s.tid.set(0);
        s.depth.set(0);
    });
}
