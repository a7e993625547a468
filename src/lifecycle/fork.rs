//! `fork` safety: every cupool lock is taken before the fork and released on
//! both sides, so a child never inherits a lock held by a thread that does not
//! exist in it. The child then forgets the parent's run and, if it uses CUDA
//! itself, writes a log of its own.

use crate::runtime::{guard, SESSION};
use crate::{observe, pool, sink};

/// Observers before the sink: a phase edge is written to the sink with the
/// phase lock held, so that is the order every thread takes them in.
pub extern "C" fn prepare() {
    observe::lock_for_fork();
    sink::lock_for_fork();
    pool::lock_for_fork();
    pool::ipc::lock_for_fork();
    pool::tools::lock_for_fork();
}

pub extern "C" fn parent() {
    // SAFETY: `pthread_atfork` runs this in the forking thread after `prepare` took every lock: `unlock`'s
    // contract.
    unsafe { unlock(false) };
}

pub extern "C" fn child() {
    // SAFETY: `pthread_atfork` runs this in the child, whose one thread is the one that ran `prepare`:
    // `unlock`'s contract.
    unsafe { unlock(true) };
    guard::reset_after_fork();
    SESSION.reset();
}

/// Releases in the reverse order of `prepare`.
unsafe fn unlock(in_child: bool) {
    pool::tools::unlock_after_fork(in_child);
    pool::ipc::unlock_after_fork(in_child);
    pool::unlock_after_fork(in_child);
    sink::unlock_after_fork(in_child);
    observe::unlock_after_fork(in_child);
}
