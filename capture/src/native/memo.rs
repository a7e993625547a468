//! Walks remembered per thread, so that a call site that allocates in a loop
//! does not unwind the same stack again every time.
//!
//! A walk is a pure function of the capture point's registers, the buffer
//! length, the thread's stack bounds and the stack words it reads: the unwind
//! rule of an address never changes once its module is registered
//! (`table.rs`), and the caches on the way only spare lookups. (One
//! exception: where framehop's reading of a module's DWARF rule fails, it
//! keeps its frame-pointer rule for that address in the cache it ran on,
//! and later walks there follow it; a walk remembered before keeps the
//! module's answer.) So if the
//! registers and length are those of a remembered walk and every word that
//! walk read still holds the value it read, walking again would read the same
//! words in the same order and return the same frames. Checking costs a load
//! and a compare per word read, where walking costs a rule lookup and its
//! execution per frame.
//!
//! Code built without frame pointers keeps its own values in rbp (a loop's
//! counter, a pointer), which its callees save on the stack, where a walk
//! reads them back: checked, they made every capture under such a loop walk
//! again. So when a capture finds a remembered walk from the same point
//! whose return addresses all still hold but another word differs (a
//! *near miss*), it walks once more finding out, frame by frame, what the
//! walk depended on (`unwind.rs`), and remembers that walk in its place
//! with two inputs left out of the check where it did not depend on them:
//! the frame pointer register at the capture point, and a saved frame
//! pointer read back from the stack that no later frame's rule used before
//! another one replaced it. Any other difference, even in a word the result
//! might not depend on, makes it walk.

use super::regs::Regs;

/// Walks remembered per thread: a loop that allocates from a few sites in turn.
const MEMOS: usize = 4;
/// Words a remembered walk may have read; a walk that read more is not remembered.
const READS: usize = 192;
/// Frames a remembered walk may have returned (`stack_depth` is at most 128).
const FRAMES: usize = 128;
/// Words of the bit set of reads left out of the check.
const OPTIONAL_WORDS: usize = READS.div_ceil(64);

struct Memo {
    valid: bool,
    /// This walk's number on its thread (never reused; 0: none yet).
    serial: u64,
    /// Where the walk started, and the buffer length it had.
    at: Regs,
    len: usize,
    reads: [(u64, u64); READS],
    nreads: usize,
    /// While recording: reads that no rule has used yet (saved frame
    /// pointers), dropped from `reads` when the walk is finished.
    optional: [u64; OPTIONAL_WORDS],
    /// The walk used the frame pointer register it started with.
    bp_matters: bool,
    /// Set when the walk read more words than `reads` holds.
    overflow: bool,
    frames: [u64; FRAMES],
    n: usize,
}

pub(crate) struct Memos {
    memos: [Memo; MEMOS],
    next: usize,
    /// The serial of the last walk recorded.
    last_serial: u64,
    /// Captures answered from memory on this thread (tests and benches read it).
    pub hits: u64,
    /// What the last `recall` found: see [`Memos::near_miss`].
    near: Option<usize>,
}

/// Where a walk being made records what it read: `None` when it will not be remembered.
pub(crate) struct Recording<'a>(Option<&'a mut Memo>);

impl Memos {
    /// Made on the heap directly: the memos are kilobytes, and a hook may run
    /// on a thread with a small stack.
    pub fn new_boxed() -> Box<Memos> {
        // SAFETY: all zeroes is a valid `Memos` (no walk remembered).
        unsafe { Box::<Memos>::new_zeroed().assume_init() }
    }

    /// Fills `out` from a remembered walk that this one would repeat, and
    /// returns its frame count and serial; `None` when there is none. When
    /// that walk's serial is `known`, the caller holds its frames already:
    /// `out` is left as it is. A miss notes a near miss ([`Memos::near_miss`]).
    ///
    /// Every remembered read lies between the remembered `sp`, which equals
    /// the caller's, and the top of this thread's stack: the caller's frame
    /// and its callers', mapped while the caller runs.
    #[inline]
    pub fn recall(&mut self, regs: &Regs, out: &mut [u64], known: u64) -> Option<(usize, u64)> {
        self.near = None;
        for (slot, m) in self.memos.iter().enumerate() {
            if !(m.valid && m.at.ip == regs.ip && m.at.sp == regs.sp && m.len == out.len()) {
                continue;
            }
            let changed = m.first_change();
            if changed.is_none() && (!m.bp_matters || m.at.bp == regs.bp) {
                if m.serial != known {
                    out[..m.n].copy_from_slice(&m.frames[..m.n]);
                }
                self.hits += 1;
                return Some((m.n, m.serial));
            }
            if self.near.is_none() && m.returns_hold_from(changed.unwrap_or(m.nreads)) {
                self.near = Some(slot);
            }
        }
        None
    }

    /// The slot of a remembered walk that the last [`Memos::recall`] found
    /// from the same point and buffer length, whose return addresses (the
    /// words it read that hold one of its frames) all still hold, though it
    /// could not be repeated: the same callers, with other words in their
    /// frames (or another frame pointer register).
    pub fn near_miss(&self) -> Option<usize> {
        self.near
    }

    /// Starts remembering the walk about to be made from `regs` into a buffer
    /// of `len` frames, in place of the walk in slot `instead` (a near miss)
    /// or else of the oldest remembered. Several walks may start from one
    /// point (one function called from several places): each is kept apart.
    pub fn record(&mut self, regs: &Regs, len: usize, instead: Option<usize>) -> Recording<'_> {
        if len > FRAMES {
            return Recording(None);
        }
        let slot = instead.unwrap_or_else(|| {
            self.next = (self.next + 1) % MEMOS;
            self.next
        });
        self.last_serial += 1;
        let m = &mut self.memos[slot];
        (m.valid, m.serial, m.at, m.len) = (false, self.last_serial, *regs, len);
        (m.nreads, m.overflow, m.n) = (0, false, 0);
        (m.optional, m.bp_matters) = ([0; OPTIONAL_WORDS], false);
        Recording(Some(m))
    }
}

impl Memo {
    /// The reads recorded (`Recording::read` stops at `READS`, and marks the
    /// walk overflowed).
    #[inline]
    fn recorded(&self) -> &[(u64, u64)] {
        &self.reads[..self.nreads]
    }

    /// The first read, by number, whose word no longer holds what the walk
    /// read; `None`: all hold.
    #[inline]
    fn first_change(&self) -> Option<usize> {
        self.recorded().iter().position(|&(addr, value)| {
            // SAFETY: see `Memos::recall`; read as the walk read it.
            let now = unsafe { std::ptr::read_volatile(addr as *const u64) };
            now != value
        })
    }

    /// From read `from` on, does every word that held one of the walk's
    /// frames (a return address) still hold it?
    fn returns_hold_from(&self, from: usize) -> bool {
        let (frames, reads) = (&self.frames[..self.n], self.recorded());
        reads[from.min(reads.len())..].iter().all(|&(addr, value)| {
            // SAFETY: see `Memos::recall`; read as the walk read it.
            let now = unsafe { std::ptr::read_volatile(addr as *const u64) };
            now == value || !frames.contains(&value)
        })
    }

    /// Drops the reads left out of the check, keeping the others in order.
    fn drop_optional(&mut self) {
        let mut kept = 0;
        for i in 0..self.nreads {
            if self.optional[i / 64] & (1 << (i % 64)) == 0 {
                self.reads[kept] = self.reads[i];
                kept += 1;
            }
        }
        self.nreads = kept;
    }
}

impl Recording<'_> {
    /// A walk not to be remembered.
    pub fn none() -> Recording<'static> {
        Recording(None)
    }

    /// A word the walk read.
    #[inline]
    pub fn read(&mut self, addr: u64, value: u64) {
        if let Some(m) = &mut self.0 {
            match m.reads.get_mut(m.nreads) {
                Some(slot) => {
                    *slot = (addr, value);
                    m.nreads += 1;
                }
                None => m.overflow = true,
            }
        }
    }

    /// Reads recorded so far: the index the next read gets.
    #[inline]
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |m| m.nreads)
    }

    /// The read numbered `i` (address, value), if recorded.
    #[inline]
    pub fn get(&self, i: usize) -> Option<(u64, u64)> {
        self.0.as_ref().and_then(|m| m.recorded().get(i).copied())
    }

    /// Read `i` (a saved frame pointer) is left out of the check unless
    /// [`Recording::needed`] says otherwise before the walk is finished.
    #[inline]
    pub fn optional(&mut self, i: usize) {
        if let Some(m) = &mut self.0 {
            if i < m.recorded().len() {
                m.optional[i / 64] |= 1 << (i % 64);
            }
        }
    }

    /// Read `i` is checked after all: a rule used the value it gave.
    #[inline]
    pub fn needed(&mut self, i: usize) {
        if let Some(m) = &mut self.0 {
            if i < READS {
                m.optional[i / 64] &= !(1 << (i % 64));
            }
        }
    }

    /// The walk used the frame pointer register it started with.
    #[inline]
    pub fn bp_matters(&mut self) {
        if let Some(m) = &mut self.0 {
            m.bp_matters = true;
        }
    }

    /// The walk ended with these frames and may be remembered: it ended on its
    /// own, not for want of a module table or an address it could not place.
    /// Returns its serial when it is remembered, else 0.
    pub fn finish(self, frames: &[u64]) -> u64 {
        match self.0 {
            Some(m) if !m.overflow => {
                if m.optional.iter().any(|&w| w != 0) {
                    m.drop_optional();
                }
                m.frames[..frames.len()].copy_from_slice(frames);
                m.n = frames.len();
                m.valid = true;
                m.serial
            }
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A walk that used its frame pointer register and every word it read.
    fn walk_reading(memos: &mut Memos, regs: &Regs, words: &[u64], frames: &[u64]) {
        let mut recording = memos.record(regs, 8, None);
        recording.bp_matters();
        for w in words {
            recording.read(w as *const u64 as u64, *w);
        }
        recording.finish(frames);
    }

    #[test]
    fn a_walk_whose_return_addresses_hold_is_a_near_miss_and_is_replaced_in_its_slot() {
        let mut memos = Memos::new_boxed();
        let regs = Regs { ip: 1, sp: 2, bp: 3 };
        // A return address (one of the frames), then a saved register.
        let mut stack = [100u64, 55];
        walk_reading(&mut memos, &regs, &stack, &[7, 100]);
        let mut out = [0; 8];
        // SAFETY: `stack` is a live local array; the pointer comes from a unique reference to one of its
        // elements.
        unsafe { std::ptr::write_volatile(&mut stack[1], 56) };
        assert_eq!(memos.recall(&regs, &mut out, 0), None);
        let slot = memos.near_miss().expect("the same callers: a near miss");
        // Another frame pointer register alone is one too.
        // SAFETY: as above.
        unsafe { std::ptr::write_volatile(&mut stack[1], 55) };
        assert_eq!(memos.recall(&Regs { bp: 4, ..regs }, &mut out, 0), None);
        assert_eq!(memos.near_miss(), Some(slot));
        // Another return address is another caller: no near miss.
        // SAFETY: as above.
        unsafe { std::ptr::write_volatile(&mut stack[0], 200) };
        assert_eq!(memos.recall(&regs, &mut out, 0), None);
        assert_eq!(memos.near_miss(), None);
        // A walk recorded in the near miss's slot takes its place.
        let before = memos.memos.iter().filter(|m| m.valid).count();
        memos.record(&regs, 8, Some(slot)).finish(&[7, 200]);
        assert_eq!(memos.memos.iter().filter(|m| m.valid).count(), before);
        assert_eq!(memos.recall(&regs, &mut out, 0).map(|r| r.0), Some(2));
        assert_eq!(out[..2], [7, 200]);
    }

    #[test]
    fn a_frame_pointer_no_rule_used_is_left_out_of_the_check() {
        let mut memos = Memos::new_boxed();
        let regs = Regs { ip: 1, sp: 2, bp: 3 };
        let mut stack = [10u64, 20, 30];
        let mut recording = memos.record(&regs, 8, None);
        for w in &stack {
            recording.read(w as *const u64 as u64, *w);
        }
        // Words 0 and 2 were saved frame pointers; a rule used the second.
        recording.optional(0);
        recording.optional(2);
        recording.needed(2);
        recording.finish(&[7, 8]);
        let mut out = [0; 8];
        // Another frame pointer register, another word 0: the same walk.
        // SAFETY: `stack` is a live local array; the pointer comes from a unique reference to one of its
        // elements.
        unsafe { std::ptr::write_volatile(&mut stack[0], 11) };
        assert_eq!(memos.recall(&Regs { bp: 99, ..regs }, &mut out, 0).map(|r| r.0), Some(2));
        assert_eq!(out[..2], [7, 8]);
        // The word a rule used, or any other, changes: walked again.
        for i in [1, 2] {
            let old = stack[i];
            // SAFETY: as above.
            unsafe { std::ptr::write_volatile(&mut stack[i], old + 1) };
            assert_eq!(memos.recall(&regs, &mut out, 0), None, "word {i}");
            // SAFETY: as above.
            unsafe { std::ptr::write_volatile(&mut stack[i], old) };
        }
        // Another sp or ip is always another walk.
        assert_eq!(memos.recall(&Regs { sp: 5, ..regs }, &mut out, 0), None);
        assert_eq!(memos.recall(&Regs { ip: 5, ..regs }, &mut out, 0), None);
        assert_eq!(memos.recall(&regs, &mut out, 0).map(|r| r.0), Some(2));
    }

    #[test]
    fn a_walk_is_recalled_only_while_every_word_it_read_is_unchanged() {
        let mut memos = Memos::new_boxed();
        let regs = Regs { ip: 1, sp: 2, bp: 3 };
        let mut stack = [10u64, 20, 30];
        walk_reading(&mut memos, &regs, &stack, &[7, 8, 9]);
        let mut out = [0; 8];
        assert_eq!(memos.recall(&regs, &mut out, 0).map(|r| r.0), Some(3));
        assert_eq!(out[..3], [7, 8, 9]);
        // Another buffer length, another register: another walk.
        assert_eq!(memos.recall(&regs, &mut out[..4], 0), None);
        assert_eq!(memos.recall(&Regs { bp: 4, ..regs }, &mut out, 0), None);
        // The last word read changes: the walk might go elsewhere. (Written
        // volatile: the memo reads the array through addresses only.)
        // SAFETY: `stack` is a live local array; the pointer comes from a unique reference to one of its
        // elements.
        unsafe { std::ptr::write_volatile(&mut stack[2], 31) };
        assert_eq!(memos.recall(&regs, &mut out, 0), None);
        // SAFETY: `stack` is a live local array; the pointer comes from a unique reference to one of its
        // elements.
        unsafe { std::ptr::write_volatile(&mut stack[2], 30) };
        assert_eq!(memos.recall(&regs, &mut out, 0).map(|r| r.0), Some(3));
        assert_eq!(memos.hits, 2);
    }

    #[test]
    fn a_known_walk_is_recalled_without_its_frames_and_a_new_walk_gets_a_new_serial() {
        let mut memos = Memos::new_boxed();
        let regs = Regs { ip: 1, sp: 2, bp: 3 };
        let stack = [10u64];
        walk_reading(&mut memos, &regs, &stack, &[7, 8]);
        let mut out = [0; 8];
        let (n, serial) = memos.recall(&regs, &mut out, 0).unwrap();
        assert_eq!((n, out[..2].to_vec()), (2, vec![7, 8]));
        assert_ne!(serial, 0);
        // The caller has these frames: they are not written again.
        let mut untouched = [0; 8];
        assert_eq!(memos.recall(&regs, &mut untouched, serial), Some((2, serial)));
        assert_eq!(untouched, [0; 8]);
        // The same point walked again is another walk, even with the same frames.
        walk_reading(&mut memos, &Regs { bp: 4, ..regs }, &stack, &[7, 8]);
        let (_, other) = memos.recall(&Regs { bp: 4, ..regs }, &mut out, serial).unwrap();
        assert!(other != serial && other != 0);
        let finished = {
            let mut recording = memos.record(&regs, 8, None);
            recording.bp_matters();
            recording.finish(&[1])
        };
        assert!(finished > other);
    }

    #[test]
    fn walks_from_one_point_through_different_callers_are_kept_apart() {
        let mut memos = Memos::new_boxed();
        let regs = Regs { ip: 1, sp: 2, bp: 3 };
        let mut caller = [100u64];
        walk_reading(&mut memos, &regs, &caller, &[1, 100]);
        // SAFETY: `caller` is a live local array; the pointer comes from a unique reference to its element.
        unsafe { std::ptr::write_volatile(&mut caller[0], 200) };
        let mut out = [0; 8];
        assert_eq!(memos.recall(&regs, &mut out, 0), None);
        walk_reading(&mut memos, &regs, &caller, &[1, 200]);
        for c in [100, 200, 100, 200] {
            // SAFETY: `caller` is a live local array; the pointer comes from a unique reference to its
            // element.
            unsafe { std::ptr::write_volatile(&mut caller[0], c) };
            assert_eq!(memos.recall(&regs, &mut out, 0).map(|r| r.0), Some(2));
            assert_eq!(out[..2], [1, c]);
        }
    }

    #[test]
    fn unfinished_or_overlong_walks_are_not_remembered() {
        let mut memos = Memos::new_boxed();
        let regs = Regs { ip: 1, sp: 2, bp: 3 };
        let word = 5u64;
        {
            // Ended for want of a module: never finished.
            let mut recording = memos.record(&regs, 8, None);
            recording.read(&word as *const u64 as u64, word);
        }
        let mut out = [0; 8];
        assert_eq!(memos.recall(&regs, &mut out, 0), None);
        let mut recording = memos.record(&regs, 8, None);
        for _ in 0..=READS {
            recording.read(&word as *const u64 as u64, word);
        }
        recording.finish(&[1]);
        assert_eq!(memos.recall(&regs, &mut out, 0), None);
        assert!(matches!(memos.record(&regs, FRAMES + 1, None), Recording(None)));
    }
}
