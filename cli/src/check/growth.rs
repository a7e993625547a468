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
use cupool_core::log::{EventKind, EventRecord, Log, MemKind};
use std::collections::HashMap;

/// What growth is measured per: a recorded allocation site, or, where the
/// log has none, allocations of one API, kind and size.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SiteKey {
    Stack(u32),
    Bare { api: String, kind: String, size: u64 },
}

impl SiteKey {
    fn of(e: &EventRecord) -> SiteKey {
        match e.stack {
            Some(id) => SiteKey::Stack(id),
            None => SiteKey::Bare { api: api_of(e), kind: kind_of(e), size: e.size.unwrap_or(0) },
        }
    }
}

fn api_of(e: &EventRecord) -> String {
    e.api.as_ref().map(|a| a.as_str().to_string()).unwrap_or_default()
}

fn kind_of(e: &EventRecord) -> String {
    e.kind.as_ref().map(|k| k.as_str().to_string()).unwrap_or_default()
}

/// A site that grew.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grown {
    pub key: SiteKey,
    /// API and kind of its allocations, for a site without frames.
    pub api: String,
    pub kind: String,
    pub growth: Growth,
    /// Bytes and allocations live from the site at the last sample.
    pub bytes: u64,
    pub count: u64,
}

/// Samples kept per series: a longer run is sampled every n-th phase.
const MAX_SAMPLES: usize = 256;

/// The growing sites of `log`, or why growth could not be checked (`Err`:
/// one sentence). `skip_phase` names phases that are not repetitions of the
/// program's work (the pytest plugin's per-test phases).
#[cfg(test)]
pub fn analyse(log: &Log, min_phases: usize, skip_phase: &dyn Fn(&str) -> bool) -> Result<Vec<Grown>, String> {
    analyse_leaving_out(log, min_phases, skip_phase, &|_| false)
}

/// [`analyse`] without the allocations `left_out` names (and so without
/// their frees): memory whose growth is judged elsewhere, such as the
/// segments of PyTorch's cache when its tensors were recorded.
pub fn analyse_leaving_out(
    log: &Log,
    min_phases: usize,
    skip_phase: &dyn Fn(&str) -> bool,
    left_out: &dyn Fn(&EventRecord) -> bool,
) -> Result<Vec<Grown>, String> {
    if !log.header.options.trace {
        return Err("logged with trace=0, so growth was not checked (it needs every allocation and free)".into());
    }
    if let Some(n) = log.end.as_ref().map(|e| e.dropped_events).filter(|&n| n > 0) {
        return Err(format!(
            "the log lost {n} event(s) (the writer fell behind), so growth was not checked: missing frees would look like growth"
        ));
    }
    let mut events: Vec<&EventRecord> =
        log.events.iter().filter(|e| !(e.ev.known() == Some(EventKind::Alloc) && left_out(e))).collect();
    events.sort_by_key(|e| e.seq);
    analyse_events(&events, min_phases, skip_phase)
}

/// The growing sites of a timeline of allocations, frees and phase edges,
/// in order (a log's, or one made from another record of the same
/// process's memory, such as PyTorch's allocation history).
pub fn analyse_events(
    events: &[&EventRecord],
    min_phases: usize,
    skip_phase: &dyn Fn(&str) -> bool,
) -> Result<Vec<Grown>, String> {
    let replay = Replay::new(events);
    let mut found: Vec<Grown> = Vec::new();
    let (groups, skipped) = phase_groups(events, min_phases, skip_phase);
    if groups.is_empty() && skipped {
        // A test session: one test is not a repetition of the one before,
        // and what each leaves behind is the per-test check's.
        return Ok(found);
    }
    if groups.is_empty() {
        let min_count = (min_phases + 1).max(8);
        let Some(clock) = clock(&replay, min_count) else {
            if replay.allocs.len() >= 4 * min_phases {
                return Err(
                    "no repeated phases and no allocation repeating regularly through the run: growth was not checked \
                     (name the loop's iterations with cupool_mark or NVTX ranges)"
                        .into(),
                );
            }
            return Ok(found);
        };
        let boundaries = every_nth(&replay.starts_of(clock), MAX_SAMPLES + 1);
        let series = replay.floors(&boundaries.items);
        let from = Source { from: "repetition", phase: replay.what(clock), stride: boundaries.stride };
        merge(&mut found, evaluate(&replay, &series, &from));
    } else {
        for (name, from, instances) in groups {
            let samples = every_nth(&instances, MAX_SAMPLES);
            // The least each site held in each phase, not what it held at
            // the phase's end: a phase that ends more than once per
            // iteration (a collective per gradient bucket) ends at different
            // points of the iteration, and what lives only part of it must
            // not show as rises and falls.
            let mut boundaries = Vec::with_capacity(samples.items.len() + 1);
            boundaries.push(0);
            boundaries.extend(samples.items.iter().map(|&i| i + 1));
            let series = replay.floors(&boundaries);
            let from = Source { from, phase: name, stride: samples.stride };
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
    let grown = |k: usize, fit: &Fit, sites: u64, bytes: u64, count: u64| Grown {
        key: replay.keys[k].clone(),
        api: replay.apis[k].0.clone(),
        kind: replay.apis[k].1.clone(),
        growth: growth(fit, sites),
        bytes,
        count,
    };
    let mut out = Vec::new();
    let mut explained = 0u64;
    let mut gains: Vec<(u64, usize)> = Vec::new();
    for (&k, series) in &s.by_site {
        let last = s.last_bytes.get(&k).copied().unwrap_or(0);
        let count = s.last_counts.get(&k).copied().unwrap_or(0);
        if let Some(fit) = grows(series) {
            explained += fit.gain;
            out.push(grown(k, &fit, 1, last, count));
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
                let bytes = gains.iter().map(|(_, k)| s.last_bytes.get(k).copied().unwrap_or(0)).sum();
                let count = gains.iter().map(|(_, k)| s.last_counts.get(k).copied().unwrap_or(0)).sum();
                out.retain(|g| g.key != replay.keys[top]);
                out.push(grown(top, &fit, gains.len() as u64, bytes, count));
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

/// `epoch 12` and `epoch 13` are the same phase: digits do not count.
pub fn phase_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_number = false;
    for c in name.chars() {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !in_number {
            out.push('#');
        }
        in_number = c.is_ascii_digit();
    }
    out
}

/// Which API named a phase: `nvtx`, `mark` or `phase`.
fn family(e: &EventRecord) -> &'static str {
    match e.api.as_ref().map(|a| a.as_str()).unwrap_or("") {
        a if a.starts_with("nvtx") => "nvtx",
        "cupool_mark" => "mark",
        _ => "phase",
    }
}

/// A phase's name, the API family that named it, and the indices in
/// `events` of its ends.
type PhaseGroup = (String, &'static str, Vec<usize>);

/// The repeated phases, each that ended at least `min` times, and whether
/// any phase was skipped. A phase edge is written once per device: an end
/// of the phase that just ended, on a device it has not yet ended on, is a
/// copy and counts once. Two ends on one device are two instances, also with
/// nothing allocated or freed between them (a loop whose memory is all
/// cached, inside a cache cupool does not see).
fn phase_groups(events: &[&EventRecord], min: usize, skip: &dyn Fn(&str) -> bool) -> (Vec<PhaseGroup>, bool) {
    let mut skipped = false;
    let mut groups: Vec<PhaseGroup> = Vec::new();
    // The phase that just ended, and the devices its end was written for.
    let mut last: Option<(&str, &str, Vec<Option<i32>>)> = None;
    for (i, e) in events.iter().enumerate() {
        match e.ev.known() {
            Some(EventKind::Alloc | EventKind::Free | EventKind::PhaseBegin) => last = None,
            Some(EventKind::PhaseEnd) => {
                let name = e.name.as_deref().unwrap_or("");
                let fam = family(e);
                if skip(name) {
                    skipped = true;
                    continue;
                }
                if let Some((f, n, devices)) = &mut last {
                    if (*f, *n) == (fam, name) && !devices.contains(&e.device) {
                        devices.push(e.device);
                        continue;
                    }
                }
                last = Some((fam, name, vec![e.device]));
                let norm = phase_name(name);
                match groups.iter_mut().find(|g| g.0 == norm && g.1 == fam) {
                    Some(g) => g.2.push(i),
                    None => groups.push((norm, fam, vec![i])),
                }
            }
            _ => {}
        }
    }
    groups.retain(|g| g.2.len() >= min);
    (groups, skipped)
}

/// The loop's clock: the site whose allocations start the loop's periods.
/// Candidates allocate at least `min_count` times at regular intervals
/// (counted in allocations: at least 80% of the gaps between two of its
/// allocations lie within half and twice their median). Most sites of a
/// loop allocate once per iteration, so the count shared by the most
/// candidates is the number of iterations (a site inside an inner loop
/// allocates a multiple of it); of the sites with that count, the first to
/// allocate is the clock. A candidate's allocations must also span at least
/// half of the time from its first one to the timeline's last event (when
/// more than a second follows them):
/// allocations that repeat in a burst and then stop (a library setting up a
/// buffer per channel, a model's weights layer by layer) are set-up, not the
/// loop the program spends its time in (what they keep is an exit leak if it
/// is never freed, judged there).
fn clock(replay: &Replay, min_count: usize) -> Option<usize> {
    const SET_UP_AFTER_NS: u64 = 1_000_000_000;
    let mut positions: Vec<Vec<usize>> = vec![Vec::new(); replay.keys.len()];
    for (ordinal, &(_, k)) in replay.allocs.iter().enumerate() {
        positions[k].push(ordinal);
    }
    let end = replay.events.last().map_or(0, |e| e.t_ns);
    let time_of = |ordinal: usize| replay.events[replay.allocs[ordinal].0].t_ns;
    let lasts = |k: usize| {
        let (from, to) = (time_of(positions[k][0]), time_of(*positions[k].last().unwrap_or(&positions[k][0])));
        let rest = end.saturating_sub(to);
        // Less than a second after it proves nothing: a short run's exit work
        // (an interpreter tearing down, a busy machine) can take that long.
        rest <= to.saturating_sub(from) || rest < SET_UP_AFTER_NS
    };
    let regular: Vec<usize> = (0..positions.len())
        .filter(|&k| positions[k].len() >= min_count)
        .filter(|&k| lasts(k))
        .filter(|&k| {
            let mut gaps: Vec<usize> = positions[k].windows(2).map(|w| w[1] - w[0]).collect();
            gaps.sort_unstable();
            let median = gaps[gaps.len() / 2];
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

/// The allocations and frees of one log, replayed per site.
struct Replay<'a> {
    events: &'a [&'a EventRecord],
    keys: Vec<SiteKey>,
    /// API and kind of each site's first allocation.
    apis: Vec<(String, String)>,
    /// (index in `events`, site) of every allocation, in order.
    allocs: Vec<(usize, usize)>,
    /// Site of the allocation at each index in `events`.
    site_at: HashMap<usize, usize>,
}

/// Per-site samples of one pass.
#[derive(Default)]
struct Series {
    by_site: HashMap<usize, Vec<u64>>,
    total: Vec<u64>,
    /// Allocations and bytes live per site at the last sample.
    last_counts: HashMap<usize, u64>,
    last_bytes: HashMap<usize, u64>,
}

impl Series {
    fn push(&mut self, site: usize, sample: usize, bytes: u64) {
        let s = self.by_site.entry(site).or_default();
        s.resize(sample, 0);
        s.push(bytes);
    }

    fn finish(&mut self) {
        let n = self.total.len();
        for s in self.by_site.values_mut() {
            s.resize(n, 0);
        }
    }
}

/// What is live: per site, and in all.
#[derive(Default)]
struct Ledger {
    by_ptr: HashMap<(bool, u64), (usize, u64)>,
    bytes: Vec<u64>,
    counts: Vec<u64>,
    total: u64,
}

impl Ledger {
    fn new(sites: usize) -> Ledger {
        Ledger { bytes: vec![0; sites], counts: vec![0; sites], ..Default::default() }
    }

    /// Applies event `i`; returns the site it changed.
    fn apply(&mut self, replay: &Replay, i: usize) -> Option<usize> {
        let e = replay.events[i];
        let (Some(ptr), Some(kind)) = (e.ptr, e.kind.as_ref()) else { return None };
        let at = (*kind == MemKind::Vmm, ptr);
        match e.ev.known() {
            Some(EventKind::Alloc) => {
                let site = *replay.site_at.get(&i)?;
                let size = e.size.unwrap_or(0);
                if let Some(old) = self.by_ptr.insert(at, (site, size)) {
                    self.release(old); // its free was never logged
                }
                self.bytes[site] += size;
                self.counts[site] += 1;
                self.total += size;
                Some(site)
            }
            Some(EventKind::Free) => {
                let old = self.by_ptr.remove(&at)?;
                self.release(old);
                Some(old.0)
            }
            _ => None,
        }
    }

    /// The site whose bytes event `i` changes, before it is applied.
    fn site_changed_by(&self, replay: &Replay, i: usize) -> Option<usize> {
        let e = replay.events[i];
        match e.ev.known() {
            Some(EventKind::Alloc) => replay.site_at.get(&i).copied(),
            Some(EventKind::Free) => {
                let kind = e.kind.as_ref()?;
                self.by_ptr.get(&(*kind == MemKind::Vmm, e.ptr?)).map(|(site, _)| *site)
            }
            _ => None,
        }
    }

    fn release(&mut self, (site, size): (usize, u64)) {
        self.bytes[site] = self.bytes[site].saturating_sub(size);
        self.counts[site] = self.counts[site].saturating_sub(1);
        self.total = self.total.saturating_sub(size);
    }
}

impl<'a> Replay<'a> {
    fn new(events: &'a [&'a EventRecord]) -> Replay<'a> {
        let mut r = Replay { events, keys: Vec::new(), apis: Vec::new(), allocs: Vec::new(), site_at: HashMap::new() };
        let mut index: HashMap<SiteKey, usize> = HashMap::new();
        for (i, e) in events.iter().enumerate() {
            if e.ev.known() != Some(EventKind::Alloc) || e.ptr.is_none() || e.kind.is_none() {
                continue;
            }
            let key = SiteKey::of(e);
            let site = *index.entry(key.clone()).or_insert_with(|| {
                r.keys.push(key);
                r.apis.push((api_of(e), kind_of(e)));
                r.keys.len() - 1
            });
            r.allocs.push((i, site));
            r.site_at.insert(i, site);
        }
        r
    }

    /// The indices in `events` of the allocations of `site`.
    fn starts_of(&self, site: usize) -> Vec<usize> {
        self.allocs.iter().filter(|a| a.1 == site).map(|a| a.0).collect()
    }

    fn what(&self, site: usize) -> String {
        let (api, kind) = &self.apis[site];
        match &self.keys[site] {
            SiteKey::Bare { size, .. } => format!("{api} ({kind}) of {size} byte(s)"),
            SiteKey::Stack(_) => format!("{api} ({kind}) at one site"),
        }
    }

    /// The least each site held during each period `[boundaries[p], boundaries[p + 1])`
    /// (indices in the timeline; its length ends the last period at its end).
    fn floors(&self, boundaries: &[usize]) -> Series {
        let mut ledger = Ledger::new(self.keys.len());
        let mut s = Series::default();
        let mut floor: HashMap<usize, u64> = HashMap::new();
        let mut total_floor = 0u64;
        let mut b = 0;
        // A boundary may be the end of the timeline (a phase's last end is its last event).
        for i in 0..=self.events.len() {
            if b < boundaries.len() && boundaries[b] == i {
                if b > 0 {
                    let last = b + 1 == boundaries.len();
                    self.sample(&ledger, &mut s, Some((&floor, total_floor)), last);
                }
                floor.clear();
                total_floor = ledger.total;
                b += 1;
                if b == boundaries.len() {
                    break; // what follows the last period's start is no whole period
                }
            }
            if i == self.events.len() {
                break;
            }
            let changed = ledger.site_changed_by(self, i).map(|site| (site, ledger.bytes[site]));
            ledger.apply(self, i);
            if let (Some((site, before)), true) = (changed, b > 0) {
                let f = floor.entry(site).or_insert(before);
                *f = (*f).min(ledger.bytes[site]);
                total_floor = total_floor.min(ledger.total);
            }
        }
        s.finish();
        s
    }

    /// One sample of every site holding memory (or, with `floors`, having
    /// held some in the period).
    fn sample(&self, ledger: &Ledger, s: &mut Series, floors: Option<(&HashMap<usize, u64>, u64)>, last: bool) {
        let n = s.total.len();
        for site in 0..self.keys.len() {
            let now = ledger.bytes[site];
            let value = match floors {
                Some((f, _)) => f.get(&site).map_or(now, |m| (*m).min(now)),
                None => now,
            };
            if value > 0 || s.by_site.contains_key(&site) {
                s.push(site, n, value);
            }
            if last && ledger.counts[site] > 0 {
                s.last_counts.insert(site, ledger.counts[site]);
                s.last_bytes.insert(site, now);
            }
        }
        s.total.push(floors.map_or(ledger.total, |(_, t)| t));
    }
}

#[cfg(test)]
#[path = "growth_tests.rs"]
mod tests;
