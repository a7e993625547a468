//! cupool's pure core: no CUDA, no FFI. The preload library, the CLI and the
//! tests all build on it.

pub mod log;
pub mod model;
pub mod options;
pub mod pool;
pub mod vmm;
