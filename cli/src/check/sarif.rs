//! `cupool check --sarif FILE`: SARIF 2.1.0 for GitHub code scanning
//! (`github/codeql-action/upload-sarif`) and other SARIF viewers.
//!
//! One run; the three rules always listed, with ids from
//! `LeakKind::rule_id`; one result per finding. Unsuppressed findings are
//! `error`s; suppressed ones stay on record as `note`s carrying a SARIF
//! suppression (viewers that honour suppressions hide them), so a suppressed
//! leak never becomes an error alert. Every result has a location (see [`source`]), relative to the
//! workspace (`$GITHUB_WORKSPACE`, else the current directory) under
//! `uriBaseId` `%SRCROOT%` when it lies inside, else an absolute `file:` URI.

use super::finding::{Finding, Findings, LeakKind};
use crate::units::human_bytes;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

pub const SARIF_SCHEMA: &str =
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json";
/// Where a reader of an alert learns about the tool: the package's page.
pub const INFORMATION_URI: &str = "https://pypi.org/project/cupool/";
/// The `partialFingerprints` key; the suffix names the fingerprint's recipe.
pub const FINGERPRINT_KEY: &str = "cupoolLeak/v1";
const SRCROOT: &str = "%SRCROOT%";

/// Per kind: (name, short description, full description, help).
fn rule_text(kind: LeakKind) -> (&'static str, &'static str, &'static str, &'static str) {
    match kind {
        LeakKind::Exit => (
            "ExitLeak",
            "Device memory still allocated at exit",
            "A CUDA device allocation was still live when its context was destroyed (cudaDeviceReset, \
             cuCtxDestroy) or when the process ended.",
            "Free the allocation, or drop the last reference to the tensor or array that owns it, before the \
             process ends. Memory kept on purpose until exit (a framework's cache, library workspaces) can be \
             suppressed with a `leak:PATTERN` line naming its site.",
        ),
        LeakKind::Growth => (
            "GrowthLeak",
            "Device memory that keeps growing across repeated phases",
            "The bytes live from one allocation site rose across the repeated phases of the run (NVTX ranges, \
             cupool phases or marks, or a repeating pattern of allocations) and were not given back: memory \
             that grows with the length of the run.",
            "Find what keeps the memory of each step alive: a list that collects tensors (loss history kept on \
             the device, outputs kept with their graph), a cache without a bound. If the growth is wanted, \
             suppress the site with a `leak:PATTERN` line.",
        ),
        LeakKind::Test => (
            "TestLeak",
            "Device memory a test left allocated",
            "Device memory allocated during one pytest test (its function-scoped fixtures included, fixtures of \
             wider scope left out) and still live after the test and its teardown, after garbage collection.",
            "Release what the test allocated before it returns: delete or scope the tensors, close what holds \
             them, and do not keep device memory in module globals. Mark a test that leaks on purpose with \
             @pytest.mark.cupool_no_leak_check.",
        ),
    }
}

const KINDS: [LeakKind; 3] = [LeakKind::Exit, LeakKind::Growth, LeakKind::Test];

/// The directory paths are made relative to: `$GITHUB_WORKSPACE`, else the current directory.
pub fn workspace_root() -> PathBuf {
    std::env::var_os("GITHUB_WORKSPACE")
        .filter(|w| !w.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Writes the SARIF log for `findings` to `path`, paths relative to [`workspace_root`].
pub fn write(findings: &Findings, path: &Path) -> std::io::Result<()> {
    let mut text = serde_json::to_string_pretty(&document(findings, &workspace_root())).expect("a value serializes");
    text.push('\n');
    std::fs::write(path, text)
}

/// The SARIF log, with paths relative to `root` where they lie under it.
pub fn document(findings: &Findings, root: &Path) -> Value {
    let rules: Vec<Value> = KINDS
        .iter()
        .map(|&k| {
            let (name, short, full, help) = rule_text(k);
            json!({
                "id": k.rule_id(),
                "name": name,
                "shortDescription": { "text": short },
                "fullDescription": { "text": full },
                "help": { "text": help.replace('`', ""), "markdown": help },
                "defaultConfiguration": { "level": "error" },
                "properties": { "tags": ["memory", "cuda", "leak"] }
            })
        })
        .collect();
    let results: Vec<Value> = findings.findings.iter().map(|f| result(f, root)).collect();
    let notifications: Vec<Value> =
        findings.notes.iter().map(|n| json!({ "level": "warning", "message": { "text": n } })).collect();
    json!({
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": {
                "name": "cupool",
                "informationUri": INFORMATION_URI,
                "version": env!("CARGO_PKG_VERSION"),
                "semanticVersion": env!("CARGO_PKG_VERSION"),
                "rules": rules,
            }},
            "originalUriBaseIds": { SRCROOT: { "uri": file_uri(root, true) } },
            "invocations": [{ "executionSuccessful": true, "toolExecutionNotifications": notifications }],
            "results": results,
            // The verdict's figures, each allocation once, as every other output gives them.
            "properties": {
                "failing_bytes": findings.verdict.leaked_bytes,
                "failing_allocations": findings.verdict.leaked_allocations,
                "fails": findings.verdict.fails,
            },
        }]
    })
}

fn result(f: &Finding, root: &Path) -> Value {
    let mut r = json!({
        "ruleId": f.kind.rule_id(),
        "ruleIndex": KINDS.iter().position(|&k| k == f.kind).unwrap_or(0),
        "kind": "fail",
        "level": if f.suppressed_by.is_some() { "note" } else { "error" },
        "message": { "text": message(f) },
        "partialFingerprints": { FINGERPRINT_KEY: f.fingerprint() },
    });
    let src = source(f, root);
    r["locations"] = json!([{ "physicalLocation": physical(&src.path, src.relative, Some(src.line.unwrap_or(1))) }]);
    if !f.frames.is_empty() {
        let frames: Vec<Value> = f
            .frames
            .iter()
            .enumerate()
            .map(|(i, frame)| {
                let mut location = json!({ "message": { "text": frame.text(i) } });
                if let Some(file) = &frame.file {
                    let (path, relative) = relative_to(file, root);
                    location["physicalLocation"] = physical(&path, relative, frame.line);
                }
                let mut v = json!({ "location": location });
                if let Some(m) = &frame.module {
                    v["module"] = json!(m);
                }
                v
            })
            .collect();
        r["stacks"] = json!([{ "message": { "text": "allocation site" }, "frames": frames }]);
    }
    if let Some(pattern) = &f.suppressed_by {
        r["suppressions"] = json!([{
            "kind": "external",
            "status": "accepted",
            "justification": format!("matched the cupool suppression {pattern}"),
        }]);
    }
    let mut props = json!({ "bytes": f.bytes, "count": f.count, "processes": f.processes });
    if let Some(t) = &f.test {
        props["test"] = json!(t);
    }
    if let Some(g) = &f.growth {
        props["growth"] = json!(g);
    }
    if f.freed_later {
        props["freed_later"] = json!(true);
    }
    r["properties"] = props;
    r
}

fn physical(path: &str, relative: bool, line: Option<u32>) -> Value {
    let mut artifact = json!({ "uri": if relative { encode(path) } else { file_uri(Path::new(path), false) } });
    if relative {
        artifact["uriBaseId"] = json!(SRCROOT);
    }
    let mut v = json!({ "artifactLocation": artifact });
    if let Some(line) = line.filter(|&l| l > 0) {
        v["region"] = json!({ "startLine": line });
    }
    v
}

/// Where a finding points in the source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// Relative to the workspace (with `/`) when `relative`, else as recorded.
    pub path: String,
    pub relative: bool,
    pub line: Option<u32>,
}

/// Where a finding is shown. Code scanning rejects a whole file when one
/// result has no location, so every finding gets one: its innermost user
/// frame; else, for a test leak, its test file (pytest node ids start with
/// it, relative to the rootdir); else its first frame with a file; else the
/// program it ran in (the first `.py` word of the command line, else its
/// first word), at line 1.
pub fn source(f: &Finding, root: &Path) -> Source {
    let test_file = || f.test.as_deref().and_then(|t| t.split("::").next()).filter(|p| !p.is_empty());
    let (file, line) = match f.user_frame().and_then(|u| Some((u.file.as_deref()?, u.line))) {
        Some(found) => found,
        None => match test_file() {
            Some(file) => (file, None),
            None => match f.frames.iter().find_map(|fr| Some((fr.file.as_deref()?, fr.line))) {
                Some(found) => found,
                None => (program(f), None),
            },
        },
    };
    let (path, relative) = relative_to(file, root);
    Source { path, relative, line }
}

fn program(f: &Finding) -> &str {
    let cmdline = f.processes.first().map(|p| p.cmdline.as_str()).unwrap_or("");
    let mut words = cmdline.split_whitespace();
    cmdline.split_whitespace().find(|w| w.ends_with(".py")).or_else(|| words.next()).unwrap_or("<unknown>")
}

/// `file` relative to `root` (the path as it is when it is relative already),
/// or as it is, with `false`, when it lies elsewhere.
pub fn relative_to(file: &str, root: &Path) -> (String, bool) {
    let p = Path::new(file);
    if p.is_relative() {
        return (file.trim_start_matches("./").to_string(), true);
    }
    let canonical = std::fs::canonicalize(root).ok();
    for r in std::iter::once(root).chain(canonical.as_deref()) {
        if let Ok(rest) = p.strip_prefix(r) {
            if !rest.as_os_str().is_empty() {
                return (rest.to_string_lossy().into_owned(), true);
            }
        }
    }
    (file.to_string(), false)
}

/// Percent-encodes all but unreserved characters and `/`, so that a path
/// reads as a relative reference (a `:` in a first segment would be a scheme).
fn encode(path: &str) -> String {
    let mut s = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

fn file_uri(path: &Path, dir: bool) -> String {
    let mut s = format!("file://{}", encode(&path.to_string_lossy()));
    if dir && !s.ends_with('/') {
        s.push('/');
    }
    s
}

/// One sentence for a finding: what leaked, how much, where it ran.
pub fn message(f: &Finding) -> String {
    let what = match f.kind {
        LeakKind::Exit => format!("{} in {} allocation(s) still allocated at exit", human_bytes(f.bytes), f.count),
        LeakKind::Growth => match &f.growth {
            Some(g) => format!(
                "{} live{} from one site that grew by {} per phase over {} phases ({})",
                human_bytes(f.bytes),
                if f.freed_later { " at the last phase" } else { "" },
                human_bytes(g.bytes_per_phase),
                g.phases,
                g.phases_from
            ),
            None => format!("{} live from one site that kept growing", human_bytes(f.bytes)),
        },
        LeakKind::Test => format!(
            "{}{} allocated by test {} and still live after it",
            human_bytes(f.bytes),
            if f.count > 0 { format!(" in {} allocation(s)", f.count) } else { String::new() },
            f.test.as_deref().unwrap_or("?")
        ),
    };
    let mut s = format!("{what}, in {}", processes(f));
    if f.freed_later {
        s.push_str(&format!("; {}", super::text::FREED_LATER));
    }
    if let Some(p) = &f.suppressed_by {
        s.push_str(&format!(" (suppressed by {p})"));
    }
    s
}

/// `pid 4242 (rank 0: python train.py)`, or `3 processes (pids 1, 2, 3)`.
pub fn processes(f: &Finding) -> String {
    match f.processes.as_slice() {
        [p] => {
            let rank = p.rank.map(|r| format!("rank {r}: ")).unwrap_or_default();
            if p.cmdline.is_empty() && rank.is_empty() {
                format!("pid {}", p.pid)
            } else {
                format!("pid {} ({rank}{})", p.pid, p.cmdline).replace(": )", ")")
            }
        }
        ps => {
            let pids: Vec<String> = ps.iter().take(8).map(|p| p.pid.to_string()).collect();
            let more = if ps.len() > 8 { ", ..." } else { "" };
            format!("{} processes (pids {}{more})", ps.len(), pids.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::json::tests::{check_golden, sample};
    use std::process::Command;

    const ROOT: &str = "/work/repo";

    #[test]
    fn golden() {
        let got = serde_json::to_string_pretty(&document(&sample(), Path::new(ROOT))).unwrap() + "\n";
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/check.sarif");
        check_golden(&path, &got.replace(env!("CARGO_PKG_VERSION"), "VERSION"));
    }

    #[test]
    fn what_code_scanning_reads_is_there() {
        let doc = document(&sample(), Path::new(ROOT));
        assert_eq!(doc["version"], "2.1.0");
        assert_eq!(doc["$schema"], SARIF_SCHEMA);
        let runs = doc["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 1);
        let driver = &runs[0]["tool"]["driver"];
        assert_eq!(driver["name"], "cupool");
        let ids: Vec<&str> = driver["rules"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["cupool/exit-leak", "cupool/growth-leak", "cupool/test-leak"]);
        for rule in driver["rules"].as_array().unwrap() {
            for key in ["shortDescription", "fullDescription", "help"] {
                assert!(!rule[key]["text"].as_str().unwrap().is_empty(), "{key} of {}", rule["id"]);
            }
        }
        let results = runs[0]["results"].as_array().unwrap();
        assert_eq!(results.len(), sample().findings.len());
        for (r, f) in results.iter().zip(&sample().findings) {
            assert_eq!(r["ruleId"], f.kind.rule_id());
            assert_eq!(driver["rules"][r["ruleIndex"].as_u64().unwrap() as usize]["id"], r["ruleId"]);
            assert_eq!(r["partialFingerprints"][FINGERPRINT_KEY], f.fingerprint());
            assert_eq!(r["level"], if f.suppressed_by.is_some() { "note" } else { "error" });
            assert!(!r["message"]["text"].as_str().unwrap().is_empty());
        }
        // The user frame, relative to the workspace, not the site-packages frame above it.
        let loc = &results[0]["locations"][0]["physicalLocation"];
        assert_eq!(loc["artifactLocation"]["uri"], "src/model/cache.py");
        assert_eq!(loc["artifactLocation"]["uriBaseId"], "%SRCROOT%");
        assert_eq!(loc["region"]["startLine"], 41);
        // Characters that would make a path read as a scheme are encoded.
        assert_eq!(
            results[2]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
            "tests/test_a%2Cb%3Ac.py"
        );
        // A test leak without frames points at its test file.
        let loc = &results[3]["locations"][0]["physicalLocation"];
        assert_eq!(
            (&loc["artifactLocation"]["uri"], &loc["region"]["startLine"]),
            (&json!("tests/test_b.py"), &json!(1))
        );
        // No frame with a file: the program, at line 1. Every result has a location.
        let loc = &results[4]["locations"][0]["physicalLocation"];
        assert_eq!((&loc["artifactLocation"]["uri"], &loc["region"]["startLine"]), (&json!("train.py"), &json!(1)));
        assert!(results.iter().all(|r| r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].is_string()));
        assert_eq!(results[4]["suppressions"][0]["status"], "accepted");
    }

    #[test]
    fn paths_outside_the_workspace_stay_absolute() {
        assert_eq!(relative_to("/work/repo/a/b.py", Path::new("/work/repo")), ("a/b.py".into(), true));
        assert_eq!(relative_to("/work/repo/a/b.py", Path::new("/work/repo/")), ("a/b.py".into(), true));
        assert_eq!(
            relative_to("/work/repository/b.py", Path::new("/work/repo")),
            ("/work/repository/b.py".into(), false)
        );
        assert_eq!(relative_to("./t/x.py", Path::new("/w")), ("t/x.py".into(), true));
        assert_eq!(file_uri(Path::new("/opt/my lib/x.cu"), false), "file:///opt/my%20lib/x.cu");
    }

    /// The official SARIF 2.1.0 schema (OASIS, draft-07), as shipped in the
    /// `serde-sarif` crate's sources: `cargo metadata` on a one-line manifest
    /// under target/ downloads the crate (nothing is compiled) and says where
    /// it lies. `CUPOOL_SARIF_SCHEMA=<file>` uses a copy instead.
    fn official_schema() -> Value {
        let path = match std::env::var_os("CUPOOL_SARIF_SCHEMA").filter(|p| !p.is_empty()) {
            Some(p) => PathBuf::from(p),
            None => fetch_schema(),
        };
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let schema: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            schema["title"],
            "Static Analysis Results Format (SARIF) Version 2.1.0 JSON Schema",
            "{}",
            path.display()
        );
        schema
    }

    fn fetch_schema() -> PathBuf {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/sarif-schema");
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::write(
            dir.join("Cargo.toml"),
            "[package]\nname = \"sarif-schema-carrier\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n\
             [dependencies]\nserde-sarif = \"=0.8.0\"\n\n[workspace]\n",
        )
        .unwrap();
        std::fs::write(dir.join("src/lib.rs"), "").unwrap();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--manifest-path"])
            .arg(dir.join("Cargo.toml"))
            .output()
            .expect("run cargo metadata");
        assert!(
            out.status.success(),
            "cargo metadata could not fetch the serde-sarif crate for the SARIF schema (needs crates.io once; \
             or set CUPOOL_SARIF_SCHEMA to a copy of sarif-schema-2.1.0.json):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
        let manifest = meta["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "serde-sarif")
            .and_then(|p| p["manifest_path"].as_str())
            .expect("serde-sarif in the metadata");
        Path::new(manifest).parent().unwrap().join("src/schema.json")
    }

    const LANGUAGE_PATTERN: &str = "^[a-zA-Z]{2}|^[a-zA-Z]{2}-[a-zA-Z]{2}]?$";

    fn replace_pattern(v: &mut Value, from: &str, to: &str) -> usize {
        match v {
            Value::Object(o) => {
                let mut n = 0;
                for (k, x) in o.iter_mut() {
                    if k == "pattern" && x == from {
                        *x = json!(to);
                        n += 1;
                    } else {
                        n += replace_pattern(x, from, to);
                    }
                }
                n
            }
            Value::Array(a) => a.iter_mut().map(|x| replace_pattern(x, from, to)).sum(),
            _ => 0,
        }
    }

    #[test]
    fn written_sarif_validates_against_the_official_schema() {
        let mut schema = official_schema();
        // With formats checked (the URIs cupool writes must be `uri-reference`s),
        // the schema's own patterns are checked as regexes too, and the one for
        // `language` (of a run and of a tool component; cupool writes neither)
        // is not one: it gets the form the spec describes, a language tag.
        let fixed = replace_pattern(&mut schema, LANGUAGE_PATTERN, "^[a-zA-Z]{2}(-[a-zA-Z]{2})?$");
        assert!(fixed > 0, "the schema has the pattern this works around");
        let v = jsonschema::options().should_validate_formats(true).build(&schema).expect("the SARIF schema compiles");
        let dir = std::env::temp_dir().join(format!("cupool-sarif-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, findings) in [("sample", sample()), ("empty", Findings::default())] {
            let path = dir.join(format!("{name}.sarif"));
            write(&findings, &path).unwrap();
            let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let errors: Vec<String> = v.iter_errors(&doc).map(|e| format!("{e} at {}", e.instance_path())).collect();
            assert!(errors.is_empty(), "{name}: {}", errors.join("\n"));
        }
        // The validator does reject what the schema forbids.
        let mut bad = document(&sample(), Path::new(ROOT));
        bad["runs"][0]["results"][0]["level"] = json!("fatal");
        assert!(!v.is_valid(&bad));
        // Formats are checked: a space is not allowed in a URI.
        let mut bad = document(&sample(), Path::new(ROOT));
        bad["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] =
            json!("src/a b.py");
        assert!(!v.is_valid(&bad));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
