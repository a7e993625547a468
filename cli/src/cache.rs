//! Files this binary carries (the shim, the Python package), written once
//! into a cache directory so that other processes can load them:
//! `$XDG_CACHE_HOME/cupool/<name>/` (else `~/.cache/cupool/...`, else a
//! private `$TMPDIR/cupool-<uid>/...`), where `<name>` changes with the
//! content, so a copy is never half old, half new.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// One file to cache: its path inside the directory, its bytes, its mode.
pub struct Carried<'a> {
    pub path: &'a str,
    pub bytes: &'a [u8],
    pub mode: u32,
}

/// `<root>/<name>/` holding `files`, in the first cache root where that
/// works; or why none did.
pub fn install(name: &str, files: &[Carried]) -> Result<PathBuf, String> {
    let mut errors = Vec::new();
    for (root, shared_tmp) in roots() {
        match install_in(&root, shared_tmp, name, files) {
            Ok(dir) => return Ok(dir),
            Err(e) => errors.push(e),
        }
    }
    Err(errors.join("; "))
}

/// FNV-1a in hex: names a cache directory after what it holds.
pub fn hash(parts: &[&[u8]]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Candidate cache directories, and whether each lies in the shared temporary directory.
fn roots() -> Vec<(PathBuf, bool)> {
    let mut v = Vec::new();
    let abs = |p: std::ffi::OsString| Some(PathBuf::from(p)).filter(|p| p.is_absolute());
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").and_then(abs) {
        v.push((x.join("cupool"), false));
    }
    if let Some(h) = std::env::var_os("HOME").and_then(abs) {
        v.push((h.join(".cache").join("cupool"), false));
    }
    // SAFETY: `getuid` takes no arguments and cannot fail.
    v.push((std::env::temp_dir().join(format!("cupool-{}", unsafe { libc::getuid() })), true));
    v
}

/// Writes each file that is not already there with the same bytes: to a
/// temporary file first, then renamed into place, so that a concurrent
/// `cupool` never loads half a file.
fn install_in(root: &Path, shared_tmp: bool, name: &str, files: &[Carried]) -> Result<PathBuf, String> {
    let dir = root.join(name);
    if shared_tmp {
        match fs::DirBuilder::new().mode(0o700).create(root) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(format!("{}: {e}", root.display())),
            _ => private(root)?,
        }
    }
    for f in files {
        let path = dir.join(f.path);
        if fs::read(&path).is_ok_and(|b| b == f.bytes) {
            continue;
        }
        let parent = path.parent().unwrap_or(&dir);
        let in_dir = |e: std::io::Error| format!("{}: {e}", parent.display());
        fs::DirBuilder::new().recursive(true).mode(0o755).create(parent).map_err(in_dir)?;
        let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = parent.join(format!(".{file_name}.{}.tmp", std::process::id()));
        let written = (|| {
            let mut out = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(f.mode).open(&tmp)?;
            out.write_all(f.bytes)?;
            out.sync_all()?;
            fs::set_permissions(&tmp, fs::Permissions::from_mode(f.mode))?;
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(in_dir(e));
        }
    }
    Ok(dir)
}

/// A directory in the shared temporary directory must be ours and closed to
/// others: nobody else may plant a library or a module there.
fn private(dir: &Path) -> Result<(), String> {
    let m = fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // SAFETY: `getuid` takes no arguments and cannot fail.
    if !m.is_dir() || m.uid() != unsafe { libc::getuid() } || m.mode() & 0o022 != 0 {
        return Err(format!("{} is not a private directory of this user", dir.display()));
    }
    Ok(())
}
