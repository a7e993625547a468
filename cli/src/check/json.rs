//! `cupool check --json FILE`: the findings as one JSON document, schema
//! `cupool-check` (docs/check-findings.schema.json, described in
//! docs/check-findings.md).

use super::finding::{Finding, Findings, ProcessRef, SuppressionUse};
use super::finding::{Over, Peaks};
use serde::Serialize;
use std::path::Path;

/// The `schema` of the document.
pub const SCHEMA: &str = "cupool-check";
/// Its version: a change that could break a reader raises it.
pub const VERSION: u32 = 1;

#[derive(Serialize)]
struct Document<'a> {
    schema: &'static str,
    version: u32,
    cupool_version: &'static str,
    summary: Summary,
    findings: Vec<Shown<'a>>,
    suppressions_used: &'a [SuppressionUse],
    processes: &'a [ProcessRef],
    notes: &'a [String],
    /// Each test's and process's peak: what `--baseline` reads back.
    peaks: &'a Peaks,
    budgets: &'a [Over],
}

/// What a CI script checks first, without walking the findings.
#[derive(Serialize)]
struct Summary {
    failing: u64,
    /// The verdict's: each allocation once, however many findings name it.
    failing_bytes: u64,
    failing_allocations: u64,
    fails: bool,
    suppressed: u64,
    /// Peaks over their budgets.
    over_budget: u64,
}

#[derive(Serialize)]
struct Shown<'a> {
    rule: &'static str,
    fingerprint: String,
    #[serde(flatten)]
    finding: &'a Finding,
    /// Index into `frames` of `Finding::user_frame`.
    #[serde(skip_serializing_if = "Option::is_none")]
    user_frame: Option<usize>,
}

/// The document for `findings`.
pub fn to_value(findings: &Findings) -> serde_json::Value {
    let failing: Vec<&Finding> = findings.failing().collect();
    let doc = Document {
        schema: SCHEMA,
        version: VERSION,
        cupool_version: env!("CARGO_PKG_VERSION"),
        summary: Summary {
            failing: failing.len() as u64,
            failing_bytes: findings.verdict.leaked_bytes,
            failing_allocations: findings.verdict.leaked_allocations,
            fails: findings.verdict.fails,
            suppressed: (findings.findings.len() - failing.len()) as u64,
            over_budget: findings.budgets.len() as u64,
        },
        findings: findings
            .findings
            .iter()
            .map(|f| Shown {
                rule: f.kind.rule_id(),
                fingerprint: f.fingerprint(),
                finding: f,
                user_frame: f.user_frame().and_then(|u| f.frames.iter().position(|x| std::ptr::eq(x, u))),
            })
            .collect(),
        suppressions_used: &findings.suppressions_used,
        processes: &findings.processes,
        notes: &findings.notes,
        peaks: &findings.peaks,
        budgets: &findings.budgets,
    };
    serde_json::to_value(doc).expect("findings serialize")
}

/// Writes the document to `path` (pretty-printed, with a final newline).
pub fn write(findings: &Findings, path: &Path) -> std::io::Result<()> {
    let mut text = serde_json::to_string_pretty(&to_value(findings)).expect("a value serializes");
    text.push('\n');
    std::fs::write(path, text)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::check::finding::{Budget, ProcessPeak, TestPeak};
    use crate::check::finding::{Growth, LeakKind};
    use crate::sites::ShownFrame;

    fn py(function: &str, file: &str, line: u32) -> ShownFrame {
        ShownFrame::python(function, file, line)
    }

    fn native(function: Option<&str>, file: Option<&str>, line: Option<u32>, module: &str, offset: u64) -> ShownFrame {
        ShownFrame {
            lang: "native",
            function: function.map(Into::into),
            file: file.map(Into::into),
            line,
            module: Some(module.into()),
            offset: Some(offset),
        }
    }

    /// Findings that use every field the outputs write: one of each kind, a
    /// suppressed one, frames with and without files and lines, a rank.
    pub(crate) fn sample() -> Findings {
        let train = ProcessRef { pid: 4242, rank: Some(0), cmdline: "python train.py --epochs 3".into() };
        let worker = ProcessRef { pid: 4243, rank: None, cmdline: "python -m pytest -n 2".into() };
        Findings {
            findings: vec![
                Finding {
                    kind: LeakKind::Exit,
                    bytes: 64 << 20,
                    count: 2,
                    frames: vec![
                        py("allocate", "/usr/lib/python3.11/site-packages/torch/cuda/memory.py", 80),
                        py("build_cache", "/work/repo/src/model/cache.py", 41),
                        py("<module>", "/work/repo/train.py", 12),
                        native(Some("cudaMalloc"), None, None, "libcudart.so.13", 0x5620),
                    ],
                    what: "cudaMalloc (device)".into(),
                    processes: vec![train.clone()],
                    test: None,
                    growth: None,
                    freed_later: false,
                    suppressed_by: None,
                    holdings: Vec::new(),
                    hidden_frames: 0,
                },
                Finding {
                    kind: LeakKind::Growth,
                    bytes: 12 << 20,
                    count: 12,
                    frames: vec![native(
                        Some("grow_buffers(int)"),
                        Some("/work/repo/csrc/buffers.cu"),
                        Some(7),
                        "prog",
                        0x1189,
                    )],
                    what: "cuMemAlloc_v2 (device)".into(),
                    processes: vec![train.clone()],
                    test: None,
                    growth: Some(Growth {
                        bytes_per_phase: 1 << 20,
                        phases: 12,
                        phases_from: "nvtx".into(),
                        phase: "epoch #".into(),
                        sites: 1,
                    }),
                    freed_later: true,
                    suppressed_by: None,
                    holdings: Vec::new(),
                    hidden_frames: 0,
                },
                Finding {
                    kind: LeakKind::Test,
                    bytes: 3 << 20,
                    count: 1,
                    frames: vec![py("test_leak", "/work/repo/tests/test_a,b:c.py", 9)],
                    what: "device memory the test left allocated".into(),
                    processes: vec![worker.clone()],
                    test: Some("tests/test_a,b:c.py::test_leak[50%]".into()),
                    growth: None,
                    freed_later: false,
                    suppressed_by: None,
                    holdings: Vec::new(),
                    hidden_frames: 0,
                },
                Finding {
                    kind: LeakKind::Test,
                    bytes: 4096,
                    count: 0,
                    frames: Vec::new(),
                    what: "device memory the test left allocated".into(),
                    processes: vec![worker.clone()],
                    test: Some("tests/test_b.py::test_cached".into()),
                    growth: None,
                    freed_later: false,
                    suppressed_by: None,
                    holdings: Vec::new(),
                    hidden_frames: 0,
                },
                Finding {
                    kind: LeakKind::Exit,
                    bytes: 32 << 20,
                    count: 1,
                    frames: vec![native(None, None, None, "libcublas.so.13", 0x10)],
                    what: "cudaMalloc (device)".into(),
                    processes: vec![train.clone(), worker.clone()],
                    test: None,
                    growth: None,
                    freed_later: false,
                    suppressed_by: Some("leak:libcublas".into()),
                    holdings: Vec::new(),
                    hidden_frames: 0,
                },
            ],
            suppressions_used: vec![SuppressionUse {
                pattern: "leak:libcublas".into(),
                source: "default".into(),
                findings: 1,
                allocations: 1,
                bytes: 32 << 20,
            }],
            verdict: Default::default(),
            suppressed: Default::default(),
            processes: vec![train.clone(), worker.clone()],
            notes: vec!["pid 4243: python 3.14 frames cannot be read".into()],
            peaks: Peaks {
                tests: vec![TestPeak {
                    test: "tests/test_models.py::test_big_batch".into(),
                    bytes: 700 << 20,
                    limit: Some("512 MiB".into()),
                    process: worker.clone(),
                }],
                processes: vec![ProcessPeak {
                    process: train.clone(),
                    cmdline: train.cmdline.clone(),
                    rank: train.rank,
                    device: 0,
                    bytes: 6 << 30,
                }],
            },
            budgets: vec![Over {
                budget: Budget::TestLimit,
                what: "test tests/test_models.py::test_big_batch".into(),
                bytes: 700 << 20,
                allowed: 512 << 20,
                baseline: None,
            }],
        }
        .judged(&cupool_core::options::Options::default())
    }

    fn schema() -> serde_json::Value {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/check-findings.schema.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).expect("the schema is JSON")
    }

    fn assert_valid(schema: &serde_json::Value, doc: &serde_json::Value) {
        let v = jsonschema::draft202012::new(schema).expect("a valid draft 2020-12 schema");
        let errors: Vec<String> = v.iter_errors(doc).map(|e| format!("{} at {}", e, e.instance_path())).collect();
        assert!(errors.is_empty(), "{}\n{doc:#}", errors.join("\n"));
    }

    #[test]
    fn written_findings_validate_against_the_documented_schema() {
        let schema = schema();
        assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
        let dir = std::env::temp_dir().join(format!("cupool-json-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, findings) in [("sample", sample()), ("empty", Findings::default())] {
            let path = dir.join(format!("{name}.json"));
            write(&findings, &path).unwrap();
            let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert_valid(&schema, &doc);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_schema_rejects_what_it_does_not_describe() {
        // additionalProperties: false all the way down, so a field added to
        // the model without the schema fails the test above.
        let schema = schema();
        let v = jsonschema::draft202012::new(&schema).unwrap();
        let good = to_value(&sample());
        let mut extra = good.clone();
        extra["findings"][0]["frames"][0]["column"] = 3.into();
        assert!(!v.is_valid(&extra));
        let mut kind = good.clone();
        kind["findings"][1]["kind"] = "leakish".into();
        assert!(!v.is_valid(&kind));
        let mut rule = good.clone();
        rule["findings"][0]["rule"] = "cupool/test-leak".into(); // an exit finding
        assert!(!v.is_valid(&rule));
        let mut freed = good;
        freed["findings"][0]["freed_later"] = true.into(); // only growth leaks are freed later
        assert!(!v.is_valid(&freed));
    }

    #[test]
    fn golden() {
        let got = serde_json::to_string_pretty(&to_value(&sample())).unwrap() + "\n";
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/check.json");
        check_golden(&path, &got.replace(env!("CARGO_PKG_VERSION"), "VERSION"));
    }

    /// Compares `got` with the file at `path`; `CUPOOL_BLESS=1` writes it instead.
    pub(crate) fn check_golden(path: &Path, got: &str) {
        if std::env::var_os("CUPOOL_BLESS").is_some_and(|v| v == "1") {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, got).unwrap();
            return;
        }
        let want = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{}: {e} (CUPOOL_BLESS=1 writes it)", path.display()));
        if want != got {
            let line = want
                .lines()
                .zip(got.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(want.lines().count().min(got.lines().count()));
            panic!(
                "{} differs from the output from line {} on (CUPOOL_BLESS=1 rewrites it after a deliberate change):\n--- want\n{}\n--- got\n{}",
                path.display(),
                line + 1,
                want.lines().skip(line).take(8).collect::<Vec<_>>().join("\n"),
                got.lines().skip(line).take(8).collect::<Vec<_>>().join("\n")
            );
        }
    }
}
