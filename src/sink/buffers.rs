//! Where events wait to be written: per-thread-sharded buffers (a short
//! lock, no allocation in the steady state, no syscall). The writer thread
//! drains them into the log file.

use crate::runtime::{clock, guard};
use cupool_core::log::Event;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

const SHARDS: usize = 16;
/// Events waiting per shard before new ones are dropped (and counted):
/// bounds memory if the disk cannot keep up.
const MAX_PENDING: usize = 1 << 20;

static BUFFERS: LazyLock<[Mutex<Vec<Event>>; SHARDS]> =
    LazyLock::new(|| std::array::from_fn(|_| Mutex::new(Vec::with_capacity(1024))));
static SEQ: AtomicU64 = AtomicU64::new(1);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// A place in the timeline taken before a call whose outcome is recorded after
/// it: a free is stamped before the memory can be handed out again, so no
/// other thread's allocation of the same address can precede it in `seq`.
#[derive(Clone, Copy)]
pub struct Stamp {
    seq: u64,
    t_ns: u64,
}

#[inline]
pub fn stamp() -> Stamp {
    Stamp { seq: SEQ.fetch_add(1, Ordering::Relaxed), t_ns: clock::now_ns() }
}

/// Stamps `e` (now, or at `at`) with time, sequence number and thread, and queues it.
#[inline]
pub fn push(mut e: Event, at: Option<Stamp>) {
    e.tid = guard::tid();
    let s = at.unwrap_or_else(stamp);
    (e.seq, e.t_ns) = (s.seq, s.t_ns);
    let mut buf = BUFFERS[e.tid as usize % SHARDS].lock();
    if buf.len() >= MAX_PENDING {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    } else {
        buf.push(e);
    }
}

pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Moves every queued event into `batch`, in `seq` order. `patience` bounds
/// the wait for a shard lock: a thread stopped by a fatal signal may hold one forever.
pub fn drain(batch: &mut Vec<Event>, patience: Duration) {
    for shard in BUFFERS.iter() {
        if let Some(mut buf) = shard.try_lock_for(patience) {
            batch.append(&mut buf);
        }
    }
    batch.sort_unstable_by_key(|e| e.seq);
}

pub fn lock_for_fork() {
    for b in BUFFERS.iter() {
        std::mem::forget(b.lock());
    }
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    for b in BUFFERS.iter() {
        b.force_unlock();
    }
    if in_child {
        for b in BUFFERS.iter() {
            b.lock().clear();
        }
        SEQ.store(1, Ordering::Relaxed);
        DROPPED.store(0, Ordering::Relaxed);
    }
}
