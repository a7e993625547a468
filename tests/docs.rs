//! Documentation that cannot drift: README's option table against the core's
//! parser, and the files BENCHMARKS.md cites against the repository.
//! `cargo test --test docs`

use std::collections::BTreeMap;
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

#[test]
fn readme_option_table_matches_the_parser() {
    let readme = repo_file("README.md");
    let table: BTreeMap<String, String> = table_rows(&readme, "Options")
        .into_iter()
        .map(|(k, d)| (k, if d == "empty" { String::new() } else { d }))
        .collect();
    let defaults = cupool_core::options::Options::default();
    let parsed: BTreeMap<String, String> = cupool_core::options::OPTION_HELP
        .iter()
        .map(|(k, _, _)| (k.to_string(), cupool_core::options::value_of(&defaults, k).expect("the parser knows it")))
        .collect();
    assert_eq!(table, parsed, "README's option table (left) against the options the core parses and their defaults");
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
