//! Walks remembered per thread, so that a call site that allocates in a loop
//! does not unwind the same stack again every time.
//!
//! A walk is a pure function of the capture point's registers, the buffer
//! length, the thread's stack bounds and the stack words it reads: the unwind
//! rule of an address never changes once its module is registered
//! (`table.rs`), and the caches on the way only spare lookups. So if the
//! registers and length are those of a remembered walk and every word that
//! walk read still holds the value it read, walking again would read the same
//! words in the same order and return the same frames. Checking costs a load
//! and a compare per word read, where walking costs a rule lookup and its
//! execution per frame. Any difference, even in a word the result might not
//! depend on, makes it walk.

use super::regs::Regs;

/// Walks remembered per thread: a loop that allocates from a few sites in turn.
const MEMOS: usize = 4;
/// Words a remembered walk may have read; a walk that read more is not remembered.
const READS: usize = 192;
/// Frames a remembered walk may have returned (`stack_depth` is at most 128).
const FRAMES: usize = 128;

struct Memo {
    valid: bool,
    /// This walk's number on its thread (never reused; 0: none yet).
    serial: u64,
    /// Where the walk started, and the buffer length it had.
    at: Regs,
    len: usize,
    reads: [(u64, u64); READS],
    nreads: usize,
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
    /// `out` is left as it is.
    ///
    /// Every remembered read lies between the remembered `sp`, which equals
    /// the caller's, and the top of this thread's stack: the caller's frame
    /// and its callers', mapped while the caller runs.
    #[inline]
    pub fn recall(&mut self, regs: &Regs, out: &mut [u64], known: u64) -> Option<(usize, u64)> {
        let m = self.memos.iter().find(|m| m.valid && m.matches(regs, out.len()) && m.reads_hold())?;
        if m.serial != known {
            out[..m.n].copy_from_slice(&m.frames[..m.n]);
        }
        self.hits += 1;
        Some((m.n, m.serial))
    }

    /// Starts remembering the walk about to be made from `regs` into a buffer
    /// of `len` frames, in place of the oldest remembered. Several walks may
    /// start from one point (one function called from several places): each
    /// is kept apart.
    pub fn record(&mut self, regs: &Regs, len: usize) -> Recording<'_> {
        if len > FRAMES {
            return Recording(None);
        }
        self.next = (self.next + 1) % MEMOS;
        self.last_serial += 1;
        let m = &mut self.memos[self.next];
        (m.valid, m.serial, m.at, m.len) = (false, self.last_serial, *regs, len);
        (m.nreads, m.overflow, m.n) = (0, false, 0);
        Recording(Some(m))
    }
}

impl Memo {
    #[inline]
    fn matches(&self, regs: &Regs, len: usize) -> bool {
        self.at == *regs && self.len == len
    }

    /// Does every word the walk read still hold what it read? A plain
    /// loop: every capture of a call site in a loop runs it.
    #[inline]
    fn reads_hold(&self) -> bool {
        for &(addr, value) in &self.reads[..self.nreads.min(READS)] {
            // SAFETY: see `Memos::recall`; read as the walk read it.
            if unsafe { std::ptr::read_volatile(addr as *const u64) } != value {
                return false;
            }
        }
        true
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

    /// The walk ended with these frames and may be remembered: it ended on its
    /// own, not for want of a module table or an address it could not place.
    /// Returns its serial when it is remembered, else 0.
    pub fn finish(self, frames: &[u64]) -> u64 {
        match self.0 {
            Some(m) if !m.overflow => {
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

    fn walk_reading(memos: &mut Memos, regs: &Regs, words: &[u64], frames: &[u64]) {
        let mut recording = memos.record(regs, 8);
        for w in words {
            recording.read(w as *const u64 as u64, *w);
        }
        recording.finish(frames);
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
        let finished = memos.record(&regs, 8).finish(&[1]);
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
            let mut recording = memos.record(&regs, 8);
            recording.read(&word as *const u64 as u64, word);
        }
        let mut out = [0; 8];
        assert_eq!(memos.recall(&regs, &mut out, 0), None);
        let mut recording = memos.record(&regs, 8);
        for _ in 0..=READS {
            recording.read(&word as *const u64 as u64, word);
        }
        recording.finish(&[1]);
        assert_eq!(memos.recall(&regs, &mut out, 0), None);
        assert!(matches!(memos.record(&regs, FRAMES + 1), Recording(None)));
    }
}
