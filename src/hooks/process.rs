//! The exit status for the log: `main`'s return value (libc calls `exit`
//! internally then, past any hook) and `exit`'s argument. `_exit` and `_Exit`
//! skip atexit handlers, so they finish the log themselves (multiprocessing
//! children leave through `os._exit`).

use crate::real::{Lib, Slot};
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

const UNKNOWN: i64 = i64::MIN;
static EXIT_STATUS: AtomicI64 = AtomicI64::new(UNKNOWN);

static LIBC_START_MAIN: Slot = Slot::new(c"__libc_start_main", Lib::Libc);
static EXIT: Slot = Slot::new(c"exit", Lib::Libc);
static UNDERSCORE_EXIT: Slot = Slot::new(c"_exit", Lib::Libc);

pub fn exit_status() -> Option<i32> {
    match EXIT_STATUS.load(Ordering::Relaxed) {
        UNKNOWN => None,
        s => Some(s as i32),
    }
}

type Main = unsafe extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) -> c_int;
static REAL_MAIN: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn main_returning_status(argc: c_int, argv: *mut *mut c_char, env: *mut *mut c_char) -> c_int {
    let main: Main = std::mem::transmute(REAL_MAIN.load(Ordering::Relaxed));
    let status = main(argc, argv, env);
    EXIT_STATUS.store(status as i64, Ordering::Relaxed);
    status
}

#[no_mangle]
pub unsafe extern "C" fn __libc_start_main(
    main: Main,
    argc: c_int,
    argv: *mut *mut c_char,
    init: *mut c_void,
    fini: *mut c_void,
    rtld_fini: *mut c_void,
    stack_end: *mut c_void,
) -> c_int {
    type Start = unsafe extern "C" fn(
        Main,
        c_int,
        *mut *mut c_char,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        *mut c_void,
    ) -> c_int;
    let Some(real) = LIBC_START_MAIN.get() else {
        crate::diag::fatal("cannot find __libc_start_main");
    };
    let real: Start = std::mem::transmute(real);
    REAL_MAIN.store(main as usize, Ordering::Relaxed);
    real(main_returning_status, argc, argv, init, fini, rtld_fini, stack_end)
}

#[no_mangle]
pub unsafe extern "C" fn exit(status: c_int) -> ! {
    EXIT_STATUS.store(status as i64, Ordering::Relaxed);
    if let Some(p) = EXIT.get() {
        let real: unsafe extern "C" fn(c_int) -> ! = std::mem::transmute(p);
        real(status);
    }
    libc::syscall(libc::SYS_exit_group, status);
    unreachable!()
}

unsafe fn leave_now(status: c_int) -> ! {
    crate::state::finish(crate::report::ExitInfo::Exit(Some(status)));
    if let Some(p) = UNDERSCORE_EXIT.get() {
        let real: unsafe extern "C" fn(c_int) -> ! = std::mem::transmute(p);
        real(status);
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
