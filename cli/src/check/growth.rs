//! Growth leaks: allocation sites whose live bytes keep growing across the
//! repeated phases of a run, the leak a long job dies of while every single
//! iteration looks fine.
//!
//! Phases: when the program names phases (NVTX ranges, `cupool_mark`,
//! `cupool_phase_begin`), those whose names repeat (digits ignored: `epoch 1`,
//! `epoch 2`, ... are one phase) at least `growth_phases` times; a site's
//! sample is the least it held during each. Without such phases the loop
//! is found from its allocations (see [`clock`]): each allocation of the
//! loop's clock site starts a period, and a site's sample is the least it held
//! during the period (its floor, which what an iteration allocates and frees
//! again does not move).
//!
//! A series grows (see [`grows`]) when, after a warm-up, it rises in both
//! halves of the run, at a rate that does not die out, and hardly ever falls:
//! a cache that fills during warm-up and then stays flat, or memory that
//! goes up and down with the data, does not.

use super::finding::Growth;
use cupool_core::model::{repeated, AllocId, Allocation, Process, What};
use std::collections::HashMap;

/// What growth is measured per: a recorded allocation site, or, where the
/// log has none, allocations of one API, kind and size.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SiteKey {
    Stack(u32),
    Bare { api: String, kind: String, size: u64 },
}

impl SiteKey {
    fn of(a: &Allocation) -> SiteKey {
        match a.stack {
            Some(id) => SiteKey::Stack(id),
            None => SiteKey::Bare { api: a.api.as_str().to_string(), kind: a.kind.as_str().to_string(), size: a.size },
        }
    }
}

/// A site that grew.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grown {
    pub key: SiteKey,
    /// API and kind of its allocations, for a site without frames.
    pub api: String,
    pub kind: String,
    pub growth: Growth,
    /// Bytes and allocations live from the site at the last sample, and
    /// which allocations they are.
    pub bytes: u64,
    pub count: u64,
    pub held: Vec<AllocId>,
    /// Its bytes grew but not the number of its allocations: the same few
    /// buffers, each replaced by a larger one (a generation's cache grown by
    /// a token a step), not a leak of one more allocation a phase.
    pub replaced: bool,
}

/// Why growth could not be judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotChecked {
    /// Logged with `trace=0`: no allocation and free in the timeline.
    TraceOff,
    /// The log lost this many events: missing frees would look like growth.
    LostEvents(u64),
    /// A busy process with neither repeated phases nor a repeating allocation.
    NoRepetition,
    /// A framework's record with no object in it.
    NoObjects(&'static str),
}

impl std::fmt::Display for NotChecked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotChecked::TraceOff => {
                f.write_str("logged with trace=0, so growth was not checked (it needs every allocation and free)")
            }
            NotChecked::LostEvents(n) => write!(
                f,
                "the log lost {n} event(s) (the writer fell behind), so growth was not checked: missing frees would \
                 look like growth"
            ),
            NotChecked::NoRepetition => f.write_str(
                "no repeated phases and no allocation repeating regularly through the run: growth was not checked \
                 (name the loop's iterations with cupool_mark or NVTX ranges)",
            ),
            NotChecked::NoObjects(kind) => write!(f, "it recorded no {kind}"),
        }
    }
}

/// Samples kept per series: a longer run is sampled every n-th phase.
const MAX_SAMPLES: usize = 256;

/// The growing sites of `log`, or why growth could not be checked (`Err`:
/// one sentence). `skip_phase` names phases that are not repetitions of the
/// program's work (the pytest plugin's per-test phases).
#[cfg(test)]
pub fn analyse(
    log: &cupool_core::log::Log,
    min_phases: usize,
    skip_phase: &dyn Fn(&str) -> bool,
) -> Result<Vec<Grown>, NotChecked> {
    analyse_leaving_out(&Process::new(log.clone()), min_phases, skip_phase, &|_| false, 0)
}

/// The growing sites of process `p` without the allocations `left_out`
/// names: memory whose growth is judged elsewhere, such as the segments of
/// PyTorch's cache when its tensors were recorded. `allocating_until`: the
/// time (in the log's clock) of the last allocation the process made that
/// another record holds (a framework's objects; 0 if none), for finding
/// the loop (see [`clock`]).
pub fn analyse_leaving_out(
    p: &Process,
    min_phases: usize,
    skip_phase: &dyn Fn(&str) -> bool,
    left_out: &dyn Fn(&Allocation) -> bool,
    allocating_until: u64,
) -> Result<Vec<Grown>, NotChecked> {
    if !p.log.header.options.trace {
        return Err(NotChecked::TraceOff);
    }
    if let Some(n) = p.log.end.as_ref().map(|e| e.dropped_events).filter(|&n| n > 0) {
        return Err(NotChecked::LostEvents(n));
    }
    analyse_process(p, min_phases, skip_phase, left_out, allocating_until)
}

/// The growing sites of a timeline of allocations, frees and phases (a
/// log's, or one made from another record of the same process's memory,
/// such as PyTorch's allocation history), `allocating_until` as
/// [`analyse_leaving_out`] takes it.
pub fn analyse_process(
    p: &Process,
    min_phases: usize,
    skip_phase: &dyn Fn(&str) -> bool,
    left_out: &dyn Fn(&Allocation) -> bool,
    allocating_until: u64,
) -> Result<Vec<Grown>, NotChecked> {
    let replay = Replay::new(p, left_out);
    let mut found: Vec<Grown> = Vec::new();
    let (groups, skipped) = repeated(&p.spans, min_phases, skip_phase);
    if groups.is_empty() && skipped {
        // A test session: one test is not a repetition of the one before,
        // and what each leaves behind is the per-test check's.
        return Ok(found);
    }
    if groups.is_empty() {
        let min_count = (min_phases + 1).max(8);
        let Some(clock) = clock(&replay, min_count, allocating_until) else {
            if replay.allocs.len() >= 4 * min_phases {
                return Err(NotChecked::NoRepetition);
            }
            return Ok(found);
        };
        let boundaries = every_nth(&replay.starts_of(clock), MAX_SAMPLES + 1);
        let series = replay.floors(&boundaries.items);
        let from = Source { from: "repetition", phase: replay.what(clock), stride: boundaries.stride };
        merge(&mut found, evaluate(&replay, &series, &from));
    } else {
        for group in groups {
            let samples = every_nth(&group.ends, MAX_SAMPLES);
            // The least each site held in each phase, not what it held at
            // the phase's end: a phase that ends more than once per
            // iteration (a collective per gradient bucket) ends at different
            // points of the iteration, and what lives only part of it must
            // not show as rises and falls.
            let mut boundaries = Vec::with_capacity(samples.items.len() + 1);
            boundaries.push(0);
            boundaries.extend(samples.items.iter().map(|&i| i + 1));
            let series = replay.floors(&boundaries);
            let from = Source { from: group.family.source(), phase: group.name, stride: samples.stride };
            merge(&mut found, evaluate(&replay, &series, &from));
        }
    }
    found.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.key.cmp(&b.key)));
    Ok(found)
}

/// Keeps one finding per site: the one seen over the most phases.
fn merge(found: &mut Vec<Grown>, new: Vec<Grown>) {
    for g in new {
        match found.iter_mut().find(|f| f.key == g.key) {
            Some(f) if (g.growth.phases, f.growth.sites) > (f.growth.phases, g.growth.sites) => *f = g,
            Some(_) => {}
            None => found.push(g),
        }
    }
}

/// Where the samples of one series came from.
struct Source {
    from: &'static str,
    phase: String,
    /// Each sample stands for this many phases (see [`every_nth`]).
    stride: usize,
}

/// The growing sites in one set of series, and, when the total grows but
/// no site explains most of it (a pool hands its segments to whichever
/// allocation misses the cache), one finding for the spread, shown at the
/// site that gained most.
fn evaluate(replay: &Replay, s: &Series, from: &Source) -> Vec<Grown> {
    let n = s.total.len();
    let growth = |fit: &Fit, sites: u64| Growth {
        bytes_per_phase: fit.per_sample / from.stride as u64,
        phases: (n * from.stride) as u64,
        phases_from: from.from.to_string(),
        phase: from.phase.clone(),
        sites,
    };
    let grown = |k: usize, fit: &Fit, sites: &[usize], counts: &[u64]| {
        let held: Vec<AllocId> = sites.iter().flat_map(|k| s.last_held.get(k).into_iter().flatten().copied()).collect();
        Grown {
            key: replay.keys[k].clone(),
            api: replay.apis[k].0.clone(),
            kind: replay.apis[k].1.clone(),
            growth: growth(fit, sites.len() as u64),
            bytes: held.iter().map(|&id| replay.p.allocations[id].size).sum(),
            count: held.len() as u64,
            held,
            replaced: grows(counts).is_none(),
        }
    };
    let mut out = Vec::new();
    let mut explained = 0u64;
    let mut gains: Vec<(u64, usize)> = Vec::new();
    for (&k, series) in &s.by_site {
        if let Some(fit) = grows(series) {
            explained += fit.gain;
            out.push(grown(k, &fit, &[k], &s.counts_by_site[&k]));
        }
        let warm = warm_up(series.len());
        if let Some(gain) = series.last().zip(series.get(warm)).and_then(|(l, f)| l.checked_sub(*f)).filter(|g| *g > 0)
        {
            gains.push((gain, k));
        }
    }
    if let Some(fit) = grows(&s.total) {
        if explained < fit.gain / 2 {
            gains.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            if let Some(&(_, top)) = gains.first() {
                let sites: Vec<usize> = gains.iter().map(|&(_, k)| k).collect();
                out.retain(|g| g.key != replay.keys[top]);
                let mut g = grown(top, &fit, &sites, &s.total_counts);
                g.growth.sites = sites.len() as u64;
                out.push(g);
            }
        }
    }
    out
}

/// How a growing series grew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    /// Bytes gained from the end of the warm-up to the last sample.
    pub gain: u64,
    /// `gain` over the samples it took.
    pub per_sample: u64,
}

/// Samples left out at the start: the first phase, and a tenth of the rest,
/// where caches fill and optimizers create their state.
fn warm_up(n: usize) -> usize {
    1 + n.saturating_sub(1) / 10
}

/// Whether a series of samples (a site's live bytes per phase) grows like a
/// leak. After the warm-up, at least 3 samples must remain, and:
/// - it ends higher than it starts, and rises in each half;
/// - the second half rises at least a third as fast as the first (a cache
///   filling up slows down; a leak keeps its pace);
/// - what it loses on the way down is at most a tenth of what it gains on
///   the way up (memory that follows the data goes both ways).
pub fn grows(series: &[u64]) -> Option<Fit> {
    let r = &series[warm_up(series.len()).min(series.len())..];
    if r.len() < 3 {
        return None;
    }
    let last = r.len() - 1;
    let mid = last / 2;
    let rise = |a: usize, b: usize| r[b].checked_sub(r[a]).filter(|g| *g > 0);
    let (first, second, gain) = (rise(0, mid)?, rise(mid, last)?, rise(0, last)?);
    // Rates per step of each half, compared without dividing.
    let (steps1, steps2) = (mid as u128, (last - mid) as u128);
    if u128::from(second) * steps1 * 3 < u128::from(first) * steps2 {
        return None;
    }
    let (mut up, mut down) = (0u128, 0u128);
    for w in r.windows(2) {
        if w[1] >= w[0] {
            up += u128::from(w[1] - w[0]);
        } else {
            down += u128::from(w[0] - w[1]);
        }
    }
    if down * 10 > up {
        return None;
    }
    Some(Fit { gain, per_sample: gain / last as u64 })
}

/// Whether `rest` after a repetition that lasted `span` may be a short run's
/// exit work (an interpreter tearing down, a busy machine), which can take
/// up to a second whatever the loop before it did: not when the
/// repetition was over in a hundredth of that time, as a burst of set-up is.
fn short_run_exit(span: u64, rest: u64) -> bool {
    const EXIT_WORK_NS: u64 = 1_000_000_000;
    rest < EXIT_WORK_NS && span.saturating_mul(100) >= rest
}

/// Every `stride`-th item, the last one always kept, with `stride` chosen
/// so that at most `max` remain.
struct Thinned {
    items: Vec<usize>,
    stride: usize,
}

fn every_nth(items: &[usize], max: usize) -> Thinned {
    let stride = items.len().div_ceil(max.max(1)).max(1);
    let mut kept: Vec<usize> = items.iter().copied().rev().step_by(stride).collect();
    kept.reverse();
    Thinned { items: kept, stride }
}

/// The loop's clock: the site whose allocations start the loop's periods.
/// Candidates allocate at least `min_count` times at regular intervals
/// (counted in allocations: at least 80% of the gaps between two of its
/// allocations lie within half and twice their median). Most sites of a
/// loop allocate once per iteration, so the count shared by the most
/// candidates is the number of iterations (a site inside an inner loop
/// allocates a multiple of it); of the sites with that count, the first to
/// allocate is the clock. A candidate's allocations must also span at least
/// half of the time from its first one to the timeline's last event, and
/// of the time over which other sites go on allocating after it:
/// allocations that repeat in a burst and then stop (a library setting up a
/// buffer per channel, a model's weights layer by layer) are set-up, not the
/// loop the program spends its time in (what they keep is an exit leak if it
/// is never freed, judged there). For a candidate whose allocations come in
/// a few bursts ([`bursty`]), other allocations include, up to `allocating_until`,
/// those only another record holds: a short run's cache filled in a few
/// bursts may be all the log sees, where the framework's objects show the
/// loop going on past them. (Not for one allocating at the loop's pace: a
/// short loop that keeps a buffer a step and is followed by a longer pass
/// of the framework's work is still the loop.) Allocations at one instant
/// (those a sampled record first saw together) are one occurrence: things
/// made at once are not made one per step.
fn clock(replay: &Replay, min_count: usize, allocating_until: u64) -> Option<usize> {
    let positions = replay.occurrences();
    let end = replay.p.changes.last().map_or(0, |c| c.t_ns);
    let time_of = |ordinal: usize| replay.p.changes[replay.allocs[ordinal].0].t_ns;
    let last_alloc_by_other = |k: usize| {
        let in_timeline = replay.allocs.iter().rev().find(|a| a.1 != k).map_or(0, |a| replay.p.changes[a.0].t_ns);
        let times = || positions[k].iter().map(|&o| time_of(o)).collect::<Vec<u64>>();
        if allocating_until > in_timeline && bursty(&times(), min_count) {
            allocating_until
        } else {
            in_timeline
        }
    };
    let lasts = |k: usize| {
        let (from, to) = (time_of(positions[k][0]), time_of(*positions[k].last().unwrap_or(&positions[k][0])));
        let span = to.saturating_sub(from);
        if last_alloc_by_other(k).saturating_sub(to) > span {
            return false; // the program went on allocating for longer elsewhere
        }
        let rest = end.saturating_sub(to);
        rest <= span || short_run_exit(span, rest)
    };
    let regular: Vec<usize> = (0..positions.len())
        .filter(|&k| positions[k].len() >= min_count)
        .filter(|&k| lasts(k))
        .filter(|&k| {
            let gaps: Vec<usize> = positions[k].windows(2).map(|w| w[1] - w[0]).collect();
            let median = median(&gaps);
            let near = gaps.iter().filter(|&&g| 2 * g >= median && g <= 2 * median).count();
            near * 5 >= gaps.len() * 4
        })
        .collect();
    let mut by_count: HashMap<usize, Vec<usize>> = HashMap::new();
    for &k in &regular {
        by_count.entry(positions[k].len()).or_default().push(k);
    }
    let (_, sites) = by_count.into_iter().max_by_key(|(count, sites)| (sites.len(), *count))?;
    sites.into_iter().min_by_key(|&k| positions[k][0])
}

/// Whether allocations at `times` (in order) come in fewer bursts than a
/// loop of `min_count` steps has: a burst ends at a pause over four times
/// the median gap (the first gap left out: a first step may be slow). A
/// loop's site allocates every step, several buffers back to back or one;
/// a cache that fills when something happens every so often comes in a
/// few bursts.
fn bursty(times: &[u64], min_count: usize) -> bool {
    let gaps: Vec<u64> = times.windows(2).skip(1).map(|w| w[1].saturating_sub(w[0])).collect();
    if gaps.is_empty() {
        return false;
    }
    let pause = 4 * median(&gaps).max(1);
    let pauses = gaps.iter().filter(|&&g| g > pause).count();
    pauses > 0 && pauses + 1 < min_count
}

/// The median of `values` (the upper one of an even count); not empty.
fn median<T: Ord + Copy>(values: &[T]) -> T {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted[sorted.len() / 2]
}

/// The allocations of one process, by site.
struct Replay<'a> {
    p: &'a Process,
    keys: Vec<SiteKey>,
    /// API and kind of each site's first allocation.
    apis: Vec<(String, String)>,
    /// (change, site) of every allocation judged, in order.
    allocs: Vec<(usize, usize)>,
    /// The site of each allocation judged (by its id).
    site_of: Vec<Option<usize>>,
    /// Every judged allocation's end: (change, allocation), in order.
    ends: Vec<(usize, AllocId)>,
}

/// Per-site samples of one pass: the least bytes, and the least number of
/// allocations, each site held in each period.
#[derive(Default)]
struct Series {
    by_site: HashMap<usize, Vec<u64>>,
    counts_by_site: HashMap<usize, Vec<u64>>,
    total: Vec<u64>,
    total_counts: Vec<u64>,
    /// The allocations live per site at the last sample.
    last_held: HashMap<usize, Vec<AllocId>>,
}

impl Series {
    fn push(&mut self, site: usize, sample: usize, bytes: u64, count: u64) {
        for (series, value) in [(&mut self.by_site, bytes), (&mut self.counts_by_site, count)] {
            let s = series.entry(site).or_default();
            s.resize(sample, 0);
            s.push(value);
        }
    }

    fn finish(&mut self) {
        let n = self.total.len();
        for s in self.by_site.values_mut().chain(self.counts_by_site.values_mut()) {
            s.resize(n, 0);
        }
    }
}

/// What is live: per site (bytes and allocations), and in all.
struct Ledger {
    bytes: Vec<u64>,
    counts: Vec<u64>,
    total: u64,
    total_count: u64,
}

/// The least a site (or all sites) held during a period: bytes, allocations.
#[derive(Clone, Copy)]
struct Floor {
    bytes: u64,
    count: u64,
}

impl Floor {
    fn lower(&mut self, bytes: u64, count: u64) {
        self.bytes = self.bytes.min(bytes);
        self.count = self.count.min(count);
    }
}

impl<'a> Replay<'a> {
    fn new(p: &'a Process, left_out: &dyn Fn(&Allocation) -> bool) -> Replay<'a> {
        let mut r = Replay {
            p,
            keys: Vec::new(),
            apis: Vec::new(),
            allocs: Vec::new(),
            site_of: vec![None; p.allocations.len()],
            ends: Vec::new(),
        };
        let mut index: HashMap<SiteKey, usize> = HashMap::new();
        for (id, a) in p.allocations.iter().enumerate() {
            if left_out(a) {
                continue;
            }
            let key = SiteKey::of(a);
            let site = *index.entry(key.clone()).or_insert_with(|| {
                r.keys.push(key);
                r.apis.push((a.api.as_str().to_string(), a.kind.as_str().to_string()));
                r.keys.len() - 1
            });
            r.allocs.push((a.at, site));
            r.site_of[id] = Some(site);
            if let Some(e) = a.end {
                r.ends.push((e.at, id));
            }
        }
        r.ends.sort_unstable();
        r
    }

    /// The changes of the allocations of `site`.
    /// The changes at which `site` allocates, one per instant.
    fn starts_of(&self, site: usize) -> Vec<usize> {
        self.occurrences()[site].iter().map(|&ordinal| self.allocs[ordinal].0).collect()
    }

    /// Each site's allocations (ordinals in `allocs`), those at the instant
    /// of the site's previous one left out.
    fn occurrences(&self) -> Vec<Vec<usize>> {
        let mut positions: Vec<Vec<usize>> = vec![Vec::new(); self.keys.len()];
        let mut last_t: Vec<Option<u64>> = vec![None; self.keys.len()];
        for (ordinal, &(change, k)) in self.allocs.iter().enumerate() {
            let t = self.p.changes[change].t_ns;
            if last_t[k] != Some(t) {
                positions[k].push(ordinal);
                last_t[k] = Some(t);
            }
        }
        positions
    }

    fn what(&self, site: usize) -> String {
        let (api, kind) = &self.apis[site];
        match &self.keys[site] {
            SiteKey::Bare { size, .. } => format!("{api} ({kind}) of {size} byte(s)"),
            SiteKey::Stack(_) => format!("{api} ({kind}) at one site"),
        }
    }

    /// The least each site held during each period `[boundaries[p], boundaries[p + 1])`
    /// (changes of the timeline; its length ends the last period at its end).
    fn floors(&self, boundaries: &[usize]) -> Series {
        let sites = self.keys.len();
        let mut ledger = Ledger { bytes: vec![0; sites], counts: vec![0; sites], total: 0, total_count: 0 };
        let mut live: Vec<Vec<AllocId>> = vec![Vec::new(); sites];
        let mut s = Series::default();
        let mut floor: HashMap<usize, Floor> = HashMap::new();
        let mut total_floor = Floor { bytes: 0, count: 0 };
        let mut b = 0;
        let mut next_end = 0;
        let changes = self.p.changes.len();
        // A boundary may be the end of the timeline (a phase's last end is its last change).
        for i in 0..=changes {
            if b < boundaries.len() && boundaries[b] == i {
                if b > 0 {
                    let last = b + 1 == boundaries.len();
                    self.sample(&ledger, &live, &mut s, &floor, total_floor, last);
                }
                floor.clear();
                total_floor = Floor { bytes: ledger.total, count: ledger.total_count };
                b += 1;
                if b == boundaries.len() {
                    break; // what follows the last period's start is no whole period
                }
            }
            if i == changes {
                break;
            }
            // The allocations change `i` ended, then what it made.
            let mut deltas: Vec<(usize, AllocId, bool)> = Vec::new();
            while next_end < self.ends.len() && self.ends[next_end].0 == i {
                let id = self.ends[next_end].1;
                if let Some(site) = self.site_of[id] {
                    deltas.push((site, id, false));
                }
                next_end += 1;
            }
            if let What::Alloc(id) = self.p.changes[i].what {
                if let Some(site) = self.site_of[id] {
                    deltas.push((site, id, true));
                }
            }
            for (site, id, made) in deltas {
                let before = Floor { bytes: ledger.bytes[site], count: ledger.counts[site] };
                let size = self.p.allocations[id].size;
                if made {
                    ledger.bytes[site] += size;
                    ledger.counts[site] += 1;
                    ledger.total += size;
                    ledger.total_count += 1;
                    live[site].push(id);
                } else {
                    ledger.bytes[site] = ledger.bytes[site].saturating_sub(size);
                    ledger.counts[site] = ledger.counts[site].saturating_sub(1);
                    ledger.total = ledger.total.saturating_sub(size);
                    ledger.total_count = ledger.total_count.saturating_sub(1);
                    if let Some(at) = live[site].iter().rposition(|&x| x == id) {
                        live[site].swap_remove(at);
                    }
                }
                if b > 0 {
                    floor.entry(site).or_insert(before).lower(ledger.bytes[site], ledger.counts[site]);
                    total_floor.lower(ledger.total, ledger.total_count);
                }
            }
        }
        s.finish();
        s
    }

    /// One sample of every site holding memory (or having held some in the period).
    fn sample(
        &self,
        ledger: &Ledger,
        live: &[Vec<AllocId>],
        s: &mut Series,
        floors: &HashMap<usize, Floor>,
        total_floor: Floor,
        last: bool,
    ) {
        let n = s.total.len();
        for (site, held) in live.iter().enumerate() {
            let (bytes, count) = (ledger.bytes[site], ledger.counts[site]);
            let f = floors
                .get(&site)
                .map_or(Floor { bytes, count }, |f| Floor { bytes: f.bytes.min(bytes), count: f.count.min(count) });
            if f.bytes > 0 || s.by_site.contains_key(&site) {
                s.push(site, n, f.bytes, f.count);
            }
            if last && !held.is_empty() {
                let mut held = held.clone();
                held.sort_unstable();
                s.last_held.insert(site, held);
            }
        }
        s.total.push(total_floor.bytes);
        s.total_counts.push(total_floor.count);
    }
}

#[cfg(test)]
#[path = "growth_tests.rs"]
mod tests;
