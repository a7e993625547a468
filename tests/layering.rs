//! The shim's layers import one way (docs/architecture.md): each top-level
//! module of `src/` names, through `crate::`, only the layers below it.
//! `cargo test --test layering`

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every layer of `src/`, top first, with the layers it may name. A layer
/// may name only layers listed after it, so the table itself admits no cycle.
const LAYERS: &[(&str, &[&str])] = &[
    ("hooks", &["intercept", "lifecycle", "runtime", "cuda"]),
    ("intercept", &["lifecycle", "observe", "pool", "sink", "runtime", "cuda"]),
    ("lifecycle", &["observe", "pool", "sink", "runtime", "cuda"]),
    // `pool` for one type: the handle an allocation keeps of its pool.
    ("observe", &["pool", "sink", "runtime", "cuda"]),
    ("pool", &["runtime", "cuda"]),
    ("sink", &["runtime", "cuda"]),
    ("cuda", &["runtime"]),
    ("runtime", &[]),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text of `source` without its comments (line and block), so that a
/// path named in prose is not taken for an import. String literals are kept:
/// none of the shim's names a `crate::` path.
fn code_of(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The top-level modules a file names through `crate::`: `crate::pool::x`,
/// `crate::{pool, sink}`, `crate::real!` (the `cuda` table's macro).
fn named_layers(code: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && code[..at].ends_with('$') {
            continue; // `$crate::` in a macro: the macro's own crate
        }
        let rest = &code[at + "crate::".len()..];
        let items: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group: split at commas outside nested braces.
            let mut depth = 0;
            let mut items = Vec::new();
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        items.push(&group[start..i]);
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        items.push(&group[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            items
        } else {
            vec![rest]
        };
        for item in items {
            let name: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            match name.as_str() {
                "" | "self" => {}
                // Macros exported at the crate root.
                "real" => drop(named.insert("cuda".to_string())),
                _ => drop(named.insert(name)),
            }
        }
    }
    named
}

#[test]
fn each_layer_names_only_the_layers_below_it() {
    let order: BTreeMap<&str, usize> = LAYERS.iter().enumerate().map(|(i, (name, _))| (*name, i)).collect();
    for (i, (layer, below)) in LAYERS.iter().enumerate() {
        for dep in *below {
            let j = order.get(dep).unwrap_or_else(|| panic!("{layer} may name {dep}, which is no layer"));
            assert!(*j > i, "the table lets {layer} name {dep}, which is not below it: that could close a cycle");
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut seen_layers = BTreeSet::new();
    let mut wrong = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let mut parts = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned());
        let first = parts.next().unwrap();
        let layer = first.strip_suffix(".rs").unwrap_or(&first).to_string();
        if layer == "lib" {
            continue; // the crate root only declares the layers
        }
        let Some(&(_, allowed)) = LAYERS.iter().find(|(name, _)| *name == layer) else {
            panic!("src/{} belongs to no layer of tests/layering.rs's table", relative.display());
        };
        seen_layers.insert(layer.clone());
        let source = std::fs::read_to_string(file).unwrap();
        for named in named_layers(&code_of(&source)) {
            if named != layer && !allowed.contains(&named.as_str()) {
                wrong.push(format!("src/{} ({layer}) names crate::{named}", relative.display()));
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the layering (docs/architecture.md):\n{}", wrong.join("\n"));
    let unused: Vec<&str> = LAYERS.iter().map(|(name, _)| *name).filter(|name| !seen_layers.contains(*name)).collect();
    assert!(unused.is_empty(), "layers in the table with no module in src/: {unused:?}");
}

#[test]
fn the_reader_finds_imports_in_every_form() {
    let code = code_of(
        "use crate::observe::{self, Space};\nuse crate::{lifecycle, pool::{a, b}, real};\n\
         // crate::hooks in a comment\nlet x = crate::sink::stamp(); $crate::runtime::x();\n/* crate::intercept */",
    );
    let named: Vec<String> = named_layers(&code).into_iter().collect();
    assert_eq!(named, ["cuda", "lifecycle", "observe", "pool", "sink"]);
}
