//! `exit` is observed to learn the exit status for the log; `_exit` and
//! `_Exit` skip atexit handlers, so they finish the log themselves
//! (multiprocessing children leave through `os._exit`).

use crate::real::{Lib, Slot};
use std::ffi::c_int;
use std::sync::atomic::{AtomicI64, Ordering};

const UNKNOWN: i64 = i64::MIN;
static EXIT_STATUS: AtomicI64 = AtomicI64::new(UNKNOWN);

static EXIT: Slot = Slot::new(c"exit", Lib::Libc);
static UNDERSCORE_EXIT: Slot = Slot::new(c"_exit", Lib::Libc);

pub fn exit_status() -> Option<i32> {
    match EXIT_STATUS.load(Ordering::Relaxed) {
        UNKNOWN => None,
        s => Some(s as i32),
    }
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
