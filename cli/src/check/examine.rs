//! From processes to findings: the exit leaks and growth leaks of every
//! process, identical sites of all processes grouped into one finding,
//! suppressions applied, and the verdict, which counts each allocation once
//! however many findings name it.

use super::finding::{Finding, Findings, Growth, Held, Holding, LeakKind, ProcessRef, SuppressionUse, Totals, Verdict};
use super::growth::{self, Grown, SiteKey};
use super::history::{self, History};
use super::site::{frame_texts, Namer, Site};
use super::suppress::Suppressions;
use crate::units::human_bytes;
use cupool_core::model::{Allocation, EndedBy, Process, What};
use cupool_core::options::Options;
use std::collections::{HashMap, HashSet};

/// Everything `processes` (with the PyTorch `histories` of their
/// processes, and the per-test findings `tests`, whose holdings index the
/// same `processes`) hold, judged by `opts` (`fail_on`, `max_leak_bytes`,
/// `growth_phases`). `notes` are lines about inputs that could not be read;
/// more are added.
pub fn examine(
    processes: &[Process],
    histories: &[History],
    tests: Vec<Finding>,
    supp: &Suppressions,
    opts: &Options,
    notes: Vec<String>,
) -> Findings {
    let mut groups = Groups::default();
    let mut out = Findings { notes, ..Default::default() };
    let mut unusable = Vec::new();
    for (index, p) in processes.iter().enumerate() {
        let log = &p.log;
        let process = ProcessRef::of(log);
        let who = format!("pid {}", process.pid);
        let mut namer = Namer::new(p);
        if log.end.is_none() {
            out.notes.push(format!(
                "{who}: the log has no end record (killed, replaced by exec, or still running): its exit leaks are what was \
                 live when the log stopped"
            ));
        }
        out.notes.extend(p.problems.iter().map(|n| format!("{who}: {n}")));
        exit_leaks(p, index, &process, &mut namer, &mut groups);
        let mine: Vec<(usize, &History)> = history::of(histories, log).map(|h| (position(histories, h), h)).collect();
        growth_leaks(p, index, &mine, opts, &process, &mut namer, &mut groups, &mut out.notes);
        // A module file is the same for every process that loaded it: told once, after every process.
        unusable.extend(namer.unusable());
        if let Some(end) = &log.end {
            out.notes.extend(end.notes.iter().map(|n| format!("{who}: {n}")));
        }
        out.processes.push(process);
    }
    out.notes.extend(crate::symbolize::describe(&unusable));
    for t in tests {
        groups.add_finding(t);
    }
    out.findings = groups.judge(supp, &mut out.suppressions_used);
    out.judged(opts)
}

impl Findings {
    /// The findings with their totals and verdict by `opts`: what every
    /// output prints, computed here once.
    pub fn judged(mut self, opts: &Options) -> Findings {
        self.suppressed = Totals::of(self.findings.iter().filter(|f| f.suppressed_by.is_some()));
        self.verdict = verdict(&self.findings, opts);
        self.verdict.fails |= !self.budgets.is_empty();
        self
    }
}

/// Where `h` is in `all`.
fn position(all: &[History], h: &History) -> usize {
    all.iter().position(|x| std::ptr::eq(x, h)).unwrap_or(usize::MAX)
}

/// Sites whose live allocations keep growing. With a framework's record of
/// its own objects (PyTorch's tensors, JAX's arrays), growth inside its
/// cache or arena is judged from the objects (their sites: the Python
/// stacks the framework recorded), and the arena's own allocations (at the
/// addresses the history names, or made from the arena's module) are left
/// out of the judgment of the rest of the log. Without one, a site inside a
/// known arena with no frame of the user's is growth that warm-up gives as
/// well as a leak: a note, never a finding.
#[allow(clippy::too_many_arguments)]
fn growth_leaks(
    p: &Process,
    index: usize,
    histories: &[(usize, &History)],
    opts: &Options,
    process: &ProcessRef,
    namer: &mut Namer,
    groups: &mut Groups,
    notes: &mut Vec<String>,
) {
    let who = format!("pid {}", process.pid);
    let min = opts.growth_phases as usize;
    let skip = &super::per_test::is_plugin_phase;
    let mut addresses: HashSet<u64> = HashSet::new();
    let mut arena_stacks: HashSet<u32> = HashSet::new();
    let mut holders: HashSet<usize> = HashSet::new();
    let mut objects_judged = false;
    // The last object a framework's record saw made: the process went on
    // allocating until then, whatever the log saw (see `growth::clock`).
    let mut allocating_until = 0;
    for &(at, h) in histories {
        let (api, kind) = (h.framework.api(), h.framework.kind());
        let objects = h.process(p);
        // Not a sampled record's: its times are the samples' that saw an
        // object first, the one at exit among them.
        if !h.framework.sampled() {
            let last_made = objects.changes.iter().rev().find(|c| matches!(c.what, What::Alloc(_)));
            allocating_until = allocating_until.max(last_made.map_or(0, |c| c.t_ns));
        }
        let judged = if objects.allocations.is_empty() {
            Err(growth::NotChecked::NoObjects(kind))
        } else {
            growth::analyse_process(&objects, min, skip, &|_| false, 0)
        };
        let mut grown_stacks: HashSet<u32> = HashSet::new();
        match judged {
            Ok(grown) => {
                for g in grown {
                    if let SiteKey::Stack(id) = g.key {
                        grown_stacks.insert(id);
                    }
                    let site = object_site(h, &g);
                    if g.replaced {
                        notes.push(replaced_note(&who, &site, &g));
                        continue;
                    }
                    let held = |id| Held::Object { process: index, history: at, id };
                    let freed = freed_later(&objects, &g);
                    groups.add(LeakKind::Growth, &site, holdings(&objects, &g, held), process, Some(g.growth), freed);
                }
                if h.wrapped() {
                    notes.push(format!(
                        "{who}: {api}'s record kept only its last {} events per device ({}): growth inside its \
                         cache was judged over them",
                        h.max_entries,
                        h.framework.size_option()
                    ));
                }
                addresses.extend(h.segment_addresses());
                holders.extend(h.holders(p));
                arena_stacks.extend(namer.stacks_in(&|m| h.framework.arena(m)));
                objects_judged = true;
            }
            Err(why) => {
                let batches =
                    batches_note(&who, h, &grown_stacks, (min + 1).max(8), p.log.header.options.jax_history_ms);
                match batches.filter(|_| h.framework.sampled() && why == growth::NotChecked::NoRepetition) {
                    // What it saw, and why it is not judged, rather than the general advice.
                    Some(note) => notes.push(note),
                    None => notes.push(format!(
                        "{who}: {api}'s record of its {kind}s ({}): {why}; growth inside its arena judged from the arena",
                        h.path.display()
                    )),
                }
                continue;
            }
        }
        if h.framework.sampled() && h.phases.is_empty() {
            notes.extend(batches_note(&who, h, &grown_stacks, (min + 1).max(8), p.log.header.options.jax_history_ms));
        }
    }
    let left_out = |a: &Allocation| {
        addresses.contains(&a.addr) || holders.contains(&a.event) || a.stack.is_some_and(|s| arena_stacks.contains(&s))
    };
    match growth::analyse_leaving_out(p, min, skip, &left_out, allocating_until) {
        Ok(grown) => {
            for g in grown {
                let site = match &g.key {
                    SiteKey::Stack(id) => namer.site(Some(*id), &g.api, &g.kind, g.bytes / g.count.max(1)),
                    SiteKey::Bare { size, .. } => namer.site(None, &g.api, &g.kind, *size),
                };
                if g.replaced {
                    notes.push(replaced_note(&who, &site, &g));
                    continue;
                }
                if let Some(arena) = arena_without_user_frame(&site) {
                    notes.push(format!(
                        "{who}: {arena} grew by {} per phase over {} phases ({}): growth of an arena alone, which a \
                         warm-up gives as well as a leak; it is judged by the {}, which were not recorded here",
                        human_bytes(g.growth.bytes_per_phase),
                        g.growth.phases,
                        site_text(&site),
                        arena_objects(arena)
                    ));
                    continue;
                }
                let held = |id| Held::Allocation { process: index, id };
                let freed = freed_later(p, &g);
                groups.add(LeakKind::Growth, &site, holdings(p, &g, held), process, Some(g.growth), freed);
            }
        }
        // The framework's objects were judged: that the log, without its arena, repeats nothing is no news.
        Err(growth::NotChecked::NoRepetition) if objects_judged => {}
        Err(why) => notes.push(format!("{who}: {why}")),
    }
}

/// The batches of a sampled record that it could not judge: objects first
/// seen together at one site and kept, other than at a site found growing.
fn batches_note(who: &str, h: &History, grown: &HashSet<u32>, min_count: usize, period_ms: u64) -> Option<String> {
    let batches: Vec<(u32, usize)> =
        h.batches_kept(min_count).into_iter().filter(|(s, _)| !grown.contains(s)).collect();
    let &(stack, count) = batches.first()?;
    let frames = h.frames(stack);
    let at = crate::sites::user_frame(&frames, None)
        .or(frames.first())
        .map_or_else(|| "one site".to_string(), |f| f.text(0).trim_start_matches("#0 ").to_string());
    let more = match batches.len() - 1 {
        0 => String::new(),
        n => format!(" (and batches at {n} other site(s))"),
    };
    let (api, kind) = (h.framework.api(), h.framework.kind());
    Some(format!(
        "{who}: {api}'s record first saw {count} {kind}s made at {at} in one sample{more}, kept to the end: made at \
         once, or by a loop whose steps are shorter than the sampling period ({period_ms} ms, jax_history_ms), which \
         the record cannot tell apart; not judged as growth. Mark the loop's steps with cupool.mark() for the \
         record to sample at each"
    ))
}

/// A site whose bytes grew while the number of its allocations did not.
fn replaced_note(who: &str, site: &Site, g: &Grown) -> String {
    format!(
        "{who}: {} grew by {} per phase over {} phases, in the same {} allocation(s) each replaced by a larger one \
         (a cache that grows, such as a generation's): not a leak, for it keeps no more allocations than it did",
        site_text(site),
        human_bytes(g.growth.bytes_per_phase),
        g.growth.phases,
        g.count
    )
}

/// The innermost frame of a site, or what it allocated when it has none.
fn site_text(site: &Site) -> String {
    site.frames.first().map_or_else(|| site.what.clone(), |f| f.text(0).trim_start_matches("#0 ").to_string())
}

/// The known arenas: a framework's cache or pool, by the modules its own
/// allocations are made from.
const ARENAS: [(&str, &[&str]); 4] = [
    ("PyTorch's caching allocator", &["libc10_cuda"]),
    ("JAX's arena (XLA's BFC allocator)", &["xla_cuda", "jaxlib", "libxla", "xla_extension"]),
    ("CuPy's memory pool", &["cupy_backends", "cupy/cuda/memory"]),
    ("RMM's pool", &["librmm", "/rmm/"]),
];

/// The arena a site lies in, when no frame of it is the user's: then its
/// growth cannot be told from the arena's warm-up.
fn arena_without_user_frame(site: &Site) -> Option<&'static str> {
    if site.frames.iter().any(|f| f.origin() == crate::sites::Origin::User) {
        return None;
    }
    let texts = site.match_texts();
    ARENAS.iter().find(|(_, marks)| texts.iter().any(|t| marks.iter().any(|m| t.contains(m)))).map(|(name, _)| *name)
}

/// What an arena's growth is judged by.
fn arena_objects(arena: &str) -> &'static str {
    match arena {
        a if a.starts_with("PyTorch") => "tensors in PyTorch's allocation history (torch_history)",
        a if a.starts_with("JAX") => "arrays JAX keeps, sampled (jax_history_ms)",
        a if a.starts_with("CuPy") => "arrays CuPy's allocator handed out (cupy_history)",
        _ => "framework's own objects",
    }
}

/// Whether all that a grown site held at the last phase was freed later.
fn freed_later(p: &Process, g: &Grown) -> bool {
    !g.held.is_empty()
        && g.held.iter().all(|&id| p.allocations[id].end.as_ref().is_some_and(|e| e.by != EndedBy::ContextDestroyed))
}

/// What a growing site holds at its last sample.
fn holdings(p: &Process, g: &Grown, held: impl Fn(usize) -> Held) -> Vec<Holding> {
    g.held.iter().map(|&id| Holding { what: held(id), bytes: p.allocations[id].size, allocations: 1 }).collect()
}

/// The site of a framework's objects that grew: the Python stack it
/// recorded, or, for objects made where no Python code ran (autograd's
/// threads), their size.
fn object_site(h: &History, g: &Grown) -> Site {
    let what = format!("{} ({})", h.framework.api(), h.framework.kind());
    match &g.key {
        SiteKey::Stack(id) => Site::new(h.frames(*id), what, Vec::new(), g.bytes / g.count.max(1)),
        SiteKey::Bare { size, .. } => Site::new(Vec::new(), what, Vec::new(), *size),
    }
}

/// What of the exit leaks of `processes` the shipped suppressions class as
/// held by known caches (PyTorch's, NCCL's, ...): (bytes, allocations, the
/// libraries named). Exit leaks only: `cupool run`'s summary says it without
/// the price of a whole check.
pub fn held_by_known_caches(processes: &[Process]) -> Option<(u64, u64, Vec<String>)> {
    let mut groups = Groups::default();
    for (index, p) in processes.iter().enumerate() {
        exit_leaks(p, index, &ProcessRef::of(&p.log), &mut Namer::new(p), &mut groups);
    }
    let mut f = Findings::default();
    f.findings = groups.judge(&Suppressions::load(&[]).ok()?, &mut f.suppressions_used);
    let (totals, names) = super::suppress::known_caches(&f);
    (!names.is_empty()).then(|| (totals.bytes, totals.allocations, names.into_iter().map(String::from).collect()))
}

/// Allocations still live when their context died or the process ended:
/// the end record's list, or for a log cut short, what its timeline leaves live.
fn exit_leaks(p: &Process, index: usize, process: &ProcessRef, namer: &mut Namer, groups: &mut Groups) {
    for (i, l) in p.leaks.iter().enumerate() {
        let leak = &l.leak;
        let site = namer.site(leak.stack, leak.api.as_str(), leak.kind.as_str(), leak.size);
        let what = match l.alloc {
            Some(id) => Held::Allocation { process: index, id },
            None => Held::ExitLeak { process: index, index: i },
        };
        let held = vec![Holding { what, bytes: leak.size, allocations: 1 }];
        groups.add(LeakKind::Exit, &site, held, process, None, false);
    }
}

/// Findings being gathered, one per kind and site (and test).
#[derive(Default)]
struct Groups {
    entries: Vec<Entry>,
    index: HashMap<(LeakKind, String, Option<String>), usize>,
}

struct Entry {
    finding: Finding,
    key: String,
    /// What suppressions are matched against.
    texts: Vec<String>,
}

impl Groups {
    fn add(
        &mut self,
        kind: LeakKind,
        site: &Site,
        held: Vec<Holding>,
        process: &ProcessRef,
        growth: Option<Growth>,
        freed_later: bool,
    ) {
        let id = (kind, site.key.clone(), None);
        let new = !self.index.contains_key(&id);
        let i = *self.index.entry(id).or_insert_with(|| {
            self.entries.push(Entry {
                finding: Finding {
                    kind,
                    frames: site.frames.clone(),
                    hidden_frames: site.hidden,
                    what: site.what.clone(),
                    ..Default::default()
                },
                key: site.key.clone(),
                texts: site.match_texts().into_iter().map(String::from).collect(),
            });
            self.entries.len() - 1
        });
        let f = &mut self.entries[i].finding;
        f.freed_later = freed_later && (new || f.freed_later);
        for h in held {
            f.hold(h);
        }
        if !f.processes.contains(process) {
            f.processes.push(process.clone());
        }
        // Over several processes, the growth shown is the fastest one's.
        if let Some(g) = growth {
            if f.growth.as_ref().is_none_or(|old| g.bytes_per_phase > old.bytes_per_phase) {
                f.growth = Some(g);
            }
        }
    }

    /// A finding made elsewhere (per test), grouped with its equals.
    fn add_finding(&mut self, f: Finding) {
        let key = f.fingerprint();
        let id = (f.kind, key.clone(), f.test.clone());
        match self.index.get(&id) {
            Some(&i) => self.entries[i].finding.absorb(f),
            None => {
                let texts = frame_texts(&f.frames).into_iter().map(String::from).collect();
                self.index.insert(id, self.entries.len());
                self.entries.push(Entry { finding: f, key, texts });
            }
        }
    }

    /// The findings with suppressions applied, unsuppressed first, largest
    /// first; `used` gets what each suppression matched (each allocation once).
    fn judge(&mut self, supp: &Suppressions, used: &mut Vec<SuppressionUse>) -> Vec<Finding> {
        let mut matched: Vec<((String, String), Vec<usize>)> = Vec::new();
        for (i, e) in self.entries.iter_mut().enumerate() {
            let texts: Vec<&str> = e.texts.iter().map(String::as_str).collect();
            let Some(rule) = supp.matching(e.finding.kind, &texts) else { continue };
            e.finding.suppressed_by = Some(rule.pattern.clone());
            let key = (rule.pattern.clone(), rule.source.clone());
            match matched.iter_mut().find(|(k, _)| *k == key) {
                Some((_, list)) => list.push(i),
                None => matched.push((key, vec![i])),
            }
        }
        for ((pattern, source), list) in matched {
            let totals = Totals::of(list.iter().map(|&i| &self.entries[i].finding));
            used.push(SuppressionUse {
                pattern,
                source,
                findings: list.len() as u64,
                allocations: totals.allocations,
                bytes: totals.bytes,
            });
        }
        used.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.pattern.cmp(&b.pattern)));
        let mut entries = std::mem::take(&mut self.entries);
        for e in &mut entries {
            e.finding.processes.sort_by_key(|p| (p.rank, p.pid));
        }
        entries.sort_by(|a, b| {
            let (x, y) = (&a.finding, &b.finding);
            (x.suppressed_by.is_some(), std::cmp::Reverse(x.bytes), x.kind, &a.key).cmp(&(
                y.suppressed_by.is_some(),
                std::cmp::Reverse(y.bytes),
                y.kind,
                &b.key,
            ))
        });
        entries.into_iter().map(|e| e.finding).collect()
    }
}

/// The kinds `fail_on` names.
pub fn fail_on(opts: &Options) -> Vec<LeakKind> {
    [LeakKind::Exit, LeakKind::Growth, LeakKind::Test]
        .into_iter()
        .filter(|k| opts.fail_on.split(',').any(|w| w.trim() == k.name()))
        .collect()
}

/// Whether the failing findings fail the job: their bytes and allocations,
/// each allocation once however many findings name it (a growing site also
/// leaked at exit, a test's leak also live at exit), against `max_leak_bytes`.
fn verdict(findings: &[Finding], opts: &Options) -> Verdict {
    let kinds = fail_on(opts);
    let failing: Vec<&Finding> =
        findings.iter().filter(|f| f.suppressed_by.is_none() && kinds.contains(&f.kind)).collect();
    let totals = Totals::of(failing.iter().copied());
    Verdict {
        fail_on: kinds,
        max_leak_bytes: opts.max_leak_bytes,
        leaked_bytes: totals.bytes,
        leaked_allocations: totals.allocations,
        fails: !failing.is_empty() && totals.bytes > opts.max_leak_bytes,
    }
}
