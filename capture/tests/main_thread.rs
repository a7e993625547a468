//! Runs on the process's main thread (no test harness: its own `main`), where
//! the stack bounds come from a different source than for other threads, and
//! where forking is safe: the walk reaches `_start`; after a thread's first
//! capture no capture allocates or makes a system call; a fork child can
//! capture and register new modules.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::c_void;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use common::{build_so, dladdr_name, eventually, open_symbol, positions, ExeSymbols};
use cupool_capture::native::{capture, lock_for_fork, unlock_after_fork};

/// Counts the allocations of the threads that ask for it.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTED.try_with(|c| c.get()).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's own arguments, so `Counting` keeps
// `GlobalAlloc`'s contract exactly as `System` does; `count` only bumps an atomic (it never allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's `layout` is passed on unchanged: `System.alloc`'s contract is the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's `layout` is passed on unchanged: `System.alloc_zeroed`'s contract is the
        // caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: `ptr`, `layout` and `new_size` are the caller's, passed on unchanged: `System.realloc`'s
        // contract is the caller's, and `ptr` came from `System` through this allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` and `layout` are the caller's, passed on unchanged: `ptr` came from `System` through
        // this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[inline(never)]
fn marker_leaf(out: &mut [u64]) -> usize {
    let n = capture(black_box(out));
    black_box(n)
}

#[inline(never)]
fn marker_mid(out: &mut [u64]) -> usize {
    let n = marker_leaf(black_box(out));
    black_box(n)
}

/// Called only where it is checked that nothing allocates or makes a system
/// call: its return addresses are not in the unwinder's rule cache yet, so
/// the DWARF interpretation runs too.
#[inline(never)]
fn marker_cold(out: &mut [u64]) -> usize {
    let n = marker_leaf(black_box(out));
    black_box(n)
}

/// Kept out of line, like the markers, so that every frame from the leaf to
/// `main` is a frame of its own in any build: the walk must skip none of them.
#[inline(never)]
fn walk_reaches_start_on_the_main_thread() {
    let mut out = [0u64; 64];
    let n = marker_mid(&mut out);
    let names = ExeSymbols::load().names(&out[..n]);
    let frames = ["marker_leaf", "marker_mid", "walk_reaches_start_on_the_main_thread", "main_thread4main"];
    assert_eq!(positions(&names, &frames), [0, 1, 2, 3], "{names:#?}");
    assert_eq!(names.last().map(String::as_str), Some("_start"), "{names:#?}");
}

fn no_allocation_after_a_threads_first_capture() {
    std::thread::spawn(|| {
        let mut out = [0u64; 32];
        COUNTED.with(|c| c.set(true));
        assert!(marker_mid(&mut out) >= 3);
        // The counter works: the thread's first capture allocates its cache.
        assert!(ALLOCATIONS.swap(0, Relaxed) > 0);
        for _ in 0..1000 {
            assert!(marker_mid(&mut out) >= 3);
        }
        assert!(marker_cold(&mut out) >= 3);
        assert_eq!(ALLOCATIONS.load(Relaxed), 0);
        COUNTED.with(|c| c.set(false));
    })
    .join()
    .unwrap();
}

/// Runs `child` in a forked child and returns its wait status.
fn in_child(child: impl FnOnce() -> i32) -> i32 {
    lock_for_fork();
    // SAFETY: this check runs on the main thread of a process with no test harness, and its other threads
    // have finished (joined): the child starts with no lock held by a thread that does not exist in it,
    // `lock_for_fork` having taken the capture crate's own.
    let pid = unsafe { libc::fork() };
    // SAFETY: `lock_for_fork` was called just before the fork, in this thread (parent) or the thread the
    // child was forked from.
    unsafe { unlock_after_fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: `_exit` ends the child at once, without running the parent's exit handlers twice.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: `waitpid` writes only into `status`, a live local.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    status
}

fn no_system_call_after_a_threads_first_capture() {
    let mut out = [0u64; 32];
    assert!(marker_mid(&mut out) >= 3);
    let status = in_child(|| {
        // From here on, any system call but read, write and exit kills the
        // process with SIGKILL.
        let mut result = [0u8; 2];
        // SAFETY: `prctl` takes integer arguments; strict seccomp confines this forked child, nothing else.
        unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_STRICT) };
        for _ in 0..100 {
            result[0] = marker_mid(&mut out) as u8;
        }
        result[1] = marker_cold(&mut out) as u8;
        let ok = result[0] >= 3 && result[1] >= 3;
        // SAFETY: the raw `exit` system call ends this child's one thread: the only call strict seccomp
        // allows that ends it.
        unsafe { libc::syscall(libc::SYS_exit, if ok { 0 } else { 1 }) };
        unreachable!()
    });
    assert!(!libc::WIFSIGNALED(status), "killed by signal {}: a system call", libc::WTERMSIG(status));
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status:#x}");
}

const CHILD_LIB_C: &str = r#"
typedef unsigned long (*callback)(void *);
unsigned long child_call(callback cb, void *arg) {
    unsigned long r = cb(arg);
    return r + 1;
}
"#;

#[inline(never)]
unsafe extern "C" fn marker_callback(arg: *mut c_void) -> u64 {
    // SAFETY: `arg` is the pointer to a live `[u64; 32]` that `child_call`'s caller passed through unchanged,
    // and nothing else uses that array during the call.
    let out = unsafe { &mut *(arg as *mut [u64; 32]) };
    black_box(marker_leaf(out) as u64)
}

fn a_fork_child_captures_and_registers_new_modules() {
    let path = build_so("forkchild", "libforkchild.so", CHILD_LIB_C, &["-O2", "-fno-optimize-sibling-calls"]);
    let status = in_child(move || {
        type Call = unsafe extern "C" fn(unsafe extern "C" fn(*mut c_void) -> u64, *mut c_void) -> u64;
        // SAFETY: `open_symbol` returns the address of `child_call` in the library just built from
        // `CHILD_LIB_C`, whose C prototype is `Call`.
        let call = unsafe { std::mem::transmute::<usize, Call>(open_symbol(&path, "child_call")) };
        let found = eventually(|| {
            let mut out = [0u64; 32];
            // `child_call` returns the callback's answer plus one.
            // SAFETY: `call` is `child_call` (prototype `Call`); `marker_callback` takes the pointer it is
            // given, here to `out`, a live `[u64; 32]` of exactly the type it casts to.
            let n = unsafe { call(marker_callback, &mut out as *mut [u64; 32] as *mut c_void) } as usize - 1;
            // The frame after the library's one is this closure, in the executable.
            let through = out[..n].iter().position(|&ra| dladdr_name(ra).as_deref() == Some("child_call"));
            through.filter(|&i| i + 1 < n)
        });
        if found.is_some() {
            0
        } else {
            1
        }
    });
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status:#x}");
}

fn main() {
    let checks: [(&str, fn()); 4] = [
        ("walk_reaches_start_on_the_main_thread", walk_reaches_start_on_the_main_thread),
        ("no_allocation_after_a_threads_first_capture", no_allocation_after_a_threads_first_capture),
        ("no_system_call_after_a_threads_first_capture", no_system_call_after_a_threads_first_capture),
        ("a_fork_child_captures_and_registers_new_modules", a_fork_child_captures_and_registers_new_modules),
    ];
    for (name, check) in checks {
        check();
        println!("test {name} ... ok");
    }
}
