//! Allocation sites: the native and Python frames of the allocating thread,
//! each distinct stack stored once per process. An allocation carries only
//! the stack's id; the stack itself, the modules its addresses lie in and the
//! names of its Python frames go into the log as definitions the first time
//! they are seen, before any event that refers to them. Nothing is
//! symbolised here: reports do that from the module files.

use crate::runtime::{diag, options};
use crate::sink;
use cupool_capture::{native, python};
use cupool_core::log::{Definition, ModuleRecord, PyFrameRecord, StackRecord, StringRecord};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};

/// Upper bounds of the options `stack_depth` and `python_depth`.
const MAX_NATIVE: usize = 128;
const MAX_PYTHON: usize = 64;
/// A stack's key: its native addresses, a separator, then three words per
/// Python frame.
const MAX_KEY: usize = MAX_NATIVE + 1 + 3 * MAX_PYTHON;
/// Distinct stacks kept; later new stacks get no site (a program that
/// allocates from ever-new stacks must not grow cupool's memory without bound).
const MAX_STACKS: usize = 1 << 20;

/// Mixes words as they come: keys are return addresses, already well spread.
#[derive(Default)]
struct WordHasher(u64);
impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    /// A `[u64]` key arrives here as its bytes in one piece: mixed a word at a time.
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut word = [0; 8];
            word.copy_from_slice(w);
            self.write_u64(u64::from_ne_bytes(word));
        }
        for b in words.remainder() {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, w: usize) {
        self.write_u64(w as u64);
    }
}

#[derive(Default)]
struct Table {
    ids: HashMap<Box<[u64]>, u32, BuildHasherDefault<WordHasher>>,
    /// Modules already defined in the log, as (start, end).
    modules: Vec<(u64, u64)>,
    /// String ids already defined in the log.
    strings: HashSet<u32>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);
/// Why allocations have no Python frames although Python runs, once known.
static PYTHON_NOTE: Mutex<Option<String>> = Mutex::new(None);

/// Bumped when the table is emptied (a fork child starts a log of its own),
/// so that no thread answers from a stack id of the old table.
static GENERATION: AtomicU32 = AtomicU32::new(0);

/// The longest key a thread remembers with its id (the defaults make 81 words).
const LAST_KEY: usize = 96;

/// A thread's buffers for one capture, kept between allocations so that a
/// capture neither zeroes kilobytes of stack nor shares a counter between threads.
struct Scratch {
    key: [u64; MAX_KEY],
    frames: [python::PyFrame; MAX_PYTHON],
    /// Captures without Python frames since this thread last asked Python's status.
    without_python: u32,
    /// The last stack this thread captured and its id (0: none): a call site
    /// in a loop finds its id without the table's lock and hash.
    last: LastStack,
}

struct LastStack {
    key: [u64; LAST_KEY],
    len: usize,
    id: u32,
    generation: u32,
    /// The native walk that gave `key`'s native frames (`native::Walk`), 0: none.
    walk: u64,
}

thread_local! {
    // On the heap, made at the thread's first capture: in the shim's TLS
    // segment its kilobytes would be static TLS (the hot path's
    // initial-exec variables, `runtime::tls`, make the whole segment static),
    // and a later `dlopen` of the shim could not fit them in glibc's surplus.
    // During the thread's teardown, once this is gone, captures give no site.
    static SCRATCH: RefCell<Option<Box<Scratch>>> = const { RefCell::new(None) };
}

impl Scratch {
    fn new_boxed() -> Box<Scratch> {
        // SAFETY: all zeroes is a valid `Scratch` (no frames, no last stack);
        // made on the heap directly, not on a hook's stack.
        unsafe { Box::<Scratch>::new_zeroed().assume_init() }
    }
}

/// Registers the loaded modules with the unwinder.
pub fn start() {
    diag::shielded(native::init);
}

/// The site of the allocation being made on this thread: a stack id, 0 when
/// sites are off or nothing could be captured.
#[inline]
pub fn capture() -> u32 {
    let opts = options::get();
    let (native_depth, python_depth) = (opts.stack_depth as usize, opts.python_depth as usize);
    if !opts.log || (native_depth == 0 && python_depth == 0) {
        return 0;
    }
    diag::shielded(|| capture_at(native_depth.min(MAX_NATIVE), python_depth.min(MAX_PYTHON))).unwrap_or(0)
}

fn capture_at(native_depth: usize, python_depth: usize) -> u32 {
    // A hook run by a signal handler inside a capture finds the buffers taken: no site.
    SCRATCH
        .try_with(|s| {
            s.try_borrow_mut().map_or(0, |mut s| {
                let s = s.get_or_insert_with(Scratch::new_boxed);
                capture_into(s, native_depth, python_depth)
            })
        })
        .unwrap_or(0)
}

fn capture_into(s: &mut Scratch, native_depth: usize, python_depth: usize) -> u32 {
    let Scratch { key, frames, without_python, last } = s;
    let generation = GENERATION.load(Ordering::Relaxed);
    let current = last.id != 0 && last.generation == generation;
    // The last stack's native frames, when its walk is repeated, are not
    // copied into `key` (nor compared): they are `last`'s.
    let known = if current { last.walk } else { 0 };
    let walk = native::capture_known(&mut key[..native_depth], known);
    let n = walk.frames;
    let mut p = python::capture_found(&mut frames[..python_depth]);
    if p == 0 && python_depth > 0 && look_for_python(without_python) {
        p = python::capture_found(&mut frames[..python_depth]);
    }
    if n == 0 && p == 0 {
        return 0;
    }
    let mut len = n;
    key[len] = u64::MAX; // keeps a native frame from passing for a Python one
    len += 1;
    for f in &frames[..p] {
        key[len..len + 3].copy_from_slice(&[f.code, f.tag, u64::from(f.lasti)]);
        len += 3;
    }
    let same_walk = walk.serial != 0 && walk.serial == known;
    if same_walk {
        if same_words(&key[n..len], &last.key[n..last.len]) {
            return last.id;
        }
        key[..n].copy_from_slice(&last.key[..n]);
    } else if current && same_words(&last.key[..last.len], &key[..len]) {
        return last.id;
    }
    let key = &key[..len];
    let id = stack_id(key, n, &frames[..p]);
    if id != 0 && len <= LAST_KEY {
        last.key[..len].copy_from_slice(key);
        (last.len, last.id, last.generation, last.walk) = (len, id, generation, walk.serial);
    }
    id
}

/// Slice equality without a call to `memcmp`, whose call and dispatch cost
/// more than comparing the few words a repeated stack leaves to compare.
#[inline]
fn same_words(a: &[u64], b: &[u64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(true, |same, (x, y)| same & (x == y))
}

/// The id of the stack `key` (its first `native` words native frames, then
/// `frames`), defined in the log the first time; 0 when the table is full.
fn stack_id(key: &[u64], native: usize, frames: &[python::PyFrame]) -> u32 {
    let mut guard = TABLE.lock();
    let table = guard.get_or_insert_with(Table::default);
    if let Some(&id) = table.ids.get(key) {
        return id;
    }
    if table.ids.len() >= MAX_STACKS {
        return 0;
    }
    let id = table.ids.len() as u32 + 1;
    table.ids.insert(key.into(), id);
    define_stack(table, id, &key[..native], frames);
    id
}

/// Writes the definitions a new stack needs: modules its addresses lie in
/// that the log does not have yet, the names of its Python frames, then the stack.
#[cold]
fn define_stack(table: &mut Table, id: u32, native: &[u64], frames: &[python::PyFrame]) {
    if native.iter().any(|&a| !table.modules.iter().any(|&(s, e)| (s..e).contains(&a))) {
        define_new_modules(table);
    }
    let python = frames
        .iter()
        .map(|f| match python::describe(f) {
            Some(info) => {
                PyFrameRecord(define_string(table, &info.file), define_string(table, &info.function), info.line)
            }
            None => PyFrameRecord(define_string(table, "?"), define_string(table, "?"), 0),
        })
        .collect();
    sink::define(Definition::Stack(StackRecord { id, native: native.to_vec(), python }));
}

fn define_new_modules(table: &mut Table) {
    for m in native::loaded_modules() {
        if table.modules.contains(&(m.start, m.end)) {
            continue;
        }
        table.modules.push((m.start, m.end));
        let build_id = m.build_id.iter().map(|b| format!("{b:02x}")).collect();
        sink::define(Definition::Module(ModuleRecord {
            id: table.modules.len() as u32,
            path: m.path,
            base: m.base,
            start: m.start,
            end: m.end,
            build_id,
        }));
    }
}

fn define_string(table: &mut Table, text: &str) -> u32 {
    let id = sink::intern(text);
    if table.strings.insert(id) {
        sink::define(Definition::String(StringRecord { id, text: text.to_string() }));
    }
    id
}

/// Looks for Python now and then (on this thread's first capture without
/// Python frames, then every `python::LOOK_EVERY`: a count of its own, which no
/// other thread writes), and notes once if it runs but cannot be read.
/// True: Python frames can be read (try again). A look may take the dynamic
/// linker's lock, so it is never made under a lock of cupool's: a thread
/// inside `dlopen` may be allocating.
fn look_for_python(without_python: &mut u32) -> bool {
    let look_now = without_python.is_multiple_of(python::LOOK_EVERY);
    *without_python = without_python.wrapping_add(1);
    if !look_now {
        return false;
    }
    let status = python::look_again();
    if let python::Status::Unsupported { .. } = status {
        let mut note = PYTHON_NOTE.lock();
        if note.is_none() {
            let text = status.to_string();
            diag::note(&text);
            *note = Some(text);
        }
    }
    matches!(status, python::Status::Supported { .. })
}

/// What the end record should say about sites that could not be captured.
pub fn notes() -> Vec<String> {
    PYTHON_NOTE.try_lock().and_then(|n| n.clone()).into_iter().collect()
}

pub fn lock_for_fork() {
    std::mem::forget(TABLE.lock());
    native::lock_for_fork();
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    native::unlock_after_fork();
    TABLE.force_unlock();
    if in_child {
        // The child writes a log of its own: every definition again.
        *TABLE.lock() = None;
        GENERATION.fetch_add(1, Ordering::Relaxed);
    }
}
