//! Makes the `cupool` binary self-contained: it carries the preload shim
//! (`libcupool.so`) and the bundled replay traces (`traces/*.json.gz`).
//!
//! The shim is built by a nested `cargo build -p cupool --lib` of this
//! workspace, for the same profile, into its own target directory under
//! `OUT_DIR` (a nested cargo on the outer target directory would wait
//! forever on the outer build's lock). It is embedded with `include_bytes!`
//! through `$OUT_DIR/embedded.rs`.
//!
//! An empty shim is embedded instead (the CLI then only looks for a
//! `libcupool.so` beside itself or in `$CUPOOL_LIB`) when:
//! - `CUPOOL_NO_EMBED=1` is set (a quick CLI-only build), or
//! - the build is `cargo clippy`'s (`RUSTC_WORKSPACE_WRAPPER` names
//!   clippy-driver): a lint pass needs no shim, and building one would double
//!   its time. The same code compiles either way, so clippy lints it all, or
//! - this build script runs inside the nested build itself (it never does
//!   today: the nested build is `-p cupool`, which does not depend on the CLI;
//!   `CUPOOL_EMBED_NESTED` guards against that changing).
//!
//! Each of these is a `rerun-if-env-changed`, so an empty shim left by one
//! build is never reused by a build that must carry the real one.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().expect("cli/ lies in the workspace").to_path_buf();
    let out_dir = PathBuf::from(env("OUT_DIR"));

    for var in ["CUPOOL_NO_EMBED", "CUPOOL_EMBED_NESTED", "RUSTC_WORKSPACE_WRAPPER"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let traces = embed_traces(&root);
    let (shim, why_empty) = match skip_reason() {
        Some(why) => (Vec::new(), why),
        None => (build_shim(&root, &out_dir), String::new()),
    };
    if !why_empty.is_empty() && !why_empty.contains("clippy") {
        println!("cargo:warning=cupool: not embedding libcupool.so ({why_empty}); `cupool run` will need one beside the binary or in $CUPOOL_LIB");
    }
    let shim_file = out_dir.join("libcupool.so");
    write_if_changed(&shim_file, &shim);

    let mut src = String::new();
    writeln!(src, "/// The preload shim this binary was built with (empty when not embedded).").unwrap();
    writeln!(src, "pub static SHIM: &[u8] = include_bytes!({:?});", shim_file.display().to_string()).unwrap();
    writeln!(src, "/// FNV-1a of [`SHIM`], for the name of its copy in the cache.").unwrap();
    writeln!(src, "pub const SHIM_HASH: &str = \"{:016x}\";", fnv1a(&shim)).unwrap();
    writeln!(src, "/// Why [`SHIM`] is empty (empty when it is not).").unwrap();
    writeln!(src, "pub const SHIM_SKIPPED: &str = {why_empty:?};").unwrap();
    writeln!(src, "/// The traces of the repository's `traces/`: (file name, gzipped log).").unwrap();
    writeln!(src, "pub static TRACES: &[(&str, &[u8])] = &[").unwrap();
    for t in &traces {
        let name = t.file_name().unwrap().to_string_lossy();
        writeln!(src, "    ({name:?}, include_bytes!({:?})),", t.display().to_string()).unwrap();
    }
    writeln!(src, "];").unwrap();
    write_if_changed(&out_dir.join("embedded.rs"), src.as_bytes());
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("cargo sets {name} for build scripts"))
}

fn skip_reason() -> Option<String> {
    let set = |v: &str| std::env::var_os(v).is_some_and(|x| !x.is_empty() && x != "0");
    if set("CUPOOL_NO_EMBED") {
        return Some("CUPOOL_NO_EMBED is set".into());
    }
    if set("CUPOOL_EMBED_NESTED") {
        return Some("inside the nested shim build".into());
    }
    let wrapper = std::env::var("RUSTC_WORKSPACE_WRAPPER").unwrap_or_default();
    if Path::new(&wrapper).file_name().is_some_and(|n| n.to_string_lossy().starts_with("clippy-driver")) {
        return Some("a clippy build".into());
    }
    None
}

/// `traces/*.json.gz`, sorted by name; each one a `rerun-if-changed`.
fn embed_traces(root: &Path) -> Vec<PathBuf> {
    let dir = root.join("traces");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    files.retain(|p| p.is_file() && p.to_string_lossy().ends_with(".json.gz"));
    files.sort();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    files
}

/// The cargo profile of this build: the name of `target/<dir>/build/<pkg>/out`'s
/// `<dir>` (`debug` is the `dev` profile).
fn profile(out_dir: &Path) -> String {
    let dir = out_dir.ancestors().nth(3).and_then(|d| d.file_name()).map(|n| n.to_string_lossy().into_owned());
    match dir.as_deref() {
        Some("debug") | None => {
            if env("PROFILE") == "release" {
                "release".into()
            } else {
                "dev".into()
            }
        }
        Some(name) => name.into(),
    }
}

/// Builds `libcupool.so` with a nested cargo and returns its bytes.
fn build_shim(root: &Path, out_dir: &Path) -> Vec<u8> {
    // What the shim is made of: rebuild the CLI when any of it changes.
    for p in ["src", "core/src", "core/Cargo.toml", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    if !root.join("src/lib.rs").exists() {
        panic!(
            "cupool-cli embeds the shim built from {}, which is missing (the CLI crate builds only inside \
             the cupool workspace); set CUPOOL_NO_EMBED=1 to build a CLI that needs libcupool.so beside it",
            root.join("src").display()
        );
    }
    let profile = profile(out_dir);
    let target_dir = out_dir.join("shim-target");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let (target, host) = (env("TARGET"), env("HOST"));
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "--quiet", "-p", "cupool", "--lib", "--profile", &profile])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env("CUPOOL_EMBED_NESTED", "1")
        // The outer build's wrappers and flags are for the CLI; the shim's
        // build takes the ones cargo reads from the environment as usual.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR");
    if target != host {
        cmd.args(["--target", &target]);
    }
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run {cargo:?}: {e}"));
    assert!(status.success(), "the nested build of libcupool.so (cargo build -p cupool --profile {profile}) failed");
    let profile_dir = if profile == "dev" { "debug" } else { profile.as_str() };
    let mut lib = target_dir;
    if target != host {
        lib.push(&target);
    }
    let lib = lib.join(profile_dir).join("libcupool.so");
    std::fs::read(&lib).unwrap_or_else(|e| panic!("read {}: {e}", lib.display()))
}

fn write_if_changed(path: &Path, bytes: &[u8]) {
    if std::fs::read(path).ok().as_deref() != Some(bytes) {
        std::fs::write(path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
