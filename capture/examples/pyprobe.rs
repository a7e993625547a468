//! A library Python loads with ctypes to check `cupool_capture::python`
//! against a live interpreter (capture/tests/pyprobe_check.py drives it):
//!
//! ```text
//! cargo build --release -p cupool-capture --example pyprobe
//! python3 capture/tests/pyprobe_check.py target/release/examples/libpyprobe.so
//! ```
//!
//! Frames are written as records separated by 0x1e, each "file 0x1f function
//! 0x1f line", innermost first.

use std::ffi::{c_char, c_int};
use std::fmt::Write as _;
use std::time::Instant;

use cupool_capture::python::{capture, describe, frame_of_code, status, PyFrame};

const MAX_FRAMES: usize = 512;

/// Copies `text` and a NUL into `buf`; false if it does not fit.
unsafe fn put(text: &str, buf: *mut c_char, cap: usize) -> bool {
    if buf.is_null() || text.len() + 1 > cap {
        return false;
    }
    std::ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, text.len());
    *buf.add(text.len()) = 0;
    true
}

/// What `capture` and `describe` say on this thread, as text.
fn stack_text(max_frames: usize) -> (usize, String) {
    let mut frames = [PyFrame::default(); MAX_FRAMES];
    let n = capture(&mut frames[..max_frames.min(MAX_FRAMES)]);
    let mut text = String::new();
    for (i, f) in frames[..n].iter().enumerate() {
        if i > 0 {
            text.push('\x1e');
        }
        match describe(f) {
            Some(info) => write!(text, "{}\x1f{}\x1f{}", info.file, info.function, info.line).unwrap(),
            None => text.push_str("<undescribed>\x1f<undescribed>\x1f0"),
        }
    }
    (n, text)
}

/// The status line, as `status()` gives it.
///
/// # Safety
/// `buf` is null or holds `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn pyprobe_status(buf: *mut c_char, cap: usize) -> c_int {
    put(&status().to_string(), buf, cap) as c_int
}

/// The calling thread's frames (at most `max_frames`) into `buf`; returns
/// how many were captured, -1 if `buf` is too small.
///
/// # Safety
/// `buf` is null or holds `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn pyprobe_stack(buf: *mut c_char, cap: usize, max_frames: usize) -> i64 {
    let (n, text) = stack_text(max_frames);
    if put(&text, buf, cap) {
        n as i64
    } else {
        -1
    }
}

/// As `pyprobe_stack`, from a native thread spawned here, which never ran
/// Python.
///
/// # Safety
/// `buf` is null or holds `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn pyprobe_stack_new_thread(buf: *mut c_char, cap: usize, max_frames: usize) -> i64 {
    let Ok((n, text)) = std::thread::spawn(move || stack_text(max_frames)).join() else { return -2 };
    if put(&text, buf, cap) {
        n as i64
    } else {
        -1
    }
}

/// Describes code object `code` (its `id()`) at byte offset `lasti`, as
/// `pyprobe_stack` writes one frame; returns 0 if it is not a code object or
/// could not be described, -1 if `buf` is too small.
///
/// # Safety
/// `code` is 0 or a live object; `buf` is null or holds `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn pyprobe_describe_code(code: u64, lasti: u32, buf: *mut c_char, cap: usize) -> i64 {
    let Some(info) = frame_of_code(code, lasti).as_ref().and_then(describe) else { return 0 };
    let text = format!("{}\x1f{}\x1f{}", info.file, info.function, info.line);
    if put(&text, buf, cap) {
        1
    } else {
        -1
    }
}

/// Nanoseconds per `capture` call of at most `max_frames` frames, over
/// `iters` calls; the frame count of the last call goes to `frames`.
///
/// # Safety
/// `frames` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn pyprobe_bench(iters: u64, max_frames: usize, frames: *mut i64) -> f64 {
    let mut out = [PyFrame::default(); MAX_FRAMES];
    let out = &mut out[..max_frames.min(MAX_FRAMES)];
    let mut n = 0;
    let start = Instant::now();
    for _ in 0..iters {
        n = capture(std::hint::black_box(&mut *out));
    }
    let elapsed = start.elapsed();
    if !frames.is_null() {
        *frames = n as i64;
    }
    elapsed.as_nanos() as f64 / iters.max(1) as f64
}
