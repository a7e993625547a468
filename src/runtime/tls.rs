//! Thread-locals of the hot path in static TLS.
//!
//! `thread_local!` in a shared object reaches its variable through
//! `__tls_get_addr`, a call per access: 10–15 of them per pooled
//! `cudaMalloc`+`cudaFree` pair. On x86-64 Linux, [`static_tls!`] places a
//! variable in the initial-exec model instead: the thread pointer plus an
//! offset the dynamic linker put in the GOT, two loads. The shim is loaded at
//! start-up (`LD_PRELOAD`), where static TLS is always available. One such
//! variable makes the shim's whole TLS segment static, so that segment is
//! kept small (496 bytes, within the 512 bytes glibc keeps by default
//! for objects loaded later): large per-thread buffers live on the heap.
//! Elsewhere the macro falls back to `thread_local!`.
//!
//! Only for types that are valid all-zero (the initial value, as `.tbss`
//! is) and have no destructor: cells of integers and pointers.

/// `static_tls!(NAME: Type);` declares a zero-initialised thread-local;
/// `NAME.with(|v: &Type| ...)` reaches it. NAME must be unique in the shim
/// (it names an assembler symbol).
macro_rules! static_tls {
    ($(#[$meta:meta])* $vis:vis $name:ident: $t:ty;) => {
        $(#[$meta])*
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        $vis struct $name;

        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        std::arch::global_asm!(
            ".pushsection .tbss,\"awT\",@nobits",
            ".p2align {align}",
            // Global for the link (codegen units are separate objects),
            // hidden from every other module.
            concat!(".globl cupool_tls_", stringify!($name)),
            concat!(".hidden cupool_tls_", stringify!($name)),
            concat!(".type cupool_tls_", stringify!($name), ",@object"),
            concat!(".size cupool_tls_", stringify!($name), ",{size}"),
            concat!("cupool_tls_", stringify!($name), ":"),
            ".zero {size}",
            ".popsection",
            align = const std::mem::align_of::<$t>().trailing_zeros(),
            size = const std::mem::size_of::<$t>(),
            options(att_syntax)
        );

        impl $name {
            /// Runs `f` on this thread's copy.
            #[inline(always)]
            $vis fn with<R>(&self, f: impl FnOnce(&$t) -> R) -> R {
                #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
                {
                    let p: usize;
                    // SAFETY: the thread pointer plus the variable's offset
                    // from it, which the dynamic linker stored in the GOT:
                    // this thread's copy, which no other thread reaches.
                    unsafe {
                        std::arch::asm!(
                            concat!("movq cupool_tls_", stringify!($name), "@GOTTPOFF(%rip), {p}"),
                            "addq %fs:0, {p}",
                            p = out(reg) p,
                            // `addq` sets the flags: they are not preserved.
                            options(att_syntax, pure, readonly, nostack)
                        )
                    };
                    // SAFETY: aligned, zero-initialised at thread start, and
                    // valid all-zero (the macro's contract); `$t` is not
                    // `Sync`-shared: the reference does not leave `f`.
                    f(unsafe { &*(p as *const $t) })
                }
                #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
                {
                    // One per macro use: a static in a function is not
                    // copied per instantiation.
                    thread_local! {
                        // SAFETY (of the zeroes): the macro's contract.
                        static FALLBACK: $t = const { unsafe { std::mem::zeroed() } };
                    }
                    FALLBACK.with(f)
                }
            }
        }
    };
}

pub(crate) use static_tls;

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    static_tls! {
        PROBE: Cell<(u64, u32)>;
    }

    #[test]
    fn each_thread_has_its_own_zeroed_copy() {
        PROBE.with(|p| p.set((7, 8)));
        let seen_elsewhere = std::thread::spawn(|| {
            let first = PROBE.with(Cell::get);
            PROBE.with(|p| p.set((1, 2)));
            (first, PROBE.with(Cell::get))
        })
        .join()
        .unwrap();
        assert_eq!(seen_elsewhere, ((0, 0), (1, 2)), "a new thread starts at zero and keeps its own");
        assert_eq!(PROBE.with(Cell::get), (7, 8), "another thread's writes are not seen here");
    }
}
