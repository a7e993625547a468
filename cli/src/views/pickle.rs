//! A small streaming pickle writer that uses only the opcodes PyTorch's
//! memory_viz unpickler (`torch/utils/viz/MemoryViz.js`) accepts, so that the
//! viewer in the browser loads what Python's `pickle` loads too:
//! PROTO, MARK, EMPTY_DICT, EMPTY_LIST, SETITEMS, APPENDS, BININT, BININT1,
//! BININT2, LONG1, SHORT_BINUNICODE, BINUNICODE, BINPUT, LONG_BINPUT, BINGET,
//! LONG_BINGET, NEWTRUE, NEWFALSE, STOP (a subset of what it reads: no floats,
//! no `None`, no tuples are needed).
//!
//! Lists and dicts are written as an empty container followed by marked
//! batches of at most 1000 items (as Python's own pickler does). Strings are
//! written once and fetched from the memo afterwards; any finished value can
//! be memoised with [`Pickler::memoize`] and written again with [`Pickler::get`].

use std::collections::HashMap;
use std::io::{self, Write};

pub mod op {
    pub const PROTO: u8 = 0x80;
    pub const STOP: u8 = b'.';
    pub const MARK: u8 = b'(';
    pub const EMPTY_DICT: u8 = b'}';
    pub const EMPTY_LIST: u8 = b']';
    pub const SETITEMS: u8 = b'u';
    pub const APPENDS: u8 = b'e';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const BININT2: u8 = b'M';
    pub const LONG1: u8 = 0x8a;
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE: u8 = b'X';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;

    /// Every opcode the writer may emit, with its name in Python's `pickletools`.
    #[cfg(test)]
    pub const ALL: &[(u8, &str)] = &[
        (PROTO, "PROTO"),
        (STOP, "STOP"),
        (MARK, "MARK"),
        (EMPTY_DICT, "EMPTY_DICT"),
        (EMPTY_LIST, "EMPTY_LIST"),
        (SETITEMS, "SETITEMS"),
        (APPENDS, "APPENDS"),
        (BININT, "BININT"),
        (BININT1, "BININT1"),
        (BININT2, "BININT2"),
        (LONG1, "LONG1"),
        (SHORT_BINUNICODE, "SHORT_BINUNICODE"),
        (BINUNICODE, "BINUNICODE"),
        (BINPUT, "BINPUT"),
        (LONG_BINPUT, "LONG_BINPUT"),
        (BINGET, "BINGET"),
        (LONG_BINGET, "LONG_BINGET"),
        (NEWTRUE, "NEWTRUE"),
        (NEWFALSE, "NEWFALSE"),
    ];
}

/// Items per marked batch of a list or dict.
const BATCH: usize = 1000;

/// A memo slot: what [`Pickler::memoize`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Memo(u32);

/// An open list or dict: whether it is a dict, and the items in its current batch.
struct Open {
    dict: bool,
    batch: usize,
}

pub struct Pickler<W: Write> {
    out: W,
    strings: HashMap<String, Memo>,
    next_memo: u32,
    open: Vec<Open>,
}

impl<W: Write> Pickler<W> {
    /// Starts a protocol 4 pickle.
    pub fn new(mut out: W) -> io::Result<Pickler<W>> {
        out.write_all(&[op::PROTO, 4])?;
        Ok(Pickler { out, strings: HashMap::new(), next_memo: 0, open: Vec::new() })
    }

    /// A value was written: count it in the open container, closing a full batch.
    fn item(&mut self) -> io::Result<()> {
        let Some(top) = self.open.last_mut() else { return Ok(()) };
        top.batch += 1;
        let per = if top.dict { 2 * BATCH } else { BATCH };
        if top.batch == per {
            let close = if top.dict { op::SETITEMS } else { op::APPENDS };
            top.batch = 0;
            self.out.write_all(&[close, op::MARK])?;
        }
        Ok(())
    }

    pub fn bool(&mut self, b: bool) -> io::Result<()> {
        self.out.write_all(&[if b { op::NEWTRUE } else { op::NEWFALSE }])?;
        self.item()
    }

    pub fn int(&mut self, n: i128) -> io::Result<()> {
        if (0..=0xff).contains(&n) {
            self.out.write_all(&[op::BININT1, n as u8])?;
        } else if (0..=0xffff).contains(&n) {
            self.out.write_all(&[op::BININT2])?;
            self.out.write_all(&(n as u16).to_le_bytes())?;
        } else if (i32::MIN as i128..=i32::MAX as i128).contains(&n) {
            self.out.write_all(&[op::BININT])?;
            self.out.write_all(&(n as i32).to_le_bytes())?;
        } else {
            // Two's complement, little-endian, as few bytes as keep the sign.
            let bytes = n.to_le_bytes();
            let mut len = 16;
            while len > 1 {
                let (last, next) = (bytes[len - 1], bytes[len - 2]);
                if (last == 0 && next < 0x80) || (last == 0xff && next >= 0x80) {
                    len -= 1;
                } else {
                    break;
                }
            }
            self.out.write_all(&[op::LONG1, len as u8])?;
            self.out.write_all(&bytes[..len])?;
        }
        self.item()
    }

    pub fn uint(&mut self, n: u64) -> io::Result<()> {
        self.int(i128::from(n))
    }

    /// A string, from the memo when it was written before.
    pub fn str(&mut self, s: &str) -> io::Result<()> {
        if let Some(&m) = self.strings.get(s) {
            return self.get(m);
        }
        let bytes = s.as_bytes();
        if bytes.len() < 256 {
            self.out.write_all(&[op::SHORT_BINUNICODE, bytes.len() as u8])?;
        } else {
            self.out.write_all(&[op::BINUNICODE])?;
            self.out.write_all(&(bytes.len() as u32).to_le_bytes())?;
        }
        self.out.write_all(bytes)?;
        let m = self.put()?;
        self.strings.insert(s.to_string(), m);
        self.item()
    }

    /// Stores the value on top of the stack in the next memo slot.
    fn put(&mut self) -> io::Result<Memo> {
        let m = Memo(self.next_memo);
        self.next_memo += 1;
        if m.0 < 256 {
            self.out.write_all(&[op::BINPUT, m.0 as u8])?;
        } else {
            self.out.write_all(&[op::LONG_BINPUT])?;
            self.out.write_all(&m.0.to_le_bytes())?;
        }
        Ok(m)
    }

    /// Memoises the list or dict just ended, so that [`Pickler::get`] can write it again.
    pub fn memoize(&mut self) -> io::Result<Memo> {
        self.put()
    }

    /// Writes memoised value `m` again (the same object, in Python).
    pub fn get(&mut self, m: Memo) -> io::Result<()> {
        if m.0 < 256 {
            self.out.write_all(&[op::BINGET, m.0 as u8])?;
        } else {
            self.out.write_all(&[op::LONG_BINGET])?;
            self.out.write_all(&m.0.to_le_bytes())?;
        }
        self.item()
    }

    pub fn begin_list(&mut self) -> io::Result<()> {
        self.out.write_all(&[op::EMPTY_LIST, op::MARK])?;
        self.open.push(Open { dict: false, batch: 0 });
        Ok(())
    }

    pub fn begin_dict(&mut self) -> io::Result<()> {
        self.out.write_all(&[op::EMPTY_DICT, op::MARK])?;
        self.open.push(Open { dict: true, batch: 0 });
        Ok(())
    }

    /// Ends the innermost open list or dict.
    pub fn end(&mut self) -> io::Result<()> {
        let top = self.open.pop().expect("end() without a begin");
        self.out.write_all(&[if top.dict { op::SETITEMS } else { op::APPENDS }])?;
        self.item()
    }

    /// A key of the open dict (its value comes next).
    pub fn key(&mut self, k: &str) -> io::Result<()> {
        self.str(k)
    }

    /// Ends the pickle; hands the writer back.
    pub fn finish(mut self) -> io::Result<W> {
        assert!(self.open.is_empty(), "a list or dict left open");
        self.out.write_all(&[op::STOP])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
/// The opcodes of a pickle this module wrote, in order: a reader of exactly
/// the subset above (anything else is an error naming the byte offset).
pub fn opcodes(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut ops = Vec::new();
    let mut i = 0;
    let u32_at = |i: usize| -> Result<usize, String> {
        let b: [u8; 4] = bytes.get(i..i + 4).and_then(|s| s.try_into().ok()).ok_or("cut short")?;
        Ok(u32::from_le_bytes(b) as usize)
    };
    while i < bytes.len() {
        let code = bytes[i];
        ops.push(code);
        i += 1;
        i += match code {
            op::PROTO | op::BININT1 | op::BINPUT | op::BINGET => 1,
            op::BININT2 => 2,
            op::BININT | op::LONG_BINPUT | op::LONG_BINGET => 4,
            op::LONG1 | op::SHORT_BINUNICODE => 1 + *bytes.get(i).ok_or("cut short")? as usize,
            op::BINUNICODE => 4 + u32_at(i)?,
            op::STOP => return if i == bytes.len() { Ok(ops) } else { Err(format!("bytes after STOP at {i}")) },
            op::MARK | op::EMPTY_DICT | op::EMPTY_LIST | op::SETITEMS | op::APPENDS | op::NEWTRUE | op::NEWFALSE => 0,
            other => return Err(format!("opcode 0x{other:02x} at byte {} is not one memory_viz reads", i - 1)),
        };
    }
    Err("no STOP".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pickle(f: impl FnOnce(&mut Pickler<Vec<u8>>) -> io::Result<()>) -> Vec<u8> {
        let mut p = Pickler::new(Vec::new()).unwrap();
        f(&mut p).unwrap();
        p.finish().unwrap()
    }

    #[test]
    fn integers_take_the_smallest_opcode() {
        let bytes = pickle(|p| {
            p.begin_list()?;
            for n in [0i128, 255, 256, 65535, 65536, -1, i32::MIN as i128, 1 << 40, -(1 << 40), u64::MAX as i128] {
                p.int(n)?;
            }
            p.end()
        });
        let ops = opcodes(&bytes).unwrap();
        let ints: Vec<u8> =
            ops.into_iter().filter(|o| [op::BININT1, op::BININT2, op::BININT, op::LONG1].contains(o)).collect();
        use op::*;
        assert_eq!(ints, vec![BININT1, BININT1, BININT2, BININT2, BININT, BININT, BININT, LONG1, LONG1, LONG1]);
        // 2^40: 6 bytes; u64::MAX needs a ninth byte for its sign.
        let long1: Vec<u8> = bytes.windows(2).filter(|w| w[0] == LONG1).map(|w| w[1]).collect();
        assert_eq!(long1, vec![6, 6, 9]);
    }

    #[test]
    fn strings_are_memoised_and_batches_are_marked() {
        let bytes = pickle(|p| {
            p.begin_list()?;
            for _ in 0..2500 {
                p.str("alloc")?;
            }
            p.end()
        });
        let ops = opcodes(&bytes).unwrap();
        assert_eq!(ops.iter().filter(|&&o| o == op::SHORT_BINUNICODE).count(), 1);
        assert_eq!(ops.iter().filter(|&&o| o == op::BINGET).count(), 2499);
        assert_eq!(ops.iter().filter(|&&o| o == op::APPENDS).count(), 3, "batches of 1000");
        assert_eq!(ops.iter().filter(|&&o| o == op::MARK).count(), 3);
        assert!(ops.iter().all(|o| op::ALL.iter().any(|(c, _)| c == o)));
    }

    #[test]
    fn foreign_opcodes_are_named() {
        let e = opcodes(&[op::PROTO, 4, b'c', b'.']).unwrap_err();
        assert!(e.contains("0x63 at byte 2"), "{e}");
    }
}
