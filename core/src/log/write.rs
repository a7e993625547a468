//! Formatting of log lines. Pure functions over `String` so they can be golden-tested.

use super::{Event, EventKind};
use std::fmt::Write as _;

pub const SCHEMA: &str = "cupool-log";
pub const VERSION: u32 = 1;

/// Marker for the first event line, which carries no leading comma.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum EventLine {
    First,
    Later,
}

/// The first line: everything up to and including `"events":[`.
pub fn write_header(out: &mut String, process: &serde_json::Value, options: &serde_json::Value) {
    let _ = writeln!(
        out,
        "{{\"schema\":\"{SCHEMA}\",\"version\":{VERSION},\"process\":{process},\"options\":{options},\"events\":["
    );
}

/// Appends one event as one line.
pub fn write_event(out: &mut String, e: &Event, line: EventLine) {
    if line == EventLine::Later {
        out.push(',');
    }
    let _ = write!(out, "{{\"seq\":{},\"t_ns\":{},\"ev\":\"{}\"", e.seq, e.t_ns, e.kind.as_str());
    if e.kind != EventKind::Start {
        let _ = write!(out, ",\"api\":\"{}\"", e.api.as_str());
    }
    match e.kind {
        EventKind::Start => {}
        EventKind::Alloc | EventKind::Free | EventKind::Map | EventKind::Unmap => {
            let _ = write!(
                out,
                ",\"kind\":\"{}\",\"ptr\":\"{:#x}\",\"size\":{},\"device\":{}",
                e.mem.as_str(),
                e.ptr,
                e.size,
                e.device
            );
            if e.aux != 0 {
                let field = if matches!(e.kind, EventKind::Map | EventKind::Unmap) { "handle" } else { "stream" };
                let _ = write!(out, ",\"{field}\":\"{:#x}\"", e.aux);
            }
        }
        EventKind::AllocFailed | EventKind::Oom => {
            let _ = write!(
                out,
                ",\"kind\":\"{}\",\"size\":{},\"device\":{},\"result\":{}",
                e.mem.as_str(),
                e.size,
                e.device,
                e.result
            );
        }
        EventKind::InvalidFree => {
            let _ = write!(out, ",\"ptr\":\"{:#x}\",\"device\":{},\"result\":{}", e.ptr, e.device, e.result);
        }
        EventKind::Checkpoint => {
            let _ = write!(out, ",\"device\":{},\"leaked_bytes\":{},\"leaked_count\":{}", e.device, e.size, e.aux);
        }
    }
    let _ = writeln!(out, ",\"tid\":{}}}", e.tid);
}

/// Closes the events array and opens the `end` object; the caller appends the
/// end object's JSON and then `}\n`.
pub fn write_trailer_open(out: &mut String) {
    out.push_str("],\"end\":");
}

#[cfg(test)]
mod tests {
    use super::super::{Api, MemKind};
    use super::*;

    #[test]
    fn golden_lines() {
        let mut s = String::new();
        write_header(&mut s, &serde_json::json!({"pid": 7}), &serde_json::json!({"mode": "pool"}));
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
        let mut c = Event::new(EventKind::Checkpoint, Api::CuCtxDestroy);
        c.seq = 2;
        c.device = 1;
        c.size = 5000011;
        c.aux = 1;
        write_event(&mut s, &c, EventLine::Later);
        write_trailer_open(&mut s);
        s.push_str("{}}\n");
        let expected = concat!(
            "{\"schema\":\"cupool-log\",\"version\":1,\"process\":{\"pid\":7},\"options\":{\"mode\":\"pool\"},\"events\":[\n",
            "{\"seq\":0,\"t_ns\":0,\"ev\":\"start\",\"tid\":0}\n",
            ",{\"seq\":1,\"t_ns\":99,\"ev\":\"alloc\",\"api\":\"cudaMallocAsync\",\"kind\":\"async\",\"ptr\":\"0x7f0000000200\",\"size\":1000003,\"device\":0,\"stream\":\"0x55\",\"tid\":42}\n",
            ",{\"seq\":2,\"t_ns\":0,\"ev\":\"checkpoint\",\"api\":\"cuCtxDestroy_v2\",\"device\":1,\"leaked_bytes\":5000011,\"leaked_count\":1,\"tid\":0}\n",
            "],\"end\":{}}\n"
        );
        assert_eq!(s, expected);
        let v: serde_json::Value = serde_json::from_str(&s).expect("complete log is valid JSON");
        assert_eq!(v["events"].as_array().unwrap().len(), 3);
    }
}
