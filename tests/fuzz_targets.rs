//! The fuzz targets (`fuzz/`, run with `cargo +nightly fuzz run pool_ops` or
//! `vmm_ops`) are their own crate, outside the workspace: this keeps them
//! compiling against the pool cores as those change (a target that no
//! longer builds fuzzes nothing).

use std::process::Command;

#[test]
fn fuzz_targets_compile_against_the_cores() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(env!("CARGO"))
        .args(["check", "--quiet", "--bins", "--manifest-path"])
        .arg(format!("{root}/fuzz/Cargo.toml"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("cargo runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
