//! Test leaks: what the pytest plugin (`python/cupool/pytest_plugin.py`)
//! recorded per test beside the logs. The interface `cupool check` calls;
//! the reading is not written yet.

use super::finding::Finding;
use cupool_core::log::Log;
use std::path::Path;

/// The test leaks the plugin recorded in `log_dir` for the processes of `logs`.
pub fn findings(_logs: &[Log], _log_dir: &Path) -> Vec<Finding> {
    Vec::new()
}

/// Phases the plugin names around each test (`test:<nodeid>`) and around a
/// wider fixture's setup (`fixture:<scope>:<name>`). Growth analysis leaves
/// them out: one test is not a repetition of the one before.
pub fn is_plugin_phase(name: &str) -> bool {
    name.starts_with("test:") || name.starts_with("fixture:")
}
