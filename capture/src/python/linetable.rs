//! Instruction offset to line number, from a code object's `co_linetable`.
//! Pure functions over the table's bytes, so they are tested without an
//! interpreter; `describe` feeds them the bytes of a live code object.

/// The line of the instruction at byte offset `addr`, from a Python 3.10
/// (PEP 626) table: pairs of (bytes covered, signed line delta), a delta of
/// -128 meaning "no line" (Objects/lnotab_notes.txt at v3.10.0). `None` when
/// the instruction has no line or lies past the table.
pub(crate) fn line_pep626(table: &[u8], firstlineno: i32, addr: u32) -> Option<i32> {
    let mut line = firstlineno;
    let mut end: u32 = 0;
    for pair in table.chunks_exact(2) {
        end = end.saturating_add(u32::from(pair[0]));
        let delta = pair[1] as i8;
        let current = if delta == -128 {
            None
        } else {
            line = line.wrapping_add(i32::from(delta));
            Some(line)
        };
        // Entries covering no bytes only move the line; CPython skips past
        // every entry that ends at or before the address, so the first one
        // ending after it decides.
        if end > addr {
            return current;
        }
    }
    None
}

/// The line of the instruction at byte offset `addr`, from a Python 3.11+
/// location table (Objects/locations.md): entries of a start byte (bit 7 set;
/// bits 3..6 a code; bits 0..2 the number of code units covered, minus one)
/// followed by varints. Only the line matters here: codes 13 and 14 start
/// with a signed varint line delta, 10..12 add 0..2, 15 has no location, the
/// short forms 0..9 stay on the line. `None` for no location, past the end,
/// or a malformed table.
pub(crate) fn line_locations(table: &[u8], firstlineno: i32, addr: u32) -> Option<i32> {
    let mut line = firstlineno;
    let mut end: u32 = 0;
    let mut pos = 0;
    while pos < table.len() {
        let first = table[pos];
        if first & 0x80 == 0 {
            return None;
        }
        let code = (first >> 3) & 15;
        line = line.wrapping_add(match code {
            13 | 14 => signed_varint(&table[pos + 1..]),
            11 => 1,
            12 => 2,
            _ => 0,
        });
        end = end.saturating_add((u32::from(first & 7) + 1) * 2);
        if end > addr {
            return if code == 15 { None } else { Some(line) };
        }
        pos += 1;
        while pos < table.len() && table[pos] & 0x80 == 0 {
            pos += 1;
        }
    }
    None
}

/// Little-endian groups of 6 bits, bit 6 set on all but the last; the low
/// bit of the result is the sign. Stops at the end of `bytes` and ignores
/// bits past 32 rather than trusting the table to be well formed.
fn signed_varint(bytes: &[u8]) -> i32 {
    let mut value: u32 = 0;
    let mut shift = 0;
    for &b in bytes {
        if shift < 32 {
            value |= u32::from(b & 63) << shift;
        }
        shift += 6;
        if b & 64 == 0 {
            break;
        }
    }
    let magnitude = (value >> 1) as i32;
    if value & 1 != 0 {
        magnitude.wrapping_neg()
    } else {
        magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function whose lines go back and forth (a multi-line comprehension,
    /// a try/except, a 300-line gap that needs a multi-byte varint), compiled
    /// by CPython; `lines` is what its `co_lines()` gives for each code unit
    /// (0 for none). Generated with:
    ///
    /// ```text
    /// src = '\ndef f(a, b):\n    x = [i\n         for i in range(a)\n         if i % 2]\n    try:\n'
    ///       '        y = (a +\n             b)\n    except ZeroDivisionError:\n        pass\n'
    ///       + '\n' * 300 + '\n    for k in range(3):\n        x.append(k)\n    return (x,\n            y)\n'
    /// exec(compile(src, 'fixture.py', 'exec'), ns); co = ns['f'].__code__
    /// list(co.co_linetable); [line of each offset in co.co_lines()]
    /// ```
    struct Fixture {
        firstlineno: i32,
        table: &'static [u8],
        lines: &'static [i32],
    }

    const PY_3_11_7: Fixture = Fixture {
        firstlineno: 2,
        table: &[
            128, 0, 240, 2, 2, 9, 19, 240, 0, 2, 9, 19, 221, 18, 23, 152, 1, 145, 40, 148, 40, 240, 3, 2, 9, 19, 241,
            0, 2, 9, 19, 244, 0, 2, 9, 19, 128, 65, 240, 6, 4, 5, 13, 216, 13, 14, 216, 13, 14, 241, 3, 1, 14, 15, 136,
            1, 136, 1, 248, 229, 11, 28, 240, 0, 1, 5, 13, 240, 0, 1, 5, 13, 240, 0, 1, 5, 13, 216, 8, 12, 136, 4, 240,
            3, 1, 5, 13, 248, 248, 248, 245, 94, 9, 0, 14, 19, 144, 49, 137, 88, 140, 88, 240, 0, 1, 5, 20, 240, 0, 1,
            5, 20, 136, 1, 216, 8, 9, 143, 8, 138, 8, 144, 17, 137, 11, 140, 11, 136, 11, 136, 11, 216, 12, 13, 216,
            12, 13, 240, 3, 1, 12, 15, 240, 0, 1, 5, 15,
        ],
        lines: &[
            2, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3, 3, 3, 3, 3, 3, 3, 3, 3, 6, 7, 8, 7, 7, 7, 7, 0, 9, 9,
            9, 9, 9, 9, 9, 9, 9, 10, 10, 9, 0, 0, 0, 312, 312, 312, 312, 312, 312, 312, 312, 312, 312, 312, 312, 312,
            312, 312, 312, 312, 313, 313, 313, 313, 313, 313, 313, 313, 313, 313, 313, 313, 313, 313, 313, 313, 313,
            313, 313, 313, 313, 313, 314, 315, 314, 314,
        ],
    };

    const PY_3_10_13: Fixture = Fixture {
        firstlineno: 2,
        table: &[
            6, 1, 6, 1, 6, 255, 2, 3, 2, 1, 2, 1, 8, 255, 12, 2, 4, 1, 2, 255, 0, 127, 0, 127, 12, 49, 12, 1, 2, 1, 2,
            1, 4, 255,
        ],
        lines: &[
            3, 3, 3, 4, 4, 4, 3, 3, 3, 6, 7, 8, 7, 7, 7, 7, 9, 9, 9, 9, 9, 9, 10, 10, 9, 312, 312, 312, 312, 312, 312,
            313, 313, 313, 313, 313, 313, 314, 315, 314, 314,
        ],
    };

    fn check(fx: &Fixture, decode: fn(&[u8], i32, u32) -> Option<i32>) {
        for (unit, &want) in fx.lines.iter().enumerate() {
            let got = decode(fx.table, fx.firstlineno, unit as u32 * 2).unwrap_or(0);
            assert_eq!(got, want, "code unit {unit}");
        }
        assert_eq!(decode(fx.table, fx.firstlineno, fx.lines.len() as u32 * 2), None, "past the end");
    }

    #[test]
    fn locations_match_python_3_11() {
        check(&PY_3_11_7, line_locations);
    }

    #[test]
    fn pep626_matches_python_3_10() {
        check(&PY_3_10_13, line_pep626);
    }

    #[test]
    fn signed_varints() {
        assert_eq!(signed_varint(&[0]), 0);
        assert_eq!(signed_varint(&[2]), 1);
        assert_eq!(signed_varint(&[3]), -1);
        // 600 = 0b1001011000: low 6 bits 24 with continuation, then 9.
        assert_eq!(signed_varint(&[24 | 64, 9]), 300);
        assert_eq!(signed_varint(&[25 | 64, 9]), -300);
    }

    #[test]
    fn malformed_tables_give_no_line_and_do_not_panic() {
        // A continuation byte where an entry must start.
        assert_eq!(line_locations(&[0x05], 1, 0), None);
        // A long-form entry cut short inside its varint.
        assert_eq!(line_locations(&[0x80 | (14 << 3), 64 | 1], 1, 0), Some(1));
        assert_eq!(line_locations(&[], 1, 0), None);
        assert_eq!(line_pep626(&[2], 1, 0), None);
        let junk: Vec<u8> = (0..=255).collect();
        for addr in (0..600).step_by(2) {
            let _ = line_locations(&junk, i32::MAX, addr);
            let _ = line_pep626(&junk, i32::MIN, addr);
        }
    }
}
