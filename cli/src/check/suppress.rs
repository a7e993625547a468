//! Suppressions in LeakSanitizer's syntax: `leak:PATTERN` lines, matched
//! against every frame's function, module and file. cupool ships a default
//! file (`default.supp`: caches and long-lived state of known libraries);
//! `--suppressions FILE` adds more.

use super::finding::{Findings, LeakKind, Totals};
use std::path::{Path, PathBuf};

/// Where the shipped rules come from, in reports.
pub const DEFAULT_SOURCE: &str = "default";

const DEFAULT_TEXT: &str = include_str!("default.supp");

/// One `leak:PATTERN` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub pattern: String,
    /// [`DEFAULT_SOURCE`], or the file it came from.
    pub source: String,
}

impl Rule {
    pub fn is_default(&self) -> bool {
        self.source == DEFAULT_SOURCE
    }

    /// The default rules describe memory held *at exit*. Applied to growth,
    /// they would hide a tensor leaked into PyTorch's cache, which only
    /// growth can see; applied to a test leak, they would hide what the
    /// pytest plugin measured with the framework's own tensor counters (a
    /// leaked tensor is allocated by that framework's allocator, which they
    /// name). A user's rule applies to every kind.
    fn applies_to(&self, kind: LeakKind) -> bool {
        !self.is_default() || kind == LeakKind::Exit
    }
}

#[derive(Clone, Debug, Default)]
pub struct Suppressions {
    /// The defaults first: what they match is a known cache whatever else matches it.
    rules: Vec<Rule>,
}

impl Suppressions {
    /// The default rules and those of `files`, or one line naming the file
    /// (and line) that cannot be used and why.
    pub fn load(files: &[PathBuf]) -> Result<Suppressions, String> {
        let mut rules = parse(DEFAULT_TEXT, DEFAULT_SOURCE).map_err(|e| format!("default suppressions: {e}"))?;
        for file in files {
            let text = read(file)?;
            let source = file.display().to_string();
            let mine = parse(&text, &source).map_err(|e| format!("{source}:{e}"))?;
            if mine.is_empty() {
                return Err(format!("{source}: no suppressions in the file (expected lines leak:PATTERN)"));
            }
            rules.extend(mine);
        }
        Ok(Suppressions { rules })
    }

    /// The first rule that applies to `kind` and matches one of `texts`
    /// (the functions, modules and files of a finding's frames).
    pub fn matching(&self, kind: LeakKind, texts: &[&str]) -> Option<&Rule> {
        self.rules.iter().filter(|r| r.applies_to(kind)).find(|r| texts.iter().any(|t| matches(&r.pattern, t)))
    }
}

fn read(file: &Path) -> Result<String, String> {
    let bytes =
        std::fs::read(file).map_err(|e| format!("{}: cannot read the suppressions file: {e}", file.display()))?;
    String::from_utf8(bytes).map_err(|_| format!("{}: not a text file (expected lines leak:PATTERN)", file.display()))
}

/// The rules of one file; an error is `LINE: what is wrong`.
fn parse(text: &str, source: &str) -> Result<Vec<Rule>, String> {
    let mut rules = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let n = i + 1;
        let Some((kind, pattern)) = line.split_once(':') else {
            return Err(format!("{n}: '{line}' is not a suppression (expected leak:PATTERN)"));
        };
        if kind.trim() != "leak" {
            return Err(format!(
                "{n}: unsupported suppression type '{}' (cupool reads leak:PATTERN only)",
                kind.trim()
            ));
        }
        let pattern = pattern.trim();
        if pattern.is_empty() || pattern.chars().all(|c| matches!(c, '*' | '^' | '$')) {
            return Err(format!("{n}: '{line}' would suppress every leak (no text to match)"));
        }
        rules.push(Rule { pattern: pattern.to_string(), source: source.to_string() });
    }
    Ok(rules)
}

/// LeakSanitizer's template match: `text` contains the pattern, where `*`
/// stands for any run of characters, a leading `^` anchors it at the start
/// and a trailing `$` at the end. An empty text matches nothing.
pub fn matches(pattern: &str, text: &str) -> bool {
    if text.is_empty() {
        return false;
    }
    let (start, rest) = match pattern.strip_prefix('^') {
        Some(r) => (true, r),
        None => (false, pattern),
    };
    let (end, body) = match rest.strip_suffix('$') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let parts: Vec<&str> = body.split('*').collect();
    let mut at = 0;
    for (i, part) in parts.iter().enumerate() {
        let first = i == 0;
        let last = i == parts.len() - 1;
        if last && end {
            // The last piece must end the text, after what matched so far.
            let Some(from) = text.len().checked_sub(part.len()) else { return false };
            return from >= at && text.ends_with(part) && !(first && start && from != 0);
        }
        if first && start {
            if !text.starts_with(part) {
                return false;
            }
            at = part.len();
            continue;
        }
        match text[at..].find(part) {
            Some(p) => at += p + part.len(),
            None => return false,
        }
    }
    true
}

/// What the shipped suppressions matched in `f` (memory known libraries
/// keep until exit on purpose), each allocation once, and their patterns.
pub fn known_caches(f: &Findings) -> (Totals, Vec<&str>) {
    let patterns: Vec<&str> =
        f.suppressions_used.iter().filter(|u| u.source == DEFAULT_SOURCE).map(|u| u.pattern.as_str()).collect();
    let matched = f.findings.iter().filter(|x| x.suppressed_by.as_deref().is_some_and(|p| patterns.contains(&p)));
    (Totals::of(matched), patterns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_in_leaksanitizer() {
        let yes = [
            ("libc10_cuda.so", "libc10_cuda.so"),
            ("c10", "/opt/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so"),
            ("^lib", "libnccl.so.2"),
            ("so.2$", "libnccl.so.2"),
            ("^libnccl.so.2$", "libnccl.so.2"),
            ("lib*cuda", "libc10_cuda.so"),
            ("^*nccl", "libnccl.so"),
            ("cache*", "cache"),
            ("a$", "aba"),
            ("^a*a$", "aba"),
            ("^cudart::", "cudart::globalState::initializeDriver()"),
        ];
        for (p, t) in yes {
            assert!(matches(p, t), "{p:?} should match {t:?}");
        }
        let no = [
            ("^c10", "libc10_cuda.so"),
            ("cuda$", "libc10_cuda.so"),
            ("lib*nccl*3", "libnccl.so.2"),
            ("^aba$", "abab"),
            ("^ab*ba$", "aba"),
            ("x", ""),
            ("libcuda.so", "libcudart.so.13"),
        ];
        for (p, t) in no {
            assert!(!matches(p, t), "{p:?} should not match {t:?}");
        }
    }

    #[test]
    fn files_are_read_with_comments_and_blank_lines() {
        let rules = parse("# mine\n\n  leak:my_cache  \nleak:^init_\n", "my.supp").unwrap();
        let patterns: Vec<&str> = rules.iter().map(|r| r.pattern.as_str()).collect();
        assert_eq!(patterns, ["my_cache", "^init_"]);
        assert!(rules.iter().all(|r| r.source == "my.supp" && !r.is_default()));
    }

    #[test]
    fn bad_lines_are_named() {
        assert_eq!(
            parse("leak:a\nrace:b\n", "f").unwrap_err(),
            "2: unsupported suppression type 'race' (cupool reads leak:PATTERN only)"
        );
        assert_eq!(
            parse("just a word", "f").unwrap_err(),
            "1: 'just a word' is not a suppression (expected leak:PATTERN)"
        );
        assert!(parse("leak:*", "f").unwrap_err().contains("every leak"));
        assert!(parse("leak:", "f").unwrap_err().starts_with("1: "));
    }

    #[test]
    fn the_default_file_reads_and_covers_the_known_caches() {
        let s = Suppressions::load(&[]).unwrap();
        for module in [
            "libc10_cuda.so",
            "libcublasLt.so.12",
            "libcudnn_engines_precompiled.so.9",
            "libnccl.so.2",
            "/x/site-packages/cupy_backends/cuda/api/runtime.cpython-312-x86_64-linux-gnu.so",
            "/x/site-packages/cupy/cuda/memory.cpython-312-x86_64-linux-gnu.so",
            "/x/site-packages/jaxlib/xla_extension.so",
            "/x/site-packages/jax_plugins/xla_cuda12/xla_cuda_plugin.so",
            "libcudart.so.13",
        ] {
            assert!(s.matching(LeakKind::Exit, &[module]).is_some_and(Rule::is_default), "{module}");
            assert!(s.matching(LeakKind::Test, &[module]).is_none(), "{module}: defaults never hide a test's leak");
            assert!(s.matching(LeakKind::Growth, &[module]).is_none(), "{module}: defaults never hide growth");
        }
        for user in ["main", "prog_leak", "/src/train.py", "libmylib.so", "cudaish_helper"] {
            assert!(s.matching(LeakKind::Exit, &[user]).is_none(), "{user}");
        }
    }

    #[test]
    fn a_users_rules_come_after_the_defaults_and_apply_to_every_kind() {
        let dir = std::env::temp_dir().join(format!("cupool-supp-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("mine.supp");
        std::fs::write(&file, "leak:my_pool\nleak:libc10\n").unwrap();
        let s = Suppressions::load(std::slice::from_ref(&file)).unwrap();
        let rule = s.matching(LeakKind::Growth, &["main", "my_pool_grow"]).unwrap();
        assert_eq!((rule.pattern.as_str(), rule.source.as_str()), ("my_pool", file.to_str().unwrap()));
        assert!(s.matching(LeakKind::Exit, &["libc10_cuda.so"]).unwrap().is_default());
        assert_eq!(s.matching(LeakKind::Growth, &["libc10_cuda.so"]).unwrap().pattern, "libc10");

        std::fs::write(&file, "leak:ok\nleak\n").unwrap();
        let e = Suppressions::load(std::slice::from_ref(&file)).unwrap_err();
        assert!(e.starts_with(&format!("{}:2: ", file.display())), "{e}");
        std::fs::write(&file, "# nothing\n").unwrap();
        assert!(Suppressions::load(std::slice::from_ref(&file)).unwrap_err().contains("no suppressions"));
        let missing = dir.join("missing.supp");
        let e = Suppressions::load(std::slice::from_ref(&missing)).unwrap_err();
        assert!(e.starts_with(&format!("{}: cannot read", missing.display())), "{e}");
        std::fs::write(&file, [0xff, 0xfe, 0x00]).unwrap();
        assert!(Suppressions::load(std::slice::from_ref(&file)).unwrap_err().contains("not a text file"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
