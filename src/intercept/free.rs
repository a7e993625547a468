//! A free: the allocation leaves the books first, then its block goes back
//! to its pool (or the real free runs), and the free is recorded.

use super::{capture, last_error};
use crate::cuda::{Status, INVALID_VALUE, SUCCESS};
use crate::observe::{self, Space};
use crate::runtime::{diag, guard::Guard};
use crate::{lifecycle, pool, sink};
use cupool_core::log::{Api, EventKind};
use cupool_core::pool::BlockId;

/// A freeing call on a pointer.
#[inline]
pub fn free(api: Api, ptr: u64, real: impl FnOnce() -> Status) -> Status {
    release(api, Space::Pointer, ptr, real)
}

#[inline]
pub fn release(api: Api, space: Space, key: u64, real: impl FnOnce() -> Status) -> Status {
    if key == 0 {
        return real(); // cudaFree(NULL) is the runtime's initialisation idiom, not a free
    }
    let Some(_guard) = Guard::enter() else {
        return real();
    };
    lifecycle::recording();
    let known = diag::shielded(|| observe::releasing(space, key)).flatten();
    let stamp = sink::stamp_for(EventKind::Free);
    let result = match known.and_then(|a| Some((a.pooled?, a.size))) {
        Some((p, size)) => match capture::refused_free(api, p.pool) {
            Some(code) => code,
            None => {
                pool::tools::block_freed(key); // before the pool may hand it out again
                diag::shielded(|| {
                    pool::free(p.pool, BlockId::from_raw(p.block), key, size, &mut observe::reserved_changed)
                });
                SUCCESS
            }
        },
        // Not a live allocation but inside a pool segment (a double free):
        // CUDA must not see it, or it would free the whole segment.
        // When cupool cannot tell (an internal failure), CUDA must not see it either.
        None if known.is_none() && space == Space::Pointer && diag::shielded(|| pool::owns(key)).unwrap_or(true) => {
            last_error::runtime_error(api, INVALID_VALUE)
        }
        None => real(),
    };
    diag::shielded(|| match (known, result) {
        (Some(a), SUCCESS) => observe::freed(api, key, &a, stamp),
        (Some(a), _) => observe::free_refused(space, key, a), // CUDA kept it: so do we
        (None, SUCCESS) => {} // allocated before cupool could see it (e.g. inside another hook's init)
        (None, r) => observe::invalid_free(api, key, r, stamp),
    });
    result
}
