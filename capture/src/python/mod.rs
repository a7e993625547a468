//! Python frames of the calling thread, read without the GIL.
//!
//! The hook that calls [`capture`] usually runs without the GIL (PyTorch and
//! ctypes release it around native calls), so nothing here takes it or calls
//! any CPython function that needs it or touches reference counts. What is
//! read instead is the calling thread's own frame chain, the way an external
//! profiler reads a stopped thread: while this thread is inside the hook, its
//! Python frames cannot change or go away.
//!
//! Which CPython runs, and where its structures keep what we need, is decided
//! once by the probe (`probe.rs`, layouts in `layouts.rs`); only a version
//! identified positively is read, anything else makes [`capture`] return 0
//! and [`status`] say why.

mod frames;
mod layouts;
mod linetable;
mod probe;
mod read;

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use probe::{Found, Runtime};

/// One Python frame as captured: enough to tell frames apart cheaply. Names
/// and lines are worked out by [`describe`] only for stacks not seen before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// Address of the code object.
    pub code: u64,
    /// Tells a code object from a later one at the same address.
    pub tag: u64,
    /// Instruction offset in the code object, in bytes.
    pub lasti: u32,
}

/// What a report shows of one Python frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameInfo {
    /// `co_filename`, "?" if it could not be read.
    pub file: String,
    /// `co_qualname` (3.11+) or `co_name` (3.10), "?" if it could not be read.
    pub function: String,
    /// 0 when unknown.
    pub line: u32,
}

/// Whether this process's Python frames can be captured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// No CPython is loaded (so far: [`capture`] looks again now and then,
    /// [`status`] every time).
    NoPython,
    /// CPython `major.minor` runs and its frames are captured.
    Supported { major: u8, minor: u8 },
    /// CPython runs but its frames are not read: [`capture`] returns 0.
    /// `major` and `minor` are 0 when the version itself was not recognised.
    Unsupported { major: u8, minor: u8, reason: &'static str },
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Status::NoPython => write!(f, "no Python in this process"),
            Status::Supported { major, minor } => write!(f, "Python {major}.{minor} supported"),
            Status::Unsupported { major: 0, minor: 0, reason } => {
                write!(f, "Python of unknown version not supported ({reason}): no Python frames")
            }
            Status::Unsupported { major, minor, reason } => {
                write!(f, "Python {major}.{minor} not supported ({reason}): no Python frames")
            }
        }
    }
}

/// Set once a Python was found, supported or not; never reset (a loaded
/// interpreter is not unloaded).
static FOUND: OnceLock<Found> = OnceLock::new();
/// One thread probes at a time; the others go on without Python frames
/// rather than wait inside a hook.
static PROBING: AtomicBool = AtomicBool::new(false);
/// Calls of `capture` while no Python was found, to look again only every
/// `LOOK_EVERY` calls: a look is a few dynamic-linker lookups (microseconds),
/// and a program embedding Python may load it at any time.
static MISSES: AtomicU32 = AtomicU32::new(0);
/// How often [`capture`] looks for Python while none was found (in calls);
/// a caller of [`capture_found`] that counts on its own looks as often.
pub const LOOK_EVERY: u32 = 1024;
/// The loader's count of objects loaded (`dlpi_adds`) at the last look that
/// found no Python. A look asks the dynamic linker for a dozen missing
/// symbols, about 9 µs: every 1024 calls that was 9 ns on each allocation of
/// a program without Python. Python appears only with a new object, so a
/// look is made only when the count moved, and every `LOOK_ANYWAY`th time
/// regardless (an object counted while its `dlopen` had not yet made its
/// symbols visible would otherwise never be looked at again).
static LOOKED_AT_ADDS: AtomicU64 = AtomicU64::new(0);
const LOOK_ANYWAY: u32 = 64;

fn probe_now() -> Option<&'static Found> {
    if PROBING.swap(true, Ordering::Acquire) {
        return FOUND.get();
    }
    if FOUND.get().is_none() {
        LOOKED_AT_ADDS.store(objects_loaded(), Ordering::Relaxed);
        // Caught here, not by the callers' catch_unwind, so that PROBING is
        // cleared whatever happens.
        if let Ok(Some(found)) = catch_unwind(probe::probe) {
            let _ = FOUND.set(found);
        }
    }
    PROBING.store(false, Ordering::Release);
    FOUND.get()
}

#[inline]
fn runtime() -> Option<&'static Runtime> {
    let found = match FOUND.get() {
        Some(found) => found,
        None => {
            // Counted without a read-modify-write (every allocation of a
            // program without Python comes here): threads that meet may lose
            // a count, and look again a little later.
            let misses = MISSES.load(Ordering::Relaxed);
            MISSES.store(misses.wrapping_add(1), Ordering::Relaxed);
            if !misses.is_multiple_of(LOOK_EVERY) {
                return None;
            }
            look()?
        }
    };
    supported(found)
}

fn supported(found: &Found) -> Option<&Runtime> {
    match found {
        Found::Supported(rt) => Some(rt),
        Found::Unsupported { .. } => None,
    }
}

/// Looks for Python, if none was found yet and the loader loaded an object
/// since the last look (or every `LOOK_ANYWAY`th look regardless), and says
/// what is known then. For a caller of [`capture_found`], on a cadence of
/// its own.
pub fn look_again() -> Status {
    status_of(look())
}

fn look() -> Option<&'static Found> {
    static LOOKS: AtomicU32 = AtomicU32::new(0);
    if let Some(found) = FOUND.get() {
        return Some(found);
    }
    let nth = LOOKS.fetch_add(1, Ordering::Relaxed);
    let adds = objects_loaded();
    if adds == 0 || adds != LOOKED_AT_ADDS.load(Ordering::Relaxed) || nth.is_multiple_of(LOOK_ANYWAY) {
        probe_now()
    } else {
        None
    }
}

/// How many objects the dynamic linker has loaded since the start (never
/// decreases); 0 if it does not say. Takes the loader's lock briefly.
fn objects_loaded() -> u64 {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, size: usize, out: *mut std::ffi::c_void) -> i32 {
        if size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_adds) + 8 {
            // SAFETY: the loader passes a valid `info` of `size` bytes, and
            // `out` is the u64 below.
            unsafe { *(out as *mut u64) = (*info).dlpi_adds };
        }
        1 // the count is the same in every entry: stop at the first
    }
    let mut adds = 0u64;
    // SAFETY: the callback only reads its arguments and writes `adds`.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut adds as *mut u64 as *mut std::ffi::c_void) };
    adds
}

/// Fills `out` with the calling thread's Python frames, innermost first.
/// Returns 0 when the thread runs no Python, or Python is of a version this
/// build cannot read. Frames beyond `out.len()` are not walked.
///
/// Cheap enough for every hooked call: no allocation, lock or system call,
/// a few reads per frame (plus, while no Python was found, a probe every
/// 1024 calls).
pub fn capture(out: &mut [PyFrame]) -> usize {
    runtime().map_or(0, |rt| capture_with(rt, out))
}

/// [`capture`] without looking for Python when none was found so far: the
/// caller calls [`look_again`] on a cadence of its own. [`capture`]'s count
/// of calls is one word that every allocating thread writes; a caller that
/// counts per thread keeps threads off each other's cache lines.
#[inline]
pub fn capture_found(out: &mut [PyFrame]) -> usize {
    FOUND.get().and_then(supported).map_or(0, |rt| capture_with(rt, out))
}

fn capture_with(rt: &Runtime, out: &mut [PyFrame]) -> usize {
    // SAFETY: reads only this thread's own frame chain, through a layout
    // the probe identified for this interpreter, validating every pointer.
    catch_unwind(AssertUnwindSafe(|| unsafe { rt.capture(out) })).unwrap_or(0)
}

/// Names and line of a frame `capture` returned, read on the same thread
/// before the hook returns (while the frame is still alive). `None` if the
/// frame's code object is no longer the one captured. A `PyFrame` that did
/// not come from `capture` may make it read unmapped memory.
pub fn describe(frame: &PyFrame) -> Option<FrameInfo> {
    let rt = runtime()?;
    // SAFETY: as for `capture`; the caller keeps the frame alive.
    catch_unwind(AssertUnwindSafe(|| unsafe { rt.describe(frame) })).ok().flatten()
}

/// The frame [`capture`] would give for code object `code` stopped at byte
/// offset `lasti`, or `None` if `code` is not a code object. For tests that
/// check [`describe`] against every instruction of code objects Python holds
/// (`id(code)` is its address).
///
/// # Safety
/// `code` is 0 or the address of a live Python object.
#[doc(hidden)]
pub unsafe fn frame_of_code(code: u64, lasti: u32) -> Option<PyFrame> {
    let rt = runtime()?;
    catch_unwind(AssertUnwindSafe(|| rt.frame_of_code(code, lasti))).ok().flatten()
}

/// Whether Python frames are captured in this process, and if not, why.
/// Looks for Python again if none was found so far.
pub fn status() -> Status {
    let found = match FOUND.get() {
        Some(found) => Some(found),
        None => probe_now(),
    };
    status_of(found)
}

fn status_of(found: Option<&Found>) -> Status {
    match found {
        None => Status::NoPython,
        Some(Found::Supported(rt)) => Status::Supported { major: rt.major, minor: rt.layout.minor },
        Some(&Found::Unsupported { major, minor, reason }) => Status::Unsupported { major, minor, reason },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_reads_well() {
        assert_eq!(Status::NoPython.to_string(), "no Python in this process");
        assert_eq!(Status::Supported { major: 3, minor: 11 }.to_string(), "Python 3.11 supported");
        assert_eq!(
            Status::Unsupported { major: 3, minor: 9, reason: "older than 3.10" }.to_string(),
            "Python 3.9 not supported (older than 3.10): no Python frames"
        );
    }
}
