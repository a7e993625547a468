//! Fatal signals still produce the end of the log, and then the program's own
//! disposition is honoured: a handler it installed still runs, a default
//! action still kills (with the same signal, so exit statuses do not change).

use std::sync::atomic::{AtomicBool, Ordering};

const SIGNALS: [libc::c_int; 7] =
    [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGABRT, libc::SIGSEGV, libc::SIGBUS];
/// The program's actions, as `install` replaced them. All-zero until then:
/// `SIG_DFL` with no flags, a valid `sigaction`.
static mut PREVIOUS: [std::mem::MaybeUninit<libc::sigaction>; 7] = [const { std::mem::MaybeUninit::zeroed() }; 7];
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// How long a dying process waits for its log to be finished.
const FINISH_TIMEOUT_MS: i32 = 2000;

pub fn install() {
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    for (i, &sig) in SIGNALS.iter().enumerate() {
        // SAFETY: `install` runs once (`INSTALLED`). All-zero is a valid `sigaction`; the handler set is
        // `handler`, of the `SA_SIGINFO` prototype the flags ask for. `sigaction` writes the program's old
        // action into `PREVIOUS[i]` through a raw pointer (no reference to the `static mut` is made), and
        // nothing else writes it.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handler as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            let prev = std::ptr::addr_of_mut!(PREVIOUS[i]).cast::<libc::sigaction>();
            libc::sigaction(sig, &act, prev);
        }
    }
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(i) = SIGNALS.iter().position(|&s| s == sig) else {
        return;
    };
    // SAFETY: `PREVIOUS[i]` holds a valid `sigaction` from the start (all-zero: `SIG_DFL`), written only by
    // `install`'s `sigaction` call that installed this handler for `SIGNALS[i]`, and never after; the shared
    // reference is made through a raw pointer and only read.
    let prev = unsafe { &*std::ptr::addr_of!(PREVIOUS[i]).cast::<libc::sigaction>() };
    match prev.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // The default action ends the process: finish the log first.
            crate::sink::finish_from_signal(sig, FINISH_TIMEOUT_MS);
            // SAFETY: `signal` and `raise` take a signal number and a constant disposition; both are
            // async-signal-safe.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                // Pending until this handler returns, then fatal with the original signal.
                libc::raise(sig);
            }
        }
        // SAFETY: `f` is neither `SIG_IGN` nor `SIG_DFL`: it is the handler the program installed, as
        // `sigaction` gave it back, and `SA_SIGINFO` in its flags says which of the two prototypes the kernel
        // would have called it with. It gets the arguments the kernel gave this handler.
        f => unsafe {
            // The program's own handler decides; if it exits, `exit` finishes the log.
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                let h: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(f);
                h(sig, info, ctx);
            } else {
                let h: extern "C" fn(libc::c_int) = std::mem::transmute(f);
                h(sig);
            }
        },
    }
}
