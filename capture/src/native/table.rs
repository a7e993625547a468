//! The table of modules the walk reads, and how it is kept up to date.
//!
//! Unwind data is used in place, never copied: every module registered is
//! either one that is never unmapped (the executable, the vDSO, the dynamic
//! linker) or one pinned by a `dlopen(RTLD_NOLOAD)` reference taken before
//! its tables are read. Copying would cost the sum of every library's
//! `.eh_frame` in private memory (tens of MB in a PyTorch process, where the
//! pages read in place are shared, clean and mostly never touched); the price
//! of pinning is that a library the program `dlclose`s stays mapped.
//! Because registered modules never go away, the table only grows, and an
//! unwind rule cached for an address stays right for the life of the process
//! (so framehop's 16-bit module generation wrapping around is harmless).
//!
//! New modules are found by a rescan, which a capture triggers when a return
//! address lies outside every registered module (at most one per
//! `RESCAN_INTERVAL_NS`, and cheap when the loader's load count has not
//! moved).
//!
//! Locking: a published table never changes. Each thread keeps the last
//! one it took ([`Snapshot`]) and takes the newest, under a `try_lock`, only
//! when the version number has moved: a capture writes no memory that other
//! threads' captures read (an `RwLock`'s reader count was one such line, and
//! threads capturing at once met on it). A thread that finds the lock taken
//! walks with the table it has. The registry behind it is changed by one
//! rescanning thread at a time (`try_lock`: a capture that finds a rescan
//! under way does not wait for it), and a new table is put in place under a
//! lock tried for a bounded time. No lock is ever waited for without a bound,
//! so neither a lock the program holds (the loader's, during a rescan) nor
//! one inherited by a fork child can hang a capture.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use framehop::x86_64::UnwinderX86_64;
use framehop::{ExplicitModuleSectionInfo, Module, MustNotAllocateDuringUnwind, Unwinder};

use super::modules::{self, Key, Parsed, Permanent, Region};

/// At most one rescan per this interval when addresses fall outside every
/// known module (JIT code, or garbage met through a frame-pointer guess,
/// would otherwise take the loader's lock on every capture).
const RESCAN_INTERVAL_NS: u64 = 100_000_000;

/// How long publishing a new table tries for the lock before giving up (the
/// next rescan publishes it). Captures hold it for an `Arc`'s clone;
/// running out of patience means one cannot run (a lock inherited by a fork
/// child).
const PUBLISH_PATIENCE_NS: u64 = 5_000_000;

/// How long [`init`] and [`lock_for_fork`] wait for a rescan under way, and
/// a fork for the table's write lock.
const SETUP_PATIENCE_NS: u64 = 200_000_000;
/// How long a thread's first capture waits for the table's lock (the
/// coarse clock's tick is a few ms: this is at least one).
const FIRST_TAKE_PATIENCE_NS: u64 = 2_000_000;

type Data = &'static [u8];

#[derive(Clone, Copy)]
pub(super) struct Span {
    start: u64,
    end: u64,
    /// Frames here are dropped while they lead the stack.
    pub trim: bool,
}

pub(super) struct Table {
    pub unwinder: UnwinderX86_64<Data, MustNotAllocateDuringUnwind>,
    /// Sorted by start; ranges never overlap.
    spans: Vec<Span>,
}

impl Span {
    /// Contains no address.
    pub const NONE: Span = Span { start: 0, end: 0, trim: false };

    #[inline]
    pub fn contains(&self, addr: u64) -> bool {
        (self.start..self.end).contains(&addr)
    }
}

impl Table {
    pub fn span(&self, addr: u64) -> Option<&Span> {
        let i = self.spans.partition_point(|s| s.start <= addr).checked_sub(1)?;
        let span = &self.spans[i];
        (addr < span.end).then_some(span)
    }
}

/// The newest table, and its version: bumped after each one is put in place.
static CURRENT: Mutex<Option<Arc<Table>>> = Mutex::new(None);
static VERSION: AtomicU64 = AtomicU64::new(0);

/// A thread's table: the newest it could take.
#[derive(Default)]
pub(super) struct Snapshot {
    version: u64,
    table: Option<Arc<Table>>,
}

/// What a walk has to read.
pub(super) enum Current<'a> {
    Table(&'a Table),
    /// A new table is being put in place and this thread has none yet.
    Busy,
    NoTable,
}

impl Snapshot {
    /// The newest table; this thread's last one while the newest is being
    /// put in place (it holds fewer modules, never wrong rules).
    #[inline]
    pub fn current(&mut self) -> Current<'_> {
        let version = VERSION.load(Acquire);
        let mut busy = false;
        if version != self.version {
            // A thread with a table of its own walks with it rather than
            // wait; one without waits a little: the lock is held only to
            // clone or swap the table, and threads that start capturing at
            // once would otherwise take turns failing their first capture.
            let patience = if self.table.is_none() { FIRST_TAKE_PATIENCE_NS } else { 0 };
            match lock_current(patience) {
                Some(newest) => self.take(version, &newest),
                None => busy = true,
            }
        }
        match &self.table {
            Some(t) => Current::Table(t),
            None if busy => Current::Busy,
            None => Current::NoTable,
        }
    }

    fn take(&mut self, version: u64, newest: &Option<Arc<Table>>) {
        // The version read before the lock: a table put in place meanwhile is
        // taken again at the next capture.
        self.table = newest.clone();
        self.version = version;
    }
}

/// `CURRENT`, waited for at most `patience_ns`.
fn lock_current(patience_ns: u64) -> Option<MutexGuard<'static, Option<Arc<Table>>>> {
    lock_within(&CURRENT, patience_ns)
}

struct Registered {
    span: Span,
    module: Module<Data>,
}

struct Registry {
    modules: Vec<Registered>,
    /// Every object seen: registered, or not pinnable (not retried at every
    /// rescan).
    seen: BTreeSet<Key>,
    /// The loader's load count at the last complete scan.
    adds: u64,
    /// `modules` has entries `TABLE` does not have yet.
    unpublished: bool,
}

static REGISTRY: Mutex<Registry> =
    Mutex::new(Registry { modules: Vec::new(), seen: BTreeSet::new(), adds: 0, unpublished: false });

/// The registry, waited for at most `patience_ns` (0: tried once).
fn lock_registry(patience_ns: u64) -> Option<MutexGuard<'static, Registry>> {
    lock_within(&REGISTRY, patience_ns)
}

/// `lock`, waited for at most `patience_ns` (0: tried once), yielding the
/// CPU between tries.
fn lock_within<T>(lock: &'static Mutex<T>, patience_ns: u64) -> Option<MutexGuard<'static, T>> {
    let deadline = monotonic_ns().saturating_add(patience_ns);
    loop {
        match lock.try_lock() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) if monotonic_ns() < deadline => std::thread::yield_now(),
            Err(TryLockError::WouldBlock) => return None,
        }
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes one timespec; CLOCK_MONOTONIC_COARSE is served by the vDSO.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

static LAST_RESCAN_NS: AtomicU64 = AtomicU64::new(0);

pub(super) fn rescan_due() -> bool {
    let now = monotonic_ns();
    let last = LAST_RESCAN_NS.load(Relaxed);
    now.saturating_sub(last) >= RESCAN_INTERVAL_NS
        && LAST_RESCAN_NS.compare_exchange(last, now, Relaxed, Relaxed).is_ok()
}

/// Makes sure a table exists, waiting (a bounded time) for a scan another
/// thread has under way rather than returning before it is done.
pub(crate) fn init() {
    rescan(SETUP_PATIENCE_NS);
}

/// Registers the objects loaded since the last scan and publishes a table
/// with them. Returns whether a new table was published. Waits at most
/// `patience_ns` for another thread's rescan.
pub(super) fn rescan(patience_ns: u64) -> bool {
    let Some(mut reg) = lock_registry(patience_ns) else { return false };
    let permanent = Permanent::get();

    // Pass 1: the objects not seen before.
    let (mut fresh, mut adds, mut unchanged) = (Vec::new(), 0, false);
    modules::iterate(&mut |info, count| {
        adds = count;
        if count != 0 && count == reg.adds {
            unchanged = true;
            return false;
        }
        let key = modules::key_of(info);
        if !reg.seen.contains(&key) {
            if let Some(parsed) = modules::parse(info) {
                fresh.push(parsed);
            }
        }
        true
    });
    if unchanged && !reg.unpublished {
        return false;
    }

    // Pin what can go away; only then are its tables read for keeps (pass 2),
    // so the data registered belongs to the object the reference holds.
    let mut keep: Vec<Parsed> = Vec::new();
    let mut pinned = BTreeSet::new();
    for parsed in fresh {
        reg.seen.insert(parsed.key.clone());
        if permanent.contains(&parsed.key, parsed.info.start, parsed.info.end) {
            keep.push(parsed);
        } else if modules::pin(&parsed.key) {
            pinned.insert(parsed.key);
        }
    }
    if !pinned.is_empty() {
        modules::iterate(&mut |info, _| {
            let key = modules::key_of(info);
            if pinned.contains(&key) {
                keep.extend(modules::parse(info));
            }
            true
        });
    }

    let own = super::capture as *const () as u64;
    for parsed in keep {
        let is_exe = permanent.is_exe(&parsed.key);
        let file = parsed.info.path.rsplit('/').next().unwrap_or_default();
        let trim = file.starts_with("libcudart")
            || file.starts_with("libcuda.so")
            // When this crate is linked into the executable itself (tests,
            // benchmarks), trimming its module would trim the program.
            || (!is_exe && (parsed.info.start..parsed.info.end).contains(&own));
        let span = Span { start: parsed.info.start, end: parsed.info.end, trim };
        reg.modules.push(Registered { module: framehop_module(&parsed), span });
        reg.unpublished = true;
    }
    reg.adds = adds;
    reg.unpublished && publish(&mut reg)
}

fn framehop_module(parsed: &Parsed) -> Module<Data> {
    let base = parsed.info.base;
    let svma = |r: Region| r.addr.wrapping_sub(base)..r.addr.wrapping_sub(base).wrapping_add(r.len as u64);
    let mut sections = ExplicitModuleSectionInfo::<Data>::default();
    if let Some(eh_frame) = parsed.eh_frame {
        sections.eh_frame_svma = Some(svma(eh_frame));
        sections.eh_frame = Some(modules::bytes(eh_frame));
        if let (Some(hdr), true) = (parsed.eh_frame_hdr, parsed.hdr_has_table) {
            sections.eh_frame_hdr_svma = Some(svma(hdr));
            sections.eh_frame_hdr = Some(modules::bytes(hdr));
        }
    }
    Module::new(String::new(), parsed.info.start..parsed.info.end, base, sections)
}

fn publish(reg: &mut Registry) -> bool {
    let mut unwinder = UnwinderX86_64::new();
    let mut spans = Vec::with_capacity(reg.modules.len());
    for m in &reg.modules {
        unwinder.add_module(m.module.clone());
        spans.push(m.span);
    }
    spans.sort_by_key(|s| s.start);
    let table = Arc::new(Table { unwinder, spans });
    let Some(mut guard) = lock_current(PUBLISH_PATIENCE_NS) else { return false };
    let old = guard.replace(table);
    VERSION.fetch_add(1, Release);
    drop(guard);
    drop(old);
    reg.unpublished = false;
    true
}

struct ForkGuards {
    _registry: Option<MutexGuard<'static, Registry>>,
    _table: Option<MutexGuard<'static, Option<Arc<Table>>>>,
}

thread_local! {
    static FORK_GUARDS: RefCell<Option<ForkGuards>> = const { RefCell::new(None) };
}

pub(crate) fn lock_for_fork() {
    // Bounded: a rescanner may be waiting for the loader's lock, which this
    // thread can hold (a fork from a library constructor).
    let registry = lock_registry(SETUP_PATIENCE_NS);
    let table = lock_current(SETUP_PATIENCE_NS);
    let _ = FORK_GUARDS.try_with(|g| {
        if let Ok(mut g) = g.try_borrow_mut() {
            *g = Some(ForkGuards { _registry: registry, _table: table });
        }
    });
}

pub(crate) fn unlock_after_fork() {
    let guards = FORK_GUARDS.try_with(|g| g.try_borrow_mut().ok().and_then(|mut g| g.take()));
    drop(guards);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_lookup_is_half_open_and_misses_gaps() {
        let spans =
            vec![Span { start: 0x1000, end: 0x2000, trim: false }, Span { start: 0x3000, end: 0x4000, trim: true }];
        let table = Table { unwinder: UnwinderX86_64::new(), spans };
        assert!(table.span(0xfff).is_none());
        assert!(!table.span(0x1000).unwrap().trim);
        assert!(table.span(0x2000).is_none());
        assert!(table.span(0x3fff).unwrap().trim);
        assert!(table.span(0x4000).is_none());
    }
}
