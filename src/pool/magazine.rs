//! Thread magazines: small blocks handed out and taken back without the
//! pool's lock, for threads that keep meeting each other on it or whose
//! frees keep waiting for fences.
//!
//! Every pooled allocation and free takes its context's pool lock, so threads
//! allocating at once queue on it and throughput falls as threads are added
//! (BENCHMARKS.md §12). A thread that has found the lock taken often enough
//! starts a magazine: it takes small blocks from the pool a handful at a
//! time, hands them out without the lock, and gives the blocks the program
//! frees back a batch at a time. So does a thread, alone or not, whose small
//! frees of the same few sizes keep waiting for fences (several streams in
//! use): the pool cannot hand such a block back at once, so each of its
//! allocations would place another block, two to three times the cost of a
//! pair on a magazine (BENCHMARKS.md §12). A thread that does neither never
//! starts one: a program whose work goes to one stream, from one thread,
//! runs as it would without magazines.
//!
//! A thread also takes back the blocks it frees itself, without the pool:
//! the pool's own work per block (placement, splitting, merging) under its
//! one lock is what stops threads from scaling once they batch.
//!
//! Stream safety stays the pool's:
//! - a block in a magazine's stock was handed out by the pool (safe from
//!   then on) and used by nobody since;
//! - a block a thread freed waits in its class's queue, tagged with its
//!   pool's epoch at the free, until the pool's fences have completed that
//!   epoch (`progress::Progress`): the rule the pool applies to its own frees,
//!   read without its lock. While all work goes to one stream the tag is 0
//!   and the block is reusable at once, as in the pool;
//! - a freed block that goes back to the pool instead reaches it later than
//!   its free, so the fence it waits for there is recorded later and covers
//!   at least the work the free's own would have.
//!
//! What a magazine changes, and where that is made good (`registry.rs`):
//! - The pool counts blocks in magazines, unused or freed, as allocated.
//!   Pointer queries, IPC exports, `cudaMemGetInfo`, empty-cache and the end
//!   record first give every magazine back ([`settle`]), and so does a
//!   request the pool cannot serve, before it fails.
//! - A freed block's page can go back to the device only once the block
//!   reaches the pool: with its batch ([`FREED`] frees or [`FREED_BYTES`]),
//!   pushed out of its class's queue by newer frees, or at a settle.
//! - Blocks are taken by 512-byte size class: the pool's `requested`
//!   statistic counts the class's size for them.
//!
//! Locks: a magazine's own mutex is taken by its thread and by [`settle`];
//! never while holding a pool's lock, and a pool's lock is never taken
//! while holding it (the caller gives blocks back after this module returns).
//! A settle adds a dropped magazine's counts to `GONE` under the magazine's
//! lock; [`record`] takes `GONE`, then `ALL`, then each magazine, each for a
//! moment at most, so the reverse order cannot deadlock.

use super::handle::PoolHandle;
use super::progress::Progress;
use crate::runtime::bias::BiasedMutex;
use crate::runtime::options;
use cupool_core::log::MagazineRecord;
use cupool_core::options::Magazines;
use cupool_core::pool::{round_size, Block, BlockId};
use parking_lot::Mutex;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Largest request a magazine serves.
pub const MAX_SIZE: u64 = 64 << 10;
/// Contended lock acquisitions after which a thread starts a magazine, and
/// the score of fenced small frees ([`FencedFrees`]) that starts one too.
const CONTENDED_TO_START: u32 = 64;
const FENCED_SCORE_TO_START: u16 = 64;
/// Size classes one magazine holds blocks of.
const CLASSES: usize = 4;
/// Classes asked for but not held that a magazine remembers: one is taken
/// on (a refill, replacing a held class) only when asked for again while
/// remembered. Taking on every class asked for would make a thread whose
/// small sizes vary refill on nearly every allocation, each refill taking up
/// to 16 blocks it would give back unused: random sizes up to 64 KiB from
/// two threads run at 0.3-0.5 M pairs/s that way, against 1.6 M without
/// magazines.
const MISSED: usize = 8;
/// Blocks of one class a magazine takes at a time, and bytes at most.
pub const REFILL: usize = 16;
/// Blocks the first refill of a class takes: a class that turns out cold
/// costs the pool two blocks given back, not sixteen.
const FIRST_REFILL: usize = 2;
const REFILL_BYTES: u64 = 256 << 10;
/// Frees kept before they go back to the pool, and bytes at most.
pub const FREED: usize = 32;
pub const FREED_BYTES: u64 = 256 << 10;
/// Freed blocks of one class waiting to be taken again by their thread, and
/// bytes at most; past either, the oldest goes back to the pool. A thread
/// making a pair every 150 ns frees about 330 blocks between two fences
/// (`fence.rs`, one per half `fence_us` at most, 50 µs by default): with
/// room for fewer (128, say), two threads on two cores take the pool's lock
/// every few dozen pairs to give the overflow back and refill, and run no
/// faster than one.
const WAITING: usize = 512;
const WAITING_BYTES: u64 = 2 << 20;

#[derive(Clone, Copy, Default)]
struct Held {
    block: u32,
    addr: u64,
    size: u64,
}

/// A block its thread freed, with the tag of its free.
#[derive(Clone, Copy, Default)]
struct Waiting {
    block: u32,
    addr: u64,
    tag: u64,
}

struct Class {
    /// Rounded request size (0: none).
    size: u64,
    blocks: [Held; REFILL],
    n: usize,
    /// Freed blocks of this class, oldest first, in a ring from `head`
    /// (`WAITING` long; on the heap, as magazines are made on the stack of
    /// whichever thread contends).
    waiting: Box<[Waiting]>,
    head: usize,
    nwaiting: usize,
    /// Blocks its next refill takes: [`FIRST_REFILL`] when taken on, twice
    /// as many at each refill after, up to what [`REFILL`] and
    /// [`REFILL_BYTES`] allow.
    burst: usize,
}

impl Default for Class {
    fn default() -> Class {
        Class {
            size: 0,
            blocks: [Held::default(); REFILL],
            n: 0,
            waiting: vec![Waiting::default(); WAITING].into_boxed_slice(),
            head: 0,
            nwaiting: 0,
            burst: FIRST_REFILL,
        }
    }
}

impl Class {
    fn oldest(&self) -> Option<&Waiting> {
        (self.nwaiting > 0).then(|| &self.waiting[self.head])
    }

    fn pop_oldest(&mut self) -> Waiting {
        let w = self.waiting[self.head];
        self.head = (self.head + 1) % WAITING;
        self.nwaiting -= 1;
        w
    }

    fn push_waiting(&mut self, w: Waiting) {
        self.waiting[(self.head + self.nwaiting) % WAITING] = w;
        self.nwaiting += 1;
    }

    /// Freed blocks this class keeps at most.
    fn waiting_room(&self) -> usize {
        ((WAITING_BYTES / self.size.max(1)) as usize).clamp(1, WAITING)
    }
}

#[derive(Default)]
struct Magazine {
    /// The pool the classes' blocks came from (`None`: none yet).
    pool: Option<PoolHandle>,
    classes: [Class; CLASSES],
    next_class: usize,
    /// Classes asked for and not held, in a ring (0: an empty slot).
    missed: [u64; MISSED],
    next_missed: usize,
    /// Freed blocks, each with its pool (`Some` below `nfreed`).
    freed: [Option<(PoolHandle, u32)>; FREED],
    nfreed: usize,
    freed_bytes: u64,
    /// The `FORK_EPOCH` its blocks belong to: a fork child forgets them.
    epoch: u64,
    /// Its thread has exited: a settle gives its blocks back and drops it.
    orphaned: bool,
    /// What it did since its counts were last added to [`GONE`].
    counts: MagazineRecord,
}

/// Blocks to give back to their pools, as (pool, block): filled
/// here, freed by the caller under each pool's lock. On the heap (a
/// magazine's whole content is 34 KiB of them), made once per thread:
/// [`spare_returns`].
pub struct Returns {
    blocks: Vec<(PoolHandle, u32)>,
}

/// A magazine's whole content fits.
const RETURNS: usize = FREED + CLASSES * (REFILL + WAITING);

impl Default for Returns {
    fn default() -> Returns {
        Returns { blocks: Vec::with_capacity(RETURNS) }
    }
}

impl Returns {
    fn push(&mut self, pool: PoolHandle, block: u32) {
        self.blocks.push((pool, block));
    }

    pub fn as_slice(&self) -> &[(PoolHandle, u32)] {
        &self.blocks
    }

    pub fn clear(&mut self) {
        self.blocks.clear();
    }
}

thread_local! {
    static SPARE: Cell<Option<Returns>> = const { Cell::new(None) };
}

/// This thread's [`Returns`], empty, put back when dropped: a refill or a
/// batch given back makes no allocation after the thread's first. A nested
/// use (a signal handler) or one during the thread's exit gets a new one.
pub fn spare_returns() -> SpareReturns {
    let r = SPARE.try_with(Cell::take).ok().flatten().unwrap_or_default();
    SpareReturns(Some(r))
}

pub struct SpareReturns(Option<Returns>);

impl std::ops::Deref for SpareReturns {
    type Target = Returns;
    fn deref(&self) -> &Returns {
        self.0.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for SpareReturns {
    fn deref_mut(&mut self) -> &mut Returns {
        self.0.as_mut().expect("held until dropped")
    }
}

impl Drop for SpareReturns {
    fn drop(&mut self) {
        if let Some(mut r) = self.0.take() {
            r.clear();
            let _ = SPARE.try_with(|s| s.set(Some(r)));
        }
    }
}

/// Some thread started a magazine (never reset: a hint for the hot path).
static ANY: AtomicBool = AtomicBool::new(false);
/// Every magazine started, for [`settle`].
static ALL: Mutex<Vec<Arc<BiasedMutex<Magazine>>>> = Mutex::new(Vec::new());
/// Some thread with a magazine exited since the last settle.
static ORPHANS: AtomicBool = AtomicBool::new(false);
/// The magazines of exited threads, also in `ALL`: a settle of orphans
/// takes only these, and never locks a live thread's magazine (whose next
/// call would find it taken and go to the pool).
static ORPHANED: Mutex<Vec<Arc<BiasedMutex<Magazine>>>> = Mutex::new(Vec::new());
/// The counts of magazines a settle dropped (their threads exited).
static GONE: Mutex<Option<MagazineRecord>> = Mutex::new(None);
/// Bumped in a fork child: the pools its parent's magazines point into are
/// not the child's (and their locks may be held by threads that do not exist).
static FORK_EPOCH: AtomicU64 = AtomicU64::new(0);

struct ThreadMagazine {
    contended: Cell<u32>,
    magazine: RefCell<Option<Arc<BiasedMutex<Magazine>>>>,
}

impl Drop for ThreadMagazine {
    fn drop(&mut self) {
        MAGAZINE.with(|m| m.set(std::ptr::null()));
        if let Some(m) = self.magazine.get_mut().take() {
            m.lock().orphaned = true;
            ORPHANED.lock().push(m);
            ORPHANS.store(true, Ordering::Release);
        }
    }
}

thread_local! {
    static THREAD: ThreadMagazine = const { ThreadMagazine { contended: Cell::new(0), magazine: RefCell::new(None) } };
}

crate::runtime::tls::static_tls! {
    /// This thread's magazine, the one `THREAD` holds (null: none), for the
    /// hot path: in static TLS, with no destructor, where reaching `THREAD`
    /// costs a call and a borrow flag on every allocation and free (about a
    /// twentieth of a pair on a magazine). Set once `THREAD` holds it;
    /// cleared before `THREAD` lets it go (thread exit, a fork child).
    MAGAZINE: Cell<*const BiasedMutex<Magazine>>;
}

crate::runtime::tls::static_tls! {
    /// This thread's small frees that waited for fences, asked on each of
    /// them: in static TLS too.
    FENCED: Cell<FencedFrees>;
}

/// A thread's small frees that had to wait for fences: the last size
/// classes (of 512 bytes) it took note of, as many as a magazine holds, a
/// class new to it replacing the oldest; and a score that a class among
/// them raises by one and any other lowers by two. A magazine pays for a
/// thread that frees the same few sizes again; one whose sizes vary lets
/// the pool place them (random sizes up to 64 KiB ran a third slower on a
/// magazine, from one thread on the CPU), and its score stays near zero.
/// Valid all-zero, as static TLS starts (`runtime::tls`); 8 bytes, as the
/// shim's static TLS has little room.
#[derive(Clone, Copy)]
struct FencedFrees {
    classes: [u8; CLASSES],
    score: u16,
    next: u8,
}

/// This thread freed a small block of `size` that must wait for a fence
/// (several streams are in use): the pool cannot hand it back at once, so
/// the thread's next allocation of that size places another block, and the
/// pool reclaims the freed ones as their fences complete. A magazine takes
/// the thread's own frees back once their fence completes, without the pool:
/// a high enough score ([`FencedFrees`]) starts one (`magazines=auto`).
#[inline(never)]
pub fn fenced_small_free(size: u64) {
    if !MAGAZINE.with(Cell::get).is_null() {
        return;
    }
    let class = size.div_ceil(512) as u8; // at most MAX_SIZE: 128
    let often = FENCED.with(|cell| {
        let mut f = cell.get();
        if f.classes.contains(&class) {
            f.score = f.score.saturating_add(1);
        } else {
            f.score = f.score.saturating_sub(2);
            f.classes[f.next as usize % CLASSES] = class;
            f.next = f.next.wrapping_add(1);
        }
        cell.set(f);
        f.score >= FENCED_SCORE_TO_START
    });
    if often && options::get().magazines == Magazines::Auto {
        start();
    }
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
        let counts = MagazineRecord { threads: 1, ..Default::default() };
        let m = Arc::new(BiasedMutex::new(Magazine { epoch, counts, ..Default::default() }));
        ALL.lock().push(m.clone());
        let mine = Arc::as_ptr(&m);
        *slot = Some(m);
        MAGAZINE.with(|m| m.set(mine));
        ANY.store(true, Ordering::Relaxed);
    });
}

/// Has this thread a magazine? The hot path asks first. Until some thread
/// starts one (never, in a program whose threads do not meet on the pool's
/// lock), one load of a global answers; then a pointer of the thread's own,
/// with no destructor, cheaper to reach than `THREAD`.
#[inline]
pub fn active() -> bool {
    ANY.load(Ordering::Relaxed) && !MAGAZINE.with(Cell::get).is_null()
}

/// `magazines=always`: this thread starts one now, if it has none.
#[inline]
pub fn start_if_always() {
    if options::get().magazines == Magazines::Always && MAGAZINE.with(Cell::get).is_null() {
        start();
    }
}

/// Runs `f` on this thread's magazine, if it has one.
#[inline]
fn with_mine<R>(f: impl FnOnce(&mut Magazine) -> R) -> Option<R> {
    let mine = MAGAZINE.with(Cell::get);
    if mine.is_null() {
        return None;
    }
    // SAFETY: `MAGAZINE` points at the magazine this thread's `THREAD` holds an
    // `Arc` of: set after `THREAD` took it, cleared before `THREAD` lets it go
    // (its destructor, a fork child), both on this thread, which is here now.
    let mine = unsafe { &*mine };
    // Taken: a settle is giving it back, or a signal handler interrupted
    // this thread inside it. The pool serves this call.
    let mut m = mine.try_lock()?;
    let epoch = FORK_EPOCH.load(Ordering::Acquire);
    if m.epoch != epoch {
        *m = Magazine { epoch, ..Default::default() };
    }
    Some(f(&mut m))
}

/// A block for `size` bytes from this thread's magazine for `pool`, without
/// the pool's lock: the oldest block of its class that this thread freed,
/// once `progress` says no queued work can touch it any more, else one of
/// the stock. `None`: none held (see [`refill`]).
#[inline]
pub fn take(pool: PoolHandle, size: u64, progress: &Progress) -> Option<Block> {
    if size > MAX_SIZE || !active() {
        return None;
    }
    let class = round_size(size)?;
    with_mine(|m| {
        let c = m.class(pool, class)?;
        if c.oldest().is_some_and(|w| progress.is_complete(w.tag)) {
            let w = c.pop_oldest();
            m.counts.own_frees_reused += 1;
            return Some(Block { id: BlockId::from_raw(w.block), addr: w.addr, size: class });
        }
        if c.n == 0 {
            return None;
        }
        c.n -= 1;
        let h = c.blocks[c.n];
        m.counts.stock_handed_out += 1;
        Some(Block { id: BlockId::from_raw(h.block), addr: h.addr, size: h.size })
    })
    .flatten()
}

/// The tag of the oldest block of `size`'s class this thread freed into its
/// magazine for `pool`: the caller, holding the pool's lock, asks the pool's
/// fences about it before taking new blocks.
pub fn oldest_waiting(pool: PoolHandle, size: u64) -> Option<u64> {
    let class = round_size(size)?;
    with_mine(|m| m.class(pool, class)?.oldest().map(|w| w.tag)).flatten()
}

/// A refill to make for `size` bytes from `pool`: the class size and how
/// many blocks to take. Moves into `returns` what must go back first: the
/// magazine's frees, the blocks of the class it replaces, and every block of
/// another pool. `None`: this thread has no magazine, `size` is not served,
/// or its class is not held and not taken on yet (`Magazine::admits`).
pub fn refill(pool: PoolHandle, size: u64, returns: &mut Returns) -> Option<(u64, usize)> {
    if size > MAX_SIZE {
        return None;
    }
    let class = round_size(size)?;
    with_mine(|m| {
        let held = if m.pool == Some(pool) { m.classes.iter().position(|c| c.size == class) } else { None };
        if held.is_none() && !m.admits(class) {
            return None; // the pool serves it this time
        }
        m.give_back_frees(returns);
        if m.pool != Some(pool) {
            // Another pool: no class is held there yet, and none starts big.
            for slot in 0..CLASSES {
                m.give_back_class(slot, returns);
                (m.classes[slot].size, m.classes[slot].burst) = (0, FIRST_REFILL);
            }
            m.pool = Some(pool);
        }
        let most = (REFILL_BYTES / class).clamp(1, REFILL as u64) as usize;
        let c = match held {
            Some(slot) => {
                let c = &mut m.classes[slot];
                c.burst = (c.burst * 2).min(most);
                c
            }
            None => {
                m.next_class = (m.next_class + 1) % CLASSES;
                let slot = m.next_class;
                m.give_back_class(slot, returns);
                let c = &mut m.classes[slot];
                (c.size, c.burst) = (class, FIRST_REFILL.min(most));
                c
            }
        };
        Some((class, c.burst))
    })
    .flatten()
}

/// Keeps `blocks` (just taken from `pool` for `class`, beside the one the
/// refill hands out at once) for later requests; those it cannot keep (the
/// thread's magazine went meanwhile) go into `unkept`.
pub fn store(pool: PoolHandle, class: u64, blocks: &[Block], unkept: &mut Returns) {
    let kept = with_mine(|m| {
        m.counts.refills += 1;
        m.counts.stock_handed_out += 1; // the refill's first block
        let Some(c) = m.class(pool, class) else { return 0 };
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

/// The program freed `block` at `addr` (`bytes` asked) of `pool`, whose
/// fences make `progress`: kept in this thread's magazine, to be taken again
/// once its class is held and the fences have completed the free's tag,
/// else until its batch goes back. The block holds at least its class's
/// size: the pools round every request up to the same classes.
#[inline]
pub fn keep_freed(pool: PoolHandle, block: BlockId, addr: u64, bytes: u64, progress: &Progress) -> Kept {
    if bytes > MAX_SIZE || !active() {
        return Kept::No;
    }
    let Some(class) = round_size(bytes) else { return Kept::No };
    let tag = progress.tag_now();
    with_mine(|m| {
        if m.nfreed == FREED {
            // Full, and its owner could not empty it (the end record held
            // the magazine): this block goes to the pool as it is.
            return Kept::No;
        }
        let mut to_batch = (pool, block.to_raw(), bytes);
        if let Some(c) = m.class(pool, class) {
            if c.nwaiting < c.waiting_room() {
                c.push_waiting(Waiting { block: block.to_raw(), addr, tag });
                return Kept::Yes;
            }
            let oldest = c.pop_oldest();
            c.push_waiting(Waiting { block: block.to_raw(), addr, tag });
            to_batch = (pool, oldest.block, class);
            m.counts.overflowed += 1;
        }
        let (pool, block, bytes) = to_batch;
        m.freed[m.nfreed] = Some((pool, block));
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
    // `ORPHANED` holds only magazines whose threads exited.
    let magazines: Vec<_> = if only_orphans { ORPHANED.lock().clone() } else { ALL.lock().clone() };
    let epoch = FORK_EPOCH.load(Ordering::Acquire);
    let mut returns = Returns::default();
    // Only magazines emptied here as orphans go: a thread that exits
    // meanwhile orphans one this pass did not take or emptied while its
    // thread still ran, and it must stay for the next settle, which gives
    // its blocks back.
    let mut emptied_orphans = Vec::new();
    for m in magazines {
        {
            let mut magazine = m.lock();
            returns.clear();
            if magazine.epoch == epoch {
                magazine.give_back_frees(&mut returns);
                for slot in 0..CLASSES {
                    magazine.give_back_class(slot, &mut returns);
                }
            }
            if magazine.orphaned {
                // The Arc itself, not its address: a magazine freed by a
                // settle running beside this one may be reborn at the same
                // address as a live thread's new one.
                emptied_orphans.push(m.clone());
                // Taken under its lock: a settle beside this one adds nothing twice.
                *GONE.lock().get_or_insert_with(Default::default) += std::mem::take(&mut magazine.counts);
            }
        }
        give_back(&returns);
    }
    let kept = |m: &Arc<BiasedMutex<Magazine>>| !emptied_orphans.iter().any(|gone| Arc::ptr_eq(gone, m));
    ALL.lock().retain(kept);
    ORPHANED.lock().retain(kept);
}

/// What every magazine of this process did (`end.magazines`); `None` when
/// no thread started one (or the books could not be had in time). Built for
/// the end record, perhaps from a signal handler's request: every lock is
/// waited for a moment at most, and a magazine its thread keeps using (a
/// thread stopped inside it by the signal) is left out. `GONE` is held throughout, so a settle meanwhile
/// cannot move a magazine's counts past this walk: they are counted once,
/// or (a settle holding that magazine) not at all.
pub fn record() -> Option<MagazineRecord> {
    let patience = std::time::Duration::from_millis(50);
    let gone = GONE.try_lock_for(patience)?;
    let mut total = *gone;
    let all = ALL.try_lock_for(patience)?;
    for m in all.iter() {
        if let Some(m) = m.try_lock_for(patience) {
            *total.get_or_insert_with(Default::default) += m.counts;
        }
    }
    total
}

pub fn lock_for_fork() {
    std::mem::forget(ALL.lock());
    std::mem::forget(ORPHANED.lock());
    std::mem::forget(GONE.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    GONE.force_unlock();
    ORPHANED.force_unlock();
    ALL.force_unlock();
    if in_child {
        // The parent's pools are not the child's: forget, never give back.
        FORK_EPOCH.fetch_add(1, Ordering::AcqRel);
        ALL.lock().clear();
        ORPHANED.lock().clear();
        *GONE.lock() = None;
        MAGAZINE.with(|m| m.set(std::ptr::null()));
        let _ = THREAD.try_with(|t| {
            if let Ok(mut m) = t.magazine.try_borrow_mut() {
                *m = None;
            }
            t.contended.set(0);
        });
        FENCED.with(|f| f.set(FencedFrees { classes: [0; CLASSES], score: 0, next: 0 }));
    }
}

impl Magazine {
    /// May `class`, not held, be taken on? Only when it was asked for before
    /// and is still remembered ([`MISSED`]); else it is remembered now.
    fn admits(&mut self, class: u64) -> bool {
        if let Some(slot) = self.missed.iter_mut().find(|c| **c == class) {
            *slot = 0;
            return true;
        }
        self.missed[self.next_missed] = class;
        self.next_missed = (self.next_missed + 1) % MISSED;
        false
    }

    /// The class of `size` bytes this magazine holds for `pool`, if it does.
    #[inline]
    fn class(&mut self, pool: PoolHandle, size: u64) -> Option<&mut Class> {
        if self.pool != Some(pool) {
            return None;
        }
        self.classes.iter_mut().find(|c| c.size == size)
    }

    fn give_back_frees(&mut self, returns: &mut Returns) {
        for &(pool, block) in self.freed[..self.nfreed].iter().flatten() {
            returns.push(pool, block);
        }
        self.nfreed = 0;
        self.freed_bytes = 0;
    }

    fn give_back_class(&mut self, slot: usize, returns: &mut Returns) {
        let c = &mut self.classes[slot];
        // A magazine holds blocks only once it has a pool.
        let Some(pool) = self.pool else {
            debug_assert!(c.n == 0 && c.nwaiting == 0);
            return;
        };
        for h in &c.blocks[..c.n] {
            returns.push(pool, h.block);
        }
        c.n = 0;
        while c.nwaiting > 0 {
            returns.push(pool, c.pop_oldest().block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::streams;
    use super::*;
    use std::num::NonZeroUsize;

    /// Pool number `n`: the magazine only compares pools.
    fn p(n: usize) -> PoolHandle {
        // SAFETY: these handles are only compared and stored, never turned
        // back into pools (nothing here frees a block into a pool).
        unsafe { PoolHandle::for_test(NonZeroUsize::new(n).unwrap()) }
    }

    fn start_here() {
        for _ in 0..CONTENDED_TO_START {
            contended();
        }
    }

    fn block(id: u32, addr: u64, size: u64) -> Block {
        Block { id: BlockId::from_raw(id), addr, size }
    }

    /// A refill that takes the class on: asked for twice ([`MISSED`]).
    fn take_on(pool: PoolHandle, size: u64, r: &mut Returns) -> (u64, usize) {
        refill(pool, size, r).or_else(|| refill(pool, size, r)).expect("taken on when asked again")
    }

    /// Starts a magazine on this thread holding `blocks` blocks of 4 KiB
    /// (ids 0.., addresses 0x1000 × id) of `pool`.
    fn magazine_with(pool: PoolHandle, blocks: u32) {
        start_here();
        let mut r = Returns::default();
        let (class, _) = take_on(pool, 4096, &mut r);
        let blocks: Vec<Block> = (0..blocks).map(|i| block(i, 0x1000 * u64::from(i), 4096)).collect();
        let mut unkept = Returns::default();
        store(pool, class, &blocks, &mut unkept);
        assert!(unkept.as_slice().is_empty());
    }

    /// Frees tagged with `epoch` (several streams in use).
    fn tagging(epoch: u64) -> Progress {
        streams::MULTI_STREAM.store(true, std::sync::atomic::Ordering::Release);
        Progress::at(epoch, 0)
    }

    fn id(b: Block) -> u32 {
        b.id.to_raw()
    }

    #[test]
    fn nothing_is_kept_until_the_thread_has_met_contention() {
        std::thread::spawn(|| {
            let mut r = Returns::default();
            assert_eq!(keep_freed(p(1), BlockId::from_raw(1), 0x1000, 4096, &tagging(0)), Kept::No);
            assert_eq!(refill(p(1), 4096, &mut r), None);
            assert!(take(p(1), 4096, &Progress::completed_up_to(0)).is_none());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn blocks_are_handed_out_by_class_and_other_frees_go_back_in_batches() {
        std::thread::spawn(|| {
            let done = Progress::completed_up_to(0);
            magazine_with(p(7), 16);
            // Another pool's request is not served from pool 7's blocks.
            assert!(take(p(8), 4096, &done).is_none());
            assert!(take(p(7), 3000, &done).is_none(), "3000 B is the 3072 B class");
            let got = take(p(7), 3900, &done).unwrap();
            assert_eq!(got.size, 4096);
            assert!(take(p(7), 8192, &done).is_none(), "another class");
            // Frees of a class the magazine does not hold go back in batches.
            for i in 0..FREED as u32 - 1 {
                assert_eq!(keep_freed(p(7), BlockId::from_raw(100 + i), 0, 8192, &tagging(0)), Kept::Yes);
            }
            assert_eq!(keep_freed(p(7), BlockId::from_raw(999), 0, 8192, &tagging(0)), Kept::BatchFull);
            let mut r = Returns::default();
            take_frees(&mut r);
            assert_eq!(r.as_slice().len(), FREED, "the batch goes back whole");
            assert_eq!(
                keep_freed(p(7), BlockId::from_raw(5), 0, MAX_SIZE + 1, &tagging(0)),
                Kept::No,
                "too large to keep"
            );
            // A refill for another pool gives back every block of this one,
            // and the class starts there as any class does.
            let mut r = Returns::default();
            assert_eq!(take_on(p(8), 4096, &mut r), (4096, FIRST_REFILL));
            assert_eq!(r.as_slice().len(), 15);
            assert!(r.as_slice().iter().all(|&(pool, _)| pool == p(7)));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_class_is_taken_on_when_asked_again_and_its_refills_grow() {
        std::thread::spawn(|| {
            start_here();
            let mut r = Returns::default();
            // Sizes that never come back are left to the pool: no class changes hands.
            for k in 1..=MISSED as u64 {
                assert_eq!(refill(p(5), k * 512, &mut r), None, "{k}");
            }
            assert!(r.as_slice().is_empty());
            // Asked again while remembered: taken on, two blocks first, then twice as many each time.
            assert_eq!(refill(p(5), MISSED as u64 * 512, &mut r), Some((MISSED as u64 * 512, 2)));
            let bursts: Vec<usize> = (0..4).map(|_| refill(p(5), MISSED as u64 * 512, &mut r).unwrap().1).collect();
            assert_eq!(bursts, [4, 8, 16, 16]);
            // A large class takes at most REFILL_BYTES a time.
            assert_eq!(take_on(p(5), 64 << 10, &mut r), (64 << 10, 2));
            assert_eq!(refill(p(5), 64 << 10, &mut r), Some((64 << 10, 4)));
            assert_eq!(refill(p(5), 64 << 10, &mut r), Some((64 << 10, 4)));
            // Forgotten after MISSED other misses: asked once more, it is declined again.
            assert_eq!(refill(p(5), 40 * 512, &mut r), None);
            for k in 0..MISSED as u64 {
                assert_eq!(refill(p(5), (20 + k) * 512, &mut r), None);
            }
            assert_eq!(refill(p(5), 40 * 512, &mut r), None);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_freed_block_is_taken_again_only_once_its_fence_completed() {
        std::thread::spawn(|| {
            magazine_with(p(4), 2);
            let a = take(p(4), 4096, &Progress::completed_up_to(0)).unwrap();
            assert_eq!(keep_freed(p(4), a.id, a.addr, 4000, &tagging(5)), Kept::Yes);
            // Epoch 5 has not completed: the stock serves, then nothing.
            let pending = Progress::completed_up_to(4);
            let b = take(p(4), 4096, &pending).unwrap();
            assert_ne!(id(b), id(a));
            assert!(take(p(4), 4096, &pending).is_none());
            assert_eq!(oldest_waiting(p(4), 4096), Some(5));
            assert_eq!(oldest_waiting(p(4), 8192), None, "a class not held");
            // Completed: the freed block comes back, at its own address.
            let again = take(p(4), 4096, &Progress::completed_up_to(5)).unwrap();
            assert_eq!((id(again), again.addr), (id(a), a.addr));
            assert!(take(p(4), 4096, &Progress::completed_up_to(9)).is_none());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn freed_blocks_come_back_oldest_first_and_the_overflow_goes_to_the_pool() {
        std::thread::spawn(|| {
            magazine_with(p(2), 0);
            let room = (WAITING_BYTES / 4096) as u32;
            assert_eq!(room as usize, WAITING.min(room as usize));
            for i in 0..room {
                assert_eq!(
                    keep_freed(p(2), BlockId::from_raw(i), u64::from(i) << 12, 4096, &tagging(u64::from(i))),
                    Kept::Yes
                );
            }
            // One more: the oldest (block 0) goes to the batch for the pool.
            assert_eq!(keep_freed(p(2), BlockId::from_raw(room), u64::from(room) << 12, 4096, &tagging(99)), Kept::Yes);
            let mut r = Returns::default();
            take_frees(&mut r);
            assert_eq!(r.as_slice(), &[(p(2), 0)]);
            // Completed up to 2: blocks 1 and 2 come back, in that order, and no more.
            let done = Progress::completed_up_to(2);
            assert_eq!(id(take(p(2), 4096, &done).unwrap()), 1);
            assert_eq!(id(take(p(2), 4096, &done).unwrap()), 2);
            assert!(take(p(2), 4096, &done).is_none());
            // Giving the class back returns every block still waiting.
            let mut r = Returns::default();
            take_on(p(3), 4096, &mut r);
            assert_eq!(r.as_slice().len(), room as usize - 2);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_settle_returns_everything_and_drops_the_magazines_of_exited_threads() {
        std::thread::spawn(|| {
            start_here();
            let mut r = Returns::default();
            let (class, _) = take_on(p(3), 512, &mut r);
            let mut unkept = Returns::default();
            store(p(3), class, &[block(1, 0x100, 512), block(2, 0x300, 512)], &mut unkept);
            assert!(unkept.as_slice().is_empty());
            assert_eq!(keep_freed(p(3), BlockId::from_raw(9), 0x900, 512, &tagging(1)), Kept::Yes);
            assert_eq!(keep_freed(p(3), BlockId::from_raw(10), 0xa00, 4096, &tagging(1)), Kept::Yes);
        })
        .join()
        .unwrap();
        assert!(orphans());
        let mut back = Vec::new();
        settle(true, |r| back.extend_from_slice(r.as_slice()));
        for returned in [(p(3), 1), (p(3), 2), (p(3), 9), (p(3), 10)] {
            assert!(back.contains(&returned), "{back:?}");
        }
        // (Whether other tests' threads have exited meanwhile, setting the
        // flag again, is theirs: what this magazine held must not come back.)
        let mut again: Vec<(PoolHandle, u32)> = Vec::new();
        // Only orphans: a full settle would empty the magazines of tests running beside this one.
        settle(true, |r| again.extend(r.as_slice().iter().filter(|&&(pool, _)| pool == p(3))));
        assert!(again.is_empty(), "{again:?}");
    }

    /// A full batch whose owner finds the magazine locked (the end record
    /// reading it) stays full: the next free goes to the pool instead of
    /// past the batch's end.
    #[test]
    fn a_free_into_a_full_batch_that_could_not_be_emptied_goes_to_the_pool() {
        std::thread::spawn(|| {
            start_here();
            for i in 0..FREED as u32 - 1 {
                assert_eq!(keep_freed(p(11), BlockId::from_raw(i), 0, 4096, &tagging(0)), Kept::Yes);
            }
            assert_eq!(keep_freed(p(11), BlockId::from_raw(99), 0, 4096, &tagging(0)), Kept::BatchFull);
            let m = THREAD.with(|t| t.magazine.borrow().clone().unwrap());
            let mut r = Returns::default();
            {
                let _held = m.try_lock_for(std::time::Duration::from_millis(50)).unwrap(); // as `record` does
                take_frees(&mut r);
            }
            assert!(r.as_slice().is_empty(), "the lock was held: nothing taken");
            assert_eq!(keep_freed(p(11), BlockId::from_raw(100), 0, 4096, &tagging(0)), Kept::No);
            take_frees(&mut r);
            assert_eq!(r.as_slice().len(), FREED, "the batch, whole, once the lock is free");
        })
        .join()
        .unwrap();
    }
}
