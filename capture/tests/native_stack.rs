//! Native captures from Rust code: the callers are found, in order, in the
//! test executable; deep stacks are cut at the buffer; many threads at once.

mod common;

#[cfg(target_arch = "x86_64")]
use std::ffi::c_void;
use std::hint::black_box;
use std::path::Path;
use std::sync::{Arc, Barrier};

use common::{positions, ExeSymbols};
use cupool_capture::native::{capture, init, loaded_modules, memo_hits, MAX_FRAMES};

#[inline(never)]
fn marker_gamma(len: usize) -> Vec<u64> {
    let mut out = vec![0u64; len];
    let n = capture(black_box(&mut out));
    out.truncate(n);
    out
}

#[inline(never)]
fn marker_beta(len: usize) -> Vec<u64> {
    let frames = marker_gamma(black_box(len));
    black_box(frames)
}

#[inline(never)]
fn marker_alpha(len: usize) -> Vec<u64> {
    let frames = marker_beta(black_box(len));
    black_box(frames)
}

/// A named caller: the harness may inline the test function itself into its
/// own code.
#[inline(never)]
fn marker_root(len: usize) -> Vec<u64> {
    let frames = marker_alpha(black_box(len));
    black_box(frames)
}

// Tests start on several threads at once: `init` has each wait for the
// module table (a capture would return 0 frames while another thread builds it).

#[test]
fn the_callers_are_found_in_order_in_the_test_executable() {
    init();
    let frames = marker_root(32);
    let syms = ExeSymbols::load();
    let names = syms.names(&frames);
    // The first frame is the caller of `capture`: nothing of the capture itself.
    assert!(names[0].contains("marker_gamma"), "{names:#?}");
    assert_eq!(positions(&names, &["marker_gamma", "marker_beta", "marker_alpha", "marker_root"]), [0, 1, 2, 3]);

    let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
    let modules = loaded_modules();
    let module_of = |ra: u64| modules.iter().find(|m| (m.start..m.end).contains(&ra)).map(|m| Path::new(&m.path));
    for &ra in &frames[..4] {
        assert_eq!(module_of(ra), Some(exe.as_path()), "{ra:#x}");
    }
    // Below the test function: the harness, std, then libc's thread start.
    assert!(frames.len() > 6, "{names:#?}");
    assert!(
        frames.iter().any(|&ra| module_of(ra).is_some_and(|p| p.to_string_lossy().contains("libc.so"))),
        "{names:#?}"
    );
}

#[test]
fn an_empty_buffer_gets_nothing() {
    assert_eq!(marker_alpha(0), Vec::<u64>::new());
}

#[inline(never)]
fn recurse(depth: usize, len: usize) -> Vec<u64> {
    let frames = if depth == 0 { marker_gamma(len) } else { recurse(black_box(depth - 1), len) };
    black_box(frames)
}

#[test]
fn a_deep_stack_is_cut_at_the_buffer_length() {
    init();
    let syms = ExeSymbols::load();
    for len in [64, 32] {
        let frames = recurse(1500, len);
        assert_eq!(frames.len(), len);
        let names = syms.names(&frames);
        assert!(names[0].contains("marker_gamma"), "{names:#?}");
        assert!(names[1..].iter().all(|n| n.contains("recurse")), "{names:#?}");
    }
    // A buffer longer than the step bound gets exactly the bound.
    assert_eq!(recurse(1500, MAX_FRAMES + 100).len(), MAX_FRAMES);
}

/// A thread stack far below the default 8 MiB that an optimised capture fits
/// in. Unoptimised, a thread's first capture builds framehop's caches on the
/// stack before it boxes them (about 32 KiB each, and copies), so a debug
/// build needs over 128 KiB: it gets a stack of 256 KiB, still far below the
/// default and of a size the thread set itself.
const SMALL_STACK: usize = if cfg!(debug_assertions) { 256 << 10 } else { 64 << 10 };

#[test]
fn a_small_thread_stack_is_walked_to_its_start() {
    init();
    let frames =
        std::thread::Builder::new().stack_size(SMALL_STACK).spawn(|| marker_alpha(64)).unwrap().join().unwrap();
    let names = ExeSymbols::load().names(&frames);
    assert_eq!(positions(&names, &["marker_gamma", "marker_beta", "marker_alpha"]), [0, 1, 2]);
    // The walk reaches the thread's start routine (clone3 / start_thread in libc).
    assert!(frames.len() > 4 && frames.len() < 64, "{names:#?}");
}

#[test]
fn eight_threads_capture_at_once() {
    init();
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let mut first = Vec::new();
                for i in 0..2000 {
                    let frames = marker_alpha(32);
                    if i == 0 {
                        first = frames;
                    } else {
                        // The markers' return addresses, and a stack as deep
                        // (the loop's own call site may differ once unrolled).
                        assert_eq!(frames[..3], first[..3]);
                        assert_eq!(frames.len(), first.len());
                    }
                }
                first
            })
        })
        .collect();
    let syms = ExeSymbols::load();
    for t in threads {
        let names = syms.names(&t.join().unwrap());
        assert_eq!(positions(&names, &["marker_gamma", "marker_beta", "marker_alpha"]), [0, 1, 2]);
    }
}

#[test]
fn loaded_modules_names_the_executable_and_libc_with_build_ids() {
    let modules = loaded_modules();
    let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
    let exe_module = modules.iter().find(|m| Path::new(&m.path) == exe).expect("the executable by its path");
    let marker = marker_alpha as *const () as u64;
    assert!((exe_module.start..exe_module.end).contains(&marker));
    assert!(exe_module.base <= exe_module.start);

    let libc = modules.iter().find(|m| m.path.contains("/libc.so")).expect("libc");
    assert!(!libc.build_id.is_empty());
    let printf = libc::printf as *const () as u64;
    assert!((libc.start..libc.end).contains(&printf));

    assert!(modules.iter().all(|m| m.start < m.end && !m.path.is_empty()), "{modules:#?}");
    // No two modules overlap.
    let mut ranges: Vec<_> = modules.iter().map(|m| (m.start, m.end)).collect();
    ranges.sort();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "{ranges:x?}");
}

/// One function calling the markers from two places: the capture point's
/// registers are the same either way, only a return address deeper down differs.
#[inline(never)]
fn marker_twin(left: bool, len: usize) -> Vec<u64> {
    if black_box(left) {
        let frames = marker_alpha(black_box(len));
        black_box(1);
        frames
    } else {
        let frames = marker_alpha(black_box(len));
        black_box(2);
        frames
    }
}

#[test]
fn a_call_site_in_a_loop_is_answered_from_memory_and_only_with_its_own_stack() {
    init();
    std::thread::spawn(|| {
        let hits = memo_hits();
        let mut first: [Vec<u64>; 2] = Default::default();
        for i in 0..1000 {
            let which = i % 3 == 0;
            let frames = marker_twin(which, 32);
            if first[which as usize].is_empty() {
                first[which as usize] = frames;
            } else {
                assert_eq!(frames, first[which as usize], "capture {i}");
            }
        }
        let [right, left] = first;
        assert_eq!(left[..3], right[..3]);
        assert_ne!(left[3], right[3], "the two call sites in marker_twin");
        assert_eq!(left[4..], right[4..]);
        let names = ExeSymbols::load().names(&left);
        assert_eq!(positions(&names, &["marker_gamma", "marker_beta", "marker_alpha", "marker_twin"]), [0, 1, 2, 3]);
        // Both walks are remembered and told apart by the words they read.
        assert!(memo_hits() - hits >= 990, "{} of 1000 captures answered from memory", memo_hits() - hits);
    })
    .join()
    .unwrap();
}

// A frame as optimised code makes it: no frame pointer, the caller's rbp
// saved in the prologue, and rbp then holding a value of its own (here the
// first argument) across a call. A loop's counter or pointer often lives
// there, so every capture below it finds other words in that slot and in
// the register.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl cupool_test_call_with_bp",
    ".type cupool_test_call_with_bp, @function",
    "cupool_test_call_with_bp:",
    ".cfi_startproc",
    "push rbp",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset rbp, -16",
    "mov rbp, rdi",
    "mov rdi, rdx",
    "call rsi",
    "pop rbp",
    ".cfi_def_cfa_offset 8",
    "ret",
    ".cfi_endproc",
    ".size cupool_test_call_with_bp, .-cupool_test_call_with_bp",
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    /// Calls `f(arg)` with `bp` in rbp.
    fn cupool_test_call_with_bp(bp: u64, f: extern "C" fn(*mut c_void), arg: *mut c_void);
}

#[cfg(target_arch = "x86_64")]
extern "C" fn capture_below_bp_frame(out: *mut c_void) {
    // SAFETY: the callers pass a live, unaliased `Vec<u64>`.
    let out = unsafe { &mut *out.cast::<Vec<u64>>() };
    *out = marker_alpha(black_box(32));
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_caller_keeping_its_own_values_in_rbp_is_answered_from_memory() {
    init();
    std::thread::spawn(|| {
        let hits = memo_hits();
        let mut first = Vec::new();
        for i in 0..1000u64 {
            let mut frames = Vec::new();
            // SAFETY: the assembly above saves and restores rbp and keeps the
            // stack aligned; `frames` outlives the call.
            unsafe { cupool_test_call_with_bp(0x5eed_0000 + i * 24, capture_below_bp_frame, (&raw mut frames).cast()) };
            if first.is_empty() {
                first = frames;
            } else {
                assert_eq!(frames, first, "capture {i}");
            }
        }
        let names = ExeSymbols::load().names(&first);
        assert_eq!(positions(&names, &["marker_gamma", "marker_beta", "marker_alpha"]), [0, 1, 2]);
        let start = cupool_test_call_with_bp as *const () as u64;
        assert!(
            first.iter().any(|&ra| (start..start + 16).contains(&ra)),
            "the frame of the assembly is among the callers"
        );
        assert!(memo_hits() - hits >= 990, "{} of 1000 captures answered from memory", memo_hits() - hits);
    })
    .join()
    .unwrap();
}

// A frame whose unwind rule goes by the frame pointer (CFA = rbp + 16), with
// rbp pointing at a frame record of the caller's choosing: the walk's next
// return address is whatever that record holds, so it depends on rbp's value.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl cupool_test_call_through_record",
    ".type cupool_test_call_through_record, @function",
    "cupool_test_call_through_record:",
    ".cfi_startproc",
    "push rbp",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset rbp, -16",
    "mov rbp, rdi",
    ".cfi_def_cfa rbp, 16",
    "mov rdi, rdx",
    "call rsi",
    ".cfi_def_cfa rsp, 16",
    "pop rbp",
    ".cfi_def_cfa_offset 8",
    "ret",
    ".cfi_endproc",
    ".size cupool_test_call_through_record, .-cupool_test_call_through_record",
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    /// Calls `f(arg)` with rbp at `record`, a frame record [saved rbp,
    /// return address] that the unwinder follows from this frame.
    fn cupool_test_call_through_record(record: *const u64, f: extern "C" fn(*mut c_void), arg: *mut c_void);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_frame_pointer_a_rule_goes_by_is_checked_before_a_walk_is_answered_from_memory() {
    init();
    std::thread::spawn(|| {
        // Two frame records on this thread's stack, each returning into a
        // different function and ending the walk there (a zero word next).
        let (a, b) = (marker_gamma as *const () as u64 + 1, marker_beta as *const () as u64 + 1);
        let records = black_box([[0u64, a, 0, 0, 0, 0], [0, b, 0, 0, 0, 0]]);
        for i in 0..200 {
            let (record, expected) = if i % 2 == 0 { (&records[0], a) } else { (&records[1], b) };
            let mut frames = Vec::new();
            // SAFETY: the assembly above saves and restores rbp and keeps the
            // stack aligned; the records and `frames` outlive the call.
            unsafe {
                cupool_test_call_through_record(record.as_ptr(), capture_below_bp_frame, (&raw mut frames).cast())
            };
            assert_eq!(frames.last(), Some(&expected), "capture {i}: {frames:x?}");
        }
        black_box(&records);
    })
    .join()
    .unwrap();
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_frame_record_that_ends_the_stack_is_told_from_one_that_goes_on() {
    init();
    std::thread::spawn(|| {
        // The first record ends the walk there (a return address of 0),
        // the second goes on into another function.
        let b = marker_beta as *const () as u64 + 1;
        let records = black_box([[0u64, 0, 0, 0, 0, 0], [0, b, 0, 0, 0, 0]]);
        let start = cupool_test_call_through_record as *const () as u64;
        for i in 0..200 {
            let record = &records[i % 2];
            let mut frames = Vec::new();
            // SAFETY: as in the test above.
            unsafe {
                cupool_test_call_through_record(record.as_ptr(), capture_below_bp_frame, (&raw mut frames).cast())
            };
            let last = *frames.last().expect("frames");
            if i % 2 == 0 {
                assert!((start..start + 32).contains(&last), "capture {i} ends in the assembly: {frames:x?}");
            } else {
                assert_eq!(last, b, "capture {i}: {frames:x?}");
            }
        }
        black_box(&records);
    })
    .join()
    .unwrap();
}

// A frame whose rule framehop cannot reduce to one of its cached forms (the
// CFA 32 bytes above rbp): it runs the module's DWARF rule every time, and
// a failed try at it would leave a frame-pointer rule (CFA 16 above rbp)
// in the cache it ran on.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl cupool_test_call_with_rbp_cfa",
    ".type cupool_test_call_with_rbp_cfa, @function",
    "cupool_test_call_with_rbp_cfa:",
    ".cfi_startproc",
    "push rbp",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset rbp, -16",
    "sub rsp, 16",
    ".cfi_def_cfa_offset 32",
    // Zeroes where a frame-pointer rule would look (rbp and rbp + 8).
    "mov qword ptr [rsp], 0",
    "mov qword ptr [rsp + 8], 0",
    "mov rbp, rsp",
    ".cfi_def_cfa rbp, 32",
    "mov rax, rdi",
    "mov rdi, rsi",
    "call rax",
    ".cfi_def_cfa rsp, 32",
    "add rsp, 16",
    ".cfi_def_cfa_offset 16",
    "pop rbp",
    ".cfi_def_cfa_offset 8",
    "ret",
    ".cfi_endproc",
    ".size cupool_test_call_with_rbp_cfa, .-cupool_test_call_with_rbp_cfa",
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    /// Calls `f(arg)` from a frame whose CFA is rbp + 32.
    fn cupool_test_call_with_rbp_cfa(f: extern "C" fn(*mut c_void), arg: *mut c_void);
}

/// `arg` is a `Vec<u64>`: captured below the frame of rbp + 32.
#[cfg(target_arch = "x86_64")]
extern "C" fn through_rbp_cfa(arg: *mut c_void) {
    // SAFETY: the assembly passes `f` and `arg` on; `arg` is a live `Vec<u64>`.
    unsafe { cupool_test_call_with_rbp_cfa(capture_below_bp_frame, arg) };
}

/// The same, from another call site in Rust: a walk no memory answers.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn fresh_walk_through_rbp_cfa() -> Vec<u64> {
    let mut frames: Vec<u64> = Vec::new();
    // SAFETY: as above.
    unsafe { cupool_test_call_with_rbp_cfa(capture_below_bp_frame, (&raw mut frames).cast()) };
    black_box(frames)
}

#[cfg(target_arch = "x86_64")]
#[test]
fn trying_rules_on_near_misses_leaves_later_walks_as_they_were() {
    init();
    std::thread::spawn(|| {
        let symbols = ExeSymbols::load();
        // The frames from the capture up to the assembly's caller, and how
        // many frames the walk found in all.
        let through_assembly = |frames: &[u64]| {
            let names = symbols.names(frames);
            assert_eq!(positions(&names, &["marker_gamma", "marker_beta", "marker_alpha"]), [0, 1, 2]);
            let caller = names.iter().position(|n| n.contains("fresh_walk_through_rbp_cfa"));
            let caller = caller.unwrap_or_else(|| panic!("walked past the assembly: {names:?}"));
            (frames[..=caller].to_vec(), frames.len())
        };
        let before = through_assembly(&fresh_walk_through_rbp_cfa());
        // Near misses under the frame of rbp + 32: the frame pointer above
        // it varies.
        for i in 0..200u64 {
            let mut frames: Vec<u64> = Vec::new();
            // SAFETY: as in the tests above.
            unsafe { cupool_test_call_with_bp(0x5eed_0000 + i * 24, through_rbp_cfa, (&raw mut frames).cast()) };
            assert!(frames.len() > 5, "capture {i}: {frames:x?}");
        }
        // Walks of other lengths take every slot of the thread's memory: the
        // next walk through the assembly is walked, not recalled.
        for len in 9..9 + 8 {
            black_box(marker_alpha(len));
        }
        assert_eq!(through_assembly(&fresh_walk_through_rbp_cfa()), before);
    })
    .join()
    .unwrap();
}
