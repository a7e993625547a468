//! Formatting of log lines. Pure functions over `String` so they can be golden-tested.

use super::schema::{Definition, End, ProcessInfo, DEFAULT_DEVICE, DEFAULT_MEM_KIND, SCHEMA, VERSION};
use super::{Event, EventKind, MemKind};
use crate::options::Options;
use std::fmt::Write as _;

/// Marker for the first event line, which carries no leading comma.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum EventLine {
    First,
    Later,
}

/// The first line: everything up to and including `"events":[`.
pub fn write_header(out: &mut String, process: &ProcessInfo, options: &Options) {
    // Plain records of strings and numbers: serializing them cannot fail.
    let process = serde_json::to_string(process).unwrap_or_else(|_| "{}".into());
    let options = serde_json::to_string(options).unwrap_or_else(|_| "{}".into());
    let _ = writeln!(
        out,
        "{{\"schema\":\"{SCHEMA}\",\"version\":{VERSION},\"process\":{process},\"options\":{options},\"events\":["
    );
}

/// Appends one event as one line: the JSON of `EventRecord::from(e)` but for
/// `api`, `kind` and `device` at their defaults, which the line leaves out
/// (a reader fills them in, `EventRecord::with_defaults`). Formatted by
/// hand because it runs for every allocation (the writer thread must keep
/// up with millions a second; `write!` took three times as long).
pub fn write_event(out: &mut String, e: &Event, line: EventLine) {
    write_named_event(out, e, line, "");
}

/// Room for the widest line of any event but a phase's: every field at its
/// widest comes to about 400 bytes.
const EVENT_LINE_ROOM: usize = 512;

/// `write_event` for an event that carries a name (phases): `name` is the
/// text of the string the event's `aux` refers to.
pub fn write_named_event(out: &mut String, e: &Event, line: EventLine, name: &str) {
    // A string of user text: serde_json escapes it (it cannot fail on a &str).
    let name = match e.kind {
        EventKind::PhaseBegin | EventKind::PhaseEnd => serde_json::to_string(name).unwrap_or_else(|_| "\"\"".into()),
        _ => String::new(),
    };
    let mut o = Fields::new(out, EVENT_LINE_ROOM + name.len());
    if line == EventLine::Later {
        o.text(",");
    }
    o.text("{\"seq\":").uint(e.seq).text(",\"t_ns\":").uint(e.t_ns);
    o.text(",\"ev\":\"").text(e.kind.as_str()).text("\"");
    if e.kind.has_api() && e.kind.default_api() != Some(e.api) {
        o.text(",\"api\":\"").text(e.api.as_str()).text("\"");
    }
    match e.kind {
        EventKind::Start => {}
        EventKind::Alloc | EventKind::Free | EventKind::Map | EventKind::Unmap => {
            o.kind(e.mem).text(",\"ptr\":").hex(e.ptr);
            o.text(",\"size\":").uint(e.size).device(e.device);
            if e.aux != 0 {
                let field =
                    if matches!(e.kind, EventKind::Map | EventKind::Unmap) { ",\"handle\":" } else { ",\"stream\":" };
                o.text(field).hex(e.aux);
            }
            if e.kind == EventKind::Alloc && e.stack != 0 {
                o.text(",\"stack\":").uint(e.stack.into());
            }
            if e.kind == EventKind::Alloc && e.pooled {
                o.text(",\"pooled\":true");
            }
        }
        EventKind::Reserve | EventKind::Release => {
            o.text(",\"size\":").uint(e.size).device(e.device);
        }
        EventKind::AllocFailed | EventKind::Oom => {
            o.kind(e.mem).text(",\"size\":").uint(e.size);
            o.device(e.device).text(",\"result\":").int(e.result.into());
        }
        EventKind::InvalidFree => {
            o.text(",\"ptr\":").hex(e.ptr).device(e.device);
            o.text(",\"result\":").int(e.result.into());
        }
        EventKind::Checkpoint => {
            o.device(e.device).text(",\"leaked_bytes\":").uint(e.size);
            o.text(",\"leaked_count\":").uint(e.aux);
        }
        EventKind::PhaseBegin | EventKind::PhaseEnd => {
            o.device(e.device).text(",\"name\":").text(&name);
            o.text(",\"live\":").uint(e.size).text(",\"reserved\":").uint(e.ptr);
        }
    }
    o.text(",\"tid\":").uint(e.tid.into()).text("}\n");
}

/// Appends the parts of a line: text as it is, numbers in decimal, pointers
/// as a quoted `0x` hex string (what `{:#x}` writes). The line's room is
/// reserved once and each part is written straight into it, a number's
/// digits from the last one back once its length is known: no call, no
/// buffer to copy from, and the string's length set once, when the line is
/// done (`Drop`): a fifth fewer instructions than pushing each part onto
/// the string, and a third less time (`cargo bench -p cupool-core --bench log`).
struct Fields<'a> {
    out: &'a mut String,
    /// Where the next part goes, in the capacity past the string's end.
    at: *mut u8,
    /// The end of the room reserved for the line.
    end: *mut u8,
}

impl<'a> Fields<'a> {
    fn new(out: &'a mut String, room: usize) -> Fields<'a> {
        out.reserve(room);
        // SAFETY: `reserve` made `room` bytes of capacity past `len`; both
        // pointers stay within the allocation (or one past it).
        let (at, end) = unsafe {
            let at = out.as_mut_vec().as_mut_ptr().add(out.len());
            (at, at.add(room))
        };
        Fields { out, at, end }
    }

    /// Lets `write` fill the next `n` bytes of the line, which it must fill
    /// with UTF-8.
    #[inline(always)]
    fn append(&mut self, n: usize, write: impl FnOnce(*mut u8)) -> &mut Self {
        assert!(n <= self.end as usize - self.at as usize, "a log line outgrew its room");
        write(self.at);
        // SAFETY: `n` bytes fit before `end` (checked above).
        self.at = unsafe { self.at.add(n) };
        self
    }

    #[inline(always)]
    fn text(&mut self, s: &str) -> &mut Self {
        // SAFETY: `append` provides `s.len()` writable bytes, filled from `s`.
        self.append(s.len(), |at| unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), at, s.len()) })
    }

    #[inline]
    fn uint(&mut self, v: u64) -> &mut Self {
        let n = decimal_len(v);
        // SAFETY: `decimal` writes exactly the `n` bytes `append` provides.
        self.append(n, |at| unsafe { decimal(v, at, n) })
    }

    #[inline]
    fn int(&mut self, v: i64) -> &mut Self {
        let (sign, digits) = (usize::from(v < 0), decimal_len(v.unsigned_abs()));
        // SAFETY: the sign, then `decimal`'s `digits` bytes: the `sign + digits` bytes `append` provides.
        self.append(sign + digits, |at| unsafe {
            if sign == 1 {
                *at = b'-';
            }
            decimal(v.unsigned_abs(), at.add(sign), digits)
        })
    }

    /// `kind`, left out at its default (version 5).
    #[inline]
    fn kind(&mut self, mem: MemKind) -> &mut Self {
        if mem != DEFAULT_MEM_KIND {
            self.text(",\"kind\":\"").text(mem.as_str()).text("\"");
        }
        self
    }

    /// `device`, left out at its default (version 5).
    #[inline]
    fn device(&mut self, device: i32) -> &mut Self {
        if device != DEFAULT_DEVICE {
            self.text(",\"device\":").int(device.into());
        }
        self
    }

    #[inline]
    fn hex(&mut self, v: u64) -> &mut Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let digits = (64 - (v | 1).leading_zeros() as usize).div_ceil(4);
        // SAFETY: a quote and `0x`, the digits, a quote: the `digits + 4` bytes `append` provides.
        self.append(digits + 4, |at| unsafe {
            std::ptr::copy_nonoverlapping(b"\"0x".as_ptr(), at, 3);
            let mut rest = v;
            for i in (0..digits).rev() {
                *at.add(3 + i) = DIGITS[(rest & 0xf) as usize];
                rest >>= 4;
            }
            *at.add(3 + digits) = b'"';
        })
    }
}

impl Drop for Fields<'_> {
    fn drop(&mut self) {
        // SAFETY: the bytes from the string's end up to `at` were all
        // written through `append`, with ASCII or a `&str`'s bytes (UTF-8),
        // inside the capacity `new` reserved.
        unsafe {
            let v = self.out.as_mut_vec();
            let written = self.at as usize - (v.as_ptr() as usize + v.len());
            v.set_len(v.len() + written);
        }
    }
}

const POWERS_OF_TEN: [u64; 20] = {
    let mut p = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        p[i] = p[i - 1] * 10;
        i += 1;
    }
    p
};

/// Digits of `v` in decimal: a guess from its bit length (log10 2 is about
/// 1233 / 4096), corrected by one comparison.
#[inline(always)]
fn decimal_len(v: u64) -> usize {
    let v = v | 1;
    let guess = ((64 - v.leading_zeros() as usize) * 1233) >> 12;
    guess + 1 - usize::from(v < POWERS_OF_TEN[guess])
}

/// Writes the `n` decimal digits of `v` (`n == decimal_len(v)`) at `at`,
/// two a step from the last.
///
/// # Safety
/// `at` is valid for writing `n` bytes.
#[inline(always)]
unsafe fn decimal(mut v: u64, at: *mut u8, n: usize) {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
                                2021222324252627282930313233343536373839\
                                4041424344454647484950515253545556575859\
                                6061626364656667686970717273747576777879\
                                8081828384858687888990919293949596979899";
    let mut end = n;
    while v >= 100 {
        let pair = (v % 100) as usize * 2;
        v /= 100;
        end -= 2;
        // SAFETY: bytes `end` and `end + 1`, below `n`.
        unsafe { std::ptr::copy_nonoverlapping(PAIRS.as_ptr().add(pair), at.add(end), 2) };
    }
    if v >= 10 {
        // SAFETY: the first two digits, bytes 0 and 1 (`end` is 2 here).
        unsafe { std::ptr::copy_nonoverlapping(PAIRS.as_ptr().add(v as usize * 2), at, 2) };
    } else {
        // SAFETY: the first digit, byte 0 (`end` is 1 here).
        unsafe { *at = b'0' + v as u8 };
    }
}

/// Appends one definition line (a line of the `events` array; never the first).
pub fn write_definition(out: &mut String, d: &Definition) {
    out.push(',');
    // Plain records of strings and numbers: serializing them cannot fail.
    out.push_str(&serde_json::to_string(d).unwrap_or_else(|_| "{}".into()));
    out.push('\n');
}

/// Closes the events array and writes the end record and the closing brace:
/// `],"end":{...}}` and a newline.
pub fn write_end(out: &mut String, end: &End) {
    out.push_str("],\"end\":");
    // Plain records of strings and numbers (non-finite floats become null).
    out.push_str(&serde_json::to_string(end).unwrap_or_else(|_| "null".into()));
    out.push_str("}\n");
}

#[cfg(test)]
mod tests {
    use super::super::schema::{DeviceCounters, ExitRecord, LeakSummary};
    use super::super::{Api, MemKind};
    use super::*;

    #[test]
    fn decimal_digits_at_every_width() {
        let mut values = vec![0, u64::MAX, u64::MAX - 1];
        for k in 0..20 {
            let p = 10u64.pow(k);
            values.extend([p, p - 1, p + 1, p.saturating_mul(5)]);
        }
        for v in values {
            let n = decimal_len(v);
            assert_eq!(n, v.to_string().len(), "{v}");
            let mut digits = [0u8; 20];
            // SAFETY: `n` is at most 20.
            unsafe { decimal(v, digits.as_mut_ptr(), n) };
            assert_eq!(std::str::from_utf8(&digits[..n]).unwrap(), v.to_string());
        }
    }

    #[test]
    fn golden_lines() {
        let mut s = String::new();
        let process =
            ProcessInfo { pid: 7, ppid: 1, cmdline: vec!["a".into()], exe: "/a".into(), start_unix_ms: 5, rank: None };
        let options = crate::options::parse("mode=pool").0;
        write_header(&mut s, &process, &options);
        write_event(&mut s, &Event::new(EventKind::Start, Api::None), EventLine::First);
        let mut a = Event::new(EventKind::Alloc, Api::CudaMallocAsync);
        a.seq = 1;
        a.t_ns = 99;
        a.mem = MemKind::Async;
        a.device = 0;
        a.ptr = 0x7f00_0000_0200;
        a.size = 1000003;
        a.aux = 0x55;
        a.tid = 42;
        write_event(&mut s, &a, EventLine::Later);
        let mut r = Event::new(EventKind::Reserve, Api::None);
        r.seq = 3;
        r.device = 0;
        r.size = 2 << 20;
        write_event(&mut s, &r, EventLine::Later);
        let mut p = Event::new(EventKind::Alloc, Api::CudaMalloc);
        (p.seq, p.device, p.ptr, p.size, p.pooled) = (4, 0, 0x7f00_0010_0000, 512, true);
        write_event(&mut s, &p, EventLine::Later);
        let mut c = Event::new(EventKind::Checkpoint, Api::CuCtxDestroy);
        c.seq = 2;
        c.device = 1;
        c.size = 5000011;
        c.aux = 1;
        write_event(&mut s, &c, EventLine::Later);
        let end = End {
            end_unix_ms: 9,
            duration_ms: 4,
            exit: ExitRecord::Exit { status: None },
            devices: vec![],
            host: DeviceCounters::new(-1),
            leak_summary: LeakSummary::default(),
            leaks: vec![],
            dropped_events: 0,
            pools: vec![],
            magazines: None,
            ooms: vec![],
            complete: true,
            notes: vec![],
        };
        write_end(&mut s, &end);
        let expected = concat!(
            "{\"schema\":\"cupool-log\",\"version\":5,",
            "\"process\":{\"pid\":7,\"ppid\":1,\"cmdline\":[\"a\"],\"exe\":\"/a\",\"start_unix_ms\":5},",
            "\"options\":{\"mode\":\"pool\",\"log_dir\":\".\",\"log\":true,\"trace\":true,\"run_id\":\"\",",
            "\"flush_ms\":100,\"limit\":0,\"verbosity\":1,\"fence_us\":100,\"give_back\":\"auto\",\"backing\":\"vmm\",\"direct_min\":1073741824,\"magazines\":\"auto\",\"nvtx\":true,\"stack_depth\":32,\"python_depth\":16},\"events\":[\n",
            "{\"seq\":0,\"t_ns\":0,\"ev\":\"start\",\"tid\":0}\n",
            ",{\"seq\":1,\"t_ns\":99,\"ev\":\"alloc\",\"api\":\"cudaMallocAsync\",\"kind\":\"async\",\"ptr\":\"0x7f0000000200\",\"size\":1000003,\"stream\":\"0x55\",\"tid\":42}\n",
            ",{\"seq\":3,\"t_ns\":0,\"ev\":\"reserve\",\"size\":2097152,\"tid\":0}\n",
            ",{\"seq\":4,\"t_ns\":0,\"ev\":\"alloc\",\"ptr\":\"0x7f0000100000\",\"size\":512,\"pooled\":true,\"tid\":0}\n",
            ",{\"seq\":2,\"t_ns\":0,\"ev\":\"checkpoint\",\"api\":\"cuCtxDestroy_v2\",\"device\":1,\"leaked_bytes\":5000011,\"leaked_count\":1,\"tid\":0}\n",
            "],\"end\":{\"end_unix_ms\":9,\"duration_ms\":4,\"exit\":{\"how\":\"exit\",\"status\":null},\"devices\":[],",
            "\"host\":{\"device\":-1,\"allocs\":0,\"frees\":0,\"failures\":0,\"current_bytes\":0,\"peak_bytes\":0,",
            "\"current_count\":0,\"peak_count\":0,\"reserved_bytes\":0,\"peak_reserved_bytes\":0},\"leak_summary\":{\"bytes\":0,\"count\":0},\"leaks\":[],",
            "\"dropped_events\":0,\"pools\":[],\"ooms\":[],\"complete\":true}}\n"
        );
        assert_eq!(s, expected);
        let v: serde_json::Value = serde_json::from_str(&s).expect("complete log is valid JSON");
        assert_eq!(v["events"].as_array().unwrap().len(), 5);
    }
}
