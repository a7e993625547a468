//! The public vocabulary of the pool: the backend trait and block handles.

/// Both pools' step before placing a request: orders later GPU work behind
/// `newest` (the newest pending free's tag) where the timeline can do that
/// cheaply now ([`Timeline::order_behind`]) and `completed_upto` does not
/// cover it yet. True: every pending tag counts as complete now (the caller
/// reclaims those blocks), and `completed_upto` says so.
pub(crate) fn order_behind_pending(
    newest: Option<u64>,
    completed_upto: &mut Option<u64>,
    timeline: &mut impl Timeline,
) -> bool {
    let Some(tag) = newest else { return false };
    if completed_upto.is_none_or(|c| tag > c) && timeline.order_behind(tag) {
        *completed_upto = Some(tag);
        return true;
    }
    false
}

/// The GPU timeline as both pools see it: a freed block may still be
/// touched by work queued before the free, so it waits for a tag.
pub trait Timeline {
    /// Called when a block is freed. None: the block may be reused at once.
    /// Some(tag): reuse only after `is_complete(tag)` is true (GPU work queued
    /// before the free may still touch it). Tags are non-decreasing over time;
    /// a tag names a point of the GPU timeline, so equal tags complete together.
    fn free_tag(&mut self) -> Option<u64> {
        None
    }
    /// Memory stopped being used by any block: before it may be unmapped
    /// (which, unlike reuse, the GPU does not order behind queued work),
    /// the work queued so far must finish. Some(tag): unmap only once
    /// `is_complete(tag)`; None: at once.
    fn unmap_tag(&mut self) -> Option<u64> {
        None
    }
    /// Has all GPU work queued before the free that produced `tag` finished?
    fn is_complete(&mut self, tag: u64) -> bool {
        let _ = tag;
        true
    }
    /// Has the GPU *finished* the work before `tag` (not merely ordered later
    /// work behind it, which makes reuse safe but not an unmap)?
    fn is_finished(&mut self, tag: u64) -> bool {
        self.is_complete(tag)
    }
    /// Wait until every tag handed out so far is complete and finished.
    /// Returns false if waiting is impossible now (e.g. a stream capture is
    /// active); then pending blocks stay pending.
    fn synchronize(&mut self) -> bool {
        true
    }
    /// Block until `tag` is complete. Returns false if waiting is impossible
    /// now (a stream capture is active). The default waits for everything.
    fn wait_for(&mut self, tag: u64) -> bool {
        let _ = tag;
        self.synchronize()
    }
    /// Block until the GPU *finished* the work queued before `tag` (as
    /// [`Timeline::is_finished`]: a GPU-side barrier does not do). Returns
    /// false if waiting is impossible now. The default waits for everything.
    fn wait_finished(&mut self, tag: u64) -> bool {
        let _ = tag;
        self.synchronize()
    }
    /// Orders all work queued from now on behind `tag` on the GPU, without
    /// the host waiting, where that is cheap now (a GPU-side barrier); then
    /// blocks freed up to `tag` may be reused in place, though their pages
    /// may not yet be unmapped. False: nothing was done, the blocks stay
    /// pending. The default can do nothing of the kind.
    fn order_behind(&mut self, tag: u64) -> bool {
        let _ = tag;
        false
    }
    /// A monotonic clock in nanoseconds, for giving memory back by time.
    fn now_ns(&mut self) -> u64 {
        0
    }
}

/// Implements every [`Timeline`] method by handing it to `self.$field`,
/// itself a `Timeline`: for devices that carry a timeline beside their memory.
#[macro_export]
macro_rules! delegate_timeline {
    ($field:ident) => {
        fn free_tag(&mut self) -> Option<u64> {
            self.$field.free_tag()
        }
        fn unmap_tag(&mut self) -> Option<u64> {
            self.$field.unmap_tag()
        }
        fn is_complete(&mut self, tag: u64) -> bool {
            self.$field.is_complete(tag)
        }
        fn is_finished(&mut self, tag: u64) -> bool {
            self.$field.is_finished(tag)
        }
        fn synchronize(&mut self) -> bool {
            self.$field.synchronize()
        }
        fn wait_for(&mut self, tag: u64) -> bool {
            self.$field.wait_for(tag)
        }
        fn wait_finished(&mut self, tag: u64) -> bool {
            self.$field.wait_finished(tag)
        }
        fn order_behind(&mut self, tag: u64) -> bool {
            self.$field.order_behind(tag)
        }
        fn now_ns(&mut self) -> u64 {
            self.$field.now_ns()
        }
    };
}

/// Where segments come from (the device); freed blocks are fenced by the
/// [`Timeline`].
pub trait Backend: Timeline {
    /// Obtain a fresh segment of exactly `size` bytes (size is a multiple of
    /// SEGMENT_ALIGN = 2 MiB). None = device out of memory. The address must
    /// be a multiple of 512.
    fn allocate_segment(&mut self, size: u64) -> Option<u64>;
    /// Give a whole, completely free segment back to the device.
    fn release_segment(&mut self, addr: u64, size: u64);
}

/// Opaque handle of an allocated block (a slab index). It stays valid until
/// the block is freed; after that the same value may name another block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub(super) u32);

impl BlockId {
    /// The raw slab index, e.g. to store it in a compact table.
    pub fn to_raw(self) -> u32 {
        self.0
    }
    /// Inverse of [`BlockId::to_raw`].
    pub fn from_raw(raw: u32) -> Self {
        BlockId(raw)
    }
}

/// A block handed out by [`Pool::allocate`](super::Pool::allocate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub id: BlockId,
    pub addr: u64,
    /// Usable size: the rounded request, or the whole block when it was not split.
    pub size: u64,
}

/// An allocated block with its segment, from [`Pool::lookup`](super::Pool::lookup) and
/// [`Pool::live_blocks`](super::Pool::live_blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub id: BlockId,
    pub addr: u64,
    pub size: u64,
    /// Size the caller asked for.
    pub requested: u64,
    pub segment_addr: u64,
    pub segment_size: u64,
}

/// The pool could not serve a request even after its whole recovery sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory;

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("out of device memory")
    }
}

impl std::error::Error for OutOfMemory {}
