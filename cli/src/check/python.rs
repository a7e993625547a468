//! The repository's Python package (`python/cupool/`), carried in this
//! binary, so that every pytest run under `cupool check` loads the plugin
//! even where the package is not installed, and loads the copy that
//! matches this cupool.

/// `(path inside the package directory, text)`.
const PACKAGE: &[(&str, &str)] = &[
    ("cupool/__init__.py", include_str!("../../../python/cupool/__init__.py")),
    ("cupool/__main__.py", include_str!("../../../python/cupool/__main__.py")),
    ("cupool/_options.py", include_str!("../../../python/cupool/_options.py")),
    ("cupool/pytest_plugin.py", include_str!("../../../python/cupool/pytest_plugin.py")),
];

/// The module pytest loads through `PYTEST_PLUGINS`.
pub const PLUGIN: &str = "cupool.pytest_plugin";

/// The variables that make Python processes load the plugin: `PYTHONPATH`
/// with the cached package first (what was there stays, after it), and
/// `PYTEST_PLUGINS` with the plugin added. Or why the package could not be
/// written.
pub fn environment() -> Result<Vec<(String, String)>, String> {
    let bytes: Vec<&[u8]> = PACKAGE.iter().flat_map(|(p, t)| [p.as_bytes(), t.as_bytes()]).collect();
    let name = format!("{}-python-{}", env!("CARGO_PKG_VERSION"), crate::cache::hash(&bytes));
    let files: Vec<crate::cache::Carried> = PACKAGE
        .iter()
        .map(|(path, text)| crate::cache::Carried { path, bytes: text.as_bytes(), mode: 0o644 })
        .collect();
    let dir = crate::cache::install(&name, &files)?;
    let dir = dir.to_str().ok_or_else(|| format!("{}: not a UTF-8 path", dir.display()))?.to_string();
    Ok(vec![
        ("PYTHONPATH".into(), prepend(&dir, std::env::var("PYTHONPATH").ok().as_deref(), ':')),
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
        assert!(PACKAGE.iter().any(|(p, t)| *p == "cupool/pytest_plugin.py" && !t.is_empty()));
        assert!(PACKAGE.iter().any(|(p, _)| *p == "cupool/__init__.py"));
    }
}
