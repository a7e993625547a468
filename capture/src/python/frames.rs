//! Walking the calling thread's frame chain (hot path) and describing a
//! captured frame (cold path), for a [`Runtime`] the probe accepted.

use super::layouts::{Frames, InterpFrames, LineFormat, BYTES_SVAL, OB_SIZE, OB_TYPE, OWNER_GENERATOR};
use super::linetable::{line_locations, line_pep626};
use super::probe::Runtime;
use super::read::{i32_at, plausible, u32_at, u8_at, word};
use super::{FrameInfo, PyFrame};

/// Longest name or path `describe` reads, in code points; longer ones are
/// cut and end in "…".
const MAX_CHARS: usize = 4096;
/// Largest line table `describe` decodes (real ones are a few KiB).
const MAX_LINETABLE: usize = 1 << 24;

impl Runtime {
    /// # Safety
    /// Called on the thread whose frames are read; the runtime was probed in
    /// this process.
    #[inline]
    pub(crate) unsafe fn capture(&self, out: &mut [PyFrame]) -> usize {
        if out.is_empty() || (self.is_initialized)() == 0 {
            return 0;
        }
        if let Some(finalizing) = self.is_finalizing {
            if finalizing() != 0 {
                return 0;
            }
        }
        let tstate = (self.this_thread_state)() as usize;
        if !plausible(tstate, 8) {
            return 0;
        }
        // Frames the walk passes over (entry shims, frames not started)
        // count too, so a corrupt or cyclic chain still ends.
        let limit = out.len().saturating_mul(2).saturating_add(8);
        match self.layout.frames {
            Frames::Objects { tstate_frame, f_back, f_code, f_lasti } => {
                let mut frame = word(tstate + tstate_frame);
                let mut n = 0;
                let mut steps = 0;
                while frame != 0 && n < out.len() && steps < limit {
                    steps += 1;
                    if !plausible(frame, 8) || word(frame + OB_TYPE) != self.frame_type {
                        break;
                    }
                    let code = word(frame + f_code);
                    // Code units up to 3.10; -1 before the first instruction.
                    let lasti = i32_at(frame + f_lasti).max(0) as u32;
                    frame = word(frame + f_back);
                    if self.is_code(code) {
                        out[n] = PyFrame { code: code as u64, tag: self.tag(code), lasti: lasti.saturating_mul(2) };
                        n += 1;
                    }
                }
                n
            }
            Frames::Interpreter(l) => self.walk_interpreter_frames(tstate, &l, out, limit),
        }
    }

    #[inline]
    unsafe fn walk_interpreter_frames(
        &self,
        tstate: usize,
        l: &InterpFrames,
        out: &mut [PyFrame],
        limit: usize,
    ) -> usize {
        let Some(code_start) = self.layout.code.code_adaptive else { return 0 };
        let mut frame = match l.cframe_current_frame {
            Some(current) => {
                let cframe = word(tstate + l.tstate_frame);
                if !plausible(cframe, 8) {
                    return 0;
                }
                word(cframe + current)
            }
            None => word(tstate + l.tstate_frame),
        };
        let mut n = 0;
        let mut steps = 0;
        while frame != 0 && n < out.len() && steps < limit {
            steps += 1;
            if !plausible(frame, 8) {
                break;
            }
            let owner = u8_at(frame + l.owner);
            let code = word(frame + l.code);
            let instr = word(frame + l.instr);
            frame = word(frame + l.previous);
            if Some(owner) == l.owner_cstack || !self.is_code(code) {
                continue;
            }
            let start = code + code_start;
            // ob_size counts the code units of co_code_adaptive.
            let len = word(code + OB_SIZE).saturating_mul(2);
            // A frame pushed but not started points before its code.
            let Some(lasti) = instr.checked_sub(start).filter(|&b| b < len && b <= u32::MAX as usize) else {
                continue;
            };
            if let Some(first_traceable) = l.code_first_traceable {
                let first = i32_at(code + first_traceable).max(0) as usize * 2;
                if owner != OWNER_GENERATOR && lasti < first {
                    continue;
                }
            }
            out[n] = PyFrame { code: code as u64, tag: self.tag(code), lasti: lasti as u32 };
            n += 1;
        }
        n
    }

    #[inline(always)]
    unsafe fn is_code(&self, code: usize) -> bool {
        plausible(code, 8) && word(code + OB_TYPE) == self.code_type
    }

    /// Tells this code object from a later one allocated at the same address:
    /// mixes the addresses of its file and name strings with its first line.
    /// A later code object only gets the same tag if it shares all three,
    /// i.e. is the same function of the same file, so it describes alike.
    #[inline(always)]
    unsafe fn tag(&self, code: usize) -> u64 {
        let c = &self.layout.code;
        let file = word(code + c.filename) as u64;
        let name = word(code + c.name) as u64;
        let first = u64::from(u32_at(code + c.firstlineno));
        let mut h = file.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ name.rotate_left(29) ^ (first << 40 | first);
        h ^= h >> 31;
        h = h.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        h ^ (h >> 32)
    }

    /// # Safety
    /// `code` is 0 or a live object.
    pub(crate) unsafe fn frame_of_code(&self, code: u64, lasti: u32) -> Option<PyFrame> {
        let code = usize::try_from(code).ok()?;
        self.is_code(code).then(|| PyFrame { code: code as u64, tag: self.tag(code), lasti })
    }

    /// # Safety
    /// The frame was captured on this thread and is still on its stack, so
    /// its code object is alive.
    pub(crate) unsafe fn describe(&self, frame: &PyFrame) -> Option<FrameInfo> {
        let code = usize::try_from(frame.code).ok()?;
        if !self.is_code(code) || self.tag(code) != frame.tag {
            return None;
        }
        let c = &self.layout.code;
        Some(FrameInfo {
            file: self.string(word(code + c.filename)).unwrap_or_else(|| "?".into()),
            function: self.string(word(code + c.name)).unwrap_or_else(|| "?".into()),
            line: self.line(code, frame.lasti).unwrap_or(0),
        })
    }

    unsafe fn line(&self, code: usize, lasti: u32) -> Option<u32> {
        let table = word(code + self.layout.code.linetable);
        if !plausible(table, 8) || word(table + OB_TYPE) != self.bytes_type {
            return None;
        }
        let len = word(table + OB_SIZE);
        if len > MAX_LINETABLE {
            return None;
        }
        let bytes = std::slice::from_raw_parts((table + BYTES_SVAL) as *const u8, len);
        let first = i32_at(code + self.layout.code.firstlineno);
        let line = match self.layout.lines {
            LineFormat::Pep626 => line_pep626(bytes, first, lasti),
            LineFormat::Locations => line_locations(bytes, first, lasti),
        }?;
        u32::try_from(line).ok()
    }

    /// A `str` held by a code object. Only compact strings (the only kind
    /// the compiler and unmarshal make) are read; anything else is `None`.
    unsafe fn string(&self, obj: usize) -> Option<String> {
        if !plausible(obj, 8) || word(obj + OB_TYPE) != self.unicode_type {
            return None;
        }
        let u = &self.layout.unicode;
        let length = word(obj + u.length);
        if length > isize::MAX as usize {
            return None;
        }
        let state = u32_at(obj + u.state);
        let kind = (state >> 2) & 7;
        let compact = state & (1 << 5) != 0;
        let ascii = state & (1 << 6) != 0;
        let ready = state & (1 << 7) != 0;
        if !compact || (u.has_ready_bit && !ready) || (ascii && kind != 1) {
            return None;
        }
        let data = obj + if ascii { u.ascii_size } else { u.compact_size };
        let n = length.min(MAX_CHARS);
        let mut s = String::with_capacity(n);
        match kind {
            1 => {
                let bytes = std::slice::from_raw_parts(data as *const u8, n);
                // Latin-1: each byte is the code point.
                s.extend(bytes.iter().map(|&b| char::from(b)));
            }
            2 => {
                let units = std::slice::from_raw_parts(data as *const u16, n);
                s.extend(units.iter().map(|&c| char::from_u32(u32::from(c)).unwrap_or('\u{FFFD}')));
            }
            4 => {
                let units = std::slice::from_raw_parts(data as *const u32, n);
                s.extend(units.iter().map(|&c| char::from_u32(c).unwrap_or('\u{FFFD}')));
            }
            _ => return None,
        }
        if length > n {
            s.push('…');
        }
        Some(s)
    }
}
