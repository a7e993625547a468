//! Thread magazines: small blocks handed out and taken back without the
//! pool's lock, for threads that keep meeting each other on it.
//!
//! Every pooled allocation and free takes its context's pool lock, so threads
//! allocating at once queue on it and throughput falls as threads are added
//! (BENCHMARKS.md §12). A thread that has found the lock taken often enough
//! starts a magazine: it takes small blocks from the pool a handful at a
//! time, hands them out without the lock, and gives the blocks the program
//! frees back a batch at a time. A thread that never meets another on the
//! lock never starts one, so a single-threaded program runs as before.
//!
//! Stream safety stays the pool's: a block in a magazine was handed out by
//! the pool (safe from then on) and used by nobody since; a freed block
//! reaches the pool later than its free, so the fence it waits for is
//! recorded later and covers at least the work the free's own would have.
//!
//! What a magazine changes, and where that is made good (`registry.rs`):
//! - The pool counts blocks in magazines, unused or freed, as allocated.
//!   Pointer queries, IPC exports, `cudaMemGetInfo`, empty-cache and the end
//!   record first give every magazine back ([`settle`]), and so does a
//!   request the pool cannot serve, before it fails.
//! - A freed block's page can go back to the device only once its batch
//!   reaches the pool (at most [`FREED`] frees or [`FREED_BYTES`] later).
//! - Blocks are taken by 512-byte size class: the pool's `requested`
//!   statistic counts the class's size for them.
//!
//! Locks: a magazine's own mutex is taken by its thread and by [`settle`];
//! never while holding a pool's lock, and a pool's lock is never taken
//! while holding it (the caller gives blocks back after this module returns).

use crate::runtime::options;
use cupool_core::options::Magazines;
use cupool_core::pool::{round_size, Block, BlockId};
use parking_lot::Mutex;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Largest request a magazine serves.
pub const MAX_SIZE: u64 = 64 << 10;
/// Contended lock acquisitions after which a thread starts a magazine.
const CONTENDED_TO_START: u32 = 64;
/// Size classes one magazine holds blocks of.
const CLASSES: usize = 4;
/// Blocks of one class a magazine takes at a time, and bytes at most.
pub const REFILL: usize = 16;
const REFILL_BYTES: u64 = 256 << 10;
/// Frees kept before they go back to the pool, and bytes at most.
pub const FREED: usize = 32;
pub const FREED_BYTES: u64 = 256 << 10;

#[derive(Clone, Copy, Default)]
struct Held {
    block: u32,
    addr: u64,
    size: u64,
}

#[derive(Default)]
struct Class {
    /// Rounded request size (0: none).
    size: u64,
    blocks: [Held; REFILL],
    n: usize,
}

#[derive(Default)]
struct Magazine {
    /// The pool the classes' blocks came from (0: none yet).
    pool: usize,
    classes: [Class; CLASSES],
    next_class: usize,
    /// Freed blocks, each with its pool's address.
    freed: [(usize, u32); FREED],
    nfreed: usize,
    freed_bytes: u64,
    /// The `FORK_EPOCH` its blocks belong to: a fork child forgets them.
    epoch: u64,
    /// Its thread has exited: a settle gives its blocks back and drops it.
    orphaned: bool,
}

/// Blocks to give back to their pools, as (pool address, block): filled
/// here, freed by the caller under each pool's lock.
pub struct Returns {
    pub blocks: [(usize, u32); RETURNS],
    pub n: usize,
}

/// A magazine's whole content fits.
const RETURNS: usize = FREED + CLASSES * REFILL;

impl Default for Returns {
    fn default() -> Returns {
        Returns { blocks: [(0, 0); RETURNS], n: 0 }
    }
}

impl Returns {
    fn push(&mut self, pool: usize, block: u32) {
        self.blocks[self.n] = (pool, block);
        self.n += 1;
    }

    pub fn as_slice(&self) -> &[(usize, u32)] {
        &self.blocks[..self.n]
    }
}

/// Some thread started a magazine (never reset: a hint for the hot path).
static ANY: AtomicBool = AtomicBool::new(false);
/// Every magazine started, for [`settle`].
static ALL: Mutex<Vec<Arc<Mutex<Magazine>>>> = Mutex::new(Vec::new());
/// Some thread with a magazine exited since the last settle.
static ORPHANS: AtomicBool = AtomicBool::new(false);
/// Bumped in a fork child: the pools its parent's magazines point into are
/// not the child's (and their locks may be held by threads that do not exist).
static FORK_EPOCH: AtomicU64 = AtomicU64::new(0);

struct ThreadMagazine {
    contended: Cell<u32>,
    magazine: RefCell<Option<Arc<Mutex<Magazine>>>>,
}

impl Drop for ThreadMagazine {
    fn drop(&mut self) {
        let _ = ACTIVE.try_with(|a| a.set(false));
        if let Some(m) = self.magazine.get_mut().take() {
            m.lock().orphaned = true;
            ORPHANS.store(true, Ordering::Release);
        }
    }
}

thread_local! {
    static THREAD: ThreadMagazine = const { ThreadMagazine { contended: Cell::new(0), magazine: RefCell::new(None) } };
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
}

/// This thread found a pool's lock taken: often enough, that starts its
/// magazine (`magazines=auto`).
pub fn contended() {
    if options::get().magazines != Magazines::Auto {
        return;
    }
    let often = THREAD
        .try_with(|t| {
            let n = t.contended.get().saturating_add(1);
            t.contended.set(n);
            n >= CONTENDED_TO_START
        })
        .unwrap_or(false);
    if often {
        start();
    }
}

#[cold]
fn start() {
    let _ = THREAD.try_with(|t| {
        let Ok(mut slot) = t.magazine.try_borrow_mut() else { return };
        if slot.is_some() {
            return;
        }
        let epoch = FORK_EPOCH.load(Ordering::Acquire);
        let m = Arc::new(Mutex::new(Magazine { epoch, ..Default::default() }));
        ALL.lock().push(m.clone());
        *slot = Some(m);
        let _ = ACTIVE.try_with(|a| a.set(true));
        ANY.store(true, Ordering::Relaxed);
    });
}

/// Has this thread a magazine? The hot path asks first. Until some thread
/// starts one (never, in a program whose threads do not meet on the pool's
/// lock), one load of a global answers; then a flag of the thread's own,
/// with no destructor, cheaper to reach than `THREAD`.
#[inline]
pub fn active() -> bool {
    ANY.load(Ordering::Relaxed) && ACTIVE.try_with(Cell::get).unwrap_or(false)
}

/// `magazines=always`: this thread starts one now, if it has none.
#[inline]
pub fn start_if_always() {
    if options::get().magazines == Magazines::Always && !ACTIVE.try_with(Cell::get).unwrap_or(true) {
        start();
    }
}

/// Runs `f` on this thread's magazine, if it has one.
#[inline]
fn with_mine<R>(f: impl FnOnce(&mut Magazine) -> R) -> Option<R> {
    THREAD
        .try_with(|t| {
            let slot = t.magazine.try_borrow().ok()?;
            // Taken: a settle is giving it back, or a signal handler
            // interrupted this thread inside it. The pool serves this call.
            let mut m = slot.as_ref()?.try_lock()?;
            let epoch = FORK_EPOCH.load(Ordering::Acquire);
            if m.epoch != epoch {
                *m = Magazine { epoch, ..Default::default() };
            }
            Some(f(&mut m))
        })
        .ok()
        .flatten()
}

/// A block for `size` bytes from this thread's magazine for `pool`, without
/// the pool's lock. `None`: none held (see [`refill`]).
#[inline]
pub fn take(pool: usize, size: u64) -> Option<Block> {
    if size > MAX_SIZE || !active() {
        return None;
    }
    let class = round_size(size)?;
    with_mine(|m| {
        if m.pool != pool {
            return None;
        }
        let c = m.classes.iter_mut().find(|c| c.size == class && c.n > 0)?;
        c.n -= 1;
        let h = c.blocks[c.n];
        Some(Block { id: BlockId::from_raw(h.block), addr: h.addr, size: h.size })
    })
    .flatten()
}

/// A refill to make for `size` bytes from `pool`: the class size and how
/// many blocks to take. Moves into `returns` what must go back first: the
/// magazine's frees, the blocks of the class it replaces, and every block of
/// another pool. `None`: this thread has no magazine, or `size` is not served.
pub fn refill(pool: usize, size: u64, returns: &mut Returns) -> Option<(u64, usize)> {
    if size > MAX_SIZE {
        return None;
    }
    let class = round_size(size)?;
    with_mine(|m| {
        m.give_back_frees(returns);
        if m.pool != pool {
            for slot in 0..CLASSES {
                m.give_back_class(slot, returns);
            }
            m.pool = pool;
        }
        if !m.classes.iter().any(|c| c.size == class) {
            m.next_class = (m.next_class + 1) % CLASSES;
            let slot = m.next_class;
            m.give_back_class(slot, returns);
            m.classes[slot].size = class;
        }
        (class, (REFILL_BYTES / class).clamp(1, REFILL as u64) as usize)
    })
}

/// Keeps `blocks` (just taken from `pool` for `class`) for later requests;
/// those it cannot keep (the thread's magazine went meanwhile) go into `unkept`.
pub fn store(pool: usize, class: u64, blocks: &[Block], unkept: &mut Returns) {
    let kept = with_mine(|m| {
        let Some(c) = m.classes.iter_mut().find(|c| c.size == class) else { return 0 };
        if m.pool != pool {
            return 0;
        }
        let room = (REFILL - c.n).min(blocks.len());
        for b in &blocks[..room] {
            c.blocks[c.n] = Held { block: b.id.to_raw(), addr: b.addr, size: b.size };
            c.n += 1;
        }
        room
    })
    .unwrap_or(0);
    for b in &blocks[kept..] {
        unkept.push(pool, b.id.to_raw());
    }
}

/// What became of a freed block.
#[derive(Debug, PartialEq, Eq)]
pub enum Kept {
    /// No magazine here, or too large: the caller frees it now.
    No,
    Yes,
    /// Kept, and the batch is full: the caller gives it back ([`take_frees`]).
    BatchFull,
}

/// The program freed `block` (`bytes` asked) of `pool`: kept in this
/// thread's magazine until its batch goes back.
#[inline]
pub fn keep_freed(pool: usize, block: BlockId, bytes: u64) -> Kept {
    if bytes > MAX_SIZE || !active() {
        return Kept::No;
    }
    with_mine(|m| {
        m.freed[m.nfreed] = (pool, block.to_raw());
        m.nfreed += 1;
        m.freed_bytes += bytes;
        if m.nfreed == FREED || m.freed_bytes >= FREED_BYTES {
            Kept::BatchFull
        } else {
            Kept::Yes
        }
    })
    .unwrap_or(Kept::No)
}

/// Moves this thread's kept frees into `returns`.
pub fn take_frees(returns: &mut Returns) {
    with_mine(|m| m.give_back_frees(returns));
}

/// Does any magazine exist (so that a settle could give something back)?
#[inline]
pub fn any() -> bool {
    !ALL.lock().is_empty()
}

/// Were there threads with magazines that exited since the last settle?
#[inline]
pub fn orphans() -> bool {
    ORPHANS.load(Ordering::Acquire)
}

/// Gives back every block of every magazine (only those of exited threads
/// when `only_orphans`), one magazine at a time: `give_back` frees each
/// batch under its pools' locks. Magazines of exited threads go.
pub fn settle(only_orphans: bool, mut give_back: impl FnMut(&Returns)) {
    if only_orphans {
        ORPHANS.store(false, Ordering::Release);
    }
    let magazines: Vec<_> = ALL.lock().clone();
    let epoch = FORK_EPOCH.load(Ordering::Acquire);
    let mut returns = Returns::default();
    for m in magazines {
        {
            let mut m = m.lock();
            if only_orphans && !m.orphaned {
                continue;
            }
            returns.n = 0;
            if m.epoch == epoch {
                m.give_back_frees(&mut returns);
                for slot in 0..CLASSES {
                    m.give_back_class(slot, &mut returns);
                }
            }
        }
        give_back(&returns);
    }
    ALL.lock().retain(|m| !m.lock().orphaned);
}

pub fn lock_for_fork() {
    std::mem::forget(ALL.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    ALL.force_unlock();
    if in_child {
        // The parent's pools are not the child's: forget, never give back.
        FORK_EPOCH.fetch_add(1, Ordering::AcqRel);
        ALL.lock().clear();
        let _ = THREAD.try_with(|t| {
            if let Ok(mut m) = t.magazine.try_borrow_mut() {
                *m = None;
            }
            t.contended.set(0);
            let _ = ACTIVE.try_with(|a| a.set(false));
        });
    }
}

impl Magazine {
    fn give_back_frees(&mut self, returns: &mut Returns) {
        for &(pool, block) in &self.freed[..self.nfreed] {
            returns.push(pool, block);
        }
        self.nfreed = 0;
        self.freed_bytes = 0;
    }

    fn give_back_class(&mut self, slot: usize, returns: &mut Returns) {
        let pool = self.pool;
        let c = &mut self.classes[slot];
        for h in &c.blocks[..c.n] {
            returns.push(pool, h.block);
        }
        c.n = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start_here() {
        for _ in 0..CONTENDED_TO_START {
            contended();
        }
    }

    fn block(id: u32, addr: u64, size: u64) -> Block {
        Block { id: BlockId::from_raw(id), addr, size }
    }

    #[test]
    fn nothing_is_kept_until_the_thread_has_met_contention() {
        std::thread::spawn(|| {
            let mut r = Returns::default();
            assert_eq!(keep_freed(1, BlockId::from_raw(1), 4096), Kept::No);
            assert_eq!(refill(1, 4096, &mut r), None);
            assert!(take(1, 4096).is_none());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn blocks_are_handed_out_by_class_and_frees_go_back_in_batches() {
        std::thread::spawn(|| {
            start_here();
            let mut r = Returns::default();
            let (class, want) = refill(7, 4000, &mut r).unwrap();
            assert_eq!((class, want, r.n), (4096, 16, 0));
            let blocks: Vec<Block> = (0..want as u32).map(|i| block(i, 0x1000 * u64::from(i), 4096)).collect();
            let mut unkept = Returns::default();
            store(7, class, &blocks, &mut unkept);
            assert_eq!(unkept.n, 0);
            // Another pool's request is not served from pool 7's blocks.
            assert!(take(8, 4096).is_none());
            assert!(take(7, 3000).is_none(), "3000 B is the 3072 B class");
            let got = take(7, 3900).unwrap();
            assert_eq!(got.size, 4096);
            assert!(take(7, 8192).is_none(), "another class");
            for i in 0..FREED as u32 - 1 {
                assert_eq!(keep_freed(7, BlockId::from_raw(100 + i), 4096), Kept::Yes);
            }
            assert_eq!(keep_freed(7, BlockId::from_raw(999), 4096), Kept::BatchFull);
            take_frees(&mut r);
            assert_eq!(r.n, FREED, "the batch goes back whole");
            assert_eq!(keep_freed(7, BlockId::from_raw(5), MAX_SIZE + 1), Kept::No, "too large to keep");
            // A refill for another pool gives back every block of this one.
            let mut r = Returns::default();
            refill(8, 4096, &mut r).unwrap();
            assert_eq!(r.n, want - 1);
            assert!(r.as_slice().iter().all(|&(p, _)| p == 7));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_settle_returns_everything_and_drops_the_magazines_of_exited_threads() {
        std::thread::spawn(|| {
            start_here();
            let mut r = Returns::default();
            let (class, _) = refill(3, 512, &mut r).unwrap();
            let mut unkept = Returns::default();
            store(3, class, &[block(1, 0x100, 512), block(2, 0x300, 512)], &mut unkept);
            assert_eq!(unkept.n, 0);
            assert_eq!(keep_freed(3, BlockId::from_raw(9), 512), Kept::Yes);
        })
        .join()
        .unwrap();
        assert!(orphans());
        let mut back = Vec::new();
        settle(true, |r| back.extend_from_slice(r.as_slice()));
        for returned in [(3, 1), (3, 2), (3, 9)] {
            assert!(back.contains(&returned), "{back:?}");
        }
        assert!(!orphans());
        let mut again: Vec<(usize, u32)> = Vec::new();
        settle(false, |r| again.extend(r.as_slice().iter().filter(|&&(p, _)| p == 3)));
        assert!(again.is_empty(), "{again:?}");
    }
}
