//! Descriptors the shim keeps open while the program runs (the log, the
//! writer's pipes, the IPC broker's socket). The program owns the
//! descriptor table: a program that
//! closes a number twice (a bug that is harmless on its own) closes the
//! shim's descriptor if the shim got that number meanwhile, and its next
//! `open` gets it back. From then on the shim's writes would land in the
//! program's file, its reads would take the program's bytes, and truncating
//! the log would cut the program's file. So a kept descriptor moves far
//! above the numbers a program gets (the lowest free ones), and it is
//! checked to be the same file (device and inode) before each use; one that
//! is not is never used, nor closed, again. (A program that opened that very
//! file again, or the other end of the same pipe, under the number would
//! pass the check: the file, not the descriptor, is what is compared.)

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// Kept descriptors go to this number or the next free one above it, or to
/// the upper half of the process's limit where that is lower.
const HIGH: u64 = 512;

/// A descriptor the shim owns, with the identity of its open file. Usable
/// from a signal handler (`fstat` is async-signal-safe).
pub struct KeptFd {
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

impl Default for KeptFd {
    fn default() -> Self {
        Self::new()
    }
}

impl KeptFd {
    /// None kept.
    pub const fn new() -> KeptFd {
        KeptFd { fd: AtomicI32::new(-1), dev: AtomicU64::new(0), ino: AtomicU64::new(0) }
    }

    /// Keeps `fd`, which the caller owns and hands over, moved to a high
    /// number (close-on-exec, as it was opened). Where it cannot move it
    /// stays where it is, still checked before each use.
    pub fn keep(&self, fd: i32) {
        let fd = move_high(fd);
        let (dev, ino) = identity(fd).unwrap_or((0, 0));
        self.dev.store(dev, Ordering::Relaxed);
        self.ino.store(ino, Ordering::Relaxed);
        self.fd.store(fd, Ordering::Release);
    }

    /// The descriptor, if it still names the file kept.
    pub fn get(&self) -> Option<i32> {
        let fd = self.fd.load(Ordering::Acquire);
        (fd >= 0 && self.names_the_file_kept(fd)).then_some(fd)
    }

    /// Keeps `fd` (handed over: the kept file opened again, by its path) in
    /// place of a descriptor the program took, if it is the same file, and
    /// returns where it is kept now; else closes it.
    pub fn replace_if_same(&self, fd: i32) -> Option<i32> {
        if !self.names_the_file_kept(fd) {
            // SAFETY: `fd` was handed over by the caller, which does not use it after: closed once, here.
            unsafe { libc::close(fd) };
            return None;
        }
        let fd = move_high(fd);
        self.fd.store(fd, Ordering::Release);
        Some(fd)
    }

    /// Forgets the descriptor and closes it, if it still names the file
    /// kept; one that names another file is the program's now, left open.
    pub fn close(&self) {
        let fd = self.fd.swap(-1, Ordering::AcqRel);
        if fd >= 0 && self.names_the_file_kept(fd) {
            // SAFETY: `fd` was taken out of its slot above, so it is closed once, and it still names the file
            // this slot kept: it is the shim's, not a descriptor of the program's.
            unsafe { libc::close(fd) };
        }
    }

    /// Whether `fd` is open on the file kept (its device and inode).
    fn names_the_file_kept(&self, fd: i32) -> bool {
        identity(fd) == Some((self.dev.load(Ordering::Relaxed), self.ino.load(Ordering::Relaxed)))
    }
}

/// (device, inode) of the open file `fd`; None when `fd` is not open.
fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: `stat` is plain data: all-zero is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fstat` writes only into `st`, a live local; any `fd` is safe to ask about.
    let r = unsafe { libc::fstat(fd, &mut st) };
    (r == 0).then_some((st.st_dev, st.st_ino))
}

/// The lowest number a kept descriptor moves to: [`HIGH`], or half the
/// process's descriptor limit where that is lower (at least 3).
fn floor() -> i32 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `getrlimit` writes only into `limit`, a live local.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 { limit.rlim_cur } else { 1024 };
    HIGH.min(soft / 2).max(3) as i32
}

/// `fd` duplicated to a high number and closed; `fd` itself when it cannot be.
fn move_high(fd: i32) -> i32 {
    let floor = floor();
    if fd >= floor {
        return fd;
    }
    // SAFETY: `fcntl(F_DUPFD_CLOEXEC)` takes an open descriptor and a number; it creates a new descriptor or
    // fails, touching no memory.
    let moved = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor) };
    if moved < 0 {
        return fd;
    }
    // SAFETY: `fd` was handed over by the caller and is replaced by `moved`: closed once, here.
    unsafe { libc::close(fd) };
    moved
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> [i32; 2] {
        let mut p = [-1; 2];
        // SAFETY: `pipe2` writes two descriptors into `p`, a live local array of two.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        p
    }

    #[test]
    fn a_kept_descriptor_moves_high_and_answers_while_it_is_the_same_file() {
        let [rd, wr] = pipe();
        let kept = KeptFd::new();
        kept.keep(rd);
        let fd = kept.get().expect("kept");
        let floor = floor();
        assert!(fd >= floor && fd != rd, "moved from {rd} to {fd}, not at or above {floor}");
        // SAFETY: `wr` is this test's pipe's write end; `close` takes any descriptor.
        unsafe { libc::close(wr) };
        kept.close();
        assert_eq!(kept.get(), None);
    }

    #[test]
    fn a_number_the_program_closed_and_reused_is_never_used_nor_closed() {
        let [rd, wr] = pipe();
        let kept = KeptFd::new();
        kept.keep(rd);
        let fd = kept.get().unwrap();
        // The program closes the number and its own file takes it (`dup2`).
        let [other_rd, other_wr] = pipe();
        // SAFETY: `dup2` and `close` take descriptors this test made; `fd` is replaced by the other pipe.
        unsafe {
            libc::close(fd);
            assert_eq!(libc::dup2(other_rd, fd), fd);
        }
        assert_eq!(kept.get(), None, "another file under the same number");
        kept.close();
        // Still open: the program's, not closed by the shim.
        assert!(identity(fd).is_some());
        // SAFETY: closing the descriptors this test made, once each.
        unsafe {
            for d in [fd, other_rd, other_wr, wr] {
                libc::close(d);
            }
        }
    }
}
