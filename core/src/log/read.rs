//! Reading logs back, complete or cut short.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// A parsed log. `end` is `None` when the process died before finishing it
/// (SIGKILL, power loss): the events up to the last whole line are still here.
#[derive(Debug, Clone)]
pub struct Log {
    pub path: PathBuf,
    /// The header object (`schema`, `version`, `process`, `options`) without `events`.
    pub header: Value,
    pub events: Vec<Value>,
    pub end: Option<Value>,
}

pub fn read_log(path: &Path) -> std::io::Result<Log> {
    let text = std::fs::read_to_string(path)?;
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {why}", path.display()));
    if let Ok(mut whole) = serde_json::from_str::<Value>(&text) {
        let events = match whole.get_mut("events").map(Value::take) {
            Some(Value::Array(a)) => a,
            _ => return Err(bad("no events array".into())),
        };
        let end = whole.get_mut("end").map(Value::take);
        if let Some(o) = whole.as_object_mut() {
            o.remove("events");
            o.remove("end");
        }
        return Ok(Log { path: path.to_owned(), header: whole, events, end });
    }
    let mut lines = text.lines();
    let first = lines.next().ok_or_else(|| bad("empty file".into()))?;
    let mut header: Value =
        serde_json::from_str(&format!("{first}]}}")).map_err(|e| bad(format!("unreadable header: {e}")))?;
    if header.get("schema").and_then(Value::as_str) != Some(super::SCHEMA) {
        return Err(bad("not a cupool log".into()));
    }
    if let Some(o) = header.as_object_mut() {
        o.remove("events");
    }
    let mut events = Vec::new();
    let mut end = None;
    for line in lines {
        if let Some(rest) = line.strip_prefix("],\"end\":") {
            end = rest.strip_suffix('}').and_then(|o| serde_json::from_str(o).ok());
            break;
        }
        match serde_json::from_str::<Value>(line.strip_prefix(',').unwrap_or(line)) {
            Ok(v) => events.push(v),
            Err(_) => break, // the line being written when the process died
        }
    }
    Ok(Log { path: path.to_owned(), header, events, end })
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceSummary {
    pub device: i64,
    pub allocs: u64,
    pub frees: u64,
    pub failures: u64,
    pub current_bytes: u64,
    pub peak_bytes: u64,
}

#[derive(Debug, Clone)]
pub struct Summary {
    pub pid: u64,
    pub cmdline: String,
    pub complete: bool,
    pub exit: Option<Value>,
    pub devices: Vec<DeviceSummary>,
    pub host: DeviceSummary,
    /// Leak objects as written in the end record, or reconstructed from the
    /// timeline (`at: "not finished"`) when the log was cut short.
    pub leaks: Vec<Value>,
    pub leak_bytes: u64,
    pub events: usize,
}

fn field_u64(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn device_summary(v: &Value) -> DeviceSummary {
    DeviceSummary {
        device: v.get("device").and_then(Value::as_i64).unwrap_or(-1),
        allocs: field_u64(v, "allocs"),
        frees: field_u64(v, "frees"),
        failures: field_u64(v, "failures"),
        current_bytes: field_u64(v, "current_bytes"),
        peak_bytes: field_u64(v, "peak_bytes"),
    }
}

/// Per-process figures: from the end record when there is one, else rebuilt
/// from the timeline.
pub fn summarize(log: &Log) -> Summary {
    let process = &log.header["process"];
    let cmdline = process["cmdline"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let mut s = Summary {
        pid: field_u64(process, "pid"),
        cmdline,
        complete: log.end.is_some(),
        exit: None,
        devices: Vec::new(),
        host: DeviceSummary { device: -1, ..Default::default() },
        leaks: Vec::new(),
        leak_bytes: 0,
        events: log.events.len(),
    };
    if let Some(end) = &log.end {
        s.exit = end.get("exit").cloned();
        s.devices = end["devices"].as_array().map(|a| a.iter().map(device_summary).collect()).unwrap_or_default();
        s.host = device_summary(&end["host"]);
        s.leaks = end["leaks"].as_array().cloned().unwrap_or_default();
        s.leak_bytes = field_u64(&end["leak_summary"], "bytes");
        return s;
    }
    let mut devices: BTreeMap<i64, DeviceSummary> = BTreeMap::new();
    let mut live: HashMap<String, Value> = HashMap::new();
    for e in &log.events {
        if e.get("kind").is_none() {
            continue; // start, checkpoints and invalid frees move no bytes
        }
        let dev = e.get("device").and_then(Value::as_i64).unwrap_or(-1);
        let is_host = e.get("kind").and_then(Value::as_str) == Some("host");
        let slot = if is_host {
            &mut s.host
        } else {
            devices.entry(dev).or_insert_with(|| DeviceSummary { device: dev, ..Default::default() })
        };
        let size = field_u64(e, "size");
        match e.get("ev").and_then(Value::as_str) {
            Some("alloc") => {
                slot.allocs += 1;
                slot.current_bytes += size;
                slot.peak_bytes = slot.peak_bytes.max(slot.current_bytes);
                if let Some(p) = e.get("ptr").and_then(Value::as_str) {
                    live.insert(format!("{}:{p}", e["kind"] == "vmm"), e.clone());
                }
            }
            Some("free") => {
                slot.frees += 1;
                slot.current_bytes = slot.current_bytes.saturating_sub(size);
                if let Some(p) = e.get("ptr").and_then(Value::as_str) {
                    live.remove(&format!("{}:{p}", e["kind"] == "vmm"));
                }
            }
            Some("alloc_failed") => slot.failures += 1,
            _ => {}
        }
    }
    s.devices = devices.into_values().collect();
    let mut leaks: Vec<Value> = live
        .into_values()
        .map(|e| {
            serde_json::json!({"ptr": e["ptr"], "size": e["size"], "device": e["device"],
                               "kind": e["kind"], "api": e["api"], "at": "not finished"})
        })
        .collect();
    leaks.sort_by_key(|l| std::cmp::Reverse(field_u64(l, "size")));
    s.leak_bytes = leaks.iter().map(|l| field_u64(l, "size")).sum();
    s.leaks = leaks;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMPLETE: &str = concat!(
        "{\"schema\":\"cupool-log\",\"version\":1,\"process\":{\"pid\":5,\"cmdline\":[\"a\",\"b\"]},\"options\":{},\"events\":[\n",
        "{\"seq\":0,\"t_ns\":0,\"ev\":\"start\",\"tid\":1}\n",
        ",{\"seq\":1,\"t_ns\":5,\"ev\":\"alloc\",\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x10\",\"size\":100,\"device\":0,\"tid\":1}\n",
        ",{\"seq\":2,\"t_ns\":6,\"ev\":\"alloc\",\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x20\",\"size\":50,\"device\":0,\"tid\":1}\n",
        ",{\"seq\":3,\"t_ns\":7,\"ev\":\"free\",\"api\":\"cudaFree\",\"kind\":\"device\",\"ptr\":\"0x10\",\"size\":100,\"device\":0,\"tid\":1}\n",
        "],\"end\":{\"devices\":[{\"device\":0,\"allocs\":2,\"frees\":1,\"failures\":0,\"current_bytes\":50,\"peak_bytes\":150}],",
        "\"host\":{},\"leaks\":[{\"ptr\":\"0x20\",\"size\":50}],\"leak_summary\":{\"bytes\":50,\"count\":1}}}\n"
    );

    fn write_tmp(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cupool-read-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn complete_and_truncated_logs_agree() {
        let full = read_log(&write_tmp("full.json", COMPLETE)).unwrap();
        assert_eq!(full.events.len(), 4);
        let a = summarize(&full);
        assert!(a.complete);
        assert_eq!(a.cmdline, "a b");
        // Cut in the middle of the trailer line, as SIGKILL would.
        let cut = &COMPLETE[..COMPLETE.find("],\"end\"").unwrap() + 12];
        let part = read_log(&write_tmp("cut.json", cut)).unwrap();
        assert!(part.end.is_none());
        let b = summarize(&part);
        assert!(!b.complete);
        assert_eq!(b.devices, a.devices);
        assert_eq!(b.leak_bytes, 50);
        assert_eq!(b.leaks[0]["ptr"], "0x20");
        // Cut in the middle of an event line: the half line is dropped.
        let mid = &COMPLETE[..COMPLETE.find("\"seq\":3").unwrap() + 4];
        let part = read_log(&write_tmp("mid.json", mid)).unwrap();
        assert_eq!(part.events.len(), 3);
        assert_eq!(summarize(&part).leak_bytes, 150);
    }

    #[test]
    fn rejects_foreign_json() {
        assert!(read_log(&write_tmp("x.json", "{\"a\":1")).is_err());
    }
}
