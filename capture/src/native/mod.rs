//! Native stacks: DWARF (`.eh_frame`) unwinding of the calling thread, in
//! process, with framehop.
//!
//! A capture reads three registers where it stands, then lets framehop
//! unwind from there, frame by frame, through the unwind tables of every
//! loaded module (frame pointers only where a module has none). A walk
//! from the same registers over the same stack words as one of the thread's
//! last few is not made again: its frames are remembered (`memo`); a frame
//! pointer value that no frame's rule used (a caller's own value in rbp,
//! saved by its callee) is left out of that comparison. Stack
//! memory is read only between the capture point and the top of the
//! calling thread's stack. After a thread's first capture, a capture
//! allocates nothing, makes no system call and waits on no lock, unless a
//! return address lies outside every module known: then it may rescan the
//! loaded modules (at most ten times a second process-wide, see `table`).
//!
//! A capture returns 0 frames rather than wait: on a thread whose stack
//! bounds are unknown or off its stack (an alternate signal stack), when
//! re-entered on the same thread (a signal handler), during thread teardown,
//! while another thread builds the first module table (hence [`init`]), or
//! in the rare moment a new table is swapped in (a thread's first capture
//! waits up to 2 ms for the table's lock instead: threads that start
//! capturing at once would otherwise fail their first captures in turn).
//!
//! x86_64 only: elsewhere [`capture`] returns 0.

#[cfg(target_arch = "x86_64")]
mod memo;
mod modules;
#[cfg(target_arch = "x86_64")]
mod regs;
#[cfg(target_arch = "x86_64")]
mod table;
#[cfg(target_arch = "x86_64")]
mod unwind;

/// One loaded module (executable or shared object), for the log: reports map
/// return addresses back to a file and symbolise them from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    /// Path as the dynamic linker has it (the executable's resolved path for "").
    pub path: String,
    /// Load bias: runtime address = file virtual address + `base`.
    pub base: u64,
    /// Runtime address range of the module's mapped segments, `[start, end)`.
    pub start: u64,
    pub end: u64,
    /// The GNU build id, empty when the module has none.
    pub build_id: Vec<u8>,
}

/// The most frames one capture unwinds (kept and trimmed together): `out`
/// beyond this is never filled.
#[cfg(target_arch = "x86_64")]
pub const MAX_FRAMES: usize = unwind::MAX_STEPS;
#[cfg(not(target_arch = "x86_64"))]
pub const MAX_FRAMES: usize = 0;

/// The instruction pointer, stack pointer and frame pointer where this
/// expands. It must expand in the body of the function whose frame stays
/// live during the walk: the walk starts from this very frame.
#[cfg(target_arch = "x86_64")]
macro_rules! registers_here {
    () => {{
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: copies three registers; touches neither memory nor the stack.
        unsafe {
            core::arch::asm!(
                "lea {ip}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                ip = out(reg) ip,
                sp = out(reg) sp,
                bp = out(reg) bp,
                options(nomem, nostack, preserves_flags),
            )
        };
        regs::Regs { ip, sp, bp }
    }};
}

/// Walks the stack from the frame of the function this expands in (see
/// `registers_here`) into `$out` (see [`capture_known`] for `$known`); no
/// frames where there is no unwinder.
macro_rules! capture_from_this_frame {
    ($out:expr, $known:expr) => {{
        #[cfg(target_arch = "x86_64")]
        {
            let regs = registers_here!();
            let walk = unwind::capture_from(&regs, $out, $known);
            // Keeps this frame (which the walk read) from being replaced by a
            // tail call while the walk runs.
            std::hint::black_box(&regs);
            walk
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = ($out, $known);
            Walk { frames: 0, serial: 0 }
        }
    }};
}

/// What a capture gave: how many frames, and which of the calling thread's
/// walks they came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    pub frames: usize,
    /// A number for this walk, unique on the calling thread, while the walk
    /// is remembered (`memo.rs`): a later capture with the same serial
    /// returned the same frames. 0: not remembered.
    pub serial: u64,
}

/// Fills `out` with the calling thread's return addresses, innermost first,
/// without the frames of cupool, the CUDA runtime and the driver at the top.
/// Returns how many it wrote (0 when nothing could be unwound).
///
/// "cupool" is the module that holds this crate, unless that module is the
/// executable (a test, a benchmark): then only this function's own frame is
/// left out. The CUDA runtime and driver are the modules whose file names
/// start with `libcudart` and `libcuda.so`. They are left out only while
/// they lead the stack.
#[inline(never)]
pub fn capture(out: &mut [u64]) -> usize {
    capture_from_this_frame!(out, 0).frames
}

/// [`capture`], for a caller that keeps the frames of the walk numbered
/// `known` (from an earlier [`Walk`], 0 for none): when the capture repeats
/// that walk, `out` is left as it is and the serial says so. A caller that
/// keeps derived data per walk (an id for the stack) then needs neither the
/// frames copied nor compared.
#[inline(never)]
pub fn capture_known(out: &mut [u64], known: u64) -> Walk {
    capture_from_this_frame!(out, known)
}

/// [`capture`] for callers across a C ABI (a hook written in C, a helper
/// library): the frame of whoever calls this is the first one considered.
///
/// # Safety
/// `out` must be valid for writes of `len` `u64`s (or `len` must be 0).
#[inline(never)]
pub unsafe extern "C" fn capture_raw(out: *mut u64, len: usize) -> usize {
    if out.is_null() || len == 0 {
        return 0;
    }
    // SAFETY: the caller guarantees `len` writable words at `out`.
    let out = unsafe { std::slice::from_raw_parts_mut(out, len) };
    capture_from_this_frame!(out, 0).frames
}

/// Captures on the calling thread answered from a remembered walk instead of
/// a new one (a call site in a loop): for tests and benchmarks.
pub fn memo_hits() -> u64 {
    #[cfg(target_arch = "x86_64")]
    return unwind::memo_hits();
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// Registers the modules loaded now, so that the first captures neither pay
/// for it nor, on other threads meanwhile, come back empty. Waits (a bounded
/// time) for a registration another thread has under way. Optional: the
/// first capture registers them otherwise. Not from a signal handler.
pub fn init() {
    #[cfg(target_arch = "x86_64")]
    let _ = std::panic::catch_unwind(table::init);
}

/// The modules loaded now.
pub fn loaded_modules() -> Vec<ModuleInfo> {
    std::panic::catch_unwind(modules::list).unwrap_or_default()
}

/// Call right before `fork()`, on the thread that forks; then call
/// [`unlock_after_fork`] in both the parent and the child.
///
/// It takes the locks a rescan holds, so that the child does not inherit one
/// held by a thread that does not exist there (its captures would then fail
/// or it could never register a module again). It waits a bounded time for
/// them, and forks unlocked rather than wait longer.
pub fn lock_for_fork() {
    #[cfg(target_arch = "x86_64")]
    let _ = std::panic::catch_unwind(table::lock_for_fork);
}

/// Releases what [`lock_for_fork`] took.
///
/// # Safety
/// Call it only right after `fork()` returns, in the parent or the child, on
/// the thread that called [`lock_for_fork`], once per `lock_for_fork`.
pub unsafe fn unlock_after_fork() {
    #[cfg(target_arch = "x86_64")]
    let _ = std::panic::catch_unwind(table::unlock_after_fork);
}
