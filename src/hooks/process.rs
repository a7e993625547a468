//! The exit status for the log: `main`'s return value (libc calls `exit`
//! internally then, past any hook), `exit`'s and `quick_exit`'s argument.
//! `_exit` and `_Exit` skip atexit handlers, so they finish the log
//! themselves (multiprocessing children leave through `os._exit`);
//! `quick_exit` runs the handlers of `at_quick_exit`, one of which finishes it.
//! `exec` keeps no handler and no thread: `execve` and `execv` (Python's
//! `os.execv`, `os.execve` and `os.execvp`) write what is queued first. The
//! C library's other `exec` functions reach the kernel past these hooks.
//!
//! A `vfork` child (Python's `subprocess`) runs in its parent's memory until
//! it `exec`s or `_exit`s: there these hooks touch nothing of the parent's
//! and look nothing up.

use crate::cuda::real;
use crate::cuda::MainFn;
use crate::lifecycle::{self, ExitInfo};
use crate::runtime::diag;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

static REAL_MAIN: AtomicUsize = AtomicUsize::new(0);
/// The pid that ran `main` (0: not seen).
static MAIN_PID: AtomicU32 = AtomicU32::new(0);

/// Is this the process that ran `main`, or one whose own CUDA session runs
/// (a forked child)? Not a `vfork` child, nor a forked child that never
/// used CUDA.
fn own_process() -> bool {
    let main_pid = MAIN_PID.load(Ordering::Relaxed);
    main_pid == 0 || main_pid == std::process::id() || lifecycle::in_session_process()
}

unsafe extern "C" fn main_returning_status(argc: c_int, argv: *mut *mut c_char, env: *mut *mut c_char) -> c_int {
    let main: MainFn = std::mem::transmute(REAL_MAIN.load(Ordering::Relaxed));
    let status = main(argc, argv, env);
    lifecycle::note_exit_status(status);
    status
}

#[no_mangle]
pub unsafe extern "C" fn __libc_start_main(
    main: MainFn,
    argc: c_int,
    argv: *mut *mut c_char,
    init: *mut c_void,
    fini: *mut c_void,
    rtld_fini: *mut c_void,
    stack_end: *mut c_void,
) -> c_int {
    let Some(start) = real::__libc_start_main.get() else {
        diag::fatal("cannot find __libc_start_main");
    };
    REAL_MAIN.store(main as usize, Ordering::Relaxed);
    MAIN_PID.store(std::process::id(), Ordering::Relaxed);
    start(main_returning_status, argc, argv, init, fini, rtld_fini, stack_end)
}

#[no_mangle]
pub unsafe extern "C" fn exit(status: c_int) -> ! {
    lifecycle::note_exit_status(status);
    if let Some(exit) = real::exit.get() {
        exit(status);
    }
    libc::syscall(libc::SYS_exit_group, status);
    unreachable!()
}

#[no_mangle]
pub unsafe extern "C" fn quick_exit(status: c_int) -> ! {
    lifecycle::note_exit_status(status);
    if let Some(quick_exit) = real::quick_exit.get() {
        quick_exit(status);
    }
    leave_now(status)
}

unsafe fn leave_now(status: c_int) -> ! {
    if own_process() {
        lifecycle::finish(ExitInfo::Exit(Some(status)));
        if let Some(exit) = real::_exit.get() {
            exit(status);
        }
    }
    libc::syscall(libc::SYS_exit_group, status);
    unreachable!()
}

#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    leave_now(status)
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    leave_now(status)
}

extern "C" {
    /// Changed by `setenv` and `putenv`: read afresh at every call.
    static mut environ: *const *const c_char;
}

/// The events queued are written first (`lifecycle::before_exec`), then the
/// next `execve` is called (another preloaded tool's, or the C library's);
/// a `vfork` child calls it only if it was looked up already, and otherwise
/// makes the system call itself, as the C library's does.
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    lifecycle::before_exec();
    let next = if own_process() { real::execve.get() } else { real::execve.resolved() };
    match next {
        Some(execve) => execve(path, argv, envp),
        None => libc::syscall(libc::SYS_execve, path, argv, envp) as c_int,
    }
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    execve(path, argv, environ)
}
