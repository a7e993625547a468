//! Native captures through C code: a frame without unwind information (and
//! with a hostile frame pointer), a library loaded after the module table was
//! built, and the CUDA runtime's frames trimmed only while they lead.

mod common;

use std::ffi::c_void;
use std::hint::black_box;
use std::sync::OnceLock;

use common::{build_so, eventually, open_symbol, positions, ExeSymbols};
use cupool_capture::native::{capture, capture_raw, init, loaded_modules};

type Callback = unsafe extern "C" fn(*mut c_void) -> u64;
type CallThrough = unsafe extern "C" fn(Callback, *mut c_void) -> u64;
type HostileCall = unsafe extern "C" fn(Callback, *mut c_void, u64) -> u64;

const NO_UNWIND_C: &str = r#"
typedef unsigned long (*callback)(void *);

/* A real frame (stack used, a value live across the call), and no CFI. */
unsigned long nounwind_call(callback cb, void *arg) {
    volatile unsigned long scratch[8];
    for (int i = 0; i < 8; i++) scratch[i] = (unsigned long)arg + i;
    unsigned long r = cb(arg);
    return r + scratch[3];
}

/* hostile_call(cb, arg, fake_rbp): calls cb(arg) with rbp = fake_rbp, so a
   frame-pointer guess through this frame follows whatever fake_rbp holds. */
__asm__(
    ".text\n"
    ".globl hostile_call\n"
    ".type hostile_call, @function\n"
    "hostile_call:\n"
    "    push %rbp\n"
    "    mov %rdx, %rbp\n"
    "    mov %rdi, %rax\n"
    "    mov %rsi, %rdi\n"
    "    call *%rax\n"
    "    pop %rbp\n"
    "    ret\n"
    ".size hostile_call, .-hostile_call\n");
"#;

const NO_UNWIND_FLAGS: &[&str] =
    &["-O2", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-fomit-frame-pointer"];

struct NoUnwind {
    call: CallThrough,
    hostile: HostileCall,
}

fn no_unwind_lib() -> &'static NoUnwind {
    static LIB: OnceLock<NoUnwind> = OnceLock::new();
    LIB.get_or_init(|| {
        let path = build_so("nounwind", "libnounwind.so", NO_UNWIND_C, NO_UNWIND_FLAGS);
        // The premise: the library has no unwind entry for its functions.
        let frames = std::process::Command::new("readelf").arg("--debug-dump=frames").arg(&path).output();
        if let Ok(out) = frames {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(!text.contains(" FDE "), "libnounwind.so has FDEs:\n{text}");
        }
        // SAFETY: `open_symbol` returns the addresses of `nounwind_call` and `hostile_call` in the library
        // just built from `NO_UNWIND_C`, whose prototypes are `CallThrough` and `HostileCall`.
        unsafe {
            NoUnwind {
                call: std::mem::transmute::<usize, CallThrough>(open_symbol(&path, "nounwind_call")),
                hostile: std::mem::transmute::<usize, HostileCall>(open_symbol(&path, "hostile_call")),
            }
        }
    })
}

/// What a callback captured.
struct Captured {
    frames: Vec<u64>,
}

#[inline(never)]
fn marker_inner(len: usize) -> Vec<u64> {
    let mut out = vec![0u64; len];
    let n = capture(black_box(&mut out));
    out.truncate(n);
    out
}

#[inline(never)]
unsafe extern "C" fn marker_callback(arg: *mut c_void) -> u64 {
    // SAFETY: `arg` is the pointer to a live `Captured` that the caller passed through the C library
    // unchanged, and nothing else uses it during the call.
    let captured = unsafe { &mut *(arg as *mut Captured) };
    captured.frames = marker_inner(black_box(64));
    black_box(captured.frames.len() as u64)
}

#[inline(never)]
fn marker_through_nounwind() -> Vec<u64> {
    let mut captured = Captured { frames: Vec::new() };
    let lib = no_unwind_lib();
    // SAFETY: `call` is `nounwind_call` (prototype `CallThrough`); `marker_callback` takes the pointer it is
    // given, here to `captured`, a live `Captured`.
    unsafe { (lib.call)(marker_callback, &mut captured as *mut Captured as *mut c_void) };
    black_box(captured.frames)
}

#[test]
fn frames_above_a_c_function_without_unwind_info_are_found() {
    let syms = ExeSymbols::load();
    let names = eventually(|| {
        let names = syms.names(&marker_through_nounwind());
        names.iter().any(|n| n == "nounwind_call").then_some(names)
    })
    .expect("the C frame is reached once its library is registered");
    // Above the C frame everything has unwind info: found in order. Below it
    // only a frame-pointer guess is left, which may or may not get through.
    assert_eq!(positions(&names, &["marker_inner", "marker_callback", "nounwind_call"]), [0, 1, 2]);
}

#[inline(never)]
fn marker_hostile(fake_rbp: u64) -> Vec<u64> {
    let mut captured = Captured { frames: Vec::new() };
    let lib = no_unwind_lib();
    // SAFETY: `hostile` is `hostile_call` (prototype `HostileCall`), which saves `rbp`, points it at
    // `fake_rbp` for the call and restores it after, so Rust code sees the register preserved; it calls
    // `marker_callback` with `captured`, a live `Captured`.
    unsafe { (lib.hostile)(marker_callback, &mut captured as *mut Captured as *mut c_void, fake_rbp) };
    black_box(captured.frames)
}

#[test]
fn hostile_frame_pointers_below_a_frame_without_unwind_info_end_the_walk() {
    let syms = ExeSymbols::load();
    eventually(|| syms.names(&marker_hostile(0)).iter().any(|n| n == "hostile_call").then_some(()))
        .expect("the C frame is reached once its library is registered");

    let code = marker_hostile as *const () as u64 + 1;
    // Stack words the guess will follow: a frame linked to itself, a pair
    // linked to each other, one pointing far below the stack pointer.
    let mut self_loop = [0u64; 2];
    self_loop[0] = self_loop.as_ptr() as u64;
    self_loop[1] = code;
    let mut pair = [0u64; 4];
    pair[0] = pair.as_ptr() as u64 + 16;
    pair[1] = code;
    pair[2] = pair.as_ptr() as u64;
    pair[3] = code;
    let local = black_box(0u64);
    let below = [&local as *const u64 as u64 - (1 << 20), code];
    let heap = Box::new([0u64, code]);
    let candidates = [
        0,
        1,
        0xdead_beef_0000,
        u64::MAX,
        u64::MAX - 15,
        0xffff_8000_0000_0000,
        &local as *const u64 as u64 - 64 * 1024,
        self_loop.as_ptr() as u64,
        pair.as_ptr() as u64,
        below.as_ptr() as u64,
        heap.as_ptr() as u64,
    ];
    for fake_rbp in candidates {
        // Retried only while other tests' libraries make a new module table
        // be swapped in (captures then return nothing).
        let frames = eventually(|| Some(marker_hostile(black_box(fake_rbp))).filter(|f| !f.is_empty())).unwrap();
        let names = syms.names(&frames);
        assert_eq!(
            positions(&names, &["marker_inner", "marker_callback", "hostile_call"]),
            [0, 1, 2],
            "rbp {fake_rbp:#x}"
        );
        assert!(names.len() <= 64);
    }
    black_box((&self_loop, &pair, &below, &heap));
}

const LATE_C: &str = r#"
typedef unsigned long (*callback)(void *);
unsigned long late_call(callback cb, void *arg) {
    unsigned long r = cb(arg);
    return r + 1;
}
"#;

#[inline(never)]
fn marker_through_late(call: CallThrough) -> Vec<u64> {
    let mut captured = Captured { frames: Vec::new() };
    // SAFETY: `call` is a `late_call` (prototype `CallThrough`) of a library that stays loaded;
    // `marker_callback` takes the pointer to `captured`, a live `Captured`.
    unsafe { call(marker_callback, &mut captured as *mut Captured as *mut c_void) };
    black_box(captured.frames)
}

#[test]
fn a_library_loaded_after_the_first_capture_is_unwound_through() {
    let path = build_so("late", "liblate.so", LATE_C, &["-O2", "-fno-optimize-sibling-calls"]);
    let syms = ExeSymbols::load();
    // The module table exists before the library is loaded.
    init();
    assert!(!marker_inner(8).is_empty());
    assert!(!loaded_modules().iter().any(|m| m.path.ends_with("/liblate.so")));

    // SAFETY: `open_symbol` returns the address of `late_call` in the library just built from `LATE_C`, whose
    // prototype is `CallThrough`.
    let call = unsafe { std::mem::transmute::<usize, CallThrough>(open_symbol(&path, "late_call")) };
    let names = eventually(|| {
        let names = syms.names(&marker_through_late(call));
        names.iter().any(|n| n.contains("marker_through_late")).then_some(names)
    })
    .expect("the walk gets through the late library's frame (its unwind info) to its caller");
    assert_eq!(
        positions(&names, &["marker_inner", "marker_callback", "late_call", "marker_through_late"]),
        [0, 1, 2, 3]
    );
}

const FAKE_CUDART_C: &str = r#"
typedef unsigned long (*capture_fn)(unsigned long *out, unsigned long len);
typedef unsigned long (*callback)(void *);

unsigned long cudart_capture(capture_fn f, unsigned long *out, unsigned long len) {
    return f(out, len); /* a call, not a jump: -fno-optimize-sibling-calls */
}

unsigned long cudart_call(callback cb, void *arg) {
    unsigned long r = cb(arg);
    return r + 1;
}
"#;

type CudartCapture = unsafe extern "C" fn(unsafe extern "C" fn(*mut u64, usize) -> usize, *mut u64, usize) -> usize;

struct FakeCudart {
    capture: CudartCapture,
    call: CallThrough,
}

fn fake_cudart() -> FakeCudart {
    // Named like the CUDA runtime: its frames are trimmed while they lead.
    let path = build_so("cudart", "libcudart.so.99", FAKE_CUDART_C, &["-O2", "-fno-optimize-sibling-calls"]);
    // SAFETY: `open_symbol` returns the addresses of `cudart_capture` and `cudart_call` in the library just
    // built from `FAKE_CUDART_C`, whose prototypes are `CudartCapture` and `CallThrough`.
    unsafe {
        FakeCudart {
            capture: std::mem::transmute::<usize, CudartCapture>(open_symbol(&path, "cudart_capture")),
            call: std::mem::transmute::<usize, CallThrough>(open_symbol(&path, "cudart_call")),
        }
    }
}

#[inline(never)]
fn marker_capture_in_cudart(lib: &FakeCudart) -> Vec<u64> {
    let mut out = vec![0u64; 32];
    // SAFETY: `capture` is `cudart_capture` (prototype `CudartCapture`); it hands `capture_raw` the buffer
    // `out` with its true length, and `capture_raw` writes at most that many frames.
    let n = unsafe { (lib.capture)(capture_raw, out.as_mut_ptr(), out.len()) };
    out.truncate(n);
    black_box(out)
}

#[test]
fn cuda_runtime_frames_are_trimmed_only_while_they_lead() {
    let lib = fake_cudart();
    let syms = ExeSymbols::load();
    let module = |ra: u64| {
        loaded_modules().into_iter().find(|m| (m.start..m.end).contains(&ra)).map(|m| m.path).unwrap_or_default()
    };

    // capture_raw called by the runtime: its frame leads, and goes.
    let frames = eventually(|| Some(marker_capture_in_cudart(&lib)).filter(|f| !f.is_empty()))
        .expect("the runtime's module is registered");
    let names = syms.names(&frames);
    assert!(names[0].contains("marker_capture_in_cudart"), "{names:#?}");
    assert!(frames.iter().all(|&ra| !module(ra).contains("libcudart")), "{names:#?}");

    // The runtime calling back into the program: its frame is below one of
    // the program's, and stays.
    let frames = eventually(|| Some(marker_through_late(lib.call)).filter(|f| !f.is_empty())).unwrap();
    let names = syms.names(&frames);
    assert_eq!(
        positions(&names, &["marker_inner", "marker_callback", "cudart_call", "marker_through_late"]),
        [0, 1, 2, 3]
    );
    assert!(module(frames[2]).ends_with("/libcudart.so.99"));
}

#[inline(never)]
fn marker_steady() -> Vec<u64> {
    let frames = marker_inner(black_box(16));
    black_box(frames)
}

#[test]
fn captures_stay_right_while_libraries_load_and_tables_are_swapped() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;

    init();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (mut reference, mut total, mut empty) = (Vec::new(), 0u64, 0u64);
                while !stop.load(Relaxed) {
                    let frames = marker_steady();
                    total += 1;
                    if frames.is_empty() {
                        // Allowed only while a table swap outlasts the spin.
                        empty += 1;
                    } else if reference.is_empty() {
                        reference = frames;
                    } else {
                        assert_eq!(frames[..2], reference[..2]);
                        assert_eq!(frames.len(), reference.len());
                    }
                }
                (total, empty)
            })
        })
        .collect();

    let syms = ExeSymbols::load();
    for i in 0..6 {
        let path =
            build_so(&format!("swap{i}"), &format!("libswap{i}.so"), LATE_C, &["-O2", "-fno-optimize-sibling-calls"]);
        // SAFETY: `open_symbol` returns the address of `late_call` in the library just built from `LATE_C`,
        // whose prototype is `CallThrough`.
        let call = unsafe { std::mem::transmute::<usize, CallThrough>(open_symbol(&path, "late_call")) };
        eventually(|| {
            syms.names(&marker_through_late(call)).iter().any(|n| n.contains("marker_through_late")).then_some(())
        })
        .unwrap_or_else(|| panic!("libswap{i}.so is unwound through"));
    }
    stop.store(true, Relaxed);
    for t in threads {
        let (total, empty) = t.join().unwrap();
        assert!(total > 0 && empty < total, "{empty} of {total} captures empty");
        eprintln!("{empty} of {total} captures empty");
    }
}
