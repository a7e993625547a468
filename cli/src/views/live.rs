//! What is live when: the aggregators behind the pictures of the HTML page,
//! fed by one walk over a process's model (`Process::replay_pool`, which
//! also lays out the pool's segments as the memory_viz export does).
//!
//! Per device:
//! - the bytes live by allocation site at the peak of allocated bytes (the
//!   first instant it is reached) and at the end of the timeline, for the
//!   flame graph: their sum is the allocated figure at that instant;
//! - the largest sites' live bytes over time, as stacked bands: the run is
//!   cut into equal stretches and each keeps the instant where allocated is
//!   highest in it, with every band's bytes then and the rest as `other`,
//!   so the bands add up to allocated at each point and their top reaches
//!   the peak;
//! - the pool at the peak of reserved bytes (the last instant at or before
//!   it): its segments with their blocks, allocated or free, and every
//!   allocation CUDA served directly as a segment of its own.

use cupool_core::model::rebuild::{PoolReplay, Step};
use cupool_core::model::{AllocId, DeviceSeries, Moment, PoolWatch, Process, What};
use cupool_core::pool::BlockState;
use std::collections::{BTreeMap, HashMap};

/// Bytes and allocations live from each site at one instant, most bytes first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub t_ns: u64,
    /// Their sum: the device's allocated bytes then.
    pub bytes: u64,
    /// (site, bytes, allocations); `None`: allocations without a recorded site.
    pub sites: Vec<(Option<u32>, u64, u64)>,
}

/// The largest sites' live bytes over time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bands {
    pub sites: Vec<u32>,
    /// The instants kept, in order.
    pub t: Vec<u64>,
    /// Per site (as `sites`), its live bytes at each instant.
    pub values: Vec<Vec<u64>>,
    /// Allocated bytes at each instant less the sites' (smaller sites, none recorded).
    pub other: Vec<u64>,
}

/// How a stretch of a segment is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    Free,
    Allocated,
    /// Freed, waiting for the GPU before it can be reused.
    Pending,
}

/// One segment of the pool (or one allocation CUDA served directly).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub size: u64,
    /// A segment of the pool's; else an allocation CUDA served (all allocated).
    pub pooled: bool,
    pub small: bool,
    /// Its bytes in address order, as runs of one use.
    pub runs: Vec<(u64, Use)>,
}

/// The pool of a device at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolAt {
    pub t_ns: u64,
    /// The model's figures then.
    pub allocated: u64,
    pub reserved: u64,
    /// The pool's segments were laid out (rebuilt by a replay); false when a
    /// VMM-backed pool served allocations: its pages are not laid out, and
    /// the first segment stands for all of them.
    pub laid_out: bool,
    /// Bytes the pool served that are not laid out.
    pub pooled_not_laid_out: u64,
    pub segments: Vec<Segment>,
    /// Segments left out past the most a page shows: how many, their bytes,
    /// and how many of those were allocated.
    pub left_out: (u64, u64, u64),
}

/// Everything drawn for one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DevicePictures {
    pub device: i32,
    pub at_peak: Held,
    pub at_end: Held,
    pub bands: Bands,
    pub pool: Option<PoolAt>,
}

/// One device's state during the walk.
struct Dev {
    device: i32,
    allocated: u64,
    by_site: HashMap<Option<u32>, (u64, u64)>,
    peak_bytes: u64,
    at_peak: Option<Held>,
    bands: Bands,
    /// The stretch being looked at, the most allocated in it so far and the bands then.
    bucket: Option<u64>,
    best: Option<(u64, u64, Vec<u64>)>,
    reserved_peak_t: u64,
    pool: Option<PoolAt>,
    touched: bool,
}

impl Dev {
    fn snapshot(&self, t_ns: u64) -> Held {
        let mut sites: Vec<(Option<u32>, u64, u64)> =
            self.by_site.iter().filter(|(_, v)| v.0 > 0 || v.1 > 0).map(|(&k, &(b, n))| (k, b, n)).collect();
        sites.sort_by_key(|&(k, b, _)| (std::cmp::Reverse(b), k));
        Held { t_ns, bytes: self.allocated, sites }
    }

    fn band_values(&self) -> Vec<u64> {
        self.bands.sites.iter().map(|s| self.by_site.get(&Some(*s)).map_or(0, |v| v.0)).collect()
    }

    fn flush_bucket(&mut self) {
        if let Some((t, allocated, values)) = self.best.take() {
            let sum: u64 = values.iter().sum();
            self.bands.t.push(t);
            self.bands.other.push(allocated.saturating_sub(sum));
            for (k, v) in values.into_iter().enumerate() {
                self.bands.values[k].push(v);
            }
        }
    }
}

struct Walk<'a> {
    p: &'a Process,
    devs: Vec<Dev>,
    index: HashMap<i32, usize>,
    buckets: u64,
    max_segments: usize,
}

impl Walk<'_> {
    fn dev(&mut self, id: AllocId) -> Option<&mut Dev> {
        let a = &self.p.allocations[id];
        if a.is_host() {
            return None;
        }
        let i = *self.index.get(&a.device)?;
        Some(&mut self.devs[i])
    }

    fn pool_at(&self, d: &Dev, change: usize, replay: Option<&PoolReplay>) -> PoolAt {
        let p = self.p;
        let t_ns = p.changes[change].t_ns;
        let series = p.device(d.device);
        let now = series.map(|s| at(s, t_ns)).unwrap_or_default();
        let mut out = PoolAt { t_ns, allocated: now.0, reserved: now.1, laid_out: true, ..Default::default() };
        let mut segments = Vec::new();
        if let Some(r) = replay {
            for s in r.snapshot(d.device) {
                let mut runs: Vec<(u64, Use)> = Vec::new();
                for b in &s.blocks {
                    let u = match b.state {
                        BlockState::Allocated => Use::Allocated,
                        BlockState::PendingFree => Use::Pending,
                        BlockState::Free => Use::Free,
                    };
                    match runs.last_mut() {
                        Some(last) if last.1 == u => last.0 += b.size,
                        _ => runs.push((b.size, u)),
                    }
                }
                segments.push(Segment { size: s.size, pooled: true, small: s.small, runs });
            }
        }
        let mut direct: Vec<u64> = Vec::new();
        for a in p.allocations.iter().filter(|a| a.device == d.device && !a.is_host() && a.live_after(change)) {
            if !a.pooled {
                direct.push(a.size);
            } else if replay.is_none() {
                out.laid_out = false;
                out.pooled_not_laid_out += a.size;
            }
        }
        direct.sort_unstable_by(|a, b| b.cmp(a));
        if !out.laid_out {
            // A VMM-backed pool: its pages, as one stretch (what it holds beyond CUDA's own allocations).
            let size = out.reserved.saturating_sub(direct.iter().sum());
            let used = out.pooled_not_laid_out.min(size);
            let runs = [(used, Use::Allocated), (size - used, Use::Free)].into_iter().filter(|r| r.0 > 0).collect();
            segments.push(Segment { size, pooled: true, small: false, runs });
        }
        segments.extend(direct.into_iter().map(|size| Segment {
            size,
            pooled: false,
            small: false,
            runs: vec![(size, Use::Allocated)],
        }));
        if segments.len() > self.max_segments {
            // The smallest go: they hold the least of what the picture is about.
            let mut order: Vec<usize> = (0..segments.len()).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(segments[i].size));
            let dropped: Vec<usize> = order[self.max_segments..].to_vec();
            let used = |s: &Segment| s.runs.iter().filter(|r| r.1 == Use::Allocated).map(|r| r.0).sum::<u64>();
            out.left_out = (
                dropped.len() as u64,
                dropped.iter().map(|&i| segments[i].size).sum(),
                dropped.iter().map(|&i| used(&segments[i])).sum(),
            );
            let mut keep = vec![true; segments.len()];
            for i in dropped {
                keep[i] = false;
            }
            let mut k = keep.iter();
            segments.retain(|_| *k.next().expect("one flag a segment"));
        }
        out.segments = segments;
        out
    }
}

/// Allocated and reserved bytes of a device at `t` (the last sample at or before it).
fn at(s: &DeviceSeries, t: u64) -> (u64, u64) {
    let i = s.samples.partition_point(|x| x.t_ns <= t);
    if i == 0 {
        (0, 0)
    } else {
        (s.samples[i - 1].allocated, s.samples[i - 1].reserved)
    }
}

impl PoolWatch for Walk<'_> {
    fn allocated(&mut self, id: AllocId, _step: Option<&Step>) {
        let (size, stack) = (self.p.allocations[id].size, self.p.allocations[id].stack);
        if let Some(d) = self.dev(id) {
            d.allocated += size;
            let s = d.by_site.entry(stack).or_default();
            s.0 += size;
            s.1 += 1;
            d.touched = true;
        }
    }

    fn ended(&mut self, id: AllocId, _step: Option<&Step>) {
        let (size, stack) = (self.p.allocations[id].size, self.p.allocations[id].stack);
        if let Some(d) = self.dev(id) {
            d.allocated = d.allocated.saturating_sub(size);
            if let Some(s) = d.by_site.get_mut(&stack) {
                s.0 = s.0.saturating_sub(size);
                s.1 = s.1.saturating_sub(1);
            }
            d.touched = true;
        }
    }

    fn after(&mut self, moment: Moment, replay: Option<&PoolReplay>) {
        let Moment::Change(i) = moment else { return };
        let p = self.p;
        let t = p.changes[i].t_ns;
        let next_t = p.changes.get(i + 1).map(|c| c.t_ns);
        let duration = p.duration_ns.max(1);
        for k in 0..self.devs.len() {
            if self.devs[k].pool.is_none()
                && t <= self.devs[k].reserved_peak_t
                && next_t.is_none_or(|n| n > self.devs[k].reserved_peak_t)
            {
                let pool = self.pool_at(&self.devs[k], i, replay);
                self.devs[k].pool = Some(pool);
            }
            let d = &mut self.devs[k];
            if !d.touched {
                continue;
            }
            d.touched = false;
            if d.at_peak.is_none() && d.allocated == d.peak_bytes {
                d.at_peak = Some(d.snapshot(t));
            }
            let bucket = (t as u128 * self.buckets as u128 / duration as u128).min(self.buckets as u128 - 1) as u64;
            if d.bucket != Some(bucket) {
                d.flush_bucket();
                d.bucket = Some(bucket);
            }
            if d.best.as_ref().is_none_or(|b| d.allocated > b.1) {
                d.best = Some((t, d.allocated, d.band_values()));
            }
        }
    }
}

/// The pictures of every device of `p`: `bands` sites as bands over about
/// `buckets` instants, at most `max_segments` segments in the pool's picture.
pub fn pictures(p: &Process, bands: usize, buckets: u64, max_segments: usize) -> Vec<DevicePictures> {
    // The band sites: the largest peaks on each device.
    let mut live: HashMap<(i32, u32), u64> = HashMap::new();
    let mut peak: HashMap<(i32, u32), u64> = HashMap::new();
    for m in p.moments() {
        let (id, grows) = match m {
            Moment::Change(i) => match p.changes[i].what {
                What::Alloc(id) => (id, true),
                _ => continue,
            },
            Moment::Ended(id) => (id, false),
        };
        let a = &p.allocations[id];
        let (Some(stack), false) = (a.stack, a.is_host()) else { continue };
        let v = live.entry((a.device, stack)).or_default();
        if grows {
            *v += a.size;
            let top = peak.entry((a.device, stack)).or_default();
            *top = (*top).max(*v);
        } else {
            *v = v.saturating_sub(a.size);
        }
    }
    let mut ranked: Vec<((i32, u32), u64)> = peak.into_iter().collect();
    ranked.sort_by_key(|&((d, s), b)| (d, std::cmp::Reverse(b), s));
    let mut band_sites: BTreeMap<i32, Vec<u32>> = BTreeMap::new();
    for ((d, s), _) in ranked {
        let list = band_sites.entry(d).or_default();
        if list.len() < bands {
            list.push(s);
        }
    }
    let devs: Vec<Dev> = p
        .devices
        .iter()
        .map(|s| {
            let sites = band_sites.remove(&s.device).unwrap_or_default();
            Dev {
                device: s.device,
                allocated: 0,
                by_site: HashMap::new(),
                peak_bytes: s.peak_allocated.bytes,
                at_peak: None,
                bands: Bands { values: vec![Vec::new(); sites.len()], sites, ..Default::default() },
                bucket: None,
                best: None,
                reserved_peak_t: s.peak_reserved.t_ns,
                pool: None,
                touched: false,
            }
        })
        .collect();
    let index = devs.iter().enumerate().map(|(i, d)| (d.device, i)).collect();
    let mut walk = Walk { p, devs, index, buckets: buckets.max(1), max_segments };
    p.replay_pool(&mut walk);
    walk.devs
        .into_iter()
        .map(|mut d| {
            d.flush_bucket();
            let end_t = p.duration_ns;
            let at_end = d.snapshot(end_t);
            let at_peak = d.at_peak.take().unwrap_or_else(|| Held { t_ns: 0, ..Default::default() });
            DevicePictures { device: d.device, at_peak, at_end, bands: d.bands, pool: d.pool }
        })
        .collect()
}
