//! Where `cupool run` finds the preload library, in this order:
//! 1. `$CUPOOL_LIB` (must exist);
//! 2. `libcupool.so` beside the `cupool` executable, or in `../lib/` from it;
//! 3. the copy embedded in this binary (see `build.rs`), written once to
//!    `$XDG_CACHE_HOME/cupool/<version>-<hash>/libcupool.so` (else
//!    `~/.cache/...`, else a private `$TMPDIR/cupool-<uid>/...`).

use std::path::{Path, PathBuf};

/// What `build.rs` generated: the shim and the traces.
pub mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded.rs"));
}

/// The library to preload and where it came from, in words.
pub struct Shim {
    pub path: PathBuf,
    pub origin: String,
}

pub fn locate() -> Result<Shim, String> {
    if let Some(p) = std::env::var_os("CUPOOL_LIB").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(p);
        if !path.is_file() {
            return Err(format!("CUPOOL_LIB={} does not exist", path.display()));
        }
        return Ok(Shim { path, origin: "$CUPOOL_LIB".into() });
    }
    let beside = beside_exe();
    if let Some(path) = beside.iter().find(|p| p.is_file()) {
        return Ok(Shim { path: path.clone(), origin: "beside the cupool executable".into() });
    }
    let looked = beside.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
    if embedded::SHIM.is_empty() {
        return Err(format!(
            "cannot find libcupool.so (looked at {looked}) and this cupool carries none ({}); \
             put libcupool.so beside the cupool executable or set CUPOOL_LIB",
            embedded::SHIM_SKIPPED
        ));
    }
    let name = format!("{}-{}", env!("CARGO_PKG_VERSION"), embedded::SHIM_HASH);
    let file = crate::cache::Carried { path: "libcupool.so", bytes: embedded::SHIM, mode: 0o755 };
    match crate::cache::install(&name, &[file]) {
        Ok(dir) => Ok(Shim { path: dir.join("libcupool.so"), origin: "embedded in cupool, cached".into() }),
        Err(e) => Err(format!(
            "cannot find libcupool.so (looked at {looked}) nor write the embedded one: {e}; set CUPOOL_LIB"
        )),
    }
}

fn beside_exe() -> Vec<PathBuf> {
    let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) else {
        return Vec::new();
    };
    vec![dir.join("libcupool.so"), dir.join("../lib/libcupool.so")]
}
