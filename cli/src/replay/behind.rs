//! A replay with the GPU behind the program: the trace's calls queue work
//! on several streams, and what was queued a lag ago is done. Freed blocks
//! then wait for fences, pending frees are ordered behind GPU-side barriers
//! (at most every 100 µs, the shim's `fence_us`, and at a miss), and idle
//! pages that queued work may still touch are not unmapped until it is done
//! (mapped elsewhere meanwhile, they leave a ghost mapping): what the shim's
//! pools meet on a GPU, which a replay whose GPU keeps up (every free done
//! at once) does not show. The replay's devices have no capacity: none of
//! its allocations fail (`Behind::failed` counts them for tests with one).

use super::Replayable;
use cupool_core::pool::testing::{Fences, SimulatedDevice, SimulatedTimeline};
use cupool_core::pool::{BlockId, Pool};
use cupool_core::vmm::testing::SimulatedPages;
use cupool_core::vmm::VmmPool;
use std::collections::VecDeque;

/// Both pools' simulated devices carry a GPU timeline.
pub(super) trait OnTimeline: Replayable {
    fn gpu(&mut self) -> &mut SimulatedTimeline;
}

impl<T: OnTimeline> OnTimeline for &mut T {
    fn gpu(&mut self) -> &mut SimulatedTimeline {
        (**self).gpu()
    }
}

impl OnTimeline for VmmPool<SimulatedPages> {
    fn gpu(&mut self) -> &mut SimulatedTimeline {
        &mut self.backend_mut().gpu
    }
}

impl OnTimeline for Pool<SimulatedDevice> {
    fn gpu(&mut self) -> &mut SimulatedTimeline {
        &mut self.backend_mut().gpu
    }
}

/// A pool whose GPU runs `lag_ns` behind the trace. Counts the allocations
/// that fail.
pub(super) struct Behind<P> {
    pub(super) pool: P,
    lag_ns: u64,
    /// Queued work as (tag, when queued), oldest first.
    queued_at: VecDeque<(u64, u64)>,
    pub(super) failed: usize,
}

impl<P: OnTimeline> Behind<P> {
    pub(super) fn with(mut pool: P, lag_ns: u64) -> Behind<P> {
        let gpu = pool.gpu();
        gpu.fences = Fences::AtQueued;
        gpu.barrier = true;
        gpu.order_every_ns = Some(100_000);
        Behind { pool, lag_ns, queued_at: VecDeque::new(), failed: 0 }
    }
}

impl<P: OnTimeline> Replayable for Behind<P> {
    /// Each call of the program queues work; what was queued `lag_ns` ago is done.
    fn at(&mut self, t_ns: u64) {
        let gpu = self.pool.gpu();
        gpu.now = t_ns;
        gpu.launch();
        self.queued_at.push_back((gpu.queued, t_ns));
        while let Some(&(tag, _)) = self.queued_at.front().filter(|&&(_, at)| at + self.lag_ns <= t_ns) {
            gpu.completed = gpu.completed.max(tag);
            self.queued_at.pop_front();
        }
    }
    fn alloc(&mut self, size: u64) -> Option<BlockId> {
        let b = self.pool.alloc(size);
        self.failed += usize::from(b.is_none());
        b
    }
    fn release(&mut self, id: BlockId) {
        self.pool.release(id)
    }
    fn peak_reserved(&self) -> u64 {
        self.pool.peak_reserved()
    }
    fn reserved(&self) -> u64 {
        self.pool.reserved()
    }
}
