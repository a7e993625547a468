//! The model of a log on arbitrary timelines: it never panics, whatever the
//! records, and its figures agree with its own table of allocations.

use cupool_core::log::{EventKind, EventRecord, Header, Log, Named, ProcessInfo};
use cupool_core::model::{Process, What};
use cupool_core::options::{Backing, Mode, Options};
use proptest::prelude::*;

/// One record: which kind, and small numbers for its fields, so that
/// addresses repeat, devices collide and phases nest and cross.
#[derive(Clone, Debug)]
struct Rec {
    kind: u8,
    ptr: u8,
    size: u16,
    device: i8,
    mem: u8,
    name: u8,
    tid: u8,
    pooled: bool,
    missing: u8,
}

fn rec() -> impl Strategy<Value = Rec> {
    (0u8..14, 0u8..12, 0u16..5000, -1i8..3, 0u8..6, 0u8..3, 0u8..3, any::<bool>(), 0u8..20).prop_map(
        |(kind, ptr, size, device, mem, name, tid, pooled, missing)| Rec {
            kind,
            ptr,
            size,
            device,
            mem,
            name,
            tid,
            pooled,
            missing,
        },
    )
}

const KINDS: [&str; 14] = [
    "alloc",
    "free",
    "alloc",
    "free",
    "alloc_failed",
    "invalid_free",
    "checkpoint",
    "map",
    "unmap",
    "oom",
    "phase_begin",
    "phase_end",
    "reserve",
    "release",
];
const MEMS: [&str; 6] = ["device", "managed", "pitched", "async", "host", "vmm"];
const APIS: [&str; 4] = ["cudaMalloc", "cupool_mark", "nvtxRangePushA", "nvtxRangeStartA"];

fn record(seq: u64, r: &Rec) -> EventRecord {
    let ev = KINDS[r.kind as usize];
    let mut e = EventRecord::new(seq, seq * 10, EventKind::from_name(ev).unwrap());
    e.tid = Some(u32::from(r.tid));
    e.api = Some(Named::from_name(APIS[(r.name as usize + r.kind as usize) % APIS.len()]));
    if r.missing != 0 {
        e.ptr = Some(0x1000 * u64::from(r.ptr));
    }
    if r.missing != 1 {
        e.kind = Some(Named::from_name(MEMS[r.mem as usize]));
    }
    e.size = Some(u64::from(r.size));
    e.device = Some(i32::from(r.device));
    e.pooled = r.pooled;
    e.name = Some(format!("phase {}", r.name));
    e.live = Some(0);
    e.reserved = Some(0);
    e.result = Some(i32::from(r.name));
    e.leaked_bytes = Some(u64::from(r.size));
    e.leaked_count = Some(1);
    e
}

fn log(records: &[Rec], mode: Mode, backing: Backing, version: u32, shuffle: bool) -> Log {
    let mut events: Vec<EventRecord> = records.iter().enumerate().map(|(i, r)| record(i as u64, r)).collect();
    if shuffle {
        events.reverse();
    }
    let header = Header {
        schema: cupool_core::log::SCHEMA.into(),
        version,
        process: ProcessInfo { pid: 1, ..Default::default() },
        options: Options { mode, backing, ..Options::default() },
    };
    Log { path: "cupool.1.json".into(), header, events, definitions: Vec::new(), end: None }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn any_timeline_makes_a_model_that_agrees_with_itself(
        records in prop::collection::vec(rec(), 0..200),
        mode in prop_oneof![Just(Mode::Pool), Just(Mode::Passthrough)],
        backing in prop_oneof![Just(Backing::Segments), Just(Backing::Vmm)],
        version in 1u32..5,
        shuffle in any::<bool>(),
    ) {
        let p = Process::new(log(&records, mode, backing, version, shuffle));
        prop_assert!(p.changes.windows(2).all(|w| w[0].seq < w[1].seq), "ordered once");
        for (id, a) in p.allocations.iter().enumerate() {
            prop_assert_eq!(p.changes[a.at].what, What::Alloc(id));
            if let Some(e) = a.end {
                prop_assert!(e.at >= a.at, "an allocation ends after it began");
            }
        }
        // What each device holds at the end is what its live allocations add up to.
        for d in &p.devices {
            let live: u64 = p
                .allocations
                .iter()
                .filter(|a| a.device == d.device && !a.is_host() && a.end.is_none())
                .map(|a| a.size)
                .sum();
            prop_assert_eq!(d.now().allocated, live, "device {}", d.device);
            prop_assert!(d.peak_allocated.bytes >= live);
            prop_assert!(d.peak_reserved.bytes >= d.now().reserved);
        }
        let host: u64 = p.allocations.iter().filter(|a| a.is_host() && a.end.is_none()).map(|a| a.size).sum();
        prop_assert_eq!(p.host.now().allocated, host);
        // A log cut short: its exit leaks are the allocations left live, each once.
        let live = p.allocations.iter().filter(|a| a.end.is_none()).count();
        prop_assert_eq!(p.leaks.len(), live);
        prop_assert!(p.leaks.iter().all(|l| l.alloc.is_some_and(|id| p.allocations[id].end.is_none())));
        // Every moment is seen once: each change, and each allocation's end.
        let ended = p.allocations.iter().filter(|a| a.end.is_some()).count();
        prop_assert_eq!(p.moments().count(), p.changes.len() + ended);
        // Spans: an end never comes before its beginning.
        for s in &p.spans {
            if let (Some(b), Some(e)) = (s.begin, s.end) {
                prop_assert!(b < e);
            }
        }
        let _ = p.summary();
    }
}
