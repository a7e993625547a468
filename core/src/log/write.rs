//! Formatting of log lines. Pure functions over `String` so they can be golden-tested.

use super::schema::{Definition, End, ProcessInfo, SCHEMA, VERSION};
use super::{Event, EventKind};
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

/// Appends one event as one line: exactly the JSON of `EventRecord::from(e)`,
/// formatted by hand because it runs for every allocation (the writer thread
/// must keep up with millions a second; `write!` took three times as long).
pub fn write_event(out: &mut String, e: &Event, line: EventLine) {
    write_named_event(out, e, line, "");
}

/// `write_event` for an event that carries a name (phases): `name` is the
/// text of the string the event's `aux` refers to.
pub fn write_named_event(out: &mut String, e: &Event, line: EventLine, name: &str) {
    if line == EventLine::Later {
        out.push(',');
    }
    let mut o = Fields(out);
    o.text("{\"seq\":").uint(e.seq).text(",\"t_ns\":").uint(e.t_ns);
    o.text(",\"ev\":\"").text(e.kind.as_str()).text("\"");
    if e.kind.has_api() {
        o.text(",\"api\":\"").text(e.api.as_str()).text("\"");
    }
    match e.kind {
        EventKind::Start => {}
        EventKind::Alloc | EventKind::Free | EventKind::Map | EventKind::Unmap => {
            o.text(",\"kind\":\"").text(e.mem.as_str()).text("\",\"ptr\":").hex(e.ptr);
            o.text(",\"size\":").uint(e.size).text(",\"device\":").int(e.device.into());
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
            o.text(",\"size\":").uint(e.size).text(",\"device\":").int(e.device.into());
        }
        EventKind::AllocFailed | EventKind::Oom => {
            o.text(",\"kind\":\"").text(e.mem.as_str()).text("\",\"size\":").uint(e.size);
            o.text(",\"device\":").int(e.device.into()).text(",\"result\":").int(e.result.into());
        }
        EventKind::InvalidFree => {
            o.text(",\"ptr\":").hex(e.ptr).text(",\"device\":").int(e.device.into());
            o.text(",\"result\":").int(e.result.into());
        }
        EventKind::Checkpoint => {
            o.text(",\"device\":").int(e.device.into()).text(",\"leaked_bytes\":").uint(e.size);
            o.text(",\"leaked_count\":").uint(e.aux);
        }
        EventKind::PhaseBegin | EventKind::PhaseEnd => {
            // A string of user text: serde_json escapes it (it cannot fail on a &str).
            let name = serde_json::to_string(name).unwrap_or_else(|_| "\"\"".into());
            o.text(",\"device\":").int(e.device.into()).text(",\"name\":").text(&name);
            o.text(",\"live\":").uint(e.size).text(",\"reserved\":").uint(e.ptr);
        }
    }
    o.text(",\"tid\":").uint(e.tid.into()).text("}\n");
}

/// Appends the parts of a line: text as it is, numbers in decimal, pointers
/// as a quoted `0x` hex string (what `{:#x}` writes).
struct Fields<'a>(&'a mut String);

impl Fields<'_> {
    #[inline]
    fn text(&mut self, s: &str) -> &mut Self {
        self.0.push_str(s);
        self
    }

    #[inline]
    fn uint(&mut self, v: u64) -> &mut Self {
        self.text(itoa::Buffer::new().format(v))
    }

    #[inline]
    fn int(&mut self, v: i64) -> &mut Self {
        self.text(itoa::Buffer::new().format(v))
    }

    fn hex(&mut self, v: u64) -> &mut Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; 20];
        let mut at = buf.len();
        at -= 1;
        buf[at] = b'"';
        let mut rest = v;
        loop {
            at -= 1;
            buf[at] = DIGITS[(rest & 0xf) as usize];
            rest >>= 4;
            if rest == 0 {
                break;
            }
        }
        at -= 3;
        buf[at..at + 3].copy_from_slice(b"\"0x");
        // SAFETY: only ASCII was written (quotes, "0x", digits of `DIGITS`):
        // UTF-8, which the hot writer need not check for every pointer.
        self.text(unsafe { std::str::from_utf8_unchecked(&buf[at..]) })
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
            "{\"schema\":\"cupool-log\",\"version\":4,",
            "\"process\":{\"pid\":7,\"ppid\":1,\"cmdline\":[\"a\"],\"exe\":\"/a\",\"start_unix_ms\":5},",
            "\"options\":{\"mode\":\"pool\",\"log_dir\":\".\",\"log\":true,\"trace\":true,\"run_id\":\"\",",
            "\"flush_ms\":100,\"limit\":0,\"verbosity\":1,\"fence_us\":100,\"give_back\":\"auto\",\"backing\":\"vmm\",\"direct_min\":1073741824,\"magazines\":\"auto\",\"nvtx\":true,\"stack_depth\":32,\"python_depth\":16},\"events\":[\n",
            "{\"seq\":0,\"t_ns\":0,\"ev\":\"start\",\"tid\":0}\n",
            ",{\"seq\":1,\"t_ns\":99,\"ev\":\"alloc\",\"api\":\"cudaMallocAsync\",\"kind\":\"async\",\"ptr\":\"0x7f0000000200\",\"size\":1000003,\"device\":0,\"stream\":\"0x55\",\"tid\":42}\n",
            ",{\"seq\":3,\"t_ns\":0,\"ev\":\"reserve\",\"size\":2097152,\"device\":0,\"tid\":0}\n",
            ",{\"seq\":4,\"t_ns\":0,\"ev\":\"alloc\",\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x7f0000100000\",\"size\":512,\"device\":0,\"pooled\":true,\"tid\":0}\n",
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
