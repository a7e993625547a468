//! Views of logs for people and tools: `cupool report` in the terminal,
//! `cupool report --html` as one page, `cupool export` for Perfetto and PyTorch's memory_viz. Every view is
//! drawn from one model of each process (`model`), built in one pass over
//! its timeline, with the pool's segments rebuilt where the log was written
//! in pool mode (`pool`).

pub mod export;
pub mod html;
pub mod load;
pub mod memviz;
pub mod model;
pub mod perfetto;
pub mod pickle;
pub mod pool;
pub mod progress;
pub mod report;

/// What an export says when it kept fewer points than it saw: `kept` of `seen`.
pub fn downsampled_note(kept: usize, seen: usize) -> String {
    if kept < seen {
        format!(" (downsampled from {seen}, peaks kept)")
    } else {
        String::new()
    }
}
