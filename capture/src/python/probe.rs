//! Finding the process's CPython and deciding whether its frames can be
//! read. Runs rarely (once, or rate-limited while no Python is loaded), so it
//! may call the dynamic linker; the hot path only reads what it leaves.

use std::ffi::{c_char, c_int, c_void, CStr};

use super::layouts::{self, DebugOffsets313, Fingerprint, Frames, Layout, TYPE_BASICSIZE, TYPE_ITEMSIZE};
use super::read;

type ThreadStateFn = unsafe extern "C" fn() -> *mut c_void;
type FlagFn = unsafe extern "C" fn() -> c_int;
type VersionFn = unsafe extern "C" fn() -> *const c_char;

/// A Python whose frames this build reads: its layout and the addresses the
/// hot path compares against or calls.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub major: u8,
    pub layout: Layout,
    pub code_type: usize,
    pub unicode_type: usize,
    pub bytes_type: usize,
    /// `PyFrame_Type` where frames are objects (3.10); 0 otherwise.
    pub frame_type: usize,
    /// `PyGILState_GetThisThreadState`: reads a thread-specific key, so it
    /// gives this OS thread's state whether or not it holds the GIL, and NULL
    /// for a thread that never ran Python. No reference is taken.
    pub this_thread_state: ThreadStateFn,
    pub is_initialized: FlagFn,
    /// `_Py_IsFinalizing` (up to 3.12) or `Py_IsFinalizing` (3.13+): thread
    /// states and frame memory are torn down during finalization.
    pub is_finalizing: Option<FlagFn>,
}

/// What the probe concluded about a process that has Python.
#[derive(Debug)]
pub(crate) enum Found {
    Supported(Box<Runtime>),
    Unsupported { major: u8, minor: u8, reason: &'static str },
}

fn sym(name: &CStr) -> usize {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks
    // the name up in the global scope.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
}

/// The base address of the object that defines `addr`, to make sure every
/// symbol we use comes from one interpreter.
fn object_of(addr: usize) -> usize {
    // SAFETY: dladdr only inspects the loader's tables; `info` is plain data.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr as *const c_void, &mut info) == 0 {
            return 0;
        }
        info.dli_fbase as usize
    }
}

/// `(major, minor)` from the start of a version string such as
/// "3.10.13 (main, ...)".
pub(crate) fn parse_version(s: &[u8]) -> Option<(u8, u8)> {
    let mut parts = s.split(|&b| b == b'.');
    let num = |p: Option<&[u8]>| -> Option<u8> {
        let p = p?;
        let digits = p.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 || digits > 3 {
            return None;
        }
        std::str::from_utf8(&p[..digits]).ok()?.parse().ok()
    };
    Some((num(parts.next())?, num(parts.next())?))
}

/// `(major, minor)` of the loaded Python, `None` when there is none.
fn version() -> Option<Result<(u8, u8), &'static str>> {
    let get_version = sym(c"Py_GetVersion");
    let hex = sym(c"Py_Version");
    if get_version == 0 && hex == 0 {
        return None;
    }
    let from_string = (get_version != 0).then(|| {
        // SAFETY: Py_GetVersion exists in every CPython, takes no lock and
        // needs no GIL: it formats constants into a static buffer.
        let s = unsafe {
            let f: VersionFn = std::mem::transmute(get_version);
            let p = f();
            if p.is_null() {
                return None;
            }
            CStr::from_ptr(p)
        };
        parse_version(s.to_bytes())
    });
    let from_hex = (hex != 0 && hex.is_multiple_of(8)).then(|| {
        // SAFETY: Py_Version (3.11+) is a `const unsigned long` holding
        // PY_VERSION_HEX.
        let v = unsafe { read::word(hex) } as u64;
        (((v >> 24) & 0xff) as u8, ((v >> 16) & 0xff) as u8)
    });
    Some(match (from_hex, from_string) {
        (Some(a), Some(Some(b))) if a != b => Err("Py_Version and Py_GetVersion disagree"),
        (Some(a), _) => Ok(a),
        (None, Some(Some(b))) => Ok(b),
        _ => Err("version not recognised"),
    })
}

/// Looks for CPython in the process. `None`: none is loaded (yet).
pub(crate) fn probe() -> Option<Found> {
    let (major, minor) = match version()? {
        Ok(v) => v,
        Err(reason) => return Some(Found::Unsupported { major: 0, minor: 0, reason }),
    };
    Some(match runtime(major, minor) {
        Ok(rt) => Found::Supported(Box::new(rt)),
        Err(reason) => Found::Unsupported { major, minor, reason },
    })
}

fn runtime(major: u8, minor: u8) -> Result<Runtime, &'static str> {
    if !cfg!(all(target_pointer_width = "64", target_endian = "little")) {
        return Err("only 64-bit little-endian builds are known");
    }
    if major != 3 || minor < 10 {
        return Err("older than 3.10");
    }
    // Debug builds export reference-count bookkeeping; their object layouts
    // were never checked here (and Py_TRACE_REFS moves every field).
    if [c"_Py_RefTotal", c"_Py_GetRefTotal", c"_Py_NegativeRefcount"].iter().any(|n| sym(n) != 0) {
        return Err("debug build");
    }
    let layout = match minor {
        10..=12 => *layouts::table(minor).ok_or("no layout")?,
        13 => {
            let runtime = sym(c"_PyRuntime");
            if runtime == 0 || !runtime.is_multiple_of(8) {
                return Err("_PyRuntime not found");
            }
            // SAFETY: in 3.13 `_PyRuntime` starts with `_Py_DebugOffsets`,
            // statically initialised, so it is readable before Py_Initialize.
            // Only the cookie and version are trusted before checking them.
            let offsets = unsafe { std::ptr::read_unaligned(runtime as *const DebugOffsets313) };
            layouts::from_debug_offsets_3_13(&offsets)?
        }
        _ => return Err("newer than this build knows (3.13)"),
    };

    let need = |name: &CStr| match sym(name) {
        0 => Err("a CPython symbol is missing"),
        a => Ok(a),
    };
    let code_type = need(c"PyCode_Type")?;
    let unicode_type = need(c"PyUnicode_Type")?;
    let bytes_type = need(c"PyBytes_Type")?;
    let this_thread_state = need(c"PyGILState_GetThisThreadState")?;
    let is_initialized = need(c"Py_IsInitialized")?;
    let is_finalizing = match sym(c"Py_IsFinalizing") {
        0 => sym(c"_Py_IsFinalizing"),
        a => a,
    };
    let frame_type = match layout.frames {
        Frames::Objects { .. } => need(c"PyFrame_Type")?,
        Frames::Interpreter(_) => 0,
    };
    let home = object_of(code_type);
    // The version came from these, and 3.13's offsets from _PyRuntime.
    let versions = [sym(c"Py_Version"), sym(c"Py_GetVersion"), if minor == 13 { sym(c"_PyRuntime") } else { 0 }];
    let mut all = vec![unicode_type, bytes_type, this_thread_state, is_initialized, is_finalizing, frame_type];
    all.extend(versions);
    if home == 0 || all.iter().any(|&a| a != 0 && object_of(a) != home) {
        return Err("its symbols come from more than one library");
    }
    if ![code_type, unicode_type, bytes_type, frame_type].iter().all(|&a| a == 0 || read::plausible(a, 8)) {
        return Err("a type object is misaligned");
    }
    // SAFETY: the type objects are static data of the interpreter; the
    // offsets of tp_basicsize and tp_itemsize are those of every CPython
    // without Py_TRACE_REFS.
    let seen = unsafe {
        Fingerprint {
            code_basicsize: read::word(code_type + TYPE_BASICSIZE),
            code_itemsize: read::word(code_type + TYPE_ITEMSIZE),
            unicode_basicsize: read::word(unicode_type + TYPE_BASICSIZE),
            frame_basicsize: (frame_type != 0).then(|| read::word(frame_type + TYPE_BASICSIZE)),
        }
    };
    if seen != layout.fingerprint {
        return Err("its object sizes differ from the known layout");
    }
    // SAFETY: the addresses are these functions of this interpreter, with
    // these C signatures in every supported version.
    unsafe {
        Ok(Runtime {
            major,
            layout,
            code_type,
            unicode_type,
            bytes_type,
            frame_type,
            this_thread_state: std::mem::transmute::<usize, ThreadStateFn>(this_thread_state),
            is_initialized: std::mem::transmute::<usize, FlagFn>(is_initialized),
            is_finalizing: (is_finalizing != 0).then(|| std::mem::transmute::<usize, FlagFn>(is_finalizing)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version(b"3.10.13 (main, May  9 2026, 07:35:25) [GCC 12.2.0]"), Some((3, 10)));
        assert_eq!(parse_version(b"3.13.0rc1"), Some((3, 13)));
        assert_eq!(parse_version(b"2.7"), Some((2, 7)));
        assert_eq!(parse_version(b"3"), None);
        assert_eq!(parse_version(b"x.y"), None);
        assert_eq!(parse_version(b""), None);
    }
}
