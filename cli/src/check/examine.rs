//! From logs to findings: the exit leaks and growth leaks of every process,
//! identical sites of all processes grouped into one finding, suppressions
//! applied, and the verdict.

use super::finding::{Finding, Findings, Growth, LeakKind, ProcessRef, SuppressionUse, Verdict};
use super::growth::{self, Grown, SiteKey};
use super::site::{frame_texts, Namer, Site};
use super::suppress::Suppressions;
use super::torch::{self, History};
use cupool_core::log::{summarize, EventKind, EventRecord, Log};
use cupool_core::options::Options;
use std::collections::HashMap;

/// Everything `logs` (with the PyTorch `histories` of their processes, and
/// the per-test findings `tests`) hold, judged by `opts` (`fail_on`,
/// `max_leak_bytes`, `growth_phases`). `notes` are lines about inputs that
/// could not be read; more are added.
pub fn examine(
    logs: &[Log],
    histories: &[History],
    tests: Vec<Finding>,
    supp: &Suppressions,
    opts: &Options,
    notes: Vec<String>,
) -> Findings {
    let mut groups = Groups::default();
    let mut out = Findings { notes, ..Default::default() };
    for log in logs {
        let process = ProcessRef::of(log);
        let who = format!("pid {}", process.pid);
        let mut namer = Namer::new(log);
        if log.end.is_none() {
            out.notes.push(format!(
                "{who}: the log has no end record (killed, or still running): its exit leaks are what was \
                 live when the log stopped"
            ));
        }
        exit_leaks(log, &process, &mut namer, &mut groups);
        growth_leaks(log, torch::of(histories, log), opts, &process, &mut namer, &mut groups, &mut out.notes);
        // A module file is the same for every process that loaded it: one line each.
        for problem in namer.problems() {
            if !out.notes.contains(&problem) {
                out.notes.push(problem);
            }
        }
        if let Some(end) = &log.end {
            out.notes.extend(end.notes.iter().map(|n| format!("{who}: {n}")));
        }
        out.processes.push(process);
    }
    for t in tests {
        groups.add_finding(t);
    }
    out.findings = groups.judge(supp, &mut out.suppressions_used);
    out.verdict = verdict(&out.findings, &groups.keys, opts);
    out
}

/// Sites whose live bytes keep growing. With PyTorch's allocation history
/// of the process, growth inside PyTorch's cache is judged from the
/// tensors (their sites: the Python stacks PyTorch recorded), and the
/// cache's segments (at the addresses the history names, or allocated from
/// `libc10_cuda`) are left out of the judgment of the rest of the log.
fn growth_leaks(
    log: &Log,
    history: Option<&History>,
    opts: &Options,
    process: &ProcessRef,
    namer: &mut Namer,
    groups: &mut Groups,
    notes: &mut Vec<String>,
) {
    let who = format!("pid {}", process.pid);
    let min = opts.growth_phases as usize;
    let skip = &super::per_test::is_plugin_phase;
    let mut cache = None;
    if let Some(h) = history {
        let timeline = h.timeline(log);
        let events: Vec<&EventRecord> = timeline.iter().collect();
        let judged = if timeline.iter().any(|e| e.ev.known() == Some(EventKind::Alloc)) {
            growth::analyse_events(&events, min, skip)
        } else {
            Err("it recorded no tensor allocation".to_string())
        };
        match judged {
            Ok(grown) => {
                for g in grown {
                    let site = tensor_site(h, &g);
                    groups.add(LeakKind::Growth, &site, g.bytes, g.count, process, Some(g.growth));
                }
                if h.wrapped() {
                    notes.push(format!(
                        "{who}: PyTorch's allocation history kept only its last {} events per device \
                         (torch_history): growth inside its cache was judged over them",
                        h.max_entries
                    ));
                }
                cache = Some((h.segment_addresses(), namer.stacks_in(&|m| m.starts_with("libc10_cuda"))));
            }
            Err(why) => notes.push(format!(
                "{who}: PyTorch's allocation history ({}): {why}; growth inside its cache judged from its segments",
                h.path.display()
            )),
        }
    }
    let left_out = |e: &EventRecord| {
        cache.as_ref().is_some_and(|(addresses, stacks)| {
            e.ptr.is_some_and(|p| addresses.contains(&p)) || e.stack.is_some_and(|s| stacks.contains(&s))
        })
    };
    match growth::analyse_leaving_out(log, min, skip, &left_out) {
        Ok(grown) => {
            for g in grown {
                let site = match &g.key {
                    SiteKey::Stack(id) => namer.site(Some(*id), &g.api, &g.kind, g.bytes / g.count.max(1)),
                    SiteKey::Bare { size, .. } => namer.site(None, &g.api, &g.kind, *size),
                };
                groups.add(LeakKind::Growth, &site, g.bytes, g.count, process, Some(g.growth));
            }
        }
        Err(why) => notes.push(format!("{who}: {why}")),
    }
}

/// The site of tensors that grew: the Python stack PyTorch recorded, or,
/// for tensors allocated where no Python code ran (autograd's threads),
/// their size.
fn tensor_site(h: &History, g: &Grown) -> Site {
    let what = format!("{} ({})", torch::API, torch::KIND);
    match &g.key {
        SiteKey::Stack(id) => Site::new(h.frames(*id), what, Vec::new(), g.bytes / g.count.max(1)),
        SiteKey::Bare { size, .. } => Site::new(Vec::new(), what, Vec::new(), *size),
    }
}

/// What of the exit leaks of `logs` the shipped suppressions class as held
/// by known caches (PyTorch's, NCCL's, ...): (bytes, allocations, the
/// libraries named). Exit leaks only: `cupool run`'s summary says it without
/// the price of a whole check.
pub fn held_by_known_caches(logs: &[Log]) -> Option<(u64, u64, Vec<String>)> {
    let mut groups = Groups::default();
    for log in logs {
        exit_leaks(log, &ProcessRef::of(log), &mut Namer::new(log), &mut groups);
    }
    let mut used = Vec::new();
    groups.judge(&Suppressions::load(&[]).ok()?, &mut used);
    let known: Vec<&SuppressionUse> = used.iter().filter(|u| u.source == super::suppress::DEFAULT_SOURCE).collect();
    (!known.is_empty()).then(|| {
        (
            known.iter().map(|u| u.bytes).sum(),
            known.iter().map(|u| u.allocations).sum(),
            known.iter().map(|u| u.pattern.clone()).collect(),
        )
    })
}

/// Allocations still live when their context died or the process ended:
/// the end record's list, or for a log cut short, what its timeline leaves live.
fn exit_leaks(log: &Log, process: &ProcessRef, namer: &mut Namer, groups: &mut Groups) {
    for leak in summarize(log).leaks {
        let site = namer.site(leak.stack, leak.api.as_str(), leak.kind.as_str(), leak.size);
        groups.add(LeakKind::Exit, &site, leak.size, 1, process, None);
    }
}

/// Findings being gathered, one per kind and site (and test).
#[derive(Default)]
struct Groups {
    entries: Vec<Entry>,
    index: HashMap<(LeakKind, String, Option<String>), usize>,
    /// The site key of each finding, by position once judged.
    keys: Vec<String>,
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
        bytes: u64,
        count: u64,
        process: &ProcessRef,
        growth: Option<Growth>,
    ) {
        let id = (kind, site.key.clone(), None);
        let i = *self.index.entry(id).or_insert_with(|| {
            self.entries.push(Entry {
                finding: Finding { kind, frames: site.frames.clone(), what: site.what.clone(), ..Default::default() },
                key: site.key.clone(),
                texts: site.match_texts().into_iter().map(String::from).collect(),
            });
            self.entries.len() - 1
        });
        let f = &mut self.entries[i].finding;
        f.bytes += bytes;
        f.count += count;
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
            Some(&i) => {
                let g = &mut self.entries[i].finding;
                g.bytes += f.bytes;
                g.count += f.count;
                for p in f.processes {
                    if !g.processes.contains(&p) {
                        g.processes.push(p);
                    }
                }
            }
            None => {
                let texts = frame_texts(&f.frames).into_iter().map(String::from).collect();
                self.index.insert(id, self.entries.len());
                self.entries.push(Entry { finding: f, key, texts });
            }
        }
    }

    /// The findings with suppressions applied, unsuppressed first, largest
    /// first; `used` gets what each suppression matched.
    fn judge(&mut self, supp: &Suppressions, used: &mut Vec<SuppressionUse>) -> Vec<Finding> {
        for e in &mut self.entries {
            let texts: Vec<&str> = e.texts.iter().map(String::as_str).collect();
            let Some(rule) = supp.matching(e.finding.kind, &texts) else { continue };
            e.finding.suppressed_by = Some(rule.pattern.clone());
            let i = match used.iter().position(|u| u.pattern == rule.pattern && u.source == rule.source) {
                Some(i) => i,
                None => {
                    used.push(SuppressionUse {
                        pattern: rule.pattern.clone(),
                        source: rule.source.clone(),
                        findings: 0,
                        allocations: 0,
                        bytes: 0,
                    });
                    used.len() - 1
                }
            };
            used[i].findings += 1;
            used[i].allocations += e.finding.count;
            used[i].bytes += e.finding.bytes;
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
        self.keys = entries.iter().map(|e| e.key.clone()).collect();
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

/// The failing findings' bytes and allocations, each allocation once: a
/// growing site whose memory is also an exit leak of the same processes
/// counts as the exit leak.
fn verdict(findings: &[Finding], keys: &[String], opts: &Options) -> Verdict {
    let kinds = fail_on(opts);
    let failing: Vec<(usize, &Finding)> =
        findings.iter().enumerate().filter(|(_, f)| f.suppressed_by.is_none() && kinds.contains(&f.kind)).collect();
    let at_exit = |i: usize, f: &Finding| {
        failing.iter().any(|(j, e)| {
            e.kind == LeakKind::Exit && keys[*j] == keys[i] && f.processes.iter().all(|p| e.processes.contains(p))
        })
    };
    let (mut bytes, mut allocations) = (0, 0);
    for &(i, f) in &failing {
        if f.kind == LeakKind::Growth && at_exit(i, f) {
            continue;
        }
        bytes += f.bytes;
        allocations += f.count;
    }
    Verdict {
        fail_on: kinds,
        max_leak_bytes: opts.max_leak_bytes,
        leaked_bytes: bytes,
        leaked_allocations: allocations,
        fails: !failing.is_empty() && bytes > opts.max_leak_bytes,
    }
}
