//! The exit status for the log: `main`'s return value (libc calls `exit`
//! internally then, past any hook) and `exit`'s argument. `_exit` and `_Exit`
//! skip atexit handlers, so they finish the log themselves (multiprocessing
//! children leave through `os._exit`).

use crate::cuda::real;
use crate::cuda::MainFn;
use crate::lifecycle::{self, ExitInfo};
use crate::runtime::diag;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

static REAL_MAIN: AtomicUsize = AtomicUsize::new(0);

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

unsafe fn leave_now(status: c_int) -> ! {
    lifecycle::finish(ExitInfo::Exit(Some(status)));
    if let Some(exit) = real::_exit.get() {
        exit(status);
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
