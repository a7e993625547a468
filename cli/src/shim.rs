//! Where `cupool run` finds the preload library, in this order:
//! 1. `$CUPOOL_LIB` (must exist);
//! 2. `libcupool.so` beside the `cupool` executable, or in `../lib/` from it;
//! 3. the copy embedded in this binary (see `build.rs`), written once to
//!    `$XDG_CACHE_HOME/cupool/<version>-<hash>/libcupool.so` (else
//!    `~/.cache/...`, else a private `$TMPDIR/cupool-<uid>/...`).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
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
    let mut errors = Vec::new();
    for (root, shared_tmp) in cache_roots() {
        match install(&root, shared_tmp) {
            Ok(path) => return Ok(Shim { path, origin: "embedded in cupool, cached".into() }),
            Err(e) => errors.push(e),
        }
    }
    Err(format!(
        "cannot find libcupool.so (looked at {looked}) nor write the embedded one: {}; set CUPOOL_LIB",
        errors.join("; ")
    ))
}

fn beside_exe() -> Vec<PathBuf> {
    let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) else {
        return Vec::new();
    };
    vec![dir.join("libcupool.so"), dir.join("../lib/libcupool.so")]
}

/// Candidate cache directories, each one to hold `<version>-<hash>/libcupool.so`,
/// and whether it lies in the shared temporary directory.
fn cache_roots() -> Vec<(PathBuf, bool)> {
    let mut v = Vec::new();
    let abs = |p: std::ffi::OsString| Some(PathBuf::from(p)).filter(|p| p.is_absolute());
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").and_then(abs) {
        v.push((x.join("cupool"), false));
    }
    if let Some(h) = std::env::var_os("HOME").and_then(abs) {
        v.push((h.join(".cache").join("cupool"), false));
    }
    v.push((std::env::temp_dir().join(format!("cupool-{}", unsafe { libc::getuid() })), true));
    v
}

/// `<root>/<version>-<hash>/libcupool.so`, written there unless an identical
/// copy already is: to a temporary file first, then renamed into place, so a
/// concurrent `cupool run` never preloads half a file.
fn install(root: &Path, shared_tmp: bool) -> Result<PathBuf, String> {
    let dir = root.join(format!("{}-{}", env!("CARGO_PKG_VERSION"), embedded::SHIM_HASH));
    let path = dir.join("libcupool.so");
    if fs::read(&path).is_ok_and(|b| b == embedded::SHIM) {
        return Ok(path);
    }
    let in_dir = |e: std::io::Error| format!("{}: {e}", dir.display());
    if shared_tmp {
        match fs::DirBuilder::new().mode(0o700).create(root) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(format!("{}: {e}", root.display())),
            _ => private(root)?,
        }
    }
    fs::DirBuilder::new().recursive(true).mode(0o755).create(&dir).map_err(in_dir)?;
    let tmp = dir.join(format!(".libcupool.so.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o755).open(&tmp)?;
        f.write_all(embedded::SHIM)?;
        f.sync_all()?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
        fs::rename(&tmp, &path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(in_dir(e));
    }
    Ok(path)
}

/// A directory in the shared temporary directory must be ours and closed to
/// others: nobody else may plant a library there.
fn private(dir: &Path) -> Result<(), String> {
    let m = fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !m.is_dir() || m.uid() != unsafe { libc::getuid() } || m.mode() & 0o022 != 0 {
        return Err(format!("{} is not a private directory of this user", dir.display()));
    }
    Ok(())
}
