//! The report on stderr, in LeakSanitizer's words so that people and the
//! scripts they already have read it: findings largest first, each with its
//! frames and processes, then what known caches held, the suppressions
//! used, and `SUMMARY: cupool: X byte(s) leaked in Y allocation(s).`

use super::finding::{Finding, Findings, LeakKind, ProcessRef};
use crate::summary::short_cmdline;
use crate::units::human_bytes;
use std::io::{self, Write};

/// What a growth leak whose memory was all freed before the process ended
/// is told by, in every format.
pub const FREED_LATER: &str =
    "all of it was freed later, before the process ended: held while the loop ran, more the longer it runs";

/// Frames shown per finding.
const FRAMES: usize = 16;
/// Processes named per finding.
const PROCESSES: usize = 4;

pub fn write(f: &Findings, out: &mut dyn Write) -> io::Result<()> {
    if f.processes.is_empty() {
        // Nothing was read: no verdict, only why (the caller says what that means).
        for note in &f.notes {
            writeln!(out, "cupool: note: {note}")?;
        }
        return Ok(());
    }
    let shown: Vec<&Finding> = f.findings.iter().filter(|x| x.suppressed_by.is_none()).collect();
    writeln!(out, "cupool: {} process(es) checked", f.processes.len())?;
    if f.failing().next().is_some() {
        writeln!(out)?;
        writeln!(out, "ERROR: cupool: detected CUDA memory leaks")?;
    }
    for finding in &shown {
        writeln!(out)?;
        write_finding(finding, &f.verdict.fail_on, out)?;
    }
    if !shown.is_empty() {
        writeln!(out)?;
    }
    write_known_caches(f, out)?;
    write_suppressions(f, out)?;
    for note in &f.notes {
        writeln!(out, "cupool: note: {note}")?;
    }
    for over in &f.budgets {
        writeln!(out, "cupool: over budget: {}", over.text())?;
    }
    let v = &f.verdict;
    if f.failing().next().is_none() {
        writeln!(out, "cupool: no leaks")?;
    } else {
        if !v.fails {
            writeln!(
                out,
                "cupool: {} byte(s) leaked, no more than max_leak_bytes={}: the job does not fail",
                v.leaked_bytes, v.max_leak_bytes
            )?;
        }
        writeln!(out, "SUMMARY: cupool: {} byte(s) leaked in {} allocation(s).", v.leaked_bytes, v.leaked_allocations)?;
    }
    if !f.budgets.is_empty() {
        writeln!(out, "SUMMARY: cupool: {} memory budget(s) exceeded.", f.budgets.len())?;
    }
    Ok(())
}

fn write_finding(f: &Finding, fail_on: &[LeakKind], out: &mut dyn Write) -> io::Result<()> {
    match (f.kind, &f.growth) {
        (LeakKind::Growth, Some(g)) => {
            let plural = g.sites > 1;
            let (holds, when) = match (f.freed_later, plural) {
                (true, _) => ("held", " at the last phase"),
                (false, true) => ("now hold", ""),
                (false, false) => ("now holds", ""),
            };
            writeln!(
                out,
                "Growing leak of {} byte(s) per phase over {} phases (site{} {holds} {} byte(s) in {} allocation(s){when}) \
                 allocated from:",
                g.bytes_per_phase,
                g.phases,
                if plural { "s" } else { "" },
                f.bytes,
                f.count,
            )?;
            write_frames(f, out)?;
            match g.phases_from.as_str() {
                "repetition" => writeln!(
                    out,
                    "  phases: periods of the loop, each begun by an allocation of {} (found without marks)",
                    g.phase
                )?,
                from => {
                    let api = match from {
                        "nvtx" => "NVTX ranges",
                        "mark" => "cupool_mark",
                        _ => "cupool_phase_begin",
                    };
                    writeln!(out, "  phases: '{}' ({api})", g.phase)?
                }
            }
            if g.sites > 1 {
                writeln!(out, "  the process's memory grew at {} sites; shown: the one that gained most", g.sites)?;
            }
            if f.freed_later {
                writeln!(out, "  {FREED_LATER}")?;
            }
        }
        (LeakKind::Test, _) => {
            let test = f.test.as_deref().unwrap_or("?");
            writeln!(
                out,
                "Test leak of {} byte(s) in {} allocation(s) in test {test} allocated from:",
                f.bytes, f.count
            )?;
            write_frames(f, out)?;
        }
        _ => {
            writeln!(out, "Direct leak of {} byte(s) in {} allocation(s) allocated from:", f.bytes, f.count)?;
            write_frames(f, out)?;
        }
    }
    for p in f.processes.iter().take(PROCESSES) {
        writeln!(out, "  in {}", process_text(p))?;
    }
    if f.processes.len() > PROCESSES {
        writeln!(out, "  and {} more process(es)", f.processes.len() - PROCESSES)?;
    }
    if !fail_on.contains(&f.kind) {
        writeln!(out, "  reported only: fail_on does not name {} leaks", f.kind.name())?;
    }
    Ok(())
}

fn write_frames(f: &Finding, out: &mut dyn Write) -> io::Result<()> {
    if f.frames.is_empty() {
        // Sites without frames are told apart by size, so one finding's allocations are all alike.
        let each = f.bytes.checked_div(f.count).map(|b| format!(", {b} byte(s) each")).unwrap_or_default();
        return writeln!(out, "    (no stack recorded: {}{each})", f.what);
    }
    for (i, frame) in f.frames.iter().take(FRAMES).enumerate() {
        writeln!(out, "    {}", frame.text(i))?;
    }
    if f.frames.len() > FRAMES {
        writeln!(out, "    ... {} more frame(s)", f.frames.len() - FRAMES)?;
    }
    if f.hidden_frames > 0 {
        writeln!(out, "    ({} frame(s) of the interpreter, the test runner and cupool not shown)", f.hidden_frames)?;
    }
    Ok(())
}

pub fn process_text(p: &ProcessRef) -> String {
    let argv: Vec<String> = p.cmdline.split(' ').map(String::from).collect();
    let rank = p.rank.map(|r| format!(" (rank {r})")).unwrap_or_default();
    format!("pid {}{rank}: {}", p.pid, short_cmdline(&argv, 60))
}

/// One line for what the default suppressions matched: memory libraries
/// keep until exit on purpose.
fn write_known_caches(f: &Findings, out: &mut dyn Write) -> io::Result<()> {
    let (held, names) = super::suppress::known_caches(f);
    if names.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "cupool: held at exit by known caches: {} byte(s) ({}) in {} allocation(s) ({}); not leaks",
        held.bytes,
        human_bytes(held.bytes),
        held.allocations,
        names.join(", ")
    )
}

fn write_suppressions(f: &Findings, out: &mut dyn Write) -> io::Result<()> {
    if f.suppressions_used.is_empty() {
        return Ok(());
    }
    let rule = "-----------------------------------------------------";
    writeln!(out, "{rule}")?;
    writeln!(out, "Suppressions used:")?;
    writeln!(out, "  count      bytes template")?;
    for u in &f.suppressions_used {
        writeln!(out, "{:>7} {:>10} {} ({})", u.allocations, u.bytes, u.pattern, u.source)?;
    }
    writeln!(out, "{rule}")
}
