//! `cupool replay`: runs recorded allocation traces through the pool cores on
//! the CPU (cupool's segment pool and VMM pool, and models of PyTorch's
//! caching allocator with and without expandable segments) and reports how
//! much memory each would reserve for them.

mod behind;
mod pages;

use behind::Behind;
use cupool_core::log::{maybe_gunzip, read_log_from, MemKind, ReadErrorKind};
use cupool_core::model::{Allocation, Moment, Process, What};
use cupool_core::pool::testing::SimulatedDevice;
use cupool_core::pool::{BlockId, Pool, PoolConfig};
use cupool_core::vmm::testing::SimulatedPages;
use cupool_core::vmm::{VmmConfig, VmmPool};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// One operation of a trace: allocate `size` under `key`, or free `key`.
enum Op {
    Alloc(u64, u64),
    Free(u64),
}

/// An operation at its time in the trace (ns; 0 where the trace has none):
/// what the allocators' clocks answer during a replay, so that rules in time
/// (giving segments back, the VMM high-water window) act as they did in the run.
type Timed = (u64, Op);

/// The header of an RMM logging CSV (`rmm::mr::logging_resource_adaptor`).
const RMM_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// Device-memory operations of a cupool log, or of an RMM logging CSV
/// (`Thread,Time,Action,Pointer,Size,Stream`); either may be gzipped.
/// Errors name the file, and the line where one is at fault.
fn load(trace: &Trace) -> Result<Vec<Timed>, String> {
    let path = trace.path();
    let in_file = |e: std::io::Error| format!("{}: {e}", path.display());
    let raw = match trace {
        Trace::File(p) => std::fs::read(p).map_err(in_file)?,
        Trace::Embedded(_, bytes) => bytes.to_vec(),
    };
    let bytes = maybe_gunzip(raw).map_err(in_file)?;
    if bytes.starts_with(b"Thread,") {
        return load_rmm_csv(&String::from_utf8_lossy(&bytes))
            .map_err(|(line, why)| format!("{}:{line}: {why}", path.display()));
    }
    let log = read_log_from(&bytes[..], path).map_err(|e| match &e.kind {
        ReadErrorKind::NotALog(why) => format!(
            "{}: neither a cupool log nor an RMM logging CSV (whose first line is {RMM_HEADER}): {why}",
            path.display()
        ),
        _ => e.to_string(),
    })?;
    let p = Process::new(log);
    // What the program asked the device for: the pool serves these,
    // and a program whose own allocator maps pages (JAX's platform
    // allocator, PyTorch's expandable segments) asks for pages.
    let replayed = |a: &Allocation| {
        matches!(a.kind.known(), Some(MemKind::Device | MemKind::Pitched | MemKind::Async | MemKind::Vmm))
    };
    let mut ops = Vec::new();
    for m in p.moments() {
        match m {
            Moment::Ended(id) => {
                let a = &p.allocations[id];
                if replayed(a) {
                    ops.push((a.end.map_or(a.t_ns, |e| e.t_ns), Op::Free(a.addr)));
                }
            }
            Moment::Change(i) => {
                if let What::Alloc(id) = p.changes[i].what {
                    let a = &p.allocations[id];
                    if replayed(a) {
                        ops.push((a.t_ns, Op::Alloc(a.addr, a.size)));
                    }
                }
            }
        }
    }
    Ok(ops)
}

/// The rows of an RMM logging CSV; an error is (1-based line, what is wrong).
/// Rows of `allocate failure` are skipped; any row that is not an
/// `allocate` or `free` with a hex pointer and a byte count is an error.
fn load_rmm_csv(text: &str) -> Result<Vec<Timed>, (usize, String)> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim_end_matches('\r')));
    let (_, header) = lines.next().unwrap_or((1, ""));
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    let column = |name: &str| {
        columns
            .iter()
            .position(|c| *c == name)
            .ok_or_else(|| (1, format!("the header has no {name} column (expected {RMM_HEADER})")))
    };
    let (action, pointer, size) = (column("Action")?, column("Pointer")?, column("Size")?);
    let time = columns.iter().position(|c| *c == "Time");
    let mut ops = Vec::new();
    for (n, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != columns.len() {
            return Err((
                n,
                format!("{} column(s) where the header has {} ({RMM_HEADER}): '{line}'", f.len(), columns.len()),
            ));
        }
        let ptr = || {
            let p = f[pointer];
            u64::from_str_radix(p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")).unwrap_or(p), 16)
                .map_err(|_| (n, format!("bad pointer '{p}' (expected hex, such as 0x7f3a00000000)")))
        };
        let bytes =
            || f[size].parse::<u64>().map_err(|_| (n, format!("bad size '{}' (expected a number of bytes)", f[size])));
        let t = time.and_then(|c| rmm_time_ns(f[c])).unwrap_or(0);
        match f[action] {
            "allocate" => ops.push((t, Op::Alloc(ptr()?, bytes()?))),
            "free" => ops.push((t, Op::Free(ptr()?))),
            "allocate failure" => {}
            other => {
                return Err((n, format!("unknown action '{other}' (expected allocate, free or allocate failure)")))
            }
        }
    }
    Ok(ops)
}

/// RMM's `Time` column, `HH:MM:SS.ffffff` (a time of day), in ns; `None`
/// when it is not in that form.
fn rmm_time_ns(text: &str) -> Option<u64> {
    let mut parts = text.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    let (whole, frac) = s.split_once('.').unwrap_or((s, "0"));
    let frac_ns = format!("{frac:0<9}").get(..9)?.parse::<u64>().ok()?;
    let secs = h.parse::<u64>().ok()? * 3600 + m.parse::<u64>().ok()? * 60 + whole.parse::<u64>().ok()?;
    Some(secs * 1_000_000_000 + frac_ns)
}

/// An allocator a trace is replayed through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// cupool's fixed-segment pool with the shim's settings (`PoolConfig::shim_default`).
    Segments,
    /// cupool's VMM pool as the shim runs it (`VmmConfig::shim_default`):
    /// 2 MiB pages, idle pages remapped, bulk frees given back.
    Vmm,
    /// PyTorch's caching allocator: the segment pool with PyTorch's defaults
    /// (`PoolConfig::default`: no release before growing, nothing given back).
    PytorchCaching,
    /// PyTorch's `expandable_segments:True` (`VmmConfig::pytorch_expandable`):
    /// one growing virtual segment per pool kind (one stream), 2 MiB pages for
    /// the small pool and 20 MiB for the large, unmapped only by `empty_cache`
    /// (which the traces do not call).
    PytorchExpandable,
}

impl Policy {
    pub const ALL: [Policy; 4] = [Policy::Segments, Policy::Vmm, Policy::PytorchCaching, Policy::PytorchExpandable];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Segments => "cupool-segments",
            Policy::Vmm => "cupool-vmm",
            Policy::PytorchCaching => "pytorch-caching",
            Policy::PytorchExpandable => "pytorch-expandable",
        }
    }
}

/// `--policy NAME`: one of [`Policy::ALL`] by name.
pub fn parse_policy(name: &str) -> Result<Policy, String> {
    Policy::ALL.into_iter().find(|p| p.name() == name).ok_or_else(|| {
        let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
        format!("no policy {name:?}; the policies are {}", names.join(", "))
    })
}

/// What replay needs of an allocator.
trait Replayable {
    /// The trace's clock reads `t_ns` now.
    fn at(&mut self, t_ns: u64);
    fn alloc(&mut self, size: u64) -> Option<BlockId>;
    fn release(&mut self, id: BlockId);
    fn peak_reserved(&self) -> u64;
    /// Bytes reserved now.
    fn reserved(&self) -> u64;
}

impl<T: Replayable> Replayable for &mut T {
    fn at(&mut self, t_ns: u64) {
        (**self).at(t_ns)
    }
    fn alloc(&mut self, size: u64) -> Option<BlockId> {
        (**self).alloc(size)
    }
    fn release(&mut self, id: BlockId) {
        (**self).release(id)
    }
    fn peak_reserved(&self) -> u64 {
        (**self).peak_reserved()
    }
    fn reserved(&self) -> u64 {
        (**self).reserved()
    }
}

/// The segment pool and the VMM core answer a replay the same way.
macro_rules! replayable {
    ($($pool:ty),*) => {$(
        impl Replayable for $pool {
            fn at(&mut self, t_ns: u64) {
                self.backend_mut().now = t_ns;
            }
            fn alloc(&mut self, size: u64) -> Option<BlockId> {
                self.allocate(size).ok().map(|b| b.id)
            }
            fn release(&mut self, id: BlockId) {
                self.free(id)
            }
            fn peak_reserved(&self) -> u64 {
                self.stats().reserved_bytes.peak
            }
            fn reserved(&self) -> u64 {
                self.stats().reserved_bytes.current
            }
        }
    )*};
}
replayable!(Pool<SimulatedDevice>, VmmPool<SimulatedPages>);

#[derive(Debug)]
struct Outcome {
    peak_live: u64,
    peak_reserved: u64,
    ns_per_op: f64,
    /// How far behind the trace its GPU ran (ns; 0: it kept up).
    gpu_behind_ns: u64,
    /// The operation after which the reserved bytes first reached their peak.
    peak_at: usize,
}

impl Outcome {
    /// Peak reserved / peak live; 1 when nothing was live.
    fn ratio(&self) -> f64 {
        over_live(self.peak_reserved, self.peak_live)
    }

    /// A floor on peak reserved / peak live for any allocator taking device
    /// memory in whole pages (the VMM pool's smallest, CUDA's usual 2 MiB
    /// granularity): the peak live bytes need that many pages at one
    /// instant, however they are packed. Often not reachable (blocks handed
    /// out do not move), but a policy above it by little has little to win.
    fn page_bound(&self) -> f64 {
        let config = VmmConfig::shim_default();
        let page = config.small_page.min(config.large_page);
        over_live(self.peak_live.next_multiple_of(page), self.peak_live)
    }
}

fn over_live(bytes: u64, live: u64) -> f64 {
    if live == 0 {
        1.0
    } else {
        bytes as f64 / live as f64
    }
}

/// `ops` through `policy`; cupool's pools with their GPU `lag_ns` behind
/// the trace when that is not 0 ([`through`]). PyTorch's models take the
/// lag as nothing: their blocks come back in stream order (one stream), and
/// they never move pages.
fn replay(ops: &[Timed], policy: Policy, lag_ns: u64) -> Outcome {
    match policy {
        Policy::Segments => through(ops, Pool::new(SimulatedDevice::new(), PoolConfig::shim_default()), lag_ns),
        Policy::Vmm => through(ops, shim_vmm(), lag_ns),
        Policy::PytorchCaching => replay_on(ops, Pool::new(SimulatedDevice::new(), PoolConfig::default())),
        Policy::PytorchExpandable => {
            replay_on(ops, VmmPool::new(SimulatedPages::new(), VmmConfig::pytorch_expandable()))
        }
    }
}

/// cupool's VMM pool as the shim runs it, on a simulated device.
fn shim_vmm() -> VmmPool<SimulatedPages> {
    VmmPool::new(SimulatedPages::new(), VmmConfig::shim_default())
}

/// `ops` through one of cupool's pools, its GPU `lag_ns` behind the trace
/// ([`Behind`]; 0: keeping up).
fn through<P: behind::OnTimeline>(ops: &[Timed], pool: P, lag_ns: u64) -> Outcome {
    if lag_ns == 0 {
        replay_on(ops, pool)
    } else {
        Outcome { gpu_behind_ns: lag_ns, ..replay_on(ops, Behind::with(pool, lag_ns)) }
    }
}

fn replay_on(ops: &[Timed], mut pool: impl Replayable) -> Outcome {
    let mut live: HashMap<u64, (BlockId, u64)> = HashMap::with_capacity(ops.len() / 2);
    let (mut live_bytes, mut peak_live) = (0u64, 0u64);
    let (mut reserved, mut peak_at) = (0, 0);
    let start = Instant::now();
    for (i, (t_ns, op)) in ops.iter().enumerate() {
        pool.at(*t_ns);
        match *op {
            Op::Alloc(key, size) => {
                if let Some(id) = pool.alloc(size) {
                    if let Some((old, old_size)) = live.insert(key, (id, size)) {
                        pool.release(old); // a free the trace lost (cut short): keep the books straight
                        live_bytes -= old_size;
                    }
                    live_bytes += size;
                    peak_live = peak_live.max(live_bytes);
                }
            }
            Op::Free(key) => {
                if let Some((id, size)) = live.remove(&key) {
                    pool.release(id);
                    live_bytes -= size;
                }
            }
        }
        if pool.reserved() > reserved {
            (reserved, peak_at) = (pool.reserved(), i);
        }
    }
    let elapsed = start.elapsed();
    Outcome {
        peak_live,
        peak_reserved: pool.peak_reserved(),
        ns_per_op: elapsed.as_nanos() as f64 / ops.len().max(1) as f64,
        gpu_behind_ns: 0,
        peak_at,
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
    let files = crate::summary::files_in(Path::new(&dir), |_| true).unwrap_or_default();
    files.into_iter().map(Trace::File).collect()
}

/// Trace files named by `path`: the file itself, or the traces in a directory
/// (`*.json`, `*.csv`, either also `.gz`; not the framework histories that
/// `cupool check` writes beside a log, which hold no device memory calls).
fn traces_named_by(path: &Path) -> Result<Vec<PathBuf>, String> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]); // reading it says what is wrong with it
    }
    let files = crate::summary::files_in(path, |name| {
        let name = name.strip_suffix(".gz").unwrap_or(name);
        (name.ends_with(".json") || name.ends_with(".csv")) && !crate::check::is_history_name(name)
    })
    .map_err(|e| format!("{}: cannot list the directory: {e}", path.display()))?;
    if files.is_empty() {
        return Err(format!("{}: no traces in this directory (*.json, *.csv, also gzipped)", path.display()));
    }
    Ok(files)
}

/// Replays every trace through each of `policies` (all of them when none are
/// named), in their order, cupool's with the GPU `gpu_behind_ms` behind:
/// a table, or with `json` one JSON object per line and per trace and policy.
pub fn run(paths: Vec<PathBuf>, json: bool, policies: &[Policy], gpu_behind_ms: u64, pages_at_peak: bool) -> ExitCode {
    let lag_ns = gpu_behind_ms.saturating_mul(1_000_000);
    let policies = if policies.is_empty() { &Policy::ALL[..] } else { policies };
    let bad_input = ExitCode::from(crate::summary::EXIT_BAD_INPUT);
    if pages_at_peak && !policies.contains(&Policy::Vmm) {
        eprintln!("cupool replay: --pages-at-peak shows the cupool-vmm pool's pages: name that policy too, or none");
        return bad_input;
    }
    let mut failed = false;
    let paths = if paths.is_empty() {
        bundled()
    } else {
        let mut files = Vec::new();
        for p in &paths {
            match traces_named_by(p) {
                Ok(f) => files.extend(f.into_iter().map(Trace::File)),
                Err(e) => {
                    eprintln!("cupool replay: {e}");
                    failed = true;
                }
            }
        }
        files
    };
    if paths.is_empty() {
        if !failed {
            eprintln!("cupool replay: no traces given and none bundled");
        }
        return bad_input;
    }
    let mut header = false;
    // A reader that stops early (`| head`) ends the replay quietly.
    let mut out = std::io::stdout().lock();
    macro_rules! line {
        ($($arg:tt)*) => {
            if writeln!(out, $($arg)*).is_err() {
                return if failed { bad_input } else { ExitCode::SUCCESS };
            }
        };
    }
    for p in &paths {
        let name = p.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let ops = match load(p) {
            Ok(ops) => ops,
            Err(e) => {
                eprintln!("cupool replay: {e}");
                failed = true;
                continue;
            }
        };
        // A lag is measured in the trace's clock: without one, the GPU would
        // never catch up, and the trace is replayed with it keeping up.
        let lag_ns = if lag_ns > 0 && ops.windows(2).all(|w| w[0].0 == w[1].0) {
            eprintln!("cupool replay: {name}: the trace has no times; replayed with the GPU keeping up");
            0
        } else {
            lag_ns
        };
        if !json && !std::mem::replace(&mut header, true) {
            if gpu_behind_ms > 0 {
                line!("cupool's pools with the GPU {gpu_behind_ms} ms behind each trace's calls (PyTorch's models as without)");
            }
            line!(
                "{:<28} {:<18} {:>8} {:>11} {:>13} {:>7} {:>10} {:>7}",
                "trace",
                "policy",
                "ops",
                "peak live",
                "peak reserved",
                "ratio",
                "page bound",
                "ns/op"
            );
        }
        let mut vmm_peak_at = None;
        for &policy in policies {
            let o = replay(&ops, policy, lag_ns);
            if pages_at_peak && policy == Policy::Vmm {
                vmm_peak_at = Some(o.peak_at);
            }
            if json {
                let row = serde_json::json!({
                    "trace": name,
                    "policy": policy.name(),
                    "gpu_behind_ms": o.gpu_behind_ns / 1_000_000,
                    "ops": ops.len(),
                    "peak_live": o.peak_live,
                    "peak_reserved": o.peak_reserved,
                    "ratio": o.ratio(),
                    "page_bound": o.page_bound(),
                    "ns_per_op": o.ns_per_op,
                });
                line!("{row}");
            } else {
                line!(
                    "{:<28} {:<18} {:>8} {:>11} {:>13} {:>7.3} {:>10.3} {:>7.1}",
                    name,
                    policy.name(),
                    ops.len(),
                    crate::units::human_bytes(o.peak_live),
                    crate::units::human_bytes(o.peak_reserved),
                    o.ratio(),
                    o.page_bound(),
                    o.ns_per_op
                );
            }
        }
        if let Some(at) = vmm_peak_at {
            line!("{name}: cupool-vmm's pages that blocks do not fill, at its peak");
            for l in pages::at_peak(&ops, at, lag_ns) {
                line!("{l}");
            }
        }
    }
    if failed {
        bad_input
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use behind::{Behind, OnTimeline};

    /// cupool's two pools go through the lagging GPU; PyTorch's models do not.
    #[test]
    fn a_lag_reaches_cupools_pools_only() {
        let ops: Vec<Timed> = vec![(0, Op::Alloc(1, 4096)), (1_000_000, Op::Free(1)), (2_000_000, Op::Alloc(2, 4096))];
        for policy in Policy::ALL {
            let lagged = matches!(policy, Policy::Segments | Policy::Vmm);
            let o = replay(&ops, policy, 5_000_000);
            assert_eq!(o.gpu_behind_ns, if lagged { 5_000_000 } else { 0 }, "{}", policy.name());
            assert_eq!(replay(&ops, policy, 0).gpu_behind_ns, 0);
        }
    }

    #[test]
    fn rmm_times_read_as_nanoseconds_of_the_day() {
        assert_eq!(rmm_time_ns("00:00:01.5"), Some(1_500_000_000));
        assert_eq!(rmm_time_ns("10:15:30.000123"), Some((10 * 3600 + 15 * 60 + 30) * 1_000_000_000 + 123_000));
        assert_eq!(rmm_time_ns("12:00:00"), Some(12 * 3600 * 1_000_000_000));
        assert_eq!(rmm_time_ns("1700000000.5"), None);
        assert_eq!(rmm_time_ns("aa:bb:cc"), None);
    }

    #[test]
    fn the_allocators_clock_follows_the_trace() {
        // A 64 MiB buffer freed and allocated again 10 ms later: cupool's pool
        // keeps that size cached (it cycles) and reserves 64 MiB at most;
        // 2 s later it would have gone back and come again, still 64 MiB.
        let cycle = |gap_ns: u64| {
            let ops: Vec<Timed> = vec![
                (0, Op::Alloc(1, 64 << 20)),
                (1, Op::Free(1)),
                (1 + gap_ns, Op::Alloc(2, 64 << 20)),
                (2 + gap_ns, Op::Free(2)),
                (3 + gap_ns, Op::Alloc(3, 64 << 20)),
            ];
            let mut pool = Pool::new(SimulatedDevice::new(), PoolConfig::shim_default());
            replay_on(&ops, &mut pool);
            pool.backend().segment_requests()
        };
        assert_eq!(cycle(10_000_000), 2, "regrown within a second: kept from then on");
        assert_eq!(cycle(2_000_000_000), 3, "regrown after two seconds: given back each time");
    }

    impl Behind<VmmPool<SimulatedPages>> {
        /// The shim's VMM pool on a device of `capacity` bytes.
        fn new(lag_ns: u64, capacity: u64) -> Self {
            let pages = SimulatedPages::new().with_capacity(Some(capacity));
            Behind::with(VmmPool::new(pages, VmmConfig::shim_default()), lag_ns)
        }
    }

    /// A program far ahead of its GPU, with several streams: a freed block
    /// stays pending, so without ordering the next step's blocks go
    /// elsewhere, holes stop matching the sizes that come, and the pool
    /// grows (VMM: pages made beside idle ones that may not move yet). Ordered
    /// before placements (at most every 100 µs), the transformer trace with
    /// the GPU 200 ms behind peaks within 2 % of its live peak on VMM pages
    /// (1.129× without) and within 3 % on segments (1.141× without), and no
    /// trace peaks higher than without.
    #[test]
    fn pending_frees_ordered_before_placing_keep_a_lagging_gpus_peak_near_the_live_one() {
        fn peaks<P: OnTimeline>(ops: &[Timed], make: impl Fn() -> P) -> (Outcome, Outcome) {
            let run = |order: bool| {
                let mut behind = Behind::with(make(), 200_000_000);
                if !order {
                    behind.pool.gpu().order_every_ns = None;
                }
                replay_on(ops, &mut behind)
            };
            (run(true), run(false))
        }
        let mut transformers = 0;
        for trace in bundled() {
            let ops = load(&trace).unwrap();
            let name = trace.path().display().to_string();
            // Cooling pages moved at the peak would hide what ordering does.
            let no_alias = VmmConfig { alias_cooling: false, ..VmmConfig::shim_default() };
            let vmm = peaks(&ops, || VmmPool::new(SimulatedPages::new(), no_alias));
            let segments = peaks(&ops, || Pool::new(SimulatedDevice::new(), PoolConfig::shim_default()));
            for (backing, (ordered, unordered), within, without) in
                [("vmm", &vmm, 1.02, 1.05), ("segments", &segments, 1.03, 1.1)]
            {
                let msg = format!("{name} on {backing}: {ordered:?} against {unordered:?}");
                assert!(ordered.peak_reserved <= unordered.peak_reserved, "{msg}");
                if name.contains("torch-transformer") {
                    assert!(ordered.ratio() <= within, "{msg}");
                    assert!(unordered.ratio() > without, "{msg}: the replay no longer shows the problem");
                }
            }
            transformers += usize::from(name.contains("torch-transformer"));
        }
        assert_eq!(transformers, 1);
    }

    /// With the GPU behind, the pages idle when a step peaks are cooling:
    /// made anew there, they stayed held for the rest of the run (gpt2 peaked
    /// at 1.112x its live bytes, serving at 1.031x, jax at 1.038x). Cooling
    /// pages moved where they are needed instead keep every trace within 2 %
    /// (or two pages) of what it reserves with the GPU keeping up. It was
    /// 1.5 % or one page until placement weighed the pages a block puts into
    /// use: keeping up, that took ResNet's trace from 1.015 to 1.008 of its
    /// live peak and the CuPy script's from 1.109 to 1.069, while behind
    /// they peak at 1.017 and two pages over that (below what they reserved
    /// keeping up before). It
    /// was 1 % until blocks started past ghosts instead of waiting for the
    /// GPU (`VmmPool::past_ghosts_in_largest`): serving 1.0078 → 1.0106, the
    /// transformer's 12 ghost waits 3-5.
    #[test]
    fn with_the_gpu_behind_every_trace_peaks_within_two_percent_or_two_pages_of_its_peak_keeping_up() {
        let page = 2 << 20;
        for trace in bundled() {
            let ops = load(&trace).unwrap();
            let mut behind = Behind::new(200_000_000, u64::MAX);
            let o = replay_on(&ops, &mut behind);
            let base = held_to(&ops);
            let two_pages = o.peak_reserved <= base.next_multiple_of(page) + 2 * page;
            let ratio = o.peak_reserved as f64 / base as f64;
            assert!(ratio <= 1.02 || two_pages, "{}: {o:?}", trace.path().display());
            assert_eq!(behind.failed, 0);
        }
    }

    /// What a trace's peak with the GPU behind is held against: what the
    /// same trace reserves with the GPU keeping up, so that the lag's own
    /// cost is judged (how close that comes to the live bytes is
    /// `tests/replay.rs`'s question).
    fn held_to(ops: &[Timed]) -> u64 {
        replay(ops, Policy::Vmm, 0).peak_reserved
    }

    /// A block whose every candidate hole lies over a ghost waited for the
    /// GPU, about 20 ms on a real one; with no cap it now starts past the
    /// ghosts where that lacks no more pages. The transformer trace, the GPU
    /// 30 and 200 ms behind, waited 12 times each before; 3 and 5 since.
    #[test]
    fn the_transformer_seldom_waits_for_a_ghost_with_the_gpu_behind() {
        let trace = bundled().into_iter().find(|t| t.path().to_string_lossy().contains("torch-transformer"));
        let ops = load(&trace.expect("the transformer trace is bundled")).unwrap();
        for lag_ns in [30_000_000, 200_000_000] {
            let mut behind = Behind::new(lag_ns, u64::MAX);
            replay_on(&ops, &mut behind);
            let waits = behind.pool.stats().num_ghost_waits;
            assert!(waits <= 5, "{waits} ghost waits with the GPU {} ms behind", lag_ns / 1_000_000);
            assert_eq!(behind.failed, 0);
        }
    }

    /// A program that never synchronizes runs far ahead of its GPU: pages it
    /// frees stay busy on the GPU for whole steps. Capped at 2 % over what
    /// it holds (or two partial pages), every bundled trace still runs to
    /// the end with the GPU a second behind: cooling pages are mapped where
    /// they are needed while their old mappings wait (ghosts). Without them
    /// `serving` fails three allocations here (at 3 % and 200 ms behind,
    /// which this test asked before, it does not: the shim orders pending
    /// frees behind a barrier early enough that ghosts were not needed).
    #[test]
    fn with_the_gpu_a_second_behind_every_trace_fits_two_percent_over_its_peak() {
        for trace in bundled() {
            let ops = load(&trace).unwrap();
            let kept_up = held_to(&ops);
            let cap = (kept_up + kept_up * 2 / 100).max(kept_up + (4 << 20)).next_multiple_of(2 << 20);
            let mut behind = Behind::new(1_000_000_000, cap);
            let peak = replay_on(&ops, &mut behind).peak_reserved;
            let (name, failed) = (trace.path().display(), behind.failed);
            assert_eq!(failed, 0, "{name}: {failed} allocations failed under a cap of {cap} for {kept_up} kept up");
            assert!(peak <= cap, "{name}");
        }
    }
}
