//! `--json FILE`: the findings as JSON. The interface `cupool check` calls;
//! the writer is not written yet.

use super::finding::Findings;
use std::path::Path;

pub fn write(_findings: &Findings, _path: &Path) -> std::io::Result<()> {
    Ok(())
}
