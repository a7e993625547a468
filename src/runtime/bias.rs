//! Biased ownership of shared state, for programs that allocate from one
//! thread: the books every thread writes (the counters and the table of
//! CUDA's own allocations, [`SHARED_BOOKS`]), each thread's own book of pooled
//! allocations, each pool's lock ([`BiasedMutex`]) and the log's sequence
//! number (`sink`).
//!
//! With locks and atomic counters alone, every pooled `cudaMalloc`+`cudaFree`
//! pair would lock and unlock a live-table shard twice, the pool twice, and
//! bump six counters: fourteen atomic read-modify-writes, about 5 ns each
//! even uncontended (half the pair's time in a `perf` of the hook bench).
//! Most programs allocate from one thread, so the first thread that touches
//! a [`Bias`]'s state *owns* it: it reads and writes with plain loads and
//! stores and takes no lock. The first other thread that needs the state
//! revokes the bias for good (everyone locks and uses atomics from then on),
//! after waiting for the owner to leave the section it may be in.
//!
//! The handshake is Dekker's, made cheap on the owner's side with an
//! asymmetric fence: the owner marks itself inside a section and then checks
//! that it still owns the state, with only a compiler fence between; the
//! revoker marks the state shared, runs `membarrier` (a full barrier on
//! every thread of the process, so the owner either saw the revocation or
//! its mark is visible), and waits for the mark to clear. The first revoker
//! registers the process for the expedited command, once (the kernel then
//! waits for an RCU grace period, 9–21 ms with several threads): an owner
//! never waits for that. Where the kernel lacks the commands (Linux 4.14),
//! nothing is biased.

use parking_lot::{Mutex, MutexGuard};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// No owner yet.
const NONE: u64 = 0;
/// Revoked (or never possible): every thread locks.
const SHARED: u64 = u64::MAX;

/// One biased domain: who owns it, and whether the owner is inside. On cache
/// lines of its own: a neighbour that other threads write would make every
/// call's reads misses.
#[repr(align(128))]
pub struct Bias {
    owner: AtomicU64,
    /// The thread that claimed the domain, kept after the revocation: it
    /// may still be inside a section then, and must not wait for itself.
    holder: AtomicU64,
    /// The owner is inside a section (written by the owner only).
    inside: AtomicU32,
    /// The owner left its last biased section after the revocation: shared
    /// access is safe.
    quiet: AtomicBool,
}

/// The counters and the table of the allocations CUDA made itself
/// (`observe`); pooled allocations are kept in per-thread books.
pub static SHARED_BOOKS: Bias = Bias::new();

/// The process `membarrier` was registered for (0: none), and its guard.
/// With several threads the kernel waits for an RCU grace period to
/// register (9–21 ms measured), so only a revoker registers, once: a
/// program that allocates from one thread never pays it, and an owner
/// never waits for it.
static REGISTERED: AtomicU64 = AtomicU64::new(0);
static REGISTERING: Mutex<()> = Mutex::new(());

const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// How the caller may touch a biased domain's state now.
pub enum Access<'a> {
    /// This thread owns it: plain loads and stores, no lock, until the
    /// section is dropped.
    Owned(Section<'a>),
    /// Take the locks and use atomics, as without the bias.
    Shared,
    /// This thread claimed it and is inside a section already (a signal
    /// handler that interrupted it): touch nothing that section may be
    /// changing.
    Busy,
}

/// The owner is inside a biased section while this lives.
pub struct Section<'a> {
    bias: &'a Bias,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for Section<'_> {
    #[inline]
    fn drop(&mut self) {
        // The section's plain stores come before the mark clears: a revoker
        // that reads it clear (acquire) sees them.
        compiler_fence(Ordering::SeqCst);
        self.bias.inside.store(0, Ordering::Release);
    }
}

#[inline]
fn me() -> u64 {
    u64::from(super::guard::tid())
}

impl Bias {
    pub const fn new() -> Bias {
        Bias {
            owner: AtomicU64::new(NONE),
            holder: AtomicU64::new(NONE),
            inside: AtomicU32::new(0),
            quiet: AtomicBool::new(false),
        }
    }

    /// How this thread may touch the state; may revoke the bias (and wait
    /// for the owner to leave its section) first.
    #[inline]
    pub fn access(&self) -> Access<'_> {
        let owner = self.owner.load(Ordering::Relaxed);
        if owner == SHARED && self.quiet.load(Ordering::Acquire) {
            return Access::Shared;
        }
        let me = me();
        if owner == me || (owner == NONE && self.claim(me)) {
            if self.inside.load(Ordering::Relaxed) != 0 {
                return Access::Busy;
            }
            self.inside.store(1, Ordering::Relaxed);
            // With the revoker's membarrier, a full fence: the mark is
            // visible to it, or the revocation is visible here.
            compiler_fence(Ordering::SeqCst);
            if self.owner.load(Ordering::Relaxed) == me {
                return Access::Owned(Section { bias: self, _not_send: std::marker::PhantomData });
            }
            self.inside.store(0, Ordering::Release);
            // Revoked meanwhile; whoever did waits for the mark just cleared.
        }
        if self.revoke(None) {
            Access::Shared
        } else {
            Access::Busy
        }
    }

    /// Is this thread the owner, outside its sections? Then no other thread
    /// is inside one either (only the owner enters them).
    pub fn owned_here(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == me() && self.inside.load(Ordering::Relaxed) == 0
    }

    /// Does this thread own the state (inside a section or not)?
    pub fn claimed_here(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == me()
    }

    /// Makes the state shared, as [`Bias::access`] does for a second thread,
    /// without waiting longer than `patience` for the owner (a fatal
    /// signal's handler must not hang on a thread stopped inside a section).
    /// False: the owner is still inside; do not touch the state.
    pub fn share_within(&self, patience: Duration) -> bool {
        self.revoke(Some(patience))
    }

    /// Makes the state shared for good, waiting for the owner to leave its
    /// section: for rare walks over all of it (context death) that would
    /// rather lock than hold a section throughout. False: this thread is the
    /// owner and interrupted its own section (a signal handler); do not
    /// touch the state.
    pub fn share(&self) -> bool {
        self.revoke(None)
    }

    /// Its owner gives the domain up (its thread exits, outside any
    /// section): the next thread to touch it may own it, with no revocation.
    pub fn vacate(&self) {
        let me = me();
        if self.inside.load(Ordering::Relaxed) == 0 && self.owner.load(Ordering::Relaxed) == me {
            // Before the owner goes: a later claimer's own `holder` is not overwritten.
            self.holder.store(NONE, Ordering::Relaxed);
            let _ = self.owner.compare_exchange(me, NONE, Ordering::SeqCst, Ordering::Relaxed);
        }
    }

    /// In a forked child, after its locks were released: one thread is
    /// left, and it may own the state again.
    pub fn reset_in_child(&self) {
        self.inside.store(0, Ordering::Relaxed);
        self.quiet.store(false, Ordering::Relaxed);
        self.holder.store(NONE, Ordering::Relaxed);
        self.owner.store(NONE, Ordering::SeqCst);
    }

    #[cold]
    fn claim(&self, me: u64) -> bool {
        if !supported() {
            // Revoked, not just marked: another thread may own the domain
            // already (registration failed here only).
            self.revoke(None);
            return false;
        }
        let won = self.owner.compare_exchange(NONE, me, Ordering::SeqCst, Ordering::Relaxed).is_ok();
        if won {
            // Before this thread's first section: nobody waits on it yet.
            self.holder.store(me, Ordering::Relaxed);
        }
        won
    }

    /// Marks the state shared and waits (at most `patience`) for the owner
    /// to leave its section. True once shared access is safe; false when the
    /// wait ran out, or this thread claimed the domain and is inside its own
    /// section (waiting would never end).
    #[cold]
    #[inline(never)]
    fn revoke(&self, patience: Option<Duration>) -> bool {
        if self.quiet.load(Ordering::Acquire) {
            return true;
        }
        let was = self.owner.swap(SHARED, Ordering::SeqCst);
        if was != NONE {
            // Every revoker that reads the mark fences first (one that found
            // the state shared already may read it before the first one's
            // fence).
            barrier_on_every_thread();
        }
        let start = Instant::now();
        while self.inside.load(Ordering::Acquire) != 0 {
            if self.holder.load(Ordering::Relaxed) == me() {
                return false; // this thread's own section, interrupted
            }
            if patience.is_some_and(|p| start.elapsed() > p) {
                return false;
            }
            std::thread::yield_now();
        }
        self.quiet.store(true, Ordering::Release);
        true
    }
}

impl Default for Bias {
    fn default() -> Self {
        Bias::new()
    }
}

/// Can state be biased here at all (`supported`)?
#[cfg(test)]
pub fn available() -> bool {
    supported()
}

/// Whether this kernel has the `membarrier` commands the revocation needs
/// (asked once; the answer outlives a fork).
fn supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        // SAFETY: a plain syscall with no pointer arguments.
        let mask = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0) };
        let need = MEMBARRIER_CMD_GLOBAL | MEMBARRIER_CMD_PRIVATE_EXPEDITED | MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED;
        mask >= 0 && mask & libc::c_long::from(need) == libc::c_long::from(need)
    })
}

/// A full memory barrier on every running thread of the process: the
/// expedited command once registered, else the global one (slower, and
/// needs no registration).
fn barrier_on_every_thread() {
    let cmd = if registered() { MEMBARRIER_CMD_PRIVATE_EXPEDITED } else { MEMBARRIER_CMD_GLOBAL };
    // SAFETY: a plain syscall with no pointer arguments.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) };
}

/// `membarrier` registered for this process (again in a forked child).
fn registered() -> bool {
    let pid = std::process::id() as u64;
    if REGISTERED.load(Ordering::Acquire) == pid {
        return true;
    }
    // Another thread registering (for up to a grace period) may have been
    // stopped by a fatal signal, or not exist (a forked child): never wait
    // for it; the global command needs no registration.
    let Some(_one_at_a_time) = REGISTERING.try_lock() else { return false };
    if REGISTERED.load(Ordering::Acquire) == pid {
        return true;
    }
    // SAFETY: a plain syscall with no pointer arguments.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) };
    if r != 0 {
        return false;
    }
    REGISTERED.store(pid, Ordering::Release);
    true
}

/// How long a thread that finds a shared [`BiasedMutex`] taken polls it
/// before the mutex's own wait. That wait spins 14 pauses (about a
/// microsecond or less), yields up to seven times, and then sleeps; while
/// one thread sleeps, the others that find it taken sleep at once. A pool's
/// lock is mostly held for the length of one placement (its driver calls,
/// pages made or mapped and fences, take longer), and on an H100 host eight
/// threads found it taken about as often as they slept (7,687 waits, 7,410
/// voluntary context switches a run, BENCHMARKS.md), each sleep costing
/// about 27 µs off the CPU in that run ((loop − CPU time) × pairs ÷
/// switches). Polling first, eight threads slept a few hundred times a run
/// instead of 6,000–10,000 (medians of three passes, BENCHMARKS.md). Pollers
/// do not queue: they may take the lock ahead of a woken sleeper, which the
/// mutex's eventual fairness bounds.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(20);
/// Polls between two reads of the clock (a read costs about 20 ns).
const POLLS_PER_CLOCK_READ: u32 = 16;

/// A mutex that its owning thread enters without an atomic operation while
/// no other thread has used it (a pool's lock: most programs allocate from
/// one thread). Each has a [`Bias`] of its own, so that holding it nests
/// with the books' sections.
pub struct BiasedMutex<T> {
    bias: Bias,
    mutex: Mutex<T>,
}

/// The guard of a [`BiasedMutex`].
pub enum BiasedGuard<'a, T> {
    /// The owner's: the section ends when the guard is dropped.
    Owned {
        _section: Section<'a>,
        value: &'a mut T,
    },
    Locked(MutexGuard<'a, T>),
}

impl<T> BiasedMutex<T> {
    pub const fn new(value: T) -> Self {
        BiasedMutex { bias: Bias::new(), mutex: Mutex::new(value) }
    }

    /// Locks. A thread that owns the biased mutex and holds it already (a
    /// signal handler that interrupted it) would deadlock on a plain mutex;
    /// here it panics (the shim's calls fall back to CUDA on a panic). Once
    /// the mutex is shared, such a thread waits for itself, as on any mutex.
    #[inline]
    pub fn lock(&self) -> BiasedGuard<'_, T> {
        self.lock_unless_busy().expect("a biased mutex locked again by the thread that holds it")
    }

    /// Locks, waiting for another thread that holds it. None: this thread
    /// owns the mutex and holds it already (a signal handler that
    /// interrupted it).
    #[inline]
    pub fn lock_unless_busy(&self) -> Option<BiasedGuard<'_, T>> {
        match self.bias.access() {
            Access::Owned(s) => Some(BiasedGuard::Owned { _section: s, value: self.owned() }),
            Access::Shared => Some(BiasedGuard::Locked(self.lock_shared())),
            Access::Busy => None,
        }
    }

    /// Locks the shared mutex, polling it for up to [`POLL_BEFORE_SLEEP`]
    /// before the mutex's own wait.
    #[inline]
    fn lock_shared(&self) -> MutexGuard<'_, T> {
        match self.mutex.try_lock() {
            Some(guard) => guard,
            None => self.lock_polling(),
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_polling(&self) -> MutexGuard<'_, T> {
        let since = Instant::now();
        loop {
            for _ in 0..POLLS_PER_CLOCK_READ {
                std::hint::spin_loop();
                // `try_lock` loads first and tries no compare-and-swap while
                // the mutex is held: polling leaves the holder's line shared.
                if let Some(guard) = self.mutex.try_lock() {
                    return guard;
                }
            }
            if since.elapsed() >= POLL_BEFORE_SLEEP {
                return self.mutex.lock();
            }
        }
    }

    /// Has a second thread taken the bias away?
    #[cfg(test)]
    pub fn is_shared(&self) -> bool {
        self.bias.owner.load(Ordering::Relaxed) == SHARED
    }

    /// Its owning thread exits: see [`Bias::vacate`].
    pub fn vacate(&self) {
        self.bias.vacate();
    }

    /// None: another thread holds it (or this one, interrupted inside it).
    #[inline]
    pub fn try_lock(&self) -> Option<BiasedGuard<'_, T>> {
        match self.bias.access() {
            Access::Owned(s) => Some(BiasedGuard::Owned { _section: s, value: self.owned() }),
            Access::Shared => self.mutex.try_lock().map(BiasedGuard::Locked),
            Access::Busy => None,
        }
    }

    /// As [`BiasedMutex::try_lock`], waiting at most `patience` (for the
    /// owner to leave, too).
    pub fn try_lock_for(&self, patience: Duration) -> Option<BiasedGuard<'_, T>> {
        if self.bias.claimed_here() {
            // Its owner: no reason to give the bias up. Another thread may
            // have taken it away meanwhile, and hold the lock: wait for that.
            return match self.bias.access() {
                Access::Owned(s) => Some(BiasedGuard::Owned { _section: s, value: self.owned() }),
                Access::Shared => self.mutex.try_lock_for(patience).map(BiasedGuard::Locked),
                Access::Busy => None,
            };
        }
        if !self.bias.share_within(patience) {
            return None;
        }
        self.mutex.try_lock_for(patience).map(BiasedGuard::Locked)
    }

    #[inline]
    #[allow(clippy::mut_from_ref)]
    fn owned(&self) -> &mut T {
        // SAFETY: only while the owner holds a section of this mutex's bias,
        // which no other thread enters, and the owner enters once at a time.
        unsafe { &mut *self.mutex.data_ptr() }
    }
}

impl<T> Deref for BiasedGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        match self {
            BiasedGuard::Owned { value, .. } => value,
            BiasedGuard::Locked(g) => g,
        }
    }
}

impl<T> DerefMut for BiasedGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        match self {
            BiasedGuard::Owned { value, .. } => value,
            BiasedGuard::Locked(g) => g,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    fn bump(bias: &Bias, n: &AtomicU64) -> bool {
        match bias.access() {
            Access::Owned(_s) => {
                // A long section: a revoker that did not wait for it to end
                // would have its increments overwritten here.
                let v = n.load(Ordering::Relaxed);
                for _ in 0..5000 {
                    std::hint::spin_loop();
                }
                n.store(v + 1, Ordering::Relaxed);
                true
            }
            Access::Shared => {
                n.fetch_add(1, Ordering::Relaxed);
                false
            }
            Access::Busy => unreachable!("no section is nested here"),
        }
    }

    /// Plain increments by the owner and atomic ones by other threads after
    /// the revocation add up exactly: none is lost while the owner is busy
    /// in its sections as the others arrive. (Each test has a domain of its
    /// own: the first thread to ask owns it.)
    #[test]
    fn no_update_is_lost_across_the_revocation() {
        static B: Bias = Bias::new();
        let n = Arc::new(AtomicU64::new(0));
        assert!(bump(&B, &n) || !supported(), "the first thread owns the domain where membarrier works");
        let started = Arc::new(std::sync::Barrier::new(5));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (n, started) = (n.clone(), started.clone());
                std::thread::spawn(move || {
                    started.wait();
                    for _ in 0..100_000 {
                        assert!(!bump(&B, &n), "only the owner writes plainly");
                    }
                })
            })
            .collect();
        let mut owned = 0;
        for k in 0..400_000 {
            if k == 1000 {
                started.wait(); // the others come while the owner is at it
            }
            owned += u64::from(bump(&B, &n));
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(n.load(Ordering::Relaxed), 800_001);
        assert!(owned >= 1000 || !supported(), "owned until revoked: {owned}");
        assert!(matches!(B.access(), Access::Shared), "revoked for good");
    }

    /// Threads that find the shared mutex taken poll it and then sleep on
    /// it; either way each gets it alone: plain read-modify-writes of the
    /// guarded value, some held long enough that the pollers give up and
    /// sleep, add up exactly.
    #[test]
    fn a_shared_mutex_is_held_by_one_thread_at_a_time_polled_or_slept_on() {
        static M: BiasedMutex<u64> = BiasedMutex::new(0);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for k in 0..20_000u32 {
                        let mut g = M.lock();
                        let v = *g;
                        // Every 1000th hold outlasts the polling.
                        if (k + t) % 1000 == 0 {
                            std::thread::sleep(POLL_BEFORE_SLEEP * 2);
                        }
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*M.lock(), 80_000);
    }

    /// The owner, interrupted inside its section (as by a signal handler)
    /// while another thread waits to revoke, is told Busy instead of waiting
    /// for itself; the revoker goes on once the section ends.
    #[test]
    fn an_owner_inside_its_section_is_busy_not_stuck() {
        static B: Bias = Bias::new();
        let Access::Owned(section) = B.access() else {
            assert!(!supported(), "owned where membarrier works");
            return;
        };
        let revoker = std::thread::spawn(|| B.share());
        while B.owner.load(Ordering::Relaxed) != SHARED {
            std::thread::yield_now();
        }
        assert!(matches!(B.access(), Access::Busy), "the owner re-entering its own section");
        assert!(!B.share(), "nor does it wait for itself");
        assert!(!revoker.is_finished(), "the revoker waits for the section");
        drop(section);
        assert!(revoker.join().unwrap());
        assert!(matches!(B.access(), Access::Shared));
    }
}
