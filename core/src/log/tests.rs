//! The writer, the records and `docs/log-schema.md` agree.

use super::*;
use crate::options::Options;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// One event of `kind` with every field set; `aux` decides the optional
/// `stream`/`handle` (and is the leak count of a checkpoint).
fn event(kind: EventKind, aux: u64) -> Event {
    let mut e = Event::new(kind, Api::CuMemAllocAsync);
    e.seq = 17;
    e.t_ns = 123_456_789;
    e.mem = if matches!(kind, EventKind::Map | EventKind::Unmap) { MemKind::Vmm } else { MemKind::Async };
    e.device = 3;
    e.ptr = 0xffff_ffff_ffff_fff0;
    e.size = u64::MAX - 1;
    e.aux = aux;
    e.tid = u32::MAX;
    e.result = -2;
    e.stack = aux as u32;
    e.pooled = aux != 0;
    e
}

/// What serde writes for `r` with `api`, `kind` and `device` left out at
/// their defaults, as a line leaves them out.
fn as_written(mut r: EventRecord) -> String {
    if r.ev.known().and_then(EventKind::default_api).is_some_and(|api| r.api.as_ref().is_some_and(|a| *a == api)) {
        r.api = None;
    }
    if r.kind.as_ref().is_some_and(|k| *k == DEFAULT_MEM_KIND) {
        r.kind = None;
    }
    if r.device == Some(DEFAULT_DEVICE) {
        r.device = None;
    }
    serde_json::to_string(&r).unwrap()
}

fn line_of(e: &Event) -> String {
    let mut s = String::new();
    write_event(&mut s, e, EventLine::Later);
    assert!(s.starts_with(',') && s.ends_with('\n'), "{s:?}");
    s[1..s.len() - 1].to_string()
}

#[test]
fn every_event_kind_round_trips_through_event_record() {
    for &kind in EventKind::ALL {
        for aux in [0, 0x55] {
            for api in [Api::None, Api::CudaMalloc, Api::CuMemUnmap] {
                for mem in MemKind::ALL {
                    let mut e = event(kind, aux);
                    e.api = api;
                    e.mem = *mem;
                    let line = line_of(&e);
                    let read: EventRecord =
                        serde_json::from_str(&line).unwrap_or_else(|err| panic!("{kind:?}: {line}: {err}"));
                    let read = read.with_defaults(VERSION);
                    assert_eq!(read, EventRecord::from(&e), "{line}");
                    assert_eq!(read.ev, kind);
                    // Byte for byte what serde writes for the record, defaults left out.
                    assert_eq!(as_written(read), line, "{kind:?}");
                }
            }
        }
    }
    let mut first = String::new();
    write_event(&mut first, &event(EventKind::Start, 0), EventLine::First);
    assert!(first.starts_with("{\"seq\":17,"), "{first}");
}

/// The hand-written number formatting at the edges: zero, one digit, carries, extremes.
#[test]
fn numbers_are_formatted_as_serde_formats_them() {
    let values = [0, 1, 9, 10, 15, 16, 255, 256, 999, 1000, 0xdead_beef, i64::MAX as u64, u64::MAX];
    for &kind in EventKind::ALL {
        for (i, &v) in values.iter().enumerate() {
            let mut e = event(kind, v);
            (e.seq, e.t_ns, e.ptr, e.size) = (v, values[values.len() - 1 - i], v, v / 3);
            e.tid = v as u32;
            e.stack = (v >> 7) as u32;
            e.device = [-1, 0, 7, 63, i32::MIN, i32::MAX][i % 6];
            e.result = [0, -1, 2, 700, i32::MIN, i32::MAX][i % 6];
            let line = line_of(&e);
            let read: EventRecord = serde_json::from_str(&line).unwrap_or_else(|err| panic!("{kind:?}: {line}: {err}"));
            let read = read.with_defaults(VERSION);
            assert_eq!(read, EventRecord::from(&e), "{line}");
            assert_eq!(as_written(read), line, "{kind:?}");
        }
    }
}

fn process() -> ProcessInfo {
    ProcessInfo {
        pid: 4242,
        ppid: 1,
        cmdline: vec!["python3".into(), "train.py".into()],
        exe: "/usr/bin/python3.12".into(),
        start_unix_ms: 1_795_320_821_241,
        rank: Some(3),
    }
}

fn stat(n: u64) -> Stat {
    Stat { current: n, peak: 2 * n }
}

/// An end record with every optional field present somewhere.
fn full_end() -> End {
    let counters = |device: i32| DeviceCounters {
        device,
        allocs: 5,
        frees: 4,
        failures: 1,
        current_bytes: 100,
        peak_bytes: 300,
        current_count: 1,
        peak_count: 3,
        reserved_bytes: 2 << 20,
        peak_reserved_bytes: 4 << 20,
    };
    let leak = Leak {
        ptr: Some(0x7f00_0000_0000),
        handle: None,
        size: 100,
        device: 0,
        kind: MemKind::Async.into(),
        api: Api::CudaMallocAsync.into(),
        age_ms: 12,
        tid: 77,
        at: "exit".into(),
        stream: Some(0x55),
        stack: Some(3),
    };
    let vmm =
        Leak { ptr: None, handle: Some(0x9), kind: MemKind::Vmm.into(), api: Api::CuMemCreate.into(), ..leak.clone() };
    End {
        end_unix_ms: 1_795_320_821_496,
        duration_ms: 255,
        exit: ExitRecord::Signal { signal: 15, name: "SIGTERM".into() },
        devices: vec![counters(0), counters(1)],
        host: counters(-1),
        leak_summary: LeakSummary { bytes: 200, count: 2 },
        leaks: vec![leak, vmm],
        dropped_events: 3,
        pools: vec![PoolRecord {
            device: 0,
            context_destroyed: true,
            allocated_bytes: stat(1),
            requested_bytes: stat(2),
            reserved_bytes: stat(3),
            active_bytes: stat(4),
            inactive_split_bytes: stat(5),
            segment: stat(6),
            num_device_alloc: 7,
            num_device_free: 8,
            num_alloc_retries: 9,
            num_ooms: 10,
            num_syncs: 11,
            num_waits: 12,
            largest_free_block: 13,
            multi_stream: true,
            multi_stream_because: Some(super::MultiStreamBecause::BoundThread),
            fences: FenceCounters {
                recorded: 1,
                completed: 2,
                skipped_for_capture: 3,
                record_errors: 4,
                gpu_barriers: 5,
                waits: 6,
                syncs: 7,
                wait_ns: 8,
                record_ns: 9,
                completed_unlocked: 10,
            },
            peak_reserved_over_peak_requested: 1.25,
            backing: crate::options::Backing::Vmm,
            pages: Some(PagesRecord {
                page_bytes: 2 << 20,
                va_reserved_bytes: 64 << 30,
                idle_bytes: stat(14),
                pending_bytes: stat(15),
                creates: 16,
                releases: 17,
                maps: 18,
                unmaps: 19,
                remaps: 20,
                grants: 21,
                costs: PageCosts { create_ns: 22, map_ns: 23, access_ns: 24, unmap_ns: 25, release_ns: 26 },
                aliases: 27,
                ghost_waits: 28,
                at_peak: PagesAtPeak { reserved: 29, allocated: 30, pending: 31, idle: 32, cooling: 33 },
            }),
            lock_waits: 34,
            lock_wait_ns: 35,
        }],
        magazines: Some(MagazineRecord {
            threads: 8,
            own_frees_reused: 900,
            stock_handed_out: 100,
            refills: 7,
            overflowed: 3,
        }),
        ooms: vec![OomRecord {
            t_ns: 1,
            device: 0,
            requested: 2,
            reserved: 3,
            allocated: 4,
            free_in_pool: 5,
            largest_free_block: 6,
            largest_live: vec![8, 7],
            address_reserved: 64 << 30,
        }],
        complete: false,
        notes: vec!["Python 3.9 is not one cupool can read frames of".into()],
    }
}

/// One definition of each kind.
fn definitions() -> Vec<Definition> {
    vec![
        Definition::Module(ModuleRecord {
            id: 1,
            path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
            base: 0x7f00_0000_0000,
            start: 0x7f00_0002_8000,
            end: 0x7f00_001f_0000,
            build_id: "a1b2c3".into(),
        }),
        Definition::String(StringRecord { id: 4, text: "train.py".into() }),
        Definition::Stack(StackRecord {
            id: 3,
            native: vec![0x7f00_0003_0001, 0x5555_0000_1234],
            python: vec![PyFrameRecord(4, 4, 42)],
        }),
    ]
}

/// A whole log as the writer writes it, with one event of each kind.
fn full_log_text(end: &End) -> String {
    let mut s = String::new();
    let options = crate::options::parse("mode=pool:run_id=r1:fence_us=250").0;
    write_header(&mut s, &process(), &options);
    write_event(&mut s, &event(EventKind::Start, 0), EventLine::First);
    for d in definitions() {
        write_definition(&mut s, &d);
    }
    for (i, &kind) in EventKind::ALL.iter().enumerate() {
        let mut e = event(kind, 0x10 + i as u64);
        e.seq = 100 + i as u64;
        write_event(&mut s, &e, EventLine::Later);
    }
    write_end(&mut s, end);
    s
}

#[test]
fn a_written_log_reads_back_into_the_same_records() {
    let end = full_end();
    let text = full_log_text(&end);
    let log = read_log_from(text.as_bytes(), "full.json").unwrap();
    assert_eq!(log.header.schema, SCHEMA);
    assert_eq!(log.header.version, VERSION);
    assert_eq!(log.header.process, process());
    assert_eq!(log.header.options.fence_us, 250);
    assert_eq!(log.events.len(), EventKind::ALL.len() + 1);
    assert_eq!(log.definitions, definitions());
    assert_eq!(log.end.as_ref(), Some(&end));
    // The typed log serializes back to the document that was written, with
    // the definitions in an array of their own; that document reads back the same.
    let mut written: Value = serde_json::from_str(&text).unwrap();
    let events = written["events"].as_array_mut().unwrap();
    let defs: Vec<Value> = events.iter().filter(|e| e.get("def").is_some()).cloned().collect();
    events.retain(|e| e.get("def").is_none());
    written["definitions"] = Value::Array(defs);
    let back = serde_json::to_value(&log).unwrap();
    assert_eq!(back, written);
    let again = read_log_from(back.to_string().as_bytes(), "again.json").unwrap();
    let sites = Sites::of(&log);
    assert_eq!((again.events, again.definitions, again.end), (log.events, log.definitions, log.end));
    assert_eq!(sites.stack(3).map(|s| s.native.len()), Some(2));
    assert_eq!(sites.string(4), "train.py");
    assert_eq!(sites.module_of(0x7f00_0003_0001).map(|m| m.id), Some(1));
    assert_eq!(sites.module_of(0x5555_0000_1234), None);
    // Every exit form round-trips.
    for exit in [ExitRecord::Exit { status: Some(7) }, ExitRecord::Exit { status: None }] {
        let v = serde_json::to_value(&exit).unwrap();
        assert_eq!(v["how"], "exit");
        assert!(v.as_object().unwrap().contains_key("status"), "{v}");
        assert_eq!(serde_json::from_value::<ExitRecord>(v).unwrap(), exit);
    }
}

// ---------------------------------------------------------------------------
// docs/log-schema.md

const DOC: &str = include_str!("../../../docs/log-schema.md");

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().unwrap_or_else(|| panic!("not an object: {v}")).keys().cloned().collect()
}

fn union(vs: &[Value]) -> BTreeSet<String> {
    vs.iter().flat_map(keys).collect()
}

/// The field names of every record, by the path the doc's headings use.
fn record_fields() -> BTreeMap<&'static str, BTreeSet<String>> {
    let end = full_end();
    let log: Value = serde_json::from_str(&full_log_text(&end)).unwrap();
    let e = &log["end"];
    let exits = [
        serde_json::to_value(ExitRecord::Exit { status: Some(0) }).unwrap(),
        serde_json::to_value(ExitRecord::Signal { signal: 9, name: "SIGKILL".into() }).unwrap(),
    ];
    let (defs, evs): (Vec<Value>, Vec<Value>) =
        log["events"].as_array().unwrap().iter().cloned().partition(|e| e.get("def").is_some());
    let def = |kind: &str| keys(defs.iter().find(|d| d["def"] == kind).unwrap());
    let common: BTreeSet<String> = evs.iter().map(keys).reduce(|a, b| &a & &b).unwrap();
    let mut m = BTreeMap::new();
    m.insert("log", keys(&log));
    m.insert("process", keys(&log["process"]));
    m.insert("options", keys(&serde_json::to_value(Options::default()).unwrap()));
    m.insert("events[]", common);
    m.insert("end", keys(e));
    m.insert("end.exit", union(&exits));
    m.insert("end.devices[]", union(e["devices"].as_array().unwrap()));
    m.insert("end.leak_summary", keys(&e["leak_summary"]));
    m.insert("end.leaks[]", union(e["leaks"].as_array().unwrap()));
    m.insert("end.pools[]", keys(&e["pools"][0]));
    m.insert("end.pools[].segment", keys(&e["pools"][0]["segment"]));
    m.insert("end.pools[].fences", keys(&e["pools"][0]["fences"]));
    m.insert("end.pools[].pages", keys(&e["pools"][0]["pages"]));
    m.insert("end.pools[].pages.costs", keys(&e["pools"][0]["pages"]["costs"]));
    m.insert("end.pools[].pages.at_peak", keys(&e["pools"][0]["pages"]["at_peak"]));
    m.insert("end.magazines", keys(&e["magazines"]));
    m.insert("end.ooms[]", keys(&e["ooms"][0]));
    m.insert("module", def("module"));
    m.insert("string", def("string"));
    m.insert("stack", def("stack"));
    m
}

/// Backticked words of a markdown cell, each with whether a `?` follows it.
fn ticked(cell: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut rest = cell;
    while let Some(a) = rest.find('`') {
        let Some(b) = rest[a + 1..].find('`') else { break };
        let word = &rest[a + 1..a + 1 + b];
        rest = &rest[a + b + 2..];
        out.push((word.to_string(), rest.starts_with('?')));
    }
    out
}

/// The doc's tables: heading path -> rows of cells. A table belongs to the
/// first backticked word of the heading above it.
fn doc_tables() -> BTreeMap<String, Vec<Vec<String>>> {
    let mut tables: BTreeMap<String, Vec<Vec<String>>> = BTreeMap::new();
    let mut path = None;
    let mut lines = DOC.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with('#') {
            path = ticked(line).into_iter().next().map(|(w, _)| w);
            continue;
        }
        let (Some(p), true) = (&path, line.starts_with('|')) else { continue };
        let cells: Vec<String> = line.trim().trim_matches('|').split('|').map(|c| c.trim().to_string()).collect();
        if cells[0].starts_with("---") || lines.peek().is_some_and(|next| next.starts_with("|---")) {
            continue; // the header and separator rows
        }
        tables.entry(p.clone()).or_default().push(cells);
    }
    tables
}

#[test]
fn the_schema_doc_lists_exactly_the_fields_of_the_records() {
    let tables = doc_tables();
    let mut problems = Vec::new();
    for (path, fields) in record_fields() {
        let Some(rows) = tables.get(path) else {
            problems.push(format!("no table for `{path}`"));
            continue;
        };
        let documented: BTreeSet<String> = rows.iter().flat_map(|r| ticked(&r[0])).map(|(w, _)| w).collect();
        for f in fields.difference(&documented) {
            problems.push(format!("`{path}`: field `{f}` is written but not documented"));
        }
        for f in documented.difference(&fields) {
            problems.push(format!("`{path}`: field `{f}` is documented but not in the record"));
        }
    }
    // The fields of each kind of event: `events[].ev` rows are `ev` names and
    // their fields besides the common ones; `x`? marks a field written only sometimes.
    let common = &record_fields()["events[]"];
    let mut by_kind: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for row in tables.get("events[].ev").map(Vec::as_slice).unwrap_or_default() {
        let fields: BTreeSet<String> = ticked(&row[1]).into_iter().map(|(w, _)| w).collect();
        let optional: BTreeSet<String> = ticked(&row[1]).into_iter().filter(|(_, q)| *q).map(|(w, _)| w).collect();
        for (ev, _) in ticked(&row[0]) {
            by_kind.insert(ev, (fields.clone(), optional.clone()));
        }
    }
    for &kind in EventKind::ALL {
        let with: Value = serde_json::from_str(&line_of(&event(kind, 0x55))).unwrap();
        let without: Value = serde_json::from_str(&line_of(&event(kind, 0))).unwrap();
        let all: BTreeSet<String> = &keys(&with) - common;
        let sometimes: BTreeSet<String> = &keys(&with) - &keys(&without);
        match by_kind.remove(kind.as_str()) {
            None => problems.push(format!("event `{kind}` is not documented")),
            Some((fields, optional)) => {
                if fields != all {
                    problems.push(format!("event `{kind}`: documented {fields:?}, written {all:?}"));
                }
                if optional != sometimes {
                    problems
                        .push(format!("event `{kind}`: documented as optional {optional:?}, optional {sometimes:?}"));
                }
            }
        }
    }
    for ev in by_kind.keys() {
        problems.push(format!("event `{ev}` is documented but not written"));
    }
    // Every field of EventRecord is written by some kind of event.
    let all_written: BTreeSet<String> =
        EventKind::ALL.iter().flat_map(|&k| keys(&serde_json::from_str(&line_of(&event(k, 1))).unwrap())).collect();
    let mut every = EventRecord::from(&event(EventKind::Alloc, 1));
    every.handle = Some(1);
    every.result = Some(0);
    every.leaked_bytes = Some(0);
    every.leaked_count = Some(0);
    every.name = Some(String::new());
    every.live = Some(0);
    every.reserved = Some(0);
    assert_eq!(every.stack, Some(1));
    assert_eq!(all_written, keys(&serde_json::to_value(every).unwrap()));
    assert!(DOC.starts_with(&format!("# The cupool log, schema `{SCHEMA}` version {VERSION}\n")), "doc title");
    assert!(problems.is_empty(), "docs/log-schema.md does not match the records:\n  {}", problems.join("\n  "));
}

#[test]
fn phase_names_are_escaped_and_read_back_as_written() {
    let mut e = event(EventKind::PhaseBegin, 3);
    e.api = Api::CupoolPhaseBegin;
    for name in ["epoch 3", "quote \" and \\ backslash", "line\nbreak\ttab", "ünïcode ✓", ""] {
        let mut s = String::new();
        write_named_event(&mut s, &e, EventLine::First, name);
        let read: EventRecord = serde_json::from_str(s.trim_end()).unwrap_or_else(|err| panic!("{s:?}: {err}"));
        assert_eq!(read.name.as_deref(), Some(name));
        assert_eq!(read, EventRecord::named(&e, name));
        assert_eq!(serde_json::to_string(&read).unwrap(), s.trim_end());
    }
}

#[test]
fn what_made_reuse_wait_keeps_in_one_byte_and_reads_a_newer_reason() {
    use MultiStreamBecause::*;
    assert_eq!(MultiStreamBecause::from_code(0), None, "none yet");
    for because in [StreamCreated, SecondStream, DriverThreads, BoundThread, Unknown] {
        assert_eq!(MultiStreamBecause::from_code(because.code()), Some(because));
    }
    assert_eq!(MultiStreamBecause::from_code(6), None);
    let names: Vec<String> = [StreamCreated, SecondStream, DriverThreads, BoundThread]
        .iter()
        .map(|b| serde_json::to_string(b).unwrap())
        .collect();
    assert_eq!(names, ["\"stream_created\"", "\"second_stream\"", "\"driver_threads\"", "\"bound_thread\""]);
    let newer: MultiStreamBecause = serde_json::from_str("\"a_reason_from_a_newer_writer\"").unwrap();
    assert_eq!(newer, Unknown);
}
