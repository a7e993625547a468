//! `fork` safety: every cupool lock is taken before the fork and released on
//! both sides, so a child never inherits a lock held by a thread that does not
//! exist in it. The child then forgets the parent's run and, if it uses CUDA
//! itself, writes a log of its own.

pub extern "C" fn prepare() {
    crate::events::lock_all();
    crate::tracker::lock_all();
    crate::report::lock_for_fork();
    crate::pool::lock_all();
}

pub extern "C" fn parent() {
    unsafe {
        crate::pool::unlock_all(false);
        crate::report::unlock_after_fork(false);
        crate::tracker::unlock_all();
        crate::events::unlock_all();
    }
}

pub extern "C" fn child() {
    unsafe {
        crate::pool::unlock_all(true);
        crate::report::unlock_after_fork(true);
        crate::tracker::unlock_all();
        crate::events::unlock_all();
    }
    crate::guard::reset_after_fork();
    crate::events::reset_in_child();
    crate::tracker::clear();
    crate::state::reset_in_child();
}
