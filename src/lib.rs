//! `libcupool.so`: the preload library. It intercepts CUDA memory calls at the
//! runtime and driver level, records them, and writes `cupool.<pid>.json`.
//!
//! Layers, outermost first: `hooks` (C ABI, thin) → `record` (the seam:
//! tracking, and where the pool sits) → `tracker` / `events` / `report`
//! (bookkeeping, no CUDA) → `cupool_core` (pure Rust). `real` finds the
//! functions cupool stands in front of.

mod diag;
mod events;
mod ffi;
mod fork;
mod guard;
mod hooks;
mod pool;
mod real;
mod record;
mod report;
mod signals;
mod state;
mod tracker;
