//! Biased ownership of the shim's shared books (the live table's shards and
//! the counters), for programs that allocate from one thread.
//!
//! Every pooled `cudaMalloc`+`cudaFree` pair locks and unlocks a live-table
//! shard twice and bumps six counters: ten atomic read-modify-writes, about
//! 5 ns each even uncontended (a `perf` of the hook bench put a third of the
//! pair there). Most programs allocate from one thread, so the first thread
//! that touches the books *owns* them: it reads and writes them with plain
//! loads and stores and takes no lock. The first other thread that needs
//! them revokes the bias for good (everyone locks and uses atomics from then
//! on), after waiting for the owner to leave the section it may be in.
//!
//! The handshake is Dekker's, made cheap on the owner's side with an
//! asymmetric fence: the owner marks itself inside a section and then checks
//! that it still owns the books, with only a compiler fence between; the
//! revoker marks the books shared, runs `membarrier` (a full barrier on
//! every thread of the process, so the owner either saw the revocation or
//! its mark is visible), and waits for the mark to clear. Where the kernel
//! has no `membarrier` (private expedited, Linux 4.14), nothing is ever
//! biased.

use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// No owner yet.
const NONE: u64 = 0;
/// Revoked (or never possible): every thread locks.
const SHARED: u64 = u64::MAX;

/// The state every call reads, on cache lines of its own: a neighbour that
/// other threads write would make each of those reads a miss.
#[repr(align(128))]
struct State {
    owner: AtomicU64,
    /// The owner is inside a section (written by the owner only).
    inside: AtomicU32,
    /// The owner left its last biased section after the revocation: shared
    /// access is safe.
    quiet: AtomicBool,
}

static STATE: State = State { owner: AtomicU64::new(NONE), inside: AtomicU32::new(0), quiet: AtomicBool::new(false) };
static OWNER: &AtomicU64 = &STATE.owner;
static INSIDE: &AtomicU32 = &STATE.inside;
static QUIET: &AtomicBool = &STATE.quiet;
/// The process this thread registered `membarrier` for (0: none).
static REGISTERED: AtomicU64 = AtomicU64::new(0);

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// How the caller may touch the books now.
pub enum Access {
    /// This thread owns them: plain loads and stores, no lock, until the
    /// section is dropped.
    Owned(Section),
    /// Take the locks and use atomics, as without the bias.
    Shared,
    /// This thread owns them and is inside a section already (a signal
    /// handler that interrupted it): touch nothing that section may be
    /// changing.
    Busy,
}

/// The owner is inside a biased section while this lives.
pub struct Section {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for Section {
    #[inline]
    fn drop(&mut self) {
        // The section's plain stores come before the mark clears: a revoker
        // that reads it clear (acquire) sees them.
        compiler_fence(Ordering::SeqCst);
        INSIDE.store(0, Ordering::Release);
    }
}

#[inline]
fn me() -> u64 {
    u64::from(super::guard::tid())
}

/// How this thread may touch the biased books; may revoke the bias (and
/// wait for the owner to leave its section) first.
#[inline]
pub fn access() -> Access {
    let owner = OWNER.load(Ordering::Relaxed);
    if owner == SHARED && QUIET.load(Ordering::Acquire) {
        return Access::Shared;
    }
    let me = me();
    if owner == me || (owner == NONE && claim(me)) {
        if INSIDE.load(Ordering::Relaxed) != 0 {
            return Access::Busy;
        }
        INSIDE.store(1, Ordering::Relaxed);
        // With the revoker's membarrier, a full fence: the mark is visible
        // to it, or the revocation is visible here.
        compiler_fence(Ordering::SeqCst);
        if OWNER.load(Ordering::Relaxed) == me {
            return Access::Owned(Section { _not_send: std::marker::PhantomData });
        }
        INSIDE.store(0, Ordering::Release);
        // Revoked meanwhile; whoever did waits for the mark just cleared.
    }
    revoke(None);
    Access::Shared
}

/// Makes the books shared, as [`access`] does for a second thread, without
/// waiting longer than `patience` for the owner (a fatal signal's handler
/// must not hang on a thread stopped inside a section). False: the owner
/// is still inside; do not touch the books.
pub fn share_within(patience: Duration) -> bool {
    if OWNER.load(Ordering::Relaxed) == me() && INSIDE.load(Ordering::Relaxed) != 0 {
        return false; // interrupted its own section
    }
    revoke(Some(patience))
}

#[cold]
fn claim(me: u64) -> bool {
    if !registered() {
        let _ = OWNER.compare_exchange(NONE, SHARED, Ordering::SeqCst, Ordering::Relaxed);
        QUIET.store(true, Ordering::Release);
        return false;
    }
    OWNER.compare_exchange(NONE, me, Ordering::SeqCst, Ordering::Relaxed).is_ok()
}

/// `membarrier` registered for this process (again in a forked child).
fn registered() -> bool {
    let pid = std::process::id() as u64;
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

/// Marks the books shared and waits (at most `patience`) for the owner to
/// leave its section. True once shared access is safe.
#[cold]
#[inline(never)]
fn revoke(patience: Option<Duration>) -> bool {
    if QUIET.load(Ordering::Acquire) {
        return true;
    }
    let was = OWNER.swap(SHARED, Ordering::SeqCst);
    if was != NONE && REGISTERED.load(Ordering::Acquire) != 0 {
        // Every revoker that reads the mark fences first (one that found the
        // books shared already may read it before the first one's fence).
        // SAFETY: a plain syscall; registered for this process.
        unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
    }
    let start = Instant::now();
    while INSIDE.load(Ordering::Acquire) != 0 {
        if was == me() {
            break; // this thread is the owner, between its own sections
        }
        if patience.is_some_and(|p| start.elapsed() > p) {
            return false;
        }
        std::thread::yield_now();
    }
    QUIET.store(true, Ordering::Release);
    true
}

/// Makes the books shared for good, waiting for the owner to leave its
/// section: for rare walks over all of them (context death, `fork`, which
/// takes every lock) that would rather lock than hold a section throughout.
pub fn share() {
    revoke(None);
}

/// In a forked child, after its locks were released: one thread is left, and
/// it may own the books again.
pub fn reset_in_child() {
    INSIDE.store(0, Ordering::Relaxed);
    QUIET.store(false, Ordering::Relaxed);
    OWNER.store(NONE, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    fn bump(n: &AtomicU64) -> bool {
        match access() {
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
    /// in its sections as the others arrive. The bias is process-wide, so
    /// the test runs itself again in a process of its own, where its main
    /// thread is the first to ask.
    #[test]
    fn no_update_is_lost_across_the_revocation() {
        const CHILD: &str = "CUPOOL_BIAS_TEST_CHILD";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "runtime::bias::tests::no_update_is_lost_across_the_revocation", "--test-threads=1"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success() && text.contains("1 passed"), "{text}");
            return;
        }
        let n = Arc::new(AtomicU64::new(0));
        assert!(bump(&n) || !registered(), "the first thread owns the books where membarrier works");
        let started = Arc::new(std::sync::Barrier::new(5));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (n, started) = (n.clone(), started.clone());
                std::thread::spawn(move || {
                    started.wait();
                    for _ in 0..100_000 {
                        assert!(!bump(&n), "only the owner writes plainly");
                    }
                })
            })
            .collect();
        let mut owned = 0;
        for k in 0..400_000 {
            if k == 1000 {
                started.wait(); // the others come while the owner is at it
            }
            owned += u64::from(bump(&n));
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(n.load(Ordering::Relaxed), 800_001);
        assert!(owned >= 1000 || !registered(), "owned until revoked: {owned}");
        assert!(matches!(access(), Access::Shared), "revoked for good");
    }
}
