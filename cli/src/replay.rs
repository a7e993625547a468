//! `cupool replay`: runs recorded allocation traces through the pool core on
//! the CPU and reports how much memory it would reserve for them.

use cupool_core::log::{maybe_gunzip, read_log_from, EventKind, MemKind};
use cupool_core::pool::testing::SimulatedDevice;
use cupool_core::pool::{BlockId, Pool, PoolConfig};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// One operation of a trace: allocate `size` under `key`, or free `key`.
enum Op {
    Alloc(u64, u64),
    Free(u64),
}

/// Device-memory operations of a cupool log, or of an RMM logging CSV
/// (`Thread,Time,Action,Pointer,Size,Stream`); either may be gzipped.
fn load(trace: &Trace) -> Result<Vec<Op>, String> {
    let path = trace.path();
    let in_file = |e: std::io::Error| format!("{}: {e}", path.display());
    let raw = match trace {
        Trace::File(p) => std::fs::read(p).map_err(in_file)?,
        Trace::Embedded(_, bytes) => bytes.to_vec(),
    };
    let bytes = maybe_gunzip(raw).map_err(in_file)?;
    let mut ops = Vec::new();
    if bytes.starts_with(b"Thread,") {
        let text = String::from_utf8_lossy(&bytes);
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            if f.len() < 5 {
                continue;
            }
            let ptr = u64::from_str_radix(f[3].trim_start_matches("0x"), 16).unwrap_or(0);
            match f[2] {
                "allocate" => ops.push(Op::Alloc(ptr, f[4].parse().unwrap_or(0))),
                "free" => ops.push(Op::Free(ptr)),
                _ => {}
            }
        }
        return Ok(ops);
    }
    let mut events = read_log_from(&bytes[..], path).map_err(|e| e.to_string())?.events;
    events.sort_by_key(|e| e.seq);
    for e in events {
        if !matches!(e.kind.as_ref().and_then(|k| k.known()), Some(MemKind::Device | MemKind::Pitched)) {
            continue; // what the pool serves
        }
        let ptr = e.ptr.unwrap_or(0);
        match e.ev.known() {
            Some(EventKind::Alloc) => ops.push(Op::Alloc(ptr, e.size.unwrap_or(0))),
            Some(EventKind::Free) => ops.push(Op::Free(ptr)),
            _ => {}
        }
    }
    Ok(ops)
}

struct Outcome {
    ops: usize,
    peak_live: u64,
    peak_reserved: u64,
    segments: u64,
    ns_per_op: f64,
}

fn replay(ops: &[Op]) -> Outcome {
    let mut pool = Pool::new(SimulatedDevice::new(), PoolConfig::shim_default());
    let mut live: HashMap<u64, (BlockId, u64)> = HashMap::with_capacity(ops.len() / 2);
    let (mut live_bytes, mut peak_live) = (0u64, 0u64);
    let start = Instant::now();
    for op in ops {
        match *op {
            Op::Alloc(key, size) => {
                if let Ok(b) = pool.allocate(size) {
                    if let Some((old, old_size)) = live.insert(key, (b.id, size)) {
                        pool.free(old); // a free the trace lost (cut short): keep the books straight
                        live_bytes -= old_size;
                    }
                    live_bytes += size;
                    peak_live = peak_live.max(live_bytes);
                }
            }
            Op::Free(key) => {
                if let Some((id, size)) = live.remove(&key) {
                    pool.free(id);
                    live_bytes -= size;
                }
            }
        }
    }
    let elapsed = start.elapsed();
    let s = pool.stats();
    Outcome {
        ops: ops.len(),
        peak_live,
        peak_reserved: s.reserved_bytes.peak,
        segments: s.segment.peak,
        ns_per_op: elapsed.as_nanos() as f64 / ops.len().max(1) as f64,
    }
}

/// A trace to replay: a file, or one carried in this binary.
enum Trace {
    File(PathBuf),
    Embedded(&'static str, &'static [u8]),
}

impl Trace {
    fn path(&self) -> &Path {
        match self {
            Trace::File(p) => p,
            Trace::Embedded(name, _) => Path::new(name),
        }
    }
}

/// Every file in `$CUPOOL_TRACES` when it is set, else the traces of the
/// repository's `traces/` that this binary carries (`build.rs`).
fn bundled() -> Vec<Trace> {
    let Some(dir) = std::env::var_os("CUPOOL_TRACES").filter(|d| !d.is_empty()) else {
        return crate::shim::embedded::TRACES.iter().map(|(name, bytes)| Trace::Embedded(name, bytes)).collect();
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    files.sort();
    files.into_iter().map(Trace::File).collect()
}

pub fn run(paths: Vec<PathBuf>) -> ExitCode {
    let paths = if paths.is_empty() { bundled() } else { paths.into_iter().map(Trace::File).collect() };
    if paths.is_empty() {
        eprintln!("cupool replay: no traces given and none bundled");
        return ExitCode::from(2);
    }
    println!(
        "{:<40} {:>9} {:>12} {:>14} {:>8} {:>9} {:>8}",
        "trace", "ops", "peak live", "peak reserved", "ratio", "segments", "ns/op"
    );
    let mut failed = false;
    for p in &paths {
        let name = p.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        match load(p) {
            Ok(ops) => {
                let o = replay(&ops);
                let ratio = if o.peak_live == 0 { 1.0 } else { o.peak_reserved as f64 / o.peak_live as f64 };
                println!(
                    "{:<40} {:>9} {:>12} {:>14} {:>8.3} {:>9} {:>8.1}",
                    name,
                    o.ops,
                    crate::summary::human_bytes(o.peak_live),
                    crate::summary::human_bytes(o.peak_reserved),
                    ratio,
                    o.segments,
                    o.ns_per_op
                );
            }
            Err(e) => {
                eprintln!("cupool replay: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}
