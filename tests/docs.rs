//! Documentation that cannot drift: the lists of options kept outside
//! `core/src/options.rs` (docs/options.md's table, the log schema's, the
//! Python package's defaults) against the declaration there, the exit
//! statuses (docs/usage.md) against the CLI's constants, README's install
//! commands, every link between the pages, the files BENCHMARKS.md cites,
//! and the length of README.md and BENCHMARKS.md. `cargo test --test docs`

use cupool_core::options::OPTION_HELP;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn repo_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The rows of the first table under `## {section}`: the first two cells, backticks removed.
fn table_rows(markdown: &str, section: &str) -> Vec<(String, String)> {
    let heading = format!("## {section}");
    let body = markdown.split_once(&heading).unwrap_or_else(|| panic!("no {heading:?}")).1;
    let body = body.split("\n## ").next().unwrap_or("");
    body.lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let cell = |i: usize| cells.get(i).copied().unwrap_or("").trim_matches('`').to_string();
            (cell(1), cell(2))
        })
        .collect()
}

/// docs/options.md's table has one row per declared option, with its default.
#[test]
fn option_table_matches_the_declaration() {
    let doc = repo_file("docs/options.md");
    let table: BTreeMap<String, String> = table_rows(&doc, "The options")
        .into_iter()
        .map(|(k, d)| (k, if d == "empty" { String::new() } else { d }))
        .collect();
    let declared: BTreeMap<String, String> =
        OPTION_HELP.iter().map(|(k, d, _)| (k.to_string(), d.to_string())).collect();
    let missing: Vec<&String> = declared.keys().filter(|k| !table.contains_key(*k)).collect();
    let unknown: Vec<&String> = table.keys().filter(|k| !declared.contains_key(*k)).collect();
    let other_default: Vec<String> = declared
        .iter()
        .filter_map(|(k, d)| table.get(k).filter(|t| *t != d).map(|t| format!("{k}: docs {t:?}, declared {d:?}")))
        .collect();
    assert!(
        missing.is_empty() && unknown.is_empty() && other_default.is_empty(),
        "docs/options.md's option table against core/src/options.rs: no row for {missing:?}; rows of no option \
         {unknown:?}; other defaults {other_default:?}"
    );
    // The declared default is what the parser reads and writes back.
    let defaults = cupool_core::options::Options::default();
    for (k, d, _) in OPTION_HELP {
        assert_eq!(cupool_core::options::value_of(&defaults, k).as_deref(), Some(*d), "{k}");
    }
}

/// Every backticked repository path in BENCHMARKS.md (a word with a `/` that starts with
/// one of the repository's top-level entries) names a file or directory that exists.
#[test]
fn benchmarks_cite_only_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = repo_file("BENCHMARKS.md");
    // Made by the commands shown, not kept in the repository.
    let outputs = ["target/", ".gpu/"];
    let mut cited = Vec::new();
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 0 {
            continue; // outside backticks
        }
        for word in span.split_whitespace() {
            let word = word.trim_end_matches([',', ';', ')', '.']);
            let Some((top, _)) = word.split_once('/') else { continue };
            if top.is_empty()
                || top.contains(['{', '*', '$', ':', '=', '"'])
                || outputs.iter().any(|o| word.starts_with(o))
            {
                continue;
            }
            cited.push(word.to_string());
        }
    }
    assert!(cited.iter().any(|c| c == "scripts/gpu-bench.sh"), "the scan finds the cited scripts: {cited:?}");
    let missing: Vec<&String> = cited.iter().filter(|c| !root.join(c.as_str()).exists()).collect();
    assert!(missing.is_empty(), "BENCHMARKS.md cites files that are not in the repository: {missing:?}");
}

/// `const NAME: u8 = N;` in `file` (a path under cli/src/).
fn constant(file: &str, name: &str) -> Option<u8> {
    let text = repo_file(&format!("cli/src/{file}"));
    let at = text.find(&format!("const {name}: u8 = "))?;
    let rest = &text[at..];
    let value = rest.split_once('=')?.1.split_once(';')?.0.trim();
    value.parse().ok()
}

/// Each row of docs/usage.md's exit statuses that names a constant of the
/// CLI gives its value, and every constant of the CLI's exit statuses has a
/// row: a status moved in the code fails here until the page says so.
#[test]
fn exit_status_table_matches_the_code() {
    let doc = repo_file("docs/usage.md");
    let rows = table_rows(&doc, "Exit statuses");
    assert!(rows.len() >= 10, "{rows:?}");
    let files = [
        ("run::exit::", "run.rs"),
        ("check::exit::", "check/mod.rs"),
        ("summary::", "summary.rs"),
        ("views::export::", "views/export.rs"),
    ];
    let mut named = Vec::new();
    for (status, name) in &rows {
        let Some((prefix, file)) = files.iter().find(|(p, _)| name.starts_with(p)) else {
            if name.contains("exitcode") {
                let default = cupool_core::options::Options::default().exitcode;
                assert_eq!(status, &default.to_string(), "the exitcode option's default");
            }
            continue;
        };
        let constant_name = &name[prefix.len()..];
        let value =
            constant(file, constant_name).unwrap_or_else(|| panic!("no const {constant_name} in cli/src/{file}"));
        assert_eq!(status, &value.to_string(), "docs/usage.md says {status} for {name}, the code {value}");
        named.push(name.clone());
    }
    for (module, file) in [("run::exit::", "run.rs"), ("check::exit::", "check/mod.rs")] {
        let text = repo_file(&format!("cli/src/{file}"));
        let body = text.split("pub mod exit {").nth(1).unwrap_or_else(|| panic!("cli/src/{file} has pub mod exit"));
        let body = body.split("\n}").next().unwrap();
        for line in body.lines() {
            if let Some(rest) = line.trim().strip_prefix("pub const ") {
                let name = format!("{module}{}", rest.split(':').next().unwrap());
                assert!(named.contains(&name), "docs/usage.md's exit statuses lack {name}");
            }
        }
    }
}

#[test]
fn readme_is_short_and_benchmarks_a_summary() {
    let readme = repo_file("README.md").lines().count();
    assert!(readme <= 250, "README.md has {readme} lines; a newcomer's page is 250 at most");
    let benchmarks = repo_file("BENCHMARKS.md").lines().count();
    assert!(benchmarks <= 300, "BENCHMARKS.md has {benchmarks} lines; where things stand is 300 at most");
}

/// The install commands README.md gives are the ones that work: the lock
/// file honoured, the wheel built where `pip install` looks, and no
/// `pip install cupool` before a release is published.
#[test]
fn readme_install_commands_work_as_written() {
    let readme = repo_file("README.md");
    for command in [
        "cargo install --locked --path cli",
        "maturin build --release --locked --out dist",
        "pip install dist/cupool-*.whl",
    ] {
        assert!(readme.contains(command), "README.md lacks {command:?}");
    }
    for page in ["README.md", "docs/install.md", "docs/check.md"] {
        let text = repo_file(page);
        let mut in_code = false;
        for line in text.lines() {
            if line.starts_with("```") {
                in_code = !in_code;
            } else if in_code {
                let words: Vec<&str> = line.split_whitespace().collect();
                let bad = words.windows(3).any(|w| w[0] == "pip" && w[1] == "install" && w[2] == "cupool");
                assert!(!bad, "{page}: {line:?} installs cupool from PyPI, where it is not published");
            }
        }
    }
}

/// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, blanks as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every relative link of README.md and docs/*.md names a file that exists,
/// and an anchor that its page has.
#[test]
fn links_between_the_pages_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (_, rest) in text.match_indices("](").map(|(i, _)| ((), &text[i + 2..])) {
            let Some(target) = rest.split(')').next() else { continue };
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let dest = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
            if !dest.exists() {
                broken.push(format!("{}: {target}: no such file", page.display()));
                continue;
            }
            if !frag.is_empty() && dest.extension().is_some_and(|x| x == "md") {
                let target_text = std::fs::read_to_string(&dest).unwrap();
                let has = target_text.lines().any(|l| l.starts_with('#') && anchor(l.trim_start_matches('#')) == frag)
                    || target_text.contains(&format!("<a id=\"{frag}\">"));
                if !has {
                    broken.push(format!("{}: {target}: no such heading", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n  {}", broken.join("\n  "));
}

/// The defaults `python/cupool/_options.py` keeps (`DEFAULTS`, for the
/// options the Python package reads) are the declared ones, and every option
/// the package reads through `option(...)` is among them.
#[test]
fn python_option_defaults_match_the_declaration() {
    const FILE: &str = "python/cupool/_options.py";
    let text = repo_file(FILE);
    let block = text
        .split_once("\nDEFAULTS = {\n")
        .and_then(|(_, rest)| rest.split_once("\n}\n"))
        .unwrap_or_else(|| panic!("{FILE} has no `DEFAULTS = {{ ... }}` dict (one `\"key\": \"default\",` per line)"))
        .0;
    let declared: BTreeMap<&str, &str> = OPTION_HELP.iter().map(|(k, d, _)| (*k, *d)).collect();
    let mut python = BTreeMap::new();
    for line in block.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let quoted: Vec<&str> = line.split('"').collect();
        let [_, key, _, value, rest] = quoted[..] else {
            panic!("{FILE}: DEFAULTS line {line:?} is not `\"key\": \"default\",`");
        };
        assert_eq!(rest, ",", "{FILE}: DEFAULTS line {line:?} is not `\"key\": \"default\",`");
        match declared.get(key) {
            None => panic!("{FILE}: DEFAULTS names {key:?}, which core/src/options.rs does not declare"),
            Some(d) => assert_eq!(
                value, *d,
                "{FILE}: DEFAULTS[{key:?}] is {value:?}, but core/src/options.rs declares the default {d:?}"
            ),
        }
        python.insert(key.to_string(), value.to_string());
    }
    assert!(!python.is_empty(), "{FILE}: DEFAULTS is empty");
    // Every option the package reads through `option(opts, "key")` has its default there.
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/cupool");
    for entry in std::fs::read_dir(&package).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "py") {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        for (i, _) in source.match_indices("option(") {
            let Some((args, _)) = source[i + "option(".len()..].split_once(')') else { continue };
            let Some((_, key)) = args.split_once(',') else { continue };
            let Some(key) = key.trim().strip_prefix('"').and_then(|k| k.strip_suffix('"')) else { continue };
            assert!(python.contains_key(key), "{} reads option {key:?}, which {FILE}'s DEFAULTS lacks", path.display());
        }
    }
}

/// The log schema's table of the `options` record lists exactly the
/// options a log records (those the CLI alone reads are not recorded).
#[test]
fn log_schema_lists_the_recorded_options() {
    let schema = repo_file("docs/log-schema.md");
    let listed: BTreeSet<String> = table_rows(&schema, "`options`").into_iter().map(|(k, _)| k).collect();
    let record = serde_json::to_value(cupool_core::options::Options::default()).unwrap();
    let recorded: BTreeSet<String> = record.as_object().unwrap().keys().cloned().collect();
    let missing: Vec<&String> = recorded.difference(&listed).collect();
    let extra: Vec<&String> = listed.difference(&recorded).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/log-schema.md's `options` table against the options a log records: missing {missing:?}, not \
         recorded {extra:?}"
    );
}
