//! Per-thread books: the pooled allocations each thread made that are still
//! live, and its batch of counter changes (`counters::Batch`).
//!
//! A thread that frees what it allocated touches only its own book, which it
//! owns (`runtime::bias`): no lock, no atomic read-modify-write, no cache line
//! that another thread writes. Every other use takes the book's lock, and
//! with it the bias, from its thread for good (that thread locks its book
//! from then on): a free of another thread's allocation takes the book that
//! holds it, and readers (the end record, phases, `cupool_memory_stats`, a
//! context's death) take every book in turn. A free looks in its own book
//! first; another book is asked only where a filter of the keys it holds
//! says it may hold this one, so a thread that frees what one other thread
//! made shares that one book, and the other threads keep theirs.
//!
//! Books live as long as the process: a thread that exits adds its batch and
//! leaves its book, with whatever it still holds, to the next thread that
//! needs one. A forked child starts with no books.

use super::allocation::Allocation;
use super::counters::{self, Batch};
use super::live::Table;
use crate::runtime::bias::BiasedMutex;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

/// Threads with a book at once, at most; later ones keep their pooled
/// allocations in the shared table.
const MAX_BOOKS: usize = 4096;
/// Counters in a book's filter: 32 KiB a book, one false "may hold" in about
/// 30 for a book holding a thousand allocations.
const FILTER_SLOTS: usize = 1 << 15;

struct Entries {
    held: Held,
    batch: Batch,
}

/// Allocations kept in `recent` before they go to the table.
const RECENT: usize = 4;

/// A book's live allocations: the last few in small arrays, where most
/// frees find them without hashing (a loop tends to free what it allocated
/// last), the others in a table. The recent keys sit apart from their
/// records, so that a search reads one cache line.
struct Held {
    /// Keys of `recent` (0: an empty slot; the books hold pooled blocks,
    /// never at address 0).
    keys: [u64; RECENT],
    recent: [Allocation; RECENT],
    /// The slot of `recent` to move to the table next when it is full.
    next: usize,
    table: Table,
}

impl Default for Held {
    fn default() -> Held {
        Held { keys: [0; RECENT], recent: [Allocation::NONE; RECENT], next: 0, table: Table::default() }
    }
}

/// What an insertion put out of the books.
enum Displaced {
    Nothing,
    /// The allocation at the same key.
    SameKey(Allocation),
    /// An allocation the table still had at the key of the one moved there.
    Stale(u64, Allocation),
}

impl Held {
    /// The recent slot holding `key`, if any.
    #[inline]
    fn recent_slot(&self, key: u64) -> Option<usize> {
        if key == 0 {
            return None;
        }
        self.keys.iter().position(|&k| k == key)
    }

    fn insert(&mut self, key: u64, a: Allocation) -> Displaced {
        if key == 0 {
            return self.table.insert(key, a).map_or(Displaced::Nothing, Displaced::SameKey);
        }
        if let Some(i) = self.recent_slot(key) {
            return Displaced::SameKey(std::mem::replace(&mut self.recent[i], a));
        }
        if let Some(i) = self.keys.iter().position(|&k| k == 0) {
            (self.keys[i], self.recent[i]) = (key, a);
            return Displaced::Nothing;
        }
        let i = self.next;
        self.next = (self.next + 1) % RECENT;
        let moved = self.keys[i];
        let old = std::mem::replace(&mut self.recent[i], a);
        self.keys[i] = key;
        self.table.insert(moved, old).map_or(Displaced::Nothing, |stale| Displaced::Stale(moved, stale))
    }

    #[inline]
    fn remove(&mut self, key: u64) -> Option<Allocation> {
        match self.recent_slot(key) {
            Some(i) => {
                self.keys[i] = 0;
                Some(self.recent[i])
            }
            None => self.table.remove(&key),
        }
    }

    fn get(&self, key: u64) -> Option<Allocation> {
        match self.recent_slot(key) {
            Some(i) => Some(self.recent[i]),
            None => self.table.get(&key).copied(),
        }
    }

    /// The recent ones, then the table's.
    fn iter(&self) -> impl Iterator<Item = (u64, Allocation)> + '_ {
        let recent = self.keys.iter().zip(&self.recent).filter(|(&k, _)| k != 0).map(|(&k, &a)| (k, a));
        recent.chain(self.table.iter().map(|(&k, &a)| (k, a)))
    }

    fn retain(&mut self, mut keep: impl FnMut(u64, &Allocation) -> bool) {
        for (k, a) in self.keys.iter_mut().zip(&self.recent) {
            if *k != 0 && !keep(*k, a) {
                *k = 0;
            }
        }
        self.table.retain(|&k, a| keep(k, a));
    }
}

pub struct Book {
    entries: BiasedMutex<Entries>,
    /// How many keys of the book fall on each slot (sticky at 255): zero
    /// means the book does not hold the key. Written with the book's
    /// entries (by its owner, or under its lock); read by any thread.
    filter: Box<[AtomicU8]>,
    /// The batch holds calls not yet added: readers skip books without any.
    pending: AtomicBool,
    /// A thread uses the book.
    occupied: AtomicBool,
}

static BOOKS: [AtomicPtr<Book>; MAX_BOOKS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_BOOKS];
/// Slots handed out (may pass `MAX_BOOKS`: those got no book).
static SLOTS_TAKEN: AtomicUsize = AtomicUsize::new(0);

crate::runtime::tls::static_tls! {
    /// This thread's book (null: none yet, or the thread is exiting).
    MINE: Cell<*const Book>;
}

/// Hands the book on when its thread exits.
struct Leaving;

impl Drop for Leaving {
    fn drop(&mut self) {
        flush_own();
        if let Some(book) = mine() {
            MINE.with(|m| m.set(std::ptr::null()));
            book.entries.vacate();
            book.occupied.store(false, Ordering::Release);
        }
    }
}

std::thread_local! {
    static LEAVING: Leaving = const { Leaving };
}

impl Book {
    fn new() -> Book {
        Book {
            entries: BiasedMutex::new(Entries { held: Held::default(), batch: Batch::default() }),
            // Built on the heap: a signal handler's small stack may make the first book.
            filter: (0..FILTER_SLOTS).map(|_| AtomicU8::new(0)).collect(),
            pending: AtomicBool::new(false),
            occupied: AtomicBool::new(true),
        }
    }

    #[inline]
    fn slot(&self, key: u64) -> &AtomicU8 {
        let h = (key ^ (key >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.filter[(h >> (64 - FILTER_SLOTS.trailing_zeros())) as usize]
    }

    #[inline]
    fn may_hold(&self, key: u64) -> bool {
        self.slot(key).load(Ordering::Relaxed) != 0
    }

    /// Plain loads and stores: only with the book's entries held.
    #[inline]
    fn note(&self, key: u64) {
        let s = self.slot(key);
        let n = s.load(Ordering::Relaxed);
        if n != u8::MAX {
            s.store(n + 1, Ordering::Relaxed);
        }
    }

    #[inline]
    fn unnote(&self, key: u64) {
        let s = self.slot(key);
        let n = s.load(Ordering::Relaxed);
        if n != u8::MAX {
            s.store(n - 1, Ordering::Relaxed);
        }
    }

    /// Counts one call in the batch.
    #[inline(always)]
    fn count(&self, e: &mut Entries, a: &Allocation, alloc: bool) {
        let c = counters::of(a.kind, a.device);
        if alloc {
            e.batch.count_alloc(c, a.size as i64);
        } else {
            e.batch.count_free(c, a.size as i64);
        }
        if !self.pending.load(Ordering::Relaxed) {
            self.pending.store(true, Ordering::Relaxed);
        }
    }

    /// Removes `key`, counting the free.
    #[inline]
    fn take(&self, e: &mut Entries, key: u64) -> Option<Allocation> {
        let a = e.held.remove(key)?;
        self.unnote(key);
        self.count(e, &a, false);
        Some(a)
    }

    fn add_batch(&self, e: &mut Entries) {
        e.batch.add_to_counters();
        self.pending.store(false, Ordering::Relaxed);
    }
}

/// Every book made so far.
fn all() -> impl Iterator<Item = &'static Book> {
    let n = SLOTS_TAKEN.load(Ordering::Acquire).min(MAX_BOOKS);
    // SAFETY: a non-null slot points at a leaked, never-freed book.
    BOOKS[..n].iter().filter_map(|b| unsafe { b.load(Ordering::Acquire).as_ref() })
}

/// This thread's book, if it has one.
#[inline]
fn mine() -> Option<&'static Book> {
    // SAFETY: a non-null `MINE` points at a leaked, never-freed book.
    unsafe { MINE.with(Cell::get).as_ref() }
}

/// This thread's book, made (or taken over from an exited thread) at its
/// first pooled allocation. None: the thread is exiting, or `MAX_BOOKS`
/// threads hold one.
#[inline]
fn own() -> Option<&'static Book> {
    mine().or_else(take_a_book)
}

#[cold]
fn take_a_book() -> Option<&'static Book> {
    // Registers the exit handler; fails once the thread's exit has begun.
    LEAVING.try_with(|_| ()).ok()?;
    let book =
        match all().find(|b| b.occupied.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok()) {
            Some(left) => left,
            None => {
                let slot = SLOTS_TAKEN.fetch_add(1, Ordering::AcqRel);
                if slot >= MAX_BOOKS {
                    return None;
                }
                let book: &'static Book = Box::leak(Box::new(Book::new()));
                BOOKS[slot].store(std::ptr::from_ref(book).cast_mut(), Ordering::Release);
                book
            }
        };
    MINE.with(|m| m.set(book));
    Some(book)
}

/// Keeps a pooled allocation in this thread's book and counts it. False: it
/// has no book, or owns it and is inside it already (a signal handler that
/// interrupted the thread there): the caller keeps it in the shared table.
/// Once another thread has taken the book's bias, the book is a plain lock,
/// and a handler that allocates while its thread holds it waits on it, as
/// on the shared table's locks.
#[inline]
pub fn insert(key: u64, a: Allocation) -> bool {
    let Some(book) = own() else { return false };
    let Some(mut e) = book.entries.lock_unless_busy() else { return false };
    // An address the pool handed out twice would be a bug of the pool's;
    // the books stay balanced all the same.
    match e.held.insert(key, a) {
        Displaced::Nothing => book.note(key),
        Displaced::SameKey(old) => book.count(&mut e, &old, false),
        Displaced::Stale(k, old) => {
            book.note(key);
            book.unnote(k);
            book.count(&mut e, &old, false);
        }
    }
    book.count(&mut e, &a, true);
    true
}

/// Takes `key` out of this thread's book, counting the free. A thread
/// without a book holds nothing: none is made for it.
#[inline]
pub fn remove_own(key: u64) -> Option<Allocation> {
    let book = mine()?;
    if !book.may_hold(key) {
        return None;
    }
    let mut e = book.entries.lock_unless_busy()?;
    book.take(&mut e, key)
}

/// Takes `key` out of another thread's book (the first that holds it).
pub fn remove_elsewhere(key: u64) -> Option<Allocation> {
    let mine = MINE.with(Cell::get);
    all().filter(|b| !std::ptr::eq(*b, mine) && b.may_hold(key)).find_map(|book| {
        let mut e = book.entries.lock_unless_busy()?;
        book.take(&mut e, key)
    })
}

/// The allocation at `key` in any book.
pub fn get(key: u64) -> Option<Allocation> {
    all().filter(|b| b.may_hold(key)).find_map(|book| book.entries.lock_unless_busy()?.held.get(key))
}

/// Adds this thread's batch, so that a call it counts at once comes after
/// its earlier ones.
#[inline]
pub fn flush_own() {
    if let Some(book) = mine().filter(|b| b.pending.load(Ordering::Relaxed)) {
        if let Some(mut e) = book.entries.lock_unless_busy() {
            book.add_batch(&mut e);
        }
    }
}

/// How long a reader waits for a book: the end record may be written from a
/// fatal signal's handler, on a thread that interrupted another one inside
/// its book.
const PATIENCE: Duration = Duration::from_millis(200);

/// Adds every book's batch to the counters. A book that cannot be had in
/// time (its thread was stopped inside it) is left out.
pub fn flush_all() {
    for book in all().filter(|b| b.pending.load(Ordering::Relaxed)) {
        if let Some(mut e) = book.entries.try_lock_for(PATIENCE) {
            book.add_batch(&mut e);
        }
    }
}

/// Appends every allocation in the books to `out`; false where a book could
/// not be had in time.
pub fn snapshot(out: &mut Vec<(u64, Allocation)>) -> bool {
    let mut complete = true;
    for book in all() {
        match book.entries.try_lock_for(PATIENCE) {
            Some(e) => out.extend(e.held.iter()),
            None => complete = false,
        }
    }
    complete
}

/// Removes every allocation that `dies` selects into `out` (a context's
/// death: counted by the caller, as memory gone without a free).
pub fn take_where(dies: &mut impl FnMut(&Allocation) -> bool, out: &mut Vec<(u64, Allocation)>) {
    for book in all() {
        let Some(mut e) = book.entries.lock_unless_busy() else { continue };
        e.held.retain(|k, a| {
            if dies(a) {
                out.push((k, *a));
                book.unnote(k);
                false
            } else {
                true
            }
        });
    }
}

/// In a forked child: its parent's threads, books and allocations are not
/// its own. The old books are left as they are (a parent's thread may have
/// been inside one), and never freed.
pub fn forget_in_child() {
    for b in &BOOKS {
        b.store(std::ptr::null_mut(), Ordering::Relaxed);
    }
    SLOTS_TAKEN.store(0, Ordering::Release);
    MINE.with(|m| m.set(std::ptr::null()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use cupool_core::log::{Api, MemKind};
    use std::sync::atomic::AtomicU64;
    use std::sync::mpsc;

    /// Counters of a device no other test uses.
    fn allocation(device: i32, size: u64) -> Allocation {
        let (kind, api) = (MemKind::Device, Api::CudaMalloc);
        Allocation { size, t_ns: 0, ctx: 1, device, kind, api, tid: 0, stream: 0, pooled: None, stack: 0 }
    }

    fn get(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }

    fn the_book_of_this_thread() -> &'static Book {
        own().expect("a book")
    }

    /// Four threads free half of what they allocate themselves and hand the
    /// other half to the next thread; each exits keeping two allocations,
    /// which the main thread frees afterwards. Every call is counted once,
    /// none is lost, and nothing is found twice.
    #[test]
    fn own_frees_cross_thread_frees_and_exited_threads_add_up_exactly() {
        let _alone = CROSS_THREAD_FREES.lock().unwrap_or_else(|e| e.into_inner());
        const DEVICE: i32 = 41;
        let base = 0x6100_0000_0000_u64; // this test's keys only
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..4).map(|_| mpsc::channel::<u64>()).unzip();
        let threads: Vec<_> = receivers
            .into_iter()
            .enumerate()
            .map(|(t, rx)| {
                let next = senders[(t + 1) % 4].clone();
                std::thread::spawn(move || {
                    let mut kept = Vec::new();
                    for round in 0..2000u64 {
                        let key = base + ((t as u64) << 32) + (round << 12);
                        assert!(insert(key, allocation(DEVICE, 4096)));
                        if round % 2 == 0 {
                            assert_eq!(remove_own(key).map(|a| a.size), Some(4096));
                        } else if round >= 1998 {
                            kept.push(key);
                        } else {
                            next.send(key).unwrap();
                        }
                        // In another thread's book, or in this one's where this
                        // thread took over the book of a thread that had exited.
                        while let Ok(theirs) = rx.try_recv() {
                            assert!(remove_own(theirs).or_else(|| remove_elsewhere(theirs)).is_some(), "{theirs:x}");
                            assert!(remove_elsewhere(theirs).is_none(), "{theirs:x} found twice");
                        }
                    }
                    (kept, rx)
                })
            })
            .collect();
        drop(senders);
        // Every thread joined before any receiver goes: a thread still running
        // may hand a key on to one that has finished.
        let finished: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let mut kept = Vec::new();
        for (k, rx) in finished {
            kept.extend(k);
            kept.extend(rx.try_iter()); // handed on after its receiver's last look
        }
        flush_all();
        let c = counters::of(MemKind::Device, DEVICE);
        assert_eq!(get(&c.allocs), 8000);
        assert_eq!((get(&c.current_count), get(&c.current_bytes)), (kept.len() as u64, kept.len() as u64 * 4096));
        let mut all = Vec::new();
        assert!(snapshot(&mut all));
        let mut left: Vec<u64> = all.iter().map(|&(k, _)| k).filter(|k| (base..base + (1 << 40)).contains(k)).collect();
        left.sort_unstable();
        kept.sort_unstable();
        assert_eq!(left, kept);
        for &key in &kept {
            assert!(remove_own(key).or_else(|| remove_elsewhere(key)).is_some(), "{key:x}");
            assert!(remove_elsewhere(key).is_none(), "{key:x} found twice");
        }
        flush_all();
        assert_eq!((get(&c.frees), get(&c.current_count), get(&c.current_bytes)), (8000, 0, 0));
    }

    /// The recent slots and the table hold each key once, whichever way
    /// keys come and go, and a key held twice comes out as displaced.
    #[test]
    fn recent_allocations_and_the_table_hold_each_key_once() {
        let mut held = Held::default();
        let keys: Vec<u64> = (1..=7).map(|k| k << 12).collect();
        for &k in &keys {
            assert!(matches!(held.insert(k, allocation(43, k)), Displaced::Nothing));
        }
        assert_eq!(held.table.len(), keys.len() - RECENT, "the oldest moved to the table");
        assert!(matches!(held.insert(keys[6], allocation(43, 1)), Displaced::SameKey(a) if a.size == keys[6]));
        assert_eq!(held.get(keys[0]).map(|a| a.size), Some(keys[0]), "from the table");
        assert_eq!(held.remove(keys[5]).map(|a| a.size), Some(keys[5]), "from the recent slots");
        assert_eq!(held.remove(keys[1]).map(|a| a.size), Some(keys[1]), "from the table");
        assert!(held.remove(keys[1]).is_none());
        held.retain(|k, _| k != keys[0] && k != keys[6]);
        let mut left: Vec<u64> = held.iter().map(|(k, _)| k).collect();
        left.sort_unstable();
        assert_eq!(left, [keys[2], keys[3], keys[4]]);
        // A key the table still holds, inserted again and moved there: the stale one comes out.
        let stale = 5 << 40;
        let mut fresh = Held::default();
        fresh.table.insert(stale, allocation(43, 1));
        for k in [stale, 1 << 40, 2 << 40, 3 << 40] {
            fresh.insert(k, allocation(43, 2));
        }
        assert!(
            matches!(fresh.insert(4 << 40, allocation(43, 2)), Displaced::Stale(k, a) if k == stale && a.size == 1)
        );
    }

    /// Held by the tests that free across threads: another thread's book
    /// whose filter may hold a key is locked (and so shared) by such a
    /// free, so a test that asserts which books stay biased must not run
    /// beside one that frees thousands of keys across threads.
    static CROSS_THREAD_FREES: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A thread that keeps a book; told to go, it frees what it holds and exits.
    type Holder = (&'static Book, mpsc::Sender<()>, std::thread::JoinHandle<()>);

    /// Starts a thread that keeps `key` in a book whose bias no thread has
    /// taken away yet. Books of exited threads are taken over as they are,
    /// and one that an earlier test shared stays shared: a thread that gets
    /// such a book keeps it, holding nothing, in `idle` until the test ends.
    fn holding(key: u64, idle: &mut Vec<Holder>) -> Holder {
        loop {
            let (book_tx, book_rx) = mpsc::channel();
            let (hold_tx, hold_rx) = mpsc::channel::<bool>();
            let (go_tx, go_rx) = mpsc::channel::<()>();
            let t = std::thread::spawn(move || {
                book_tx.send(std::ptr::from_ref(the_book_of_this_thread()) as usize).unwrap();
                let hold = hold_rx.recv().unwrap();
                if hold {
                    assert!(insert(key, allocation(42, 512)));
                    book_tx.send(0).unwrap();
                }
                go_rx.recv().unwrap();
                if hold {
                    remove_own(key);
                }
            });
            // SAFETY: books are never freed.
            let book = unsafe { &*(book_rx.recv().unwrap() as *const Book) };
            // Without the bias (no membarrier) every book is shared: any will do.
            let fresh = !book.entries.is_shared() || !crate::runtime::bias::available();
            hold_tx.send(fresh).unwrap();
            if fresh {
                book_rx.recv().unwrap(); // the key is in
                return (book, go_tx, t);
            }
            idle.push((book, go_tx, t));
        }
    }

    /// A thread that frees an allocation of one other thread shares that
    /// thread's book only: a third thread keeps its own.
    #[test]
    fn a_cross_thread_free_takes_the_bias_of_the_book_that_holds_it_only() {
        let _alone = CROSS_THREAD_FREES.lock().unwrap_or_else(|e| e.into_inner());
        let theirs = 0x6200_0000_0000_u64;
        let slot = |key| std::ptr::from_ref(the_book_of_this_thread().slot(key)) as usize;
        let bystanders = (0x6300_0000_0000_u64..).step_by(4096).find(|&k| slot(k) != slot(theirs)).unwrap();
        let mut idle = Vec::new();
        let their = holding(theirs, &mut idle);
        let bystanders = holding(bystanders, &mut idle);
        assert_eq!(remove_elsewhere(theirs).map(|a| a.size), Some(512));
        assert!(their.0.entries.is_shared() || !crate::runtime::bias::available(), "taken from the book that held it");
        assert!(
            !bystanders.0.entries.is_shared() || !crate::runtime::bias::available(),
            "a book whose filter says it cannot hold the key keeps its bias"
        );
        for (_, go, t) in [their, bystanders].into_iter().chain(idle) {
            go.send(()).unwrap();
            t.join().unwrap();
        }
    }
}
