//! Where CPython keeps what we read, per minor version, for 64-bit
//! little-endian non-debug builds without free threading.
//!
//! 3.10 to 3.12 publish no offsets at run time, so theirs are written here as
//! data. Each was read off the headers CPython installs for that release
//! (paths relative to `include/python3.X/`), then checked against the C
//! compiler's `offsetof` over the same headers (`tools/py_offsets.c`) for
//! 3.10.13, 3.11.7 and 3.12.1. Within a minor version CPython keeps these
//! structures fixed (py-spy relies on the same), and the probe checks the
//! sizes the running interpreter reports for its code and str types before it
//! trusts a table (see [`Fingerprint`]).
//!
//! 3.13 publishes `_PyRuntime.debug_offsets`; [`from_debug_offsets_3_13`]
//! builds the layout from it rather than from a table.

/// Offsets shared by every version supported here (`Include/object.h`,
/// `Include/cpython/bytesobject.h`, `Include/cpython/object.h`): a build where
/// these differ (`Py_TRACE_REFS`) fails the fingerprint and is refused.
pub(crate) const OB_TYPE: usize = 8; // PyObject.ob_type
pub(crate) const OB_SIZE: usize = 16; // PyVarObject.ob_size
pub(crate) const BYTES_SVAL: usize = 32; // PyBytesObject.ob_sval, after ob_shash
pub(crate) const TYPE_BASICSIZE: usize = 32; // PyTypeObject.tp_basicsize
pub(crate) const TYPE_ITEMSIZE: usize = 40; // PyTypeObject.tp_itemsize

/// How frames hang off a thread state and link to their callers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Frames {
    /// 3.10: a chain of `PyFrameObject`s (Include/cpython/frameobject.h).
    Objects {
        /// `PyThreadState.frame`.
        tstate_frame: usize,
        f_back: usize,
        f_code: usize,
        /// `f_lasti`, an `int` counting code units (not bytes).
        f_lasti: usize,
    },
    /// 3.11 and later: a chain of `_PyInterpreterFrame`s
    /// (Include/internal/pycore_frame.h).
    Interpreter(InterpFrames),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InterpFrames {
    /// 3.11/3.12: `PyThreadState.cframe`; 3.13: `PyThreadState.current_frame`.
    pub tstate_frame: usize,
    /// 3.11/3.12 reach the frame through a `_PyCFrame`: offset of its
    /// `current_frame`. `None` when `tstate_frame` points at the frame itself.
    pub cframe_current_frame: Option<usize>,
    pub previous: usize,
    /// `f_code` (3.11/3.12) or `f_executable` (3.13, not always a code object).
    pub code: usize,
    /// `prev_instr` (3.11/3.12) or `instr_ptr` (3.13): an address inside the
    /// code object's `co_code_adaptive`. CPython takes the line of either as
    /// the line of `(ptr - _PyCode_CODE(co))` code units, so both give the
    /// byte offset the same way.
    pub instr: usize,
    /// `owner`, a `char`.
    pub owner: usize,
    /// `FRAME_OWNED_BY_CSTACK` (3.12+): the interpreter's own entry frames,
    /// pushed where C calls into Python; their code is a trampoline, not the
    /// program's.
    pub owner_cstack: Option<u8>,
    /// `PyCodeObject._co_firsttraceable` where the layout is known: a frame
    /// whose instruction is before it has not started (CPython's
    /// `_PyFrame_IsIncomplete`) and is left out, as tracebacks leave it out.
    pub code_first_traceable: Option<usize>,
}

/// `FRAME_OWNED_BY_GENERATOR`, 1 in every version with `_PyInterpreterFrame`.
pub(crate) const OWNER_GENERATOR: u8 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Code {
    /// `co_firstlineno`, an `int`.
    pub firstlineno: usize,
    pub filename: usize,
    /// `co_qualname` where it exists (3.11+), else `co_name`.
    pub name: usize,
    pub linetable: usize,
    /// `co_code_adaptive` (3.11+): the instructions, inline in the object;
    /// `ob_size` counts them in code units.
    pub code_adaptive: Option<usize>,
}

/// `PyASCIIObject` / `PyCompactUnicodeObject` (Include/cpython/unicodeobject.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Unicode {
    /// `length`, in code points.
    pub length: usize,
    /// The `state` bit field: interned:2, kind:3, compact:1, ascii:1, then
    /// `ready:1` up to 3.11 (`statically_allocated:1` after).
    pub state: usize,
    /// `sizeof(PyASCIIObject)`: where an ASCII string's characters start.
    pub ascii_size: usize,
    /// `sizeof(PyCompactUnicodeObject)`: where other compact strings' start.
    pub compact_size: usize,
    /// Up to 3.11 a string may be "not ready" (no canonical data yet).
    pub has_ready_bit: bool,
}

/// How `co_linetable` maps instruction offsets to lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LineFormat {
    /// 3.10 (PEP 626): (byte delta, signed line delta) pairs.
    Pep626,
    /// 3.11+: the location table (Objects/locations.md).
    Locations,
}

/// Sizes the running interpreter reports through its type objects, which
/// must equal the ones the layout was derived with: a cheap check that the
/// table fits this build (a patch release or a build option that moved
/// fields would change them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    /// `PyCode_Type.tp_basicsize`: `sizeof(PyCodeObject)` up to 3.10,
    /// `offsetof(PyCodeObject, co_code_adaptive)` after.
    pub code_basicsize: usize,
    /// `PyCode_Type.tp_itemsize`: 0 up to 3.10, `sizeof(_Py_CODEUNIT)` after.
    pub code_itemsize: usize,
    /// `PyUnicode_Type.tp_basicsize`: `sizeof(PyUnicodeObject)`.
    pub unicode_basicsize: usize,
    /// `PyFrame_Type.tp_basicsize` where frames are objects we walk (3.10).
    pub frame_basicsize: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub minor: u8,
    pub frames: Frames,
    pub code: Code,
    pub unicode: Unicode,
    pub lines: LineFormat,
    pub fingerprint: Fingerprint,
}

/// Python 3.10.
pub(crate) const PY_3_10: Layout = Layout {
    minor: 10,
    // cpython/pystate.h `struct _ts`: prev, next, interp, then `frame` (24).
    // cpython/frameobject.h `struct _frame`: PyObject_VAR_HEAD (24), f_back
    // (24), f_code (32), f_builtins, f_globals, f_locals, f_valuestack,
    // f_trace (40..80), f_stackdepth (80), f_trace_lines/opcodes (84, 85),
    // f_gen (88), f_lasti (96).
    frames: Frames::Objects { tstate_frame: 24, f_back: 24, f_code: 32, f_lasti: 96 },
    // cpython/code.h `struct PyCodeObject`: PyObject_HEAD (16), seven ints
    // co_argcount..co_firstlineno (16..44, co_firstlineno at 40), then
    // pointers from 48: co_code, co_consts, co_names, co_varnames,
    // co_freevars, co_cellvars, co_cell2arg (48..104), co_filename (104),
    // co_name (112), co_linetable (120).
    code: Code { firstlineno: 40, filename: 104, name: 112, linetable: 120, code_adaptive: None },
    unicode: UNICODE_WITH_WSTR,
    lines: LineFormat::Pep626,
    fingerprint: Fingerprint {
        code_basicsize: 176,
        code_itemsize: 0,
        unicode_basicsize: 80,
        // offsetof(PyFrameObject, f_localsplus) + one slot.
        frame_basicsize: Some(360),
    },
};

/// Python 3.11.
pub(crate) const PY_3_11: Layout = Layout {
    minor: 11,
    frames: Frames::Interpreter(InterpFrames {
        // cpython/pystate.h `struct _ts`: prev, next, interp (0..24),
        // _initialized, _static, recursion_remaining, recursion_limit,
        // recursion_headroom, tracing, tracing_what (7 ints, 24..52), cframe
        // (56). `_PyCFrame`: use_tracing (uint8_t, 0), current_frame (8).
        tstate_frame: 56,
        cframe_current_frame: Some(8),
        // internal/pycore_frame.h `_PyInterpreterFrame`: f_func, f_globals,
        // f_builtins, f_locals (0..32), f_code (32), frame_obj (40),
        // previous (48), prev_instr (56), stacktop (int, 64), is_entry
        // (bool, 68), owner (char, 69).
        previous: 48,
        code: 32,
        instr: 56,
        owner: 69,
        // 3.11 has no FRAME_OWNED_BY_CSTACK: entry frames are real frames
        // marked `is_entry`.
        owner_cstack: None,
        code_first_traceable: Some(168),
    }),
    // cpython/code.h `_PyCode_DEF`: PyObject_VAR_HEAD (24), co_consts,
    // co_names, co_exceptiontable (24..48), co_flags (48), co_warmup and
    // _co_linearray_entry_size (shorts, 52, 54), co_argcount,
    // co_posonlyargcount, co_kwonlyargcount, co_stacksize (56..72),
    // co_firstlineno (72), five ints co_nlocalsplus..co_nfreevars (76..96),
    // co_localsplusnames (96), co_localspluskinds (104), co_filename (112),
    // co_name (120), co_qualname (128), co_linetable (136), co_weakreflist,
    // _co_code, _co_linearray (144..168), _co_firsttraceable (int, 168),
    // co_extra (176), co_code_adaptive (184).
    code: Code { firstlineno: 72, filename: 112, name: 128, linetable: 136, code_adaptive: Some(184) },
    unicode: UNICODE_WITH_WSTR,
    lines: LineFormat::Locations,
    fingerprint: Fingerprint { code_basicsize: 184, code_itemsize: 2, unicode_basicsize: 80, frame_basicsize: None },
};

/// Python 3.12.
pub(crate) const PY_3_12: Layout = Layout {
    minor: 12,
    frames: Frames::Interpreter(InterpFrames {
        // cpython/pystate.h `struct _ts`: prev, next, interp (0..24), the
        // `_status` bit field (unsigned int, 24), py_recursion_remaining,
        // py_recursion_limit, c_recursion_remaining, recursion_headroom,
        // tracing, what_event (6 ints, 28..52), cframe (56). `_PyCFrame`:
        // current_frame (0), previous (8).
        tstate_frame: 56,
        cframe_current_frame: Some(0),
        // internal/pycore_frame.h `_PyInterpreterFrame`: f_code (0), previous
        // (8), f_funcobj, f_globals, f_builtins, f_locals, frame_obj
        // (16..56), prev_instr (56), stacktop (int, 64), return_offset
        // (uint16_t, 68), owner (char, 70).
        previous: 8,
        code: 0,
        instr: 56,
        owner: 70,
        // enum _frameowner: FRAME_OWNED_BY_CSTACK = 3.
        owner_cstack: Some(3),
        code_first_traceable: Some(176),
    }),
    // cpython/code.h `_PyCode_DEF`: PyObject_VAR_HEAD (24), co_consts,
    // co_names, co_exceptiontable (24..48), co_flags, co_argcount,
    // co_posonlyargcount, co_kwonlyargcount, co_stacksize (48..68),
    // co_firstlineno (68), co_nlocalsplus, co_framesize, co_nlocals,
    // co_ncellvars, co_nfreevars, co_version (72..96), co_localsplusnames
    // (96), co_localspluskinds (104), co_filename (112), co_name (120),
    // co_qualname (128), co_linetable (136), co_weakreflist, _co_cached,
    // _co_instrumentation_version, _co_monitoring (144..176),
    // _co_firsttraceable (int, 176), co_extra (184), co_code_adaptive (192).
    code: Code { firstlineno: 68, filename: 112, name: 128, linetable: 136, code_adaptive: Some(192) },
    unicode: UNICODE_NO_WSTR,
    lines: LineFormat::Locations,
    fingerprint: Fingerprint { code_basicsize: 192, code_itemsize: 2, unicode_basicsize: 64, frame_basicsize: None },
};

/// Up to 3.11 (Include/cpython/unicodeobject.h): PyASCIIObject is
/// PyObject_HEAD (16), length (16), hash (24), state (32, 4 bytes + padding),
/// wstr (40): 48 bytes. PyCompactUnicodeObject adds utf8_length, utf8,
/// wstr_length: 72 bytes.
const UNICODE_WITH_WSTR: Unicode =
    Unicode { length: 16, state: 32, ascii_size: 48, compact_size: 72, has_ready_bit: true };

/// 3.12 and 3.13: the wstr fields are gone. PyASCIIObject ends after state
/// (40 bytes); PyCompactUnicodeObject adds utf8_length and utf8: 56 bytes.
const UNICODE_NO_WSTR: Unicode =
    Unicode { length: 16, state: 32, ascii_size: 40, compact_size: 56, has_ready_bit: false };

/// The table for a minor version that publishes no offsets.
pub(crate) fn table(minor: u8) -> Option<&'static Layout> {
    match minor {
        10 => Some(&PY_3_10),
        11 => Some(&PY_3_11),
        12 => Some(&PY_3_12),
        _ => None,
    }
}

/// The first fields of 3.13's `_Py_DebugOffsets`
/// (Include/internal/pycore_runtime.h at v3.13.0), all `uint64_t`, in
/// declaration order. The struct's own layout is only promised within a
/// minor version, so this mirror is used for 3.13 alone.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct DebugOffsets313 {
    pub cookie: [u8; 8],
    pub version: u64,
    pub free_threaded: u64,
    /// size, finalizing, interpreters_head.
    pub runtime_state: [u64; 3],
    /// size, id, next, threads_head, gc, imports_modules, sysdict, builtins,
    /// ceval_gil, gil_runtime_state, gil_runtime_state_enabled,
    /// gil_runtime_state_locked, gil_runtime_state_holder.
    pub interpreter_state: [u64; 13],
    pub thread_state: ThreadState313,
    pub interpreter_frame: InterpreterFrame313,
    pub code_object: CodeObject313,
    pub pyobject: PyObject313,
    /// size, tp_name, tp_repr, tp_flags.
    pub type_object: [u64; 4],
    /// size, ob_item, ob_size.
    pub tuple_object: [u64; 3],
    /// size, ob_item, ob_size.
    pub list_object: [u64; 3],
    /// size, ma_keys, ma_values.
    pub dict_object: [u64; 3],
    /// size, ob_fval.
    pub float_object: [u64; 2],
    /// size, lv_tag, ob_digit.
    pub long_object: [u64; 3],
    pub bytes_object: Bytes313,
    pub unicode_object: Unicode313,
    /// size, collecting.
    pub gc: [u64; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ThreadState313 {
    pub size: u64,
    pub prev: u64,
    pub next: u64,
    pub interp: u64,
    pub current_frame: u64,
    pub thread_id: u64,
    pub native_thread_id: u64,
    pub datastack_chunk: u64,
    pub status: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct InterpreterFrame313 {
    pub size: u64,
    pub previous: u64,
    pub executable: u64,
    pub instr_ptr: u64,
    pub localsplus: u64,
    pub owner: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct CodeObject313 {
    pub size: u64,
    pub filename: u64,
    pub name: u64,
    pub qualname: u64,
    pub linetable: u64,
    pub firstlineno: u64,
    pub argcount: u64,
    pub localsplusnames: u64,
    pub localspluskinds: u64,
    pub co_code_adaptive: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct PyObject313 {
    pub size: u64,
    pub ob_type: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bytes313 {
    pub size: u64,
    pub ob_size: u64,
    pub ob_sval: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Unicode313 {
    pub size: u64,
    pub state: u64,
    pub length: u64,
    pub asciiobject_size: u64,
}

pub(crate) const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// 3.13's layout from its debug offsets, or why they cannot be used. Every
/// field we read must lie inside the struct the offsets say it belongs to,
/// and the few facts the offsets do not carry (object header, bytes layout,
/// the unicode state bits and the compact header's tail) must agree with
/// what the offsets do say about them.
pub(crate) fn from_debug_offsets_3_13(d: &DebugOffsets313) -> Result<Layout, &'static str> {
    if &d.cookie != DEBUG_COOKIE {
        return Err("no debug offsets cookie");
    }
    if (d.version >> 24) & 0xff != 3 || (d.version >> 16) & 0xff != 13 {
        return Err("debug offsets of another version");
    }
    if d.free_threaded != 0 {
        return Err("free-threaded build");
    }
    let fits = |off: u64, width: u64, size: u64| size <= 1 << 20 && off.checked_add(width).is_some_and(|e| e <= size);
    let ts = &d.thread_state;
    let fr = &d.interpreter_frame;
    let co = &d.code_object;
    let un = &d.unicode_object;
    let by = &d.bytes_object;
    let ok = fits(ts.current_frame, 8, ts.size)
        && fits(fr.previous, 8, fr.size)
        && fits(fr.executable, 8, fr.size)
        && fits(fr.instr_ptr, 8, fr.size)
        && fits(fr.owner, 1, fr.size)
        && fits(co.filename, 8, co.size)
        && fits(co.qualname, 8, co.size)
        && fits(co.linetable, 8, co.size)
        && fits(co.firstlineno, 4, co.size)
        && co.co_code_adaptive <= co.size
        && d.pyobject.ob_type == OB_TYPE as u64
        && by.ob_size == OB_SIZE as u64
        && by.ob_sval == BYTES_SVAL as u64
        && un.length == 16
        && un.state == 32
        && un.asciiobject_size == 40;
    if !ok {
        return Err("unexpected debug offsets");
    }
    let u = |v: u64| v as usize;
    Ok(Layout {
        minor: 13,
        frames: Frames::Interpreter(InterpFrames {
            tstate_frame: u(ts.current_frame),
            cframe_current_frame: None,
            previous: u(fr.previous),
            code: u(fr.executable),
            instr: u(fr.instr_ptr),
            owner: u(fr.owner),
            // internal/pycore_frame.h at v3.13.0: FRAME_OWNED_BY_CSTACK = 3.
            owner_cstack: Some(3),
            // Not among the debug offsets. Without it a frame still in its
            // prologue shows at its first line instead of being left out; a
            // hook cannot run while a frame is in its prologue.
            code_first_traceable: None,
        }),
        code: Code {
            firstlineno: u(co.firstlineno),
            filename: u(co.filename),
            name: u(co.qualname),
            linetable: u(co.linetable),
            code_adaptive: Some(u(co.co_code_adaptive)),
        },
        // The compact header is the ASCII one plus utf8_length and utf8
        // (cpython/unicodeobject.h at v3.13.0).
        unicode: Unicode {
            length: u(un.length),
            state: u(un.state),
            ascii_size: u(un.asciiobject_size),
            compact_size: u(un.asciiobject_size) + 16,
            has_ready_bit: false,
        },
        lines: LineFormat::Locations,
        fingerprint: Fingerprint {
            code_basicsize: u(co.co_code_adaptive),
            code_itemsize: 2,
            unicode_basicsize: u(un.size),
            frame_basicsize: None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mirror must match the C struct's size (584 bytes: 73 u64s) or
    /// every field after a mistake would be read from the wrong place.
    #[test]
    fn debug_offsets_mirror_has_the_c_size() {
        assert_eq!(std::mem::size_of::<DebugOffsets313>(), 73 * 8);
        assert_eq!(std::mem::offset_of!(DebugOffsets313, thread_state), 152);
        assert_eq!(std::mem::offset_of!(DebugOffsets313, code_object), 272);
        assert_eq!(std::mem::offset_of!(DebugOffsets313, unicode_object), 536);
    }

    fn sample_3_13() -> DebugOffsets313 {
        // Values the v3.13.0 build on this machine publishes (read with
        // tools/py_offsets.c); only the ones checked or used matter here.
        // SAFETY: `DebugOffsets313` and the structs in it hold integers and integer arrays only: all-zero
        // is a valid value.
        let mut d: DebugOffsets313 = unsafe { std::mem::zeroed() };
        d.cookie = *DEBUG_COOKIE;
        d.version = 0x030d00f0;
        d.thread_state.size = 304;
        d.thread_state.current_frame = 72;
        d.interpreter_frame =
            InterpreterFrame313 { size: 80, previous: 8, executable: 0, instr_ptr: 56, localsplus: 72, owner: 70 };
        d.code_object.size = 208;
        d.code_object.filename = 112;
        d.code_object.name = 120;
        d.code_object.qualname = 128;
        d.code_object.linetable = 136;
        d.code_object.firstlineno = 68;
        d.code_object.co_code_adaptive = 200;
        d.pyobject = PyObject313 { size: 16, ob_type: 8 };
        d.bytes_object = Bytes313 { size: 40, ob_size: 16, ob_sval: 32 };
        d.unicode_object = Unicode313 { size: 64, state: 32, length: 16, asciiobject_size: 40 };
        d
    }

    #[test]
    fn debug_offsets_give_the_3_13_layout() {
        let l = from_debug_offsets_3_13(&sample_3_13()).unwrap();
        let Frames::Interpreter(f) = l.frames else { panic!("3.13 walks interpreter frames") };
        assert_eq!((f.tstate_frame, f.previous, f.code, f.instr, f.owner), (72, 8, 0, 56, 70));
        assert_eq!(l.code.code_adaptive, Some(200));
        assert_eq!(l.unicode.compact_size, 56);
    }

    #[test]
    fn debug_offsets_are_refused_when_they_do_not_fit() {
        let mut d = sample_3_13();
        d.cookie = *b"xdebugpz";
        assert!(from_debug_offsets_3_13(&d).is_err());
        let mut d = sample_3_13();
        d.version = 0x030e00f0;
        assert!(from_debug_offsets_3_13(&d).is_err());
        let mut d = sample_3_13();
        d.free_threaded = 1;
        assert!(from_debug_offsets_3_13(&d).is_err());
        let mut d = sample_3_13();
        d.interpreter_frame.owner = 80;
        assert!(from_debug_offsets_3_13(&d).is_err());
        let mut d = sample_3_13();
        d.unicode_object.asciiobject_size = 48;
        assert!(from_debug_offsets_3_13(&d).is_err());
    }
}
