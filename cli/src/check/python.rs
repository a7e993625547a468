//! The repository's Python package (`python/cupool/`), carried in this
//! binary, so that every pytest run under `cupool check` loads the plugin
//! even where the package is not installed, and loads the copy that
//! matches this cupool; and the `sitecustomize.py` that has every Python
//! process of the run record PyTorch's allocation history (`torch_history`),
//! JAX's live arrays (`jax_history_ms`) and CuPy's arrays (`cupy_history`).

/// `(path inside the carried directory, text)`: the package under `pkg/`.
const PACKAGE: &[(&str, &str)] = &[
    ("pkg/cupool/__init__.py", include_str!("../../../python/cupool/__init__.py")),
    ("pkg/cupool/__main__.py", include_str!("../../../python/cupool/__main__.py")),
    ("pkg/cupool/_options.py", include_str!("../../../python/cupool/_options.py")),
    ("pkg/cupool/_record.py", include_str!("../../../python/cupool/_record.py")),
    ("pkg/cupool/pytest_plugin.py", include_str!("../../../python/cupool/pytest_plugin.py")),
    ("pkg/cupool/torch_history.py", include_str!("../../../python/cupool/torch_history.py")),
    ("pkg/cupool/jax_history.py", include_str!("../../../python/cupool/jax_history.py")),
    ("pkg/cupool/cupy_history.py", include_str!("../../../python/cupool/cupy_history.py")),
    ("site/sitecustomize.py", include_str!("sitecustomize.py")),
];

/// The module pytest loads through `PYTEST_PLUGINS`.
pub const PLUGIN: &str = "cupool.pytest_plugin";

/// The variables that make Python processes load the plugin: `PYTHONPATH`
/// with the cached package first (what was there stays, after it), and
/// `PYTEST_PLUGINS` with the plugin added; with `histories` (of PyTorch,
/// JAX or CuPy), the directory of the carried `sitecustomize.py` before the
/// package. Or why the files could not be written.
pub fn environment(histories: bool) -> Result<Vec<(String, String)>, String> {
    let bytes: Vec<&[u8]> = PACKAGE.iter().flat_map(|(p, t)| [p.as_bytes(), t.as_bytes()]).collect();
    let name = format!("{}-python-{}", env!("CARGO_PKG_VERSION"), crate::cache::hash(&bytes));
    let files: Vec<crate::cache::Carried> = PACKAGE
        .iter()
        .map(|(path, text)| crate::cache::Carried { path, bytes: text.as_bytes(), mode: 0o644 })
        .collect();
    let dir = crate::cache::install(&name, &files)?;
    let dir = dir.to_str().ok_or_else(|| format!("{}: not a UTF-8 path", dir.display()))?.to_string();
    let mut first = format!("{dir}/pkg");
    if histories {
        first = format!("{dir}/site:{first}");
    }
    Ok(vec![
        ("PYTHONPATH".into(), prepend(&first, std::env::var("PYTHONPATH").ok().as_deref(), ':')),
        ("PYTEST_PLUGINS".into(), append(PLUGIN, std::env::var("PYTEST_PLUGINS").ok().as_deref())),
    ])
}

fn prepend(first: &str, existing: Option<&str>, sep: char) -> String {
    match existing {
        Some(rest) if !rest.is_empty() => format!("{first}{sep}{rest}"),
        _ => first.to_string(),
    }
}

/// `PYTEST_PLUGINS` is a comma-separated list; a plugin named twice would be registered twice.
fn append(plugin: &str, existing: Option<&str>) -> String {
    match existing {
        Some(list) if list.split(',').any(|p| p.trim() == plugin) => list.to_string(),
        Some(list) if !list.trim().is_empty() => format!("{list},{plugin}"),
        _ => plugin.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn existing_paths_and_plugins_are_kept() {
        assert_eq!(prepend("/c", Some("/a:/b"), ':'), "/c:/a:/b");
        assert_eq!(prepend("/c", Some(""), ':'), "/c");
        assert_eq!(prepend("/c", None, ':'), "/c");
        assert_eq!(append(PLUGIN, Some("xdist.plugin")), "xdist.plugin,cupool.pytest_plugin");
        assert_eq!(append(PLUGIN, Some("a, cupool.pytest_plugin")), "a, cupool.pytest_plugin");
        assert_eq!(append(PLUGIN, None), PLUGIN);
    }

    #[test]
    fn the_package_carries_the_plugin() {
        assert!(PACKAGE.iter().any(|(p, t)| *p == "pkg/cupool/pytest_plugin.py" && !t.is_empty()));
        assert!(PACKAGE.iter().any(|(p, _)| *p == "pkg/cupool/__init__.py"));
        assert!(PACKAGE.iter().any(|(p, _)| *p == "site/sitecustomize.py"));
    }

    /// Every module of the package is carried.
    #[test]
    fn the_whole_package_is_carried() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/cupool");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".py") {
                let path = format!("pkg/cupool/{name}");
                assert!(PACKAGE.iter().any(|(p, _)| *p == path), "{path} is not carried");
            }
        }
    }

    /// The recorder takes its defaults from the package's table of them,
    /// which tests/docs.rs checks against the options' declaration.
    #[test]
    fn the_recorder_knows_the_default_of_torch_history() {
        let text = include_str!("../../../python/cupool/torch_history.py");
        assert!(
            text.contains("\nDEFAULT_ENTRIES = int(DEFAULTS[\"torch_history\"])\n"),
            "torch_history.py: DEFAULT_ENTRIES"
        );
        assert!(
            text.contains("\nDEFAULT_DEPTH = int(DEFAULTS[\"python_depth\"])\n"),
            "torch_history.py: DEFAULT_DEPTH"
        );
    }
}
