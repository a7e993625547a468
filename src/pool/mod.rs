//! Pool mode: device allocations served from `cupool_core::pool::Pool`, one
//! pool per CUDA context (`registry`), over the real driver with reuse made
//! safe by stream tracking (`streams`) and fences (`fence`).

mod engine;
pub use engine::Carved;
mod fence;
mod handle;
pub use handle::{ContextPool, PoolHandle};
pub mod ipc;
mod magazine;
mod pages;
mod progress;
pub mod records;
mod registry;
mod streams;
pub mod tools;

pub use registry::{
    allocate, drop_context, exported, find, free, give_back_all_free, give_back_free_segments, in_context_of,
    lock_for_fork, owns, pool_of, publish_pages, release_idle_for_tools, reserved_on, reset_peaks, settle,
    stream_created, stream_destroyed, unlock_after_fork, Found, PooledBlock,
};
pub use streams::{
    any_capture, capture_begun, capture_ended, context_bound, driver_allocation, is_capturing, launch_seen, note_work,
    runtime_allocation,
};
