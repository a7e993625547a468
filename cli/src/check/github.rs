//! GitHub Actions output: `::error` workflow commands (annotations on the
//! pull request's files) and a markdown table for the job's summary page
//! (`$GITHUB_STEP_SUMMARY`).

use super::finding::{Finding, Findings, LeakKind};
use super::sarif::{message, processes, source, workspace_root};
use crate::units::human_bytes;
use std::io::Write;
use std::path::Path;

/// GitHub shows at most 10 error annotations per step.
pub const MAX_ANNOTATIONS: usize = 10;
/// Rows of the summary table; the page takes 1 MiB per step.
pub const MAX_ROWS: usize = 100;
/// Frames quoted in an annotation's message.
const ANNOTATION_FRAMES: usize = 6;

/// Writes `::error` commands for the largest unsuppressed findings (at most
/// [`MAX_ANNOTATIONS`]) to `out`, file and line from each one's innermost
/// user frame relative to `$GITHUB_WORKSPACE` (else the current directory),
/// and appends the summary table to `step_summary` when given.
pub fn report(findings: &Findings, out: &mut dyn Write, step_summary: Option<&Path>) -> std::io::Result<()> {
    let root = workspace_root();
    annotations(findings, &root, out)?;
    if let Some(path) = step_summary {
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        file.write_all(summary_markdown(findings, &root).as_bytes())?;
    }
    Ok(())
}

/// The workflow commands, paths relative to `root`.
pub fn annotations(findings: &Findings, root: &Path, out: &mut dyn Write) -> std::io::Result<()> {
    let failing: Vec<&Finding> = findings.failing().collect();
    for f in failing.iter().take(MAX_ANNOTATIONS) {
        let mut props = Vec::new();
        let src = source(f, root);
        // A file outside the workspace cannot be annotated: the message names it.
        if src.relative {
            props.push(format!("file={}", property(&src.path)));
            if let Some(line) = src.line {
                props.push(format!("line={line}"));
            }
        }
        props.push(format!("title={}", property(&title(f))));
        let mut text = message(f);
        for (i, frame) in f.frames.iter().take(ANNOTATION_FRAMES).enumerate() {
            text.push('\n');
            text.push_str(&frame.text(i));
        }
        if f.frames.len() > ANNOTATION_FRAMES {
            text.push_str(&format!("\n... {} more frame(s)", f.frames.len() - ANNOTATION_FRAMES));
        }
        writeln!(out, "::error {}::{}", props.join(","), data(&text))?;
    }
    if failing.len() > MAX_ANNOTATIONS {
        let rest = &failing[MAX_ANNOTATIONS..];
        let bytes = super::finding::Totals::of(rest.iter().copied()).bytes;
        let text = format!(
            "cupool: {} more leak finding(s), {} in all, not annotated (GitHub shows {MAX_ANNOTATIONS} per step); see the job summary",
            rest.len(),
            human_bytes(bytes)
        );
        writeln!(out, "::warning title={}::{}", property("cupool"), data(&text))?;
    }
    Ok(())
}

fn kind_name(k: LeakKind) -> &'static str {
    match k {
        LeakKind::Exit => "leak at exit",
        LeakKind::Growth => "growing leak",
        LeakKind::Test => "test leak",
    }
}

fn title(f: &Finding) -> String {
    format!("cupool: {} of {}", kind_name(f.kind), human_bytes(f.bytes))
}

/// A command's message: `%`, CR and LF escaped.
pub fn data(s: &str) -> String {
    s.replace('%', "%25").replace('\r', "%0D").replace('\n', "%0A")
}

/// A command's property value: as [`data`], and `:` and `,` too.
pub fn property(s: &str) -> String {
    data(s).replace(':', "%3A").replace(',', "%2C")
}

/// The markdown appended to the job summary.
pub fn summary_markdown(findings: &Findings, root: &Path) -> String {
    let failing: Vec<&Finding> = findings.failing().collect();
    let bytes = findings.verdict.leaked_bytes;
    let mut s = String::new();
    if findings.processes.is_empty() {
        s.push_str("### cupool check: nothing was checked (no log could be read)\n\n");
    } else if failing.is_empty() {
        s.push_str("### cupool check: no leaks\n\n");
    } else {
        s.push_str(&format!("### cupool check: {} leak finding(s), {}\n\n", failing.len(), human_bytes(bytes)));
        s.push_str("| kind | bytes | allocations | where | test or process |\n|---|---:|---:|---|---|\n");
        for f in failing.iter().take(MAX_ROWS) {
            let place = match f.user_frame() {
                Some(user) => {
                    let src = source(f, root);
                    let at = match src.line {
                        Some(l) => format!("{}:{l}", src.path),
                        None => src.path,
                    };
                    match user.function.as_deref() {
                        Some(func) => format!("{} in {}", code(&at), cell(func)),
                        None => code(&at),
                    }
                }
                None => match f.frames.first() {
                    Some(frame) => code(&frame.text(0)),
                    None => format!("{} (no site recorded)", code(&source(f, root).path)),
                },
            };
            let who = match &f.test {
                Some(t) => code(t),
                None => cell(&processes(f)),
            };
            s.push_str(&format!(
                "| {}{} | {} | {} | {place} | {who} |\n",
                kind_name(f.kind),
                if f.freed_later { " (freed later)" } else { "" },
                human_bytes(f.bytes),
                if f.count > 0 { f.count.to_string() } else { "?".into() }
            ));
        }
        if failing.len() > MAX_ROWS {
            s.push_str(&format!("\n... and {} more finding(s).\n", failing.len() - MAX_ROWS));
        }
        s.push('\n');
    }
    let suppressed = findings.findings.len() - failing.len();
    if suppressed > 0 {
        let bytes = findings.suppressed.bytes;
        let used: Vec<String> = findings
            .suppressions_used
            .iter()
            .map(|u| format!("{} ({}×, {})", code(&u.pattern), u.findings, u.source))
            .collect();
        s.push_str(&format!("Suppressed: {suppressed} finding(s), {}", human_bytes(bytes)));
        if !used.is_empty() {
            s.push_str(&format!(" by {}", used.join(", ")));
        }
        s.push_str(".\n\n");
    }
    s.push_str(&budgets_markdown(findings));
    for n in &findings.notes {
        s.push_str(&format!("> cupool: {}\n", cell(n)));
    }
    if !findings.notes.is_empty() {
        s.push('\n');
    }
    s
}

/// The peaks over their budgets, and with a baseline the peaks beside it.
fn budgets_markdown(findings: &Findings) -> String {
    let mut s = String::new();
    if !findings.budgets.is_empty() {
        s.push_str(&format!("### cupool check: {} memory budget(s) exceeded\n\n", findings.budgets.len()));
        s.push_str("| what | peak | allowed | budget |\n|---|---:|---:|---|\n");
        for o in findings.budgets.iter().take(MAX_ROWS) {
            let budget = match o.budget {
                super::finding::Budget::TestLimit => "cupool_limit_memory".to_string(),
                super::finding::Budget::MaxPeakBytes => "max_peak_bytes".to_string(),
                super::finding::Budget::Baseline => format!("baseline ({})", human_bytes(o.baseline.unwrap_or(0))),
            };
            s.push_str(&format!(
                "| {} | {} | {} | {budget} |\n",
                cell(&o.what),
                human_bytes(o.bytes),
                human_bytes(o.allowed)
            ));
        }
        s.push('\n');
    }
    s
}

/// Text for a table cell: no line breaks, `|` escaped.
fn cell(s: &str) -> String {
    s.replace(['\r', '\n'], " ").replace('|', "\\|")
}

/// A code span in a table cell, fenced with more backticks than it holds.
fn code(s: &str) -> String {
    let s = cell(s);
    let mut run = 0;
    let mut longest = 0;
    for c in s.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    let pad = if longest > 0 { " " } else { "" };
    format!("{fence}{pad}{s}{pad}{fence}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::json::tests::{check_golden, sample};

    const ROOT: &str = "/work/repo";

    fn golden_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
    }

    #[test]
    fn golden_annotations() {
        let mut out = Vec::new();
        annotations(&sample(), Path::new(ROOT), &mut out).unwrap();
        check_golden(&golden_dir().join("check-annotations.txt"), &String::from_utf8(out).unwrap());
    }

    #[test]
    fn golden_summary() {
        check_golden(&golden_dir().join("check-summary.md"), &summary_markdown(&sample(), Path::new(ROOT)));
        let nothing = summary_markdown(&Findings::default(), Path::new(ROOT));
        assert_eq!(nothing, "### cupool check: nothing was checked (no log could be read)\n\n");
        let clean = Findings { processes: sample().processes, ..Default::default() };
        assert_eq!(summary_markdown(&clean, Path::new(ROOT)), "### cupool check: no leaks\n\n");
    }

    #[test]
    fn escaping_follows_the_workflow_command_rules() {
        assert_eq!(data("50% done\r\nnext: a,b"), "50%25 done%0D%0Anext: a,b");
        assert_eq!(property("tests/a,b:c.py\n"), "tests/a%2Cb%3Ac.py%0A");
        // Escaping % first: an escape is never escaped twice, nor mistaken for one.
        assert_eq!(property("%3A"), "%253A");
    }

    #[test]
    fn at_most_ten_errors_then_one_line_for_the_rest() {
        let mut findings = sample();
        let one = findings.findings[3].clone();
        findings.findings = (0..13)
            .map(|i| {
                let mut f = one.clone();
                f.test = Some(format!("tests/test_b.py::test_{i}"));
                f
            })
            .collect();
        let mut out = Vec::new();
        annotations(&findings, Path::new(ROOT), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 11, "{text}");
        assert!(lines[..10].iter().all(|l| l.starts_with("::error file=tests/test_b.py,title=")), "{text}");
        assert!(lines[10].starts_with("::warning ") && lines[10].contains("3 more leak finding(s)"), "{text}");
    }

    #[test]
    fn the_summary_is_appended_to_the_step_summary_file() {
        let dir = std::env::temp_dir().join(format!("cupool-gh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("summary.md");
        std::fs::write(&path, "earlier step\n").unwrap();
        let mut out = Vec::new();
        report(&sample(), &mut out, Some(&path)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("earlier step\n### cupool check: 4 leak finding(s)"), "{text}");
        assert_eq!(String::from_utf8(out).unwrap().lines().count(), 4);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn code_spans_survive_backticks_and_pipes() {
        assert_eq!(code("a|b"), "`a\\|b`");
        assert_eq!(code("x`y"), "`` x`y ``");
    }
}
