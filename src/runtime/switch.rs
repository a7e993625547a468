//! A lazily started, once-finished state: off → starting → on → finished.
//!
//! The session and the log file both start on first use from whichever
//! thread gets there first, must never start twice, and end exactly once.
//! One thread starts; the others wait the few microseconds it takes.

use std::sync::atomic::{AtomicU8, Ordering};

const OFF: u8 = 0;
const STARTING: u8 = 1;
const ON: u8 = 2;
/// Finished, or failed to start: either way, never again in this process image.
const DONE: u8 = 3;

pub struct Switch(AtomicU8);

impl Switch {
    pub const fn new() -> Switch {
        Switch(AtomicU8::new(OFF))
    }

    #[inline]
    pub fn is_on(&self) -> bool {
        self.0.load(Ordering::Acquire) == ON
    }

    /// True once on. The first caller runs `start`; it turns the switch on
    /// when `start` returns true, and off for good otherwise.
    #[inline]
    pub fn ensure_on(&self, start: impl FnOnce() -> bool) -> bool {
        match self.0.load(Ordering::Acquire) {
            ON => true,
            DONE => false,
            _ => self.start_slow(start),
        }
    }

    #[cold]
    fn start_slow(&self, start: impl FnOnce() -> bool) -> bool {
        if self.0.compare_exchange(OFF, STARTING, Ordering::AcqRel, Ordering::Acquire).is_err() {
            while self.0.load(Ordering::Acquire) == STARTING {
                std::hint::spin_loop();
            }
            return self.is_on();
        }
        // A `start` that unwinds must not leave the others spinning on STARTING.
        struct Done<'a>(&'a AtomicU8);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                let _ = self.0.compare_exchange(STARTING, DONE, Ordering::AcqRel, Ordering::Acquire);
            }
        }
        let unwinding = Done(&self.0);
        let on = start();
        std::mem::forget(unwinding);
        self.0.store(if on { ON } else { DONE }, Ordering::Release);
        on
    }

    /// Whether it was ever asked to start (on, finished, or failed to start).
    pub fn was_started(&self) -> bool {
        self.0.load(Ordering::Acquire) != OFF
    }

    /// Turns an `on` switch to finished; true for the one caller that did.
    pub fn finish(&self) -> bool {
        self.0.compare_exchange(ON, DONE, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Back to off (a forked child starts afresh).
    pub fn reset(&self) {
        self.0.store(OFF, Ordering::Release);
    }
}
