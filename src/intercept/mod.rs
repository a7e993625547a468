//! Interception: what every hook calls. Each entry point takes the
//! reentrancy guard (one allocation is counted once, at the outermost layer
//! it entered through), serves the call from the pool or passes it to the
//! real CUDA function, and tells the observers what happened.
//!
//! - `call.rs`: what an allocating call asks for, and the record made of it.
//! - `pooled.rs`: a device allocation the pool serves.
//! - `passthrough.rs`: an allocation CUDA makes (the `limit`, a retry after
//!   the pools gave back what they hold).
//! - `free.rs`: a free, pooled or not.
//! - `vmm.rs`: VMM handles released and ranges mapped by the program.
//! - `retire.rs`: a context destroyed or reset, and its pool retired.
//! - `queries.rs`: free memory and pointer queries, answered as the program
//!   would see them without the pool.
//! - `work.rs`: streams created and destroyed, work queued, contexts bound.
//! - `capture.rs`: stream capture; `context.rs`: the current context;
//!   `limit.rs`: the cap; `last_error.rs`: the runtime's last error;
//!   `ipc.rs`, `phases.rs`, `stats.rs`: cupool's answers of their own.

mod call;
mod capture;
mod context;
mod free;
pub mod ipc;
mod last_error;
mod limit;
mod passthrough;
pub mod phases;
mod pooled;
mod queries;
mod retire;
pub mod stats;
mod vmm;
mod work;

pub use call::{out_ptr, AllocCall, Outcome};
pub use capture::{begin as capture_begin, end as capture_end};
pub use free::free;
pub use last_error::as_last_error;
pub use passthrough::allocation;
pub use pooled::pooled_allocation;
pub use queries::{mem_info, pooled_pointer, PooledPointer};
pub use retire::{context_destroy, primary_reset};
pub use vmm::{mapping, release_handle};
pub use work::{context_bound, stream_created, stream_destroyed, work_queued, Work};
