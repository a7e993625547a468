//! The shared live-allocation table: the allocations CUDA made itself (and
//! pooled ones of a thread without a book of its own, `books`), keyed by
//! pointer (or VMM handle).
//!
//! Sharded by pointer so that threads allocating at once rarely meet on a
//! lock, and no lock is ever held across a CUDA call. Each shard has cache
//! lines of its own, so that two threads' calls on shards side by side do
//! not take turns on the same lines.

use super::allocation::{Allocation, Space};
use crate::runtime::bias::{self, Access};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::LazyLock;

#[derive(Default)]
pub struct PtrHasher(u64);
impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys")
    }
    fn write_u64(&mut self, k: u64) {
        // Allocations are 256-byte aligned or more: fold the high bits in.
        self.0 = (k ^ (k >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}
pub type Table = HashMap<u64, Allocation, BuildHasherDefault<PtrHasher>>;

const SHARDS: usize = 1024;

/// Two cache lines: adjacent-line prefetching pairs lines up.
#[repr(align(128))]
struct Shard(Mutex<Table>);

// Tables start empty: most shards of most programs hold a few entries. Made
// on the heap: 128 KiB is too much for the stack of whichever thread comes
// first (a fatal signal's alternate stack may be the first to ask).
static POINTERS: LazyLock<Box<[Shard; SHARDS]>> = LazyLock::new(|| {
    let shards: Box<[Shard]> = (0..SHARDS).map(|_| Shard(Mutex::default())).collect();
    shards.try_into().unwrap_or_else(|_| unreachable!("SHARDS shards"))
});
static HANDLES: LazyLock<Mutex<Table>> = LazyLock::new(|| Mutex::new(Table::default()));

/// The shard of a pointer: by the 64 KiB granule it lies in, hashed. Threads
/// that allocate at once each reuse blocks of their own (thread magazines,
/// handed out in runs of neighbours), so keyed by granule each thread keeps
/// to shards of its own. Keyed by the pointer's low bits, 4 KiB blocks would
/// use only every eighth shard, and every thread's blocks would meet on
/// those: each lock a cache miss, a tenth of the time of eight threads' pairs.
#[inline]
fn shard_of(key: u64) -> usize {
    ((key >> 16).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARDS.trailing_zeros())) as usize
}

#[inline]
fn table(space: Space, key: u64) -> &'static Mutex<Table> {
    match space {
        Space::Pointer => &POINTERS[shard_of(key)].0,
        Space::VmmHandle => &HANDLES,
    }
}

fn all_tables() -> impl Iterator<Item = &'static Mutex<Table>> {
    POINTERS.iter().map(|s| &s.0).chain(std::iter::once(&*HANDLES))
}

/// Runs `f` on the table of `key` in the caller's access to the tables
/// (`runtime::bias`): without its lock while this thread owns them, else
/// under it. None: this thread owns them and interrupted its own use of
/// them (a signal handler).
#[inline(always)]
fn with_table<R>(books: &Access, space: Space, key: u64, f: impl FnOnce(&mut Table) -> R) -> Option<R> {
    let t = table(space, key);
    match books {
        // SAFETY: the owner alone touches the tables while it holds a section.
        Access::Owned(_) => Some(f(unsafe { &mut *t.data_ptr() })),
        Access::Shared => Some(f(&mut t.lock())),
        Access::Busy => None,
    }
}

/// Returns the allocation that was live at `key` already, if any.
#[inline]
pub fn insert_in(books: &Access, space: Space, key: u64, a: Allocation) -> Option<Allocation> {
    with_table(books, space, key, |t| t.insert(key, a)).flatten()
}

#[inline]
pub fn remove_in(books: &Access, space: Space, key: u64) -> Option<Allocation> {
    with_table(books, space, key, |t| t.remove(&key)).flatten()
}

/// The live allocation at `key`, if any.
pub fn get(space: Space, key: u64) -> Option<Allocation> {
    with_table(&bias::SHARED_BOOKS.access(), space, key, |t| t.get(&key).copied()).flatten()
}

/// Removes and returns every live allocation that `dies` selects (context destruction).
pub fn take_where(dies: &mut impl FnMut(&Allocation) -> bool) -> Vec<(u64, Allocation)> {
    let mut out = Vec::new();
    if !bias::SHARED_BOOKS.share() {
        return out; // a signal handler on the owner, inside the tables: leave them be
    }
    for t in all_tables() {
        t.lock().retain(|&k, l| {
            if dies(l) {
                out.push((k, *l));
                false
            } else {
                true
            }
        });
    }
    out
}

/// How long the report at exit waits for a shard, or for the thread that
/// owns the tables to leave them.
const SNAPSHOT_PATIENCE: std::time::Duration = std::time::Duration::from_millis(200);

/// Every live allocation, for the report at exit. Gives up on a shard whose
/// lock cannot be had in time (a thread stopped by a signal may hold it).
pub fn snapshot() -> (Vec<(u64, Allocation)>, bool) {
    let mut out = Vec::new();
    if !bias::SHARED_BOOKS.share_within(SNAPSHOT_PATIENCE) {
        return (out, false);
    }
    let mut complete = true;
    for t in all_tables() {
        match t.try_lock_for(SNAPSHOT_PATIENCE) {
            Some(g) => out.extend(g.iter().map(|(&k, &l)| (k, l))),
            None => complete = false,
        }
    }
    (out, complete)
}

pub fn lock_all() {
    // The owner forking needs only the locks: no other thread is inside a
    // section. Any other thread revokes first, so that the owner leaves.
    if !bias::SHARED_BOOKS.owned_here() {
        bias::SHARED_BOOKS.share();
    }
    for t in all_tables() {
        std::mem::forget(t.lock());
    }
}

/// # Safety
/// Only after `lock_all`, by the same thread (or its forked child).
pub unsafe fn unlock_all() {
    for t in all_tables() {
        t.force_unlock();
    }
}

/// A forked child owns none of its parent's allocations.
pub fn clear() {
    if !bias::SHARED_BOOKS.share() {
        return;
    }
    for t in all_tables() {
        t.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_granule_keeps_to_one_shard_and_granules_spread_over_the_shards() {
        let base = 0x7f00_0000_0000_u64;
        // A thread's run of 4 KiB blocks inside one 64 KiB granule: one shard.
        let first = shard_of(base);
        assert!((0..16).all(|i| shard_of(base + i * 4096) == first));
        // 1024 granules side by side (64 MiB of blocks) over most of the shards:
        // a pointer's low bits no longer pick a few shards for everyone.
        let used: std::collections::HashSet<usize> = (0..1024).map(|g| shard_of(base + (g << 16))).collect();
        assert!(used.len() > SHARDS / 2, "{} shards", used.len());
        assert!(used.iter().all(|&s| s < SHARDS));
    }

    fn allocation(tid: u32) -> Allocation {
        use cupool_core::log::{Api, MemKind};
        let (kind, api) = (MemKind::Device, Api::CudaMalloc);
        Allocation { size: 4096, t_ns: 0, ctx: 1, device: 0, kind, api, tid, stream: 0, pooled: None, stack: 0 }
    }

    /// Threads on shards of their own and on one shard they all take lose
    /// no entry and find none twice.
    #[test]
    fn threads_on_their_own_shards_and_on_a_common_one_keep_every_entry() {
        assert!(bias::SHARED_BOOKS.share());
        let base = 0x5a00_0000_0000_u64; // this test's keys only
        let common = base + (0xff << 32);
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                std::thread::spawn(move || {
                    for round in 0..3000u64 {
                        let own = base + (u64::from(t) << 32) + ((round % 64) << 16);
                        // One granule for all: the same shard.
                        let shared = common + (u64::from(t) << 9) + ((round % 8) << 12);
                        for key in [own, shared] {
                            let books = bias::SHARED_BOOKS.access();
                            assert!(insert_in(&books, Space::Pointer, key, allocation(t)).is_none(), "{key:x}");
                        }
                        for key in [own, shared] {
                            let books = bias::SHARED_BOOKS.access();
                            assert_eq!(remove_in(&books, Space::Pointer, key).map(|a| a.tid), Some(t), "{key:x}");
                        }
                    }
                    let books = bias::SHARED_BOOKS.access();
                    insert_in(&books, Space::Pointer, common + (u64::from(t) << 9), allocation(t));
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (all, complete) = snapshot();
        assert!(complete);
        let mut left: Vec<u64> = all.iter().map(|&(k, _)| k).filter(|k| (base..base + (1 << 40)).contains(k)).collect();
        left.sort_unstable();
        assert_eq!(left, (0..4u64).map(|t| common + (t << 9)).collect::<Vec<_>>());
    }
}
