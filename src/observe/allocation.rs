//! What cupool knows of one live allocation.

use crate::pool::PoolHandle;
use cupool_core::log::{Api, MemKind};

#[derive(Clone, Copy, Debug)]
pub struct Allocation {
    pub size: u64,
    /// When it was made, to a few ms (ages of leaks are reported in ms).
    pub t_ns: u64,
    /// The CUDA context current when it was made: context destruction frees it.
    pub ctx: u64,
    pub device: i32,
    pub kind: MemKind,
    pub api: Api,
    pub tid: u32,
    pub stream: u64,
    /// The pool block serving it; `None` when CUDA allocated it directly.
    pub pooled: Option<Pooled>,
    /// Its allocation site (`sites::capture`); 0 = none.
    pub stack: u32,
}

impl Allocation {
    /// A placeholder for an empty slot.
    pub const NONE: Allocation = Allocation {
        size: 0,
        t_ns: 0,
        ctx: 0,
        device: -1,
        kind: MemKind::Device,
        api: Api::None,
        tid: 0,
        stream: 0,
        pooled: None,
        stack: 0,
    };
}

/// A block of one of cupool's pools.
#[derive(Clone, Copy, Debug)]
pub struct Pooled {
    /// The pool that owns the block (a handle is never null, which keeps
    /// `Option<Pooled>` as small as `Pooled`).
    pub pool: PoolHandle,
    pub block: u32,
    /// What `CU_POINTER_ATTRIBUTE_BUFFER_ID` answers for it: fresh for every
    /// pooled allocation, so caches keyed on it (UCX, MPI, NCCL user
    /// buffers) never take a reused block for the allocation before.
    pub buffer_id: u64,
}

/// Device pointers and pinned host pointers share one address space (UVA);
/// VMM handles are opaque numbers and get a table of their own.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Space {
    Pointer,
    VmmHandle,
}

impl Space {
    /// Where allocations of `kind` are keyed.
    pub const fn of(kind: MemKind) -> Space {
        if matches!(kind, MemKind::Vmm) {
            Space::VmmHandle
        } else {
            Space::Pointer
        }
    }
}
