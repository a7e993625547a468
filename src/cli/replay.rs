//! `cupool replay`: runs recorded allocation traces through the pool core on
//! the CPU and reports how much memory it would reserve for them.

use cupool_core::log::read_log;
use cupool_core::pool::{Backend, BlockId, Pool, PoolConfig};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// A device with unbounded memory: segments are laid out end to end.
struct Simulated {
    next: u64,
}

impl Backend for Simulated {
    fn allocate_segment(&mut self, size: u64) -> Option<u64> {
        let addr = self.next;
        self.next += size;
        Some(addr)
    }
    fn release_segment(&mut self, _addr: u64, _size: u64) {}
}

/// One operation of a trace: allocate `size` under `key`, or free `key`.
enum Op {
    Alloc(u64, u64),
    Free(u64),
}

fn read_text(path: &Path) -> std::io::Result<String> {
    let raw = std::fs::read(path)?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut s = String::new();
        flate2::read::GzDecoder::new(&raw[..]).read_to_string(&mut s)?;
        Ok(s)
    } else {
        String::from_utf8(raw).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }
}

/// Device-memory operations of a cupool log, or of an RMM logging CSV
/// (`Thread,Time,Action,Pointer,Size,Stream`).
fn load(path: &Path) -> std::io::Result<Vec<Op>> {
    let text = read_text(path)?;
    let mut ops = Vec::new();
    if text.starts_with("Thread,") {
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
    let tmp = std::env::temp_dir().join(format!("cupool-replay-{}.json", std::process::id()));
    std::fs::write(&tmp, text)?;
    let log = read_log(&tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut events = log?.events;
    events.sort_by_key(|e| e["seq"].as_u64().unwrap_or(0));
    for e in events {
        let kind = e["kind"].as_str().unwrap_or("");
        if !matches!(kind, "device" | "pitched") {
            continue; // what the pool serves
        }
        let ptr = e["ptr"].as_str().and_then(|p| u64::from_str_radix(p.trim_start_matches("0x"), 16).ok()).unwrap_or(0);
        match e["ev"].as_str() {
            Some("alloc") => ops.push(Op::Alloc(ptr, e["size"].as_u64().unwrap_or(0))),
            Some("free") => ops.push(Op::Free(ptr)),
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
    let mut pool = Pool::new(Simulated { next: 1 << 40 }, PoolConfig::shim_default());
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

/// The traces shipped in `traces/` next to the repository's Cargo.toml (or `$CUPOOL_TRACES`).
fn bundled() -> Vec<PathBuf> {
    let dir = std::env::var_os("CUPOOL_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

pub fn run(paths: Vec<PathBuf>) -> ExitCode {
    let paths = if paths.is_empty() { bundled() } else { paths };
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
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
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
                eprintln!("cupool replay: {}: {e}", p.display());
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
