//! The walk: from the registers of the capture point, frame by frame
//! through the module table, reading only the calling thread's own stack.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, MustNotAllocateDuringUnwind, Unwinder};

use super::memo::{Memos, Recording};
use super::regs::Regs;
use super::table::{rescan, rescan_due, Current, Snapshot, Span, Table};

/// Frames unwound at most, kept and trimmed together: a bound on the time a
/// capture can take whatever the stack looks like.
pub(crate) const MAX_STEPS: usize = 256;

type Cache = CacheX86_64<MustNotAllocateDuringUnwind>;

/// framehop's rule cache is direct-mapped (509 slots by address): two
/// frames of one walk whose addresses collide evict each other on every
/// walk, and each then re-reads DWARF (measured: a build whose layout had
/// such a collision captured 2.5x slower than the same code rebuilt). The
/// first frames of a walk get a cache each, so frames of one walk never
/// share a cache there; deeper frames share the last.
const CACHES: usize = 4;

struct ThreadState {
    memos: Box<Memos>,
    walker: Walker,
    table: Snapshot,
}

/// What a walk needs besides the module table.
struct Walker {
    caches: [Cache; CACHES],
    stack_bottom: u64,
    stack_top: u64,
    /// Spans this thread's walks met last. A registered module is never
    /// unmapped and its span never changes (`table.rs`), so they stay right
    /// across tables; the walks of one call site meet the same few modules
    /// every time, and this spares each frame a search of the whole table.
    recent: [Span; RECENT_SPANS],
    next_recent: usize,
    /// framehop's cache for the trials of `bp_rule`: a trial that fails
    /// leaves a fallback rule for its address in the cache it ran on, which
    /// must not be the one real walks use.
    trial_cache: Box<Cache>,
}

const RECENT_SPANS: usize = 8;

/// The frame pointer a step is tried again with to see whether its rule
/// uses the one it was given: no stack word can be read at or near it (it
/// is not even aligned), and it is not 0, which framehop takes for the end
/// of a frame-pointer chain.
const TRIAL_BP: u64 = 1;

/// What a frame's unwind rule does with the frame pointer (rbp) it is given,
/// as far as a remembered walk's check goes (`memo.rs`): found by trying the
/// step again with rbp = [`TRIAL_BP`]. A rule that uses it (a frame-pointer
/// frame) cannot read there and fails, or lands elsewhere.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BpRule {
    /// The caller's sp and return address do not depend on it, and the
    /// caller gets it unchanged.
    PassesOn,
    /// They do not depend on it, and the caller gets a value read from the
    /// stack instead.
    Replaces,
    /// Used, or it could not be told.
    Uses,
}

/// Where the frame pointer a walk carries came from, for the check of a
/// remembered walk: compared only once a rule uses it.
#[derive(Clone, Copy)]
enum BpFrom {
    /// The register at the capture point.
    Start,
    /// The stack word of that read (by its number): left out of the check
    /// until used.
    Read(usize),
    /// Something checked already (or not known: then everything is).
    Checked,
}

/// A word of this thread's stack between `low` (the capture point's sp) and
/// `top`: mapped, and every frame in it belongs to a caller suspended until
/// the walk returns. Anything else is refused.
#[inline]
fn read_word(addr: u64, low: u64, top: u64) -> Result<u64, ()> {
    if addr < low || !addr.is_multiple_of(8) || addr > top.saturating_sub(8) {
        return Err(());
    }
    // SAFETY: an aligned word of this thread's own stack between the capture
    // point's sp and the top (checked above): mapped, and not written while
    // the walk runs, since its frames' owners are suspended in callers.
    Ok(unsafe { std::ptr::read_volatile(addr as *const u64) })
}

impl Walker {
    #[inline]
    fn span(&mut self, table: &Table, pc: u64) -> Option<Span> {
        if let Some(s) = self.recent.iter().find(|s| s.contains(pc)) {
            return Some(*s);
        }
        let s = *table.span(pc)?;
        self.recent[self.next_recent] = s;
        self.next_recent = (self.next_recent + 1) % RECENT_SPANS;
        Some(s)
    }
}

enum Slot {
    Unset,
    /// This thread's stack bounds are unknown: nothing can be read safely.
    NoStack,
    Ready(Box<ThreadState>),
}

thread_local! {
    static THREAD: RefCell<Slot> = const { RefCell::new(Slot::Unset) };
}

/// `[bottom, top)` of the calling thread's stack. glibc answers for the main
/// thread too (from /proc/self/maps and the stack rlimit: the first call
/// reads a file, hence once per thread).
fn stack_bounds() -> Option<(u64, u64)> {
    // SAFETY: plain libc calls on a zeroed attr that is destroyed once filled.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr = std::ptr::null_mut();
        let mut size = 0;
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        let bottom = addr as u64;
        (rc == 0 && size > 0).then(|| (bottom, bottom.saturating_add(size as u64)))
    }
}

/// Fills `out` from the registers of a frame that stays live until this
/// returns, unless the walk is the remembered one numbered `known` (see
/// [`super::Walk`]).
pub(crate) fn capture_from(regs: &Regs, out: &mut [u64], known: u64) -> super::Walk {
    let none = super::Walk { frames: 0, serial: 0 };
    if out.is_empty() {
        return none;
    }
    catch_unwind(AssertUnwindSafe(|| capture_on_this_thread(regs, out, known))).unwrap_or(none)
}

fn capture_on_this_thread(regs: &Regs, out: &mut [u64], known: u64) -> super::Walk {
    let walk = |frames, serial| super::Walk { frames, serial };
    // `try_with`: during the thread's teardown the state is gone; give up.
    THREAD
        .try_with(|slot| {
            // Borrowed already: a signal handler interrupted a capture on this thread.
            let Ok(mut slot) = slot.try_borrow_mut() else { return walk(0, 0) };
            if let Slot::Unset = *slot {
                *slot = match stack_bounds() {
                    Some((bottom, top)) => Slot::Ready(Box::new(ThreadState {
                        memos: Memos::new_boxed(),
                        walker: Walker {
                            caches: std::array::from_fn(|_| Cache::new_in()),
                            stack_bottom: bottom,
                            stack_top: top,
                            recent: [Span::NONE; RECENT_SPANS],
                            next_recent: 0,
                            trial_cache: Box::new(Cache::new_in()),
                        },
                        table: Snapshot::default(),
                    })),
                    None => Slot::NoStack,
                };
            }
            let Slot::Ready(state) = &mut *slot else { return walk(0, 0) };
            let ThreadState { memos, walker, table } = &mut **state;
            if let Some((n, serial)) = memos.recall(regs, out, known) {
                return walk(n, serial);
            }
            let near_miss = memos.near_miss();
            let mut recording = memos.record(regs, out.len(), near_miss);
            let (n, stop) = unwind(walker, table.current(), regs, out, &mut recording, near_miss.is_some());
            let retry = match stop {
                Stop::End => return walk(n, recording.finish(&out[..n])),
                Stop::Busy => false,
                // Rate-limited both: a rescan that cannot publish (see
                // `PUBLISH_PATIENCE_NS`) must not be retried by every capture.
                Stop::NoTable | Stop::UnknownAddress => rescan_due() && rescan(0),
            };
            if retry {
                // The frame the registers come from is still live (it called us).
                walk(unwind(walker, table.current(), regs, out, &mut Recording::none(), false).0, 0)
            } else {
                walk(n, 0)
            }
        })
        .unwrap_or(walk(0, 0))
}

enum Stop {
    End,
    /// The table is being replaced; nothing was read.
    Busy,
    NoTable,
    /// A return address outside every registered module: either a module
    /// loaded since the last scan, or code no module holds.
    UnknownAddress,
}

/// The walk, recorded. With `track`, it finds out what it depends on (a
/// near miss, `memo.rs`); otherwise everything it read and the frame
/// pointer register it started with are checked.
fn unwind(
    state: &mut Walker,
    table: Current,
    regs: &Regs,
    out: &mut [u64],
    recording: &mut Recording,
    track: bool,
) -> (usize, Stop) {
    let table = match table {
        Current::Table(t) => t,
        Current::Busy => return (0, Stop::Busy),
        Current::NoTable => return (0, Stop::NoTable),
    };
    let (low, top) = (regs.sp, state.stack_top);
    // Not on this thread's own stack (an alternate signal stack, a fiber):
    // its bounds are unknown, so nothing is read.
    if !(state.stack_bottom..top).contains(&low) {
        return (0, Stop::End);
    }
    if table.span(regs.ip).is_none() {
        return (0, Stop::UnknownAddress);
    }
    let mut uregs = UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp);
    // The first frame is the capture function itself: unwound, never kept.
    let mut frame = FrameAddress::from_instruction_pointer(regs.ip);
    let (mut n, mut leading) = (0, true);
    // Where the frame pointer the walk carries came from: `None` when the
    // walk is not tracked (everything it read is checked).
    let mut bp_from = track.then_some(BpFrom::Start);
    if !track {
        recording.bp_matters();
    }
    for step in 0..MAX_STEPS {
        if n == out.len() {
            break;
        }
        let before = Regs { ip: uregs.ip(), sp: uregs.sp(), bp: uregs.bp() };
        let first_read = if track { recording.len() } else { 0 };
        let cache = &mut state.caches[step.min(CACHES - 1)];
        let mut read_stack = |addr: u64| {
            let value = read_word(addr, low, top)?;
            recording.read(addr, value);
            Ok(value)
        };
        let stepped = table.unwinder.unwind_frame(frame, &mut uregs, cache, &mut read_stack);
        let Ok(Some(ra)) = stepped else {
            if let Some(from) = bp_from {
                // The end of the stack is where the walk ends whatever rbp
                // held if it is there with rbp = TRIAL_BP too; otherwise the
                // end (a read refused, say) may depend on it.
                let end_without_bp = matches!(stepped, Ok(None))
                    && before.bp != TRIAL_BP
                    && matches!(trial_step(table, &mut state.trial_cache, frame, &before, (low, top)), Some((None, _)));
                if !end_without_bp {
                    bp_used(recording, from);
                }
            }
            break;
        };
        if let Some(from) = bp_from {
            let step = Step { frame, before, after: &uregs, ra, reads: first_read..recording.len() };
            bp_from = Some(match bp_rule(table, &mut state.trial_cache, &step, recording, (low, top)) {
                BpRule::PassesOn => from,
                BpRule::Replaces => restored_from(recording, first_read, &uregs),
                // A frame-pointer frame: it used the one it was given, and
                // its caller's comes from the stack, at an address known
                // from that.
                BpRule::Uses => {
                    bp_used(recording, from);
                    restored_from(recording, first_read, &uregs)
                }
            });
        }
        // Every real frame pops at least its return address.
        if uregs.sp() <= before.sp {
            break;
        }
        // framehop passes a zero return address through on one path.
        let Some(span) = ra.checked_sub(1).and_then(|pc| state.span(table, pc)) else {
            return (n, Stop::UnknownAddress);
        };
        if !(leading && span.trim) {
            leading = false;
            out[n] = ra;
            n += 1;
        }
        match FrameAddress::from_return_address(ra) {
            Some(next) => frame = next,
            None => break,
        }
    }
    (n, Stop::End)
}

/// A rule used the frame pointer that came `from` there: the check of the
/// remembered walk compares it.
fn bp_used(recording: &mut Recording, from: BpFrom) {
    match from {
        BpFrom::Start => recording.bp_matters(),
        BpFrom::Read(i) => recording.needed(i),
        BpFrom::Checked => {}
    }
}

/// The read of the frame pointer a step restored: among the reads it made
/// (from `first_read` on), the one that gave the new value, not the return
/// address's slot. It is left out of the check until a rule uses it; with
/// no such read, or two, everything stays checked.
fn restored_from(recording: &mut Recording, first_read: usize, after: &UnwindRegsX86_64) -> BpFrom {
    let ra_slot = after.sp().wrapping_sub(8);
    if after.bp() == after.ip() {
        return BpFrom::Checked; // the value could be the return address's read
    }
    let mut found = None;
    for i in first_read..recording.len() {
        if let Some((addr, value)) = recording.get(i) {
            if value == after.bp() && addr != ra_slot {
                if found.is_some() {
                    return BpFrom::Checked;
                }
                found = Some(i);
            }
        }
    }
    match found {
        Some(i) => {
            recording.optional(i);
            BpFrom::Read(i)
        }
        None => BpFrom::Checked,
    }
}

/// One step of a walk, as `bp_rule` weighs it: the frame, the registers
/// before and after it, the return address it found and the reads it made.
struct Step<'a> {
    frame: FrameAddress,
    before: Regs,
    after: &'a UnwindRegsX86_64,
    ra: u64,
    reads: std::ops::Range<usize>,
}

/// What the rule of `step.frame` does with the frame pointer (see
/// [`BpRule`]): the step tried again from `before` with rbp =
/// [`TRIAL_BP`], on the trial cache, and compared with where it went. A
/// step that read the words at rbp or just above it is taken to use it,
/// whatever the trial says: the rule the walk's own cache ran there may be
/// framehop's frame-pointer fallback, left by an earlier failure, where
/// the trial ran the module's own.
fn bp_rule(
    table: &Table,
    trial_cache: &mut Cache,
    step: &Step,
    recording: &Recording,
    (low, top): (u64, u64),
) -> BpRule {
    let Step { frame, before, after, ra, ref reads } = *step;
    let near_bp = |addr: u64| addr == before.bp || addr == before.bp.wrapping_add(8);
    if before.bp == TRIAL_BP || reads.clone().any(|i| recording.get(i).is_some_and(|(addr, _)| near_bp(addr))) {
        return BpRule::Uses;
    }
    match trial_step(table, trial_cache, frame, &before, (low, top)) {
        Some((Some(r), trial)) if r == ra && trial.sp() == after.sp() => {
            if trial.bp() == TRIAL_BP && after.bp() == before.bp {
                BpRule::PassesOn
            } else if trial.bp() == after.bp() {
                BpRule::Replaces
            } else {
                BpRule::Uses
            }
        }
        _ => BpRule::Uses,
    }
}

/// The step from `before` tried again with rbp = [`TRIAL_BP`], on the trial
/// cache: the return address it found (None: the end of the stack) and the
/// registers it left, or None when it failed.
fn trial_step(
    table: &Table,
    trial_cache: &mut Cache,
    frame: FrameAddress,
    before: &Regs,
    (low, top): (u64, u64),
) -> Option<(Option<u64>, UnwindRegsX86_64)> {
    let mut trial = UnwindRegsX86_64::new(before.ip, before.sp, TRIAL_BP);
    let ra = table.unwinder.unwind_frame(frame, &mut trial, trial_cache, &mut |addr| read_word(addr, low, top)).ok()?;
    Some((ra, trial))
}

/// Captures this thread answered from a remembered walk (`memo.rs`).
pub(crate) fn memo_hits() -> u64 {
    THREAD
        .try_with(|slot| match &*slot.borrow() {
            Slot::Ready(state) => state.memos.hits,
            _ => 0,
        })
        .unwrap_or(0)
}
