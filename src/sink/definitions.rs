//! Definitions waiting to be written: modules, strings and stacks that
//! events refer to. Queued by the thread that first sees them (rarely: once
//! per distinct stack), written by the writer before the events of its batch.

use cupool_core::log::Definition;
use parking_lot::Mutex;
use std::time::Duration;

static QUEUE: Mutex<Vec<Definition>> = Mutex::new(Vec::new());

pub fn define(d: Definition) {
    QUEUE.lock().push(d);
}

/// Moves every queued definition into `out`, in the order defined.
pub fn drain(out: &mut Vec<Definition>, patience: Duration) {
    if let Some(mut q) = QUEUE.try_lock_for(patience) {
        out.append(&mut q);
    }
}

pub fn lock_for_fork() {
    std::mem::forget(QUEUE.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    QUEUE.force_unlock();
    if in_child {
        // The child's log defines what it refers to itself (the sites table starts over).
        QUEUE.lock().clear();
    }
}
