//! Each edge case of reading a log, tested once, here.

use super::*;
use crate::log::read_log_from;

const MIB: u64 = 1 << 20;

/// A log written line by line as the shim writes it.
struct Lines {
    version: u32,
    options: String,
    seq: u64,
    lines: Vec<String>,
    end: Option<String>,
}

impl Lines {
    fn new(options: &str) -> Lines {
        Lines { version: crate::log::VERSION, options: options.into(), seq: 1, lines: Vec::new(), end: None }
    }

    fn push(&mut self, body: &str) -> &mut Self {
        self.lines.push(format!("{{\"seq\":{},\"t_ns\":{},{body}}}", self.seq, self.seq * 1000));
        self.seq += 1;
        self
    }

    fn alloc(&mut self, kind: &str, ptr: u64, size: u64, device: i32) -> &mut Self {
        self.push(&format!(
            "\"ev\":\"alloc\",\"api\":\"cudaMalloc\",\"kind\":\"{kind}\",\"ptr\":\"{ptr:#x}\",\"size\":{size},\"device\":{device},\"tid\":1"
        ))
    }

    fn pooled(&mut self, ptr: u64, size: u64, device: i32) -> &mut Self {
        self.push(&format!(
            "\"ev\":\"alloc\",\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"{ptr:#x}\",\"size\":{size},\"device\":{device},\"pooled\":true,\"tid\":1"
        ))
    }

    fn free(&mut self, kind: &str, ptr: u64, size: u64, device: i32) -> &mut Self {
        self.push(&format!(
            "\"ev\":\"free\",\"api\":\"cudaFree\",\"kind\":\"{kind}\",\"ptr\":\"{ptr:#x}\",\"size\":{size},\"device\":{device},\"tid\":1"
        ))
    }

    fn pool(&mut self, ev: &str, size: u64, device: i32) -> &mut Self {
        self.push(&format!("\"ev\":\"{ev}\",\"size\":{size},\"device\":{device},\"tid\":1"))
    }

    /// One edge, a line per device, as the shim writes it.
    fn edge(&mut self, ev: &str, api: &str, name: &str, tid: u32, devices: &[i32]) -> &mut Self {
        for d in devices {
            self.push(&format!(
                "\"ev\":\"{ev}\",\"api\":\"{api}\",\"name\":\"{name}\",\"device\":{d},\"live\":0,\"reserved\":0,\"tid\":{tid}"
            ));
        }
        self
    }

    fn text(&self) -> String {
        let mut s = format!(
            "{{\"schema\":\"cupool-log\",\"version\":{},\"process\":{{\"pid\":7,\"cmdline\":[\"prog\"]}},\"options\":{{{}}},\"events\":[\n{{\"seq\":0,\"t_ns\":0,\"ev\":\"start\",\"tid\":1}}\n",
            self.version, self.options
        );
        for l in &self.lines {
            s.push(',');
            s.push_str(l);
            s.push('\n');
        }
        if let Some(end) = &self.end {
            s.push_str(&format!("],\"end\":{end}}}\n"));
        }
        s
    }

    fn model(&self) -> Process {
        Process::new(read_log_from(self.text().as_bytes(), "cupool.7.json").expect("a valid log"))
    }
}

const PASSTHROUGH: &str = "\"mode\":\"passthrough\"";
const POOL_VMM: &str = "\"mode\":\"pool\",\"backing\":\"vmm\"";

/// An end record with `leaks` (JSON objects) and the device's peak reserved.
fn end_record(leaks: &[String], peak_reserved: u64) -> String {
    let bytes: u64 = leaks
        .iter()
        .map(|l| l.split("\"size\":").nth(1).unwrap().split(',').next().unwrap().parse::<u64>().unwrap())
        .sum();
    format!(
        "{{\"end_unix_ms\":9,\"duration_ms\":1,\"exit\":{{\"how\":\"exit\",\"status\":0}},\
         \"devices\":[{{\"device\":0,\"allocs\":0,\"frees\":0,\"failures\":0,\"current_bytes\":0,\"peak_bytes\":0,\"current_count\":0,\"peak_count\":0,\"reserved_bytes\":0,\"peak_reserved_bytes\":{peak_reserved}}}],\
         \"host\":{{\"device\":-1,\"allocs\":0,\"frees\":0,\"failures\":0,\"current_bytes\":0,\"peak_bytes\":0,\"current_count\":0,\"peak_count\":0}},\
         \"leaks\":[{}],\"leak_summary\":{{\"bytes\":{bytes},\"count\":{}}},\"dropped_events\":0,\"pools\":[],\"ooms\":[],\"complete\":true}}",
        leaks.join(","),
        leaks.len()
    )
}

fn leak(ptr: u64, size: u64, at: &str) -> String {
    format!("{{\"ptr\":\"{ptr:#x}\",\"size\":{size},\"device\":0,\"kind\":\"device\",\"api\":\"cudaMalloc\",\"age_ms\":0,\"tid\":1,\"at\":\"{at}\"}}")
}

#[test]
fn an_address_that_comes_back_without_a_free_ends_the_allocation_that_held_it() {
    let mut l = Lines::new(PASSTHROUGH);
    l.alloc("device", 0x1000, MIB, 0).alloc("device", 0x1000, 2 * MIB, 0).free("device", 0x1000, 2 * MIB, 0);
    let p = l.model();
    assert_eq!(p.allocations.len(), 2);
    assert_eq!(p.allocations[0].end.map(|e| (e.at, e.by)), Some((1, EndedBy::AddressReused)));
    assert_eq!(p.allocations[1].end.map(|e| e.by), Some(EndedBy::Free));
    let d = p.device(0).unwrap();
    assert_eq!((d.peak_allocated.bytes, d.now().allocated, d.live_count), (2 * MIB, 0, 0));
    assert!(p.leaks.is_empty(), "a cut log leaves nothing live: {:?}", p.leaks);
}

#[test]
fn vmm_handles_and_pointers_are_keyed_apart_and_host_memory_is_counted_apart() {
    let mut l = Lines::new(PASSTHROUGH);
    l.alloc("vmm", 0x1000, 2 * MIB, 0) // a cuMemCreate handle with the same number as a pointer
        .alloc("device", 0x1000, MIB, 0)
        .alloc("host", 0x9000, 4096, -1)
        .free("device", 0x1000, MIB, 0);
    let p = l.model();
    assert!(p.allocations[0].end.is_none(), "the pointer's free does not end the handle");
    assert_eq!(p.device(0).unwrap().now().allocated, 2 * MIB);
    assert_eq!((p.host.allocs, p.host.now().allocated), (1, 4096));
    assert!(p.devices.iter().all(|d| d.device != -1), "host memory is no device's");
    assert!(p.sizes.iter().all(|b| b.low != 4096), "the size histogram is device memory's");
    // Killed: what is left live is the exit leak, host memory too.
    let leaks: Vec<(Option<u64>, Option<u64>, u64)> =
        p.leaks.iter().map(|l| (l.leak.ptr, l.leak.handle, l.leak.size)).collect();
    assert_eq!(leaks, vec![(None, Some(0x1000), 2 * MIB), (Some(0x9000), None, 4096)]);
    assert!(p.leaks.iter().all(|l| l.leak.at == "not finished" && l.alloc.is_some()));
}

#[test]
fn devices_are_apart_and_a_phase_edge_is_one_line_per_device() {
    let mut l = Lines::new(PASSTHROUGH);
    l.alloc("device", 0x10, 100, 0).alloc("device", 0x20, 1000, 1);
    l.edge("phase_begin", "cupool_phase_begin", "train", 1, &[0, 1]);
    l.alloc("device", 0x30, 50, 0).free("device", 0x30, 50, 0);
    // NVTX ranges pushed on two threads and popped in the other order.
    l.edge("phase_begin", "nvtxRangePushA", "fwd", 2, &[0, 1]);
    l.edge("phase_begin", "nvtxRangePushA", "bwd", 3, &[0, 1]);
    l.edge("phase_end", "nvtxRangePop", "fwd", 2, &[0, 1]);
    l.edge("phase_end", "cupool_phase_end", "train", 1, &[0, 1]);
    // The same name twice in a row on one device: two edges.
    l.edge("phase_begin", "cupool_phase_begin", "step", 1, &[0]);
    l.edge("phase_begin", "cupool_phase_begin", "step", 1, &[0]);
    let p = l.model();
    let spans: Vec<(&str, Family, bool)> =
        p.spans.iter().map(|s| (s.name.as_str(), s.family, s.end.is_some())).collect();
    assert_eq!(
        spans,
        vec![
            ("train", Family::Phase, true),
            ("fwd", Family::NvtxPush, true),
            ("bwd", Family::NvtxPush, false),
            ("step", Family::Phase, false),
            ("step", Family::Phase, false),
        ]
    );
    assert_eq!(p.spans[0].devices.len(), 2);
    assert_eq!(p.spans[4].parent, Some(3));
    let phase_changes = p.changes.iter().filter(|c| matches!(c.what, What::PhaseBegin(_) | What::PhaseEnd(_))).count();
    assert_eq!(phase_changes, 7, "one change per edge, not per line");
    let d0 = p.device(0).unwrap();
    assert_eq!((d0.peak_allocated.bytes, d0.peak_allocated.phase.as_deref()), (150, Some("train")));
    assert_eq!(p.device(1).unwrap().peak_allocated.bytes, 1000);
    assert_eq!(p.allocations[2].phase, Some(0));
}

#[test]
fn an_end_whose_beginning_came_before_the_log_is_a_phase_of_its_own() {
    let mut l = Lines::new(PASSTHROUGH);
    l.edge("phase_end", "nvtxRangePop", "warm-up", 1, &[-1]);
    let p = l.model();
    assert_eq!(p.spans.len(), 1);
    assert_eq!((p.spans[0].begin, p.spans[0].begin_ns, p.spans[0].end.is_some()), (None, 0, true));
}

#[test]
fn pool_records_are_the_reserved_memory_of_a_vmm_pool() {
    let mut l = Lines::new(POOL_VMM);
    l.pool("reserve", 2 * MIB, 0).pooled(0x1000, 4096, 0).pooled(0x2000, 8192, 0);
    l.alloc("device", 0x4000_0000, 64 * MIB, 0); // too large for the pool: CUDA's own
    l.free("device", 0x1000, 4096, 0).free("device", 0x2000, 8192, 0).pool("release", 2 * MIB, 0);
    l.end = Some(end_record(&[leak(0x4000_0000, 64 * MIB, "exit")], 66 * MIB));
    let p = l.model();
    assert_eq!(p.reserved_from, ReservedFrom::PoolRecords);
    let d = p.device(0).unwrap();
    assert_eq!(d.peak_reserved.bytes, 66 * MIB, "2 MiB of pages and the 64 MiB CUDA made");
    assert_eq!(Some(d.peak_reserved.bytes), d.recorded_peak_reserved, "the end record agrees");
    assert_eq!(d.now().reserved, 64 * MIB);
    assert!(p.rebuilt.is_none());
    assert_eq!(p.leaks.len(), 1);
    assert_eq!(p.leaks[0].alloc, Some(2), "the exit leak is the timeline's allocation");
}

#[test]
fn older_pool_logs_rebuild_segments_and_say_when_vmm_pages_were_not_recorded() {
    let mut l = Lines::new("\"mode\":\"pool\",\"backing\":\"segments\"");
    l.version = 3;
    l.alloc("device", 0x7f00_0000_0000, 4096, 0).alloc("device", 0x7f00_0000_1000, 4096, 0);
    let p = l.model();
    assert_eq!(p.reserved_from, ReservedFrom::RebuiltSegments);
    assert_eq!(p.device(0).unwrap().peak_reserved.bytes, 2 * MIB, "one 2 MiB segment");
    assert_eq!(p.rebuilt, Some(Rebuilt { placed: 2, misplaced: 0 }));
    let mut l = Lines::new(POOL_VMM);
    l.version = 3;
    l.alloc("device", 0x7f00_0000_0000, 4096, 0);
    let p = l.model();
    assert_eq!(p.reserved_from, ReservedFrom::NotRecorded);
    assert!(p.rebuilt.is_none(), "a VMM pool is not rebuilt as segments");
}

#[test]
fn a_checkpoint_ends_the_allocations_its_context_held() {
    let mut l = Lines::new(PASSTHROUGH);
    l.alloc("device", 0x1000, MIB, 0).alloc("device", 0x2000, MIB, 0);
    l.push("\"ev\":\"checkpoint\",\"api\":\"cuCtxDestroy_v2\",\"device\":0,\"leaked_bytes\":1048576,\"leaked_count\":1,\"tid\":1");
    l.alloc("device", 0x1000, 512, 0).free("device", 0x1000, 512, 0); // the address again, in a new context
    l.end = Some(end_record(&[leak(0x1000, MIB, "cuCtxDestroy_v2"), leak(0x2000, MIB, "exit")], 0));
    let p = l.model();
    assert_eq!(p.allocations[0].end.map(|e| e.by), Some(EndedBy::ContextDestroyed));
    assert!(p.allocations[1].end.is_none());
    assert_eq!(p.allocations[2].end.map(|e| e.by), Some(EndedBy::Free));
    let matched: Vec<(&str, Option<AllocId>)> = p.leaks.iter().map(|l| (l.leak.at.as_str(), l.alloc)).collect();
    assert_eq!(matched, vec![("cuCtxDestroy_v2", Some(0)), ("exit", Some(1))]);
    assert_eq!(p.checkpoints.len(), 1);
}

#[test]
fn events_are_ordered_once_and_unusable_records_are_named() {
    let mut l = Lines::new(PASSTHROUGH);
    l.alloc("device", 0x1000, 10, 0).free("device", 0x1000, 10, 0);
    l.lines.swap(0, 1); // written out of order (two threads' chunks)
    l.push("\"ev\":\"alloc\",\"api\":\"cudaMalloc\",\"kind\":\"device\",\"size\":5,\"device\":0,\"tid\":1");
    l.push("\"ev\":\"defrag\",\"tid\":1");
    l.free("device", 0x5000, 10, 0);
    let p = l.model();
    assert!(p.changes.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(p.allocations[0].end.map(|e| e.by), Some(EndedBy::Free));
    assert!(matches!(p.changes.last().unwrap().what, What::FreeOfUnknown { size: 10, .. }));
    assert_eq!(p.problems.len(), 2, "{:?}", p.problems);
    assert!(p.problems.iter().any(|l| l.contains("\"defrag\"")), "{:?}", p.problems);
    assert!(p.problems.iter().any(|l| l.contains("without a pointer")), "{:?}", p.problems);
}

#[test]
fn a_summary_comes_from_the_end_record_or_else_the_timeline() {
    let mut l = Lines::new(PASSTHROUGH);
    l.alloc("device", 0x1000, 100, 0).alloc("device", 0x2000, 50, 0).free("device", 0x1000, 100, 0);
    let cut = l.model().summary();
    assert!(!cut.complete);
    let d = &cut.devices[0];
    assert_eq!(
        (d.allocs, d.frees, d.current_bytes, d.peak_bytes, d.current_count, d.peak_count),
        (2, 1, 50, 150, 1, 2)
    );
    assert_eq!((cut.leak_bytes, cut.leaks[0].ptr), (50, Some(0x2000)));
    l.end = Some(end_record(&[leak(0x2000, 50, "exit")], 0));
    let whole = l.model().summary();
    assert!(whole.complete);
    assert_eq!(whole.leak_bytes, 50);
}

/// A log followed line by line as it is written gives the figures of the
/// whole log read at once, and holds no more than what is live and open.
#[test]
fn a_followed_log_shows_what_the_whole_log_shows_and_stays_small() {
    let mut l = Lines::new("\"mode\":\"pool\"");
    l.pool("reserve", 4 * MIB, 0);
    for step in 0..10_000u64 {
        if step > 0 {
            l.edge("phase_end", "cupool_mark", &format!("step {}", step - 1), 1, &[0, 1]);
        }
        l.edge("phase_begin", "cupool_mark", &format!("step {step}"), 1, &[0, 1]);
        l.pooled(0x1000 + step * 0x1000, 4096, 0);
        l.alloc("device", 0x9000_0000, 100 + step % 7, 1);
        if step % 3 != 0 {
            l.free("device", 0x1000 + step * 0x1000, 4096, 0);
        }
    }
    let whole = l.model();
    let text = l.text();
    let mut lines = text.lines();
    let header = crate::log::header_line(lines.next().unwrap()).unwrap();
    let version = header.version;
    let mut f = Following::new(header);
    for line in lines {
        match crate::log::line_of(line, version).unwrap() {
            crate::log::LogLine::Event(e) => f.event(&e),
            other => panic!("{other:?}"),
        }
    }
    let followed: Vec<&DeviceSeries> = f.devices().collect();
    assert_eq!(followed.len(), whole.devices.len());
    for (a, b) in followed.iter().zip(&whole.devices) {
        assert_eq!(a.now(), b.now());
        assert_eq!((&a.peak_allocated, &a.peak_reserved), (&b.peak_allocated, &b.peak_reserved));
        assert_eq!((a.allocs, a.frees, a.live_count), (b.allocs, b.frees, b.live_count));
        assert_eq!(a.samples.len(), 1, "the figures now, no history");
    }
    let mut live: Vec<(u64, u64)> = f.live().map(|a| (a.addr, a.size)).collect();
    let mut want: Vec<(u64, u64)> =
        whole.allocations.iter().filter(|a| a.end.is_none()).map(|a| (a.addr, a.size)).collect();
    live.sort_unstable();
    want.sort_unstable();
    assert_eq!(live, want);
    assert_eq!(f.phase(), Some("step 9999"));
    let (slots, spans) = f.held();
    assert!(slots <= live.len() + 2, "{slots} allocation slots for {} live", live.len());
    assert!(spans <= 4097, "{spans} phases held");
    assert_eq!(f.events(), whole.log.events.len());
}
