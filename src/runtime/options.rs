//! The options in force, parsed once from `CUPOOL_OPTIONS`.

use cupool_core::options::{self, Options};
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

static OPTIONS: OnceLock<Options> = OnceLock::new();

pub fn get() -> &'static Options {
    OPTIONS.get_or_init(|| {
        let spec = std::env::var("CUPOOL_OPTIONS").unwrap_or_default();
        let (opts, errors) = options::parse(&spec);
        super::diag::VERBOSITY.store(opts.verbosity, Ordering::Relaxed);
        for e in errors {
            super::diag::error(&format!("CUPOOL_OPTIONS: {e}"));
        }
        opts
    })
}
