//! `libcupool.so`: the preload library. It intercepts CUDA memory calls at the
//! runtime and driver level, serves device allocations from its pool (in
//! pool mode), records them, and writes `cupool.<pid>.json`.
//!
//! Layers, each importing only those below it (`docs/architecture.md`;
//! `tests/layering.rs` checks it):
//! - `hooks`: the C ABI; decode the arguments, call `intercept`, return.
//! - `intercept`: the guard; the pool or the real call; notify observers.
//! - `lifecycle`: start on the first CUDA memory call, finish at exit or on
//!   a fatal signal, fork.
//! - `observe` (live table, counters, timeline, incidents), then `pool`
//!   (pool mode) and `sink` (the log file and its writer thread); `observe`
//!   names `pool` only for `PoolHandle`.
//! - `runtime` (options, clock, guard, diagnostics, process facts) and
//!   `cuda` (CUDA's types and one typed table of its entry points).
//! - `cupool_core`: pure Rust, no CUDA.

mod cuda;
mod hooks;
mod intercept;
mod lifecycle;
mod observe;
mod pool;
mod runtime;
mod sink;
