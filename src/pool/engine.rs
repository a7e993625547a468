//! What one context's pool carves blocks from: fixed segments
//! (`cuMemAlloc`, the core's `Pool`) or physical pages mapped into reserved
//! address ranges (`backing=vmm`, the core's `VmmPool`). One face for the
//! registry and the records; both are fenced by the context's timeline.

use super::fence::CudaBackend;
use super::pages::CudaPages;
use super::tools;
use crate::runtime::{diag, options};
use cupool_core::log::{self, FenceCounters, MultiStreamBecause, PagesRecord, PoolRecord};
use cupool_core::options::{Backing, GiveBack as Policy};
use cupool_core::pool::{Block, BlockId, BlockInfo, Fragmentation, GiveBack, Pool, PoolConfig, Stat};
use cupool_core::vmm::{PageInfo, VmmConfig, VmmPool};

// One per CUDA context, behind its lock: the variants' sizes do not matter,
// an indirection on every allocation would.
#[allow(clippy::large_enum_variant)]
pub enum Engine {
    Segments(Pool<CudaBackend>),
    Pages(VmmPool<CudaPages>),
}

/// What a context's pool made of a request.
pub enum Carved {
    /// A block serves it.
    Block(Block),
    /// The pool could not place it within its limit and the device's memory.
    OutOfMemory,
    /// The pool can serve this context no more (its device refused a page
    /// mapping): the call goes to CUDA.
    PoolUnusable,
}

fn limit() -> u64 {
    match options::get().limit {
        0 => u64::MAX,
        l => l,
    }
}

/// The segment pool's give-back rule, as the options ask.
fn give_back() -> GiveBack {
    match options::get().give_back {
        Policy::Auto => PoolConfig::shim_default().give_back,
        Policy::Always => GiveBack::Always,
        Policy::Never => GiveBack::Never,
    }
}

fn segments(ctx: u64) -> Engine {
    let config = PoolConfig { limit: limit(), give_back: give_back(), ..PoolConfig::shim_default() };
    Engine::Segments(Pool::new(CudaBackend::new(ctx), config))
}

impl Engine {
    /// The pool of context `ctx` on `device`, backed as the options say.
    /// VMM backing falls back to segments, with a note, where the device has
    /// no VMM and while a memory tool is told of pool segments (its heaps are
    /// segments).
    pub fn new(ctx: u64, device: i32) -> Engine {
        if options::get().backing != Backing::Vmm {
            return segments(ctx);
        }
        if tools::attached() {
            diag::remark("backing=vmm: a memory tool is attached, which is told of segments; pool segments instead");
            return segments(ctx);
        }
        let Some((pages, page)) = CudaPages::new(ctx, device) else {
            diag::remark(&format!(
                "backing=vmm: device {device} cannot map pages (no VMM support); pool segments instead"
            ));
            return segments(ctx);
        };
        // The same give-back rule as segments, by block size.
        let cycle_regret_ns = match give_back() {
            GiveBack::Auto { regret_ns } => Some(regret_ns),
            GiveBack::Always => Some(0),
            GiveBack::Never => None,
        };
        let config = VmmConfig {
            small_page: page,
            large_page: page,
            limit: limit(),
            cycle_regret_ns,
            ..VmmConfig::shim_default()
        };
        Engine::Pages(VmmPool::new(pages, config))
    }

    #[inline(always)]
    pub fn allocate(&mut self, size: u64) -> Carved {
        match self {
            Engine::Segments(p) => match p.allocate(size) {
                Ok(block) => Carved::Block(block),
                Err(_) => Carved::OutOfMemory,
            },
            Engine::Pages(p) if p.backend().broken => Carved::PoolUnusable,
            Engine::Pages(p) => match p.allocate(size) {
                Ok(block) => Carved::Block(block),
                Err(_) if p.backend().broken => Carved::PoolUnusable,
                Err(_) => Carved::OutOfMemory,
            },
        }
    }

    /// Frees a block. True: the pool asks for a wait for the GPU, made
    /// with its lock let go (`registry::wait_unlocked`).
    #[inline(always)]
    #[must_use]
    pub fn free(&mut self, id: BlockId) -> bool {
        match self {
            Engine::Segments(p) => p.free_asking_wait(id),
            Engine::Pages(p) => p.free_asking_wait(id),
        }
    }

    /// Bytes held from the device now.
    pub fn reserved(&self) -> u64 {
        match self {
            Engine::Segments(p) => p.stats().reserved_bytes.current,
            Engine::Pages(p) => p.stats().reserved_bytes.current,
        }
    }

    pub fn limit(&self) -> u64 {
        match self {
            Engine::Segments(p) => p.config().limit,
            Engine::Pages(p) => p.config().limit,
        }
    }

    pub fn set_limit(&mut self, limit: u64) {
        match self {
            Engine::Segments(p) => p.set_limit(limit),
            Engine::Pages(p) => p.set_limit(limit),
        }
    }

    pub fn lookup(&self, ptr: u64) -> Option<BlockInfo> {
        match self {
            Engine::Segments(p) => p.lookup(ptr),
            Engine::Pages(p) => p.lookup(ptr),
        }
    }

    /// The pages under the block at `ptr`, when it lies on VMM pages.
    pub fn block_pages(&self, ptr: u64) -> Option<Vec<PageInfo>> {
        match self {
            Engine::Segments(_) => None,
            Engine::Pages(p) => p.block_pages(ptr),
        }
    }

    /// Is `ptr` inside memory the pool holds (a segment, a reserved range)?
    pub fn owns(&self, ptr: u64) -> bool {
        match self {
            Engine::Segments(p) => p.owns(ptr),
            Engine::Pages(p) => p.owns(ptr),
        }
    }

    /// Gives back what is cached and free; returns the bytes.
    pub fn empty_cache(&mut self) -> u64 {
        match self {
            Engine::Segments(p) => p.empty_cache(),
            Engine::Pages(p) => p.empty_cache(),
        }
    }

    pub fn pending_blocks(&self) -> usize {
        match self {
            Engine::Segments(p) => p.pending_blocks(),
            Engine::Pages(p) => p.pending_blocks(),
        }
    }

    pub fn reset_peak_stats(&mut self) {
        match self {
            Engine::Segments(p) => p.reset_peak_stats(),
            Engine::Pages(p) => p.reset_peak_stats(),
        }
    }

    /// The context's fences and barriers.
    pub fn timeline(&self) -> &CudaBackend {
        match self {
            Engine::Segments(p) => p.backend(),
            Engine::Pages(p) => &p.backend().timeline,
        }
    }

    /// After a wait for the GPU that a free asked for (`free` returned
    /// true). True: the pool asks for one more.
    #[must_use]
    pub fn after_gpu_wait(&mut self) -> bool {
        match self {
            Engine::Segments(p) => {
                p.after_gpu_wait();
                false
            }
            Engine::Pages(p) => p.after_gpu_wait(),
        }
    }

    pub fn timeline_mut(&mut self) -> &mut CudaBackend {
        match self {
            Engine::Segments(p) => p.backend_mut(),
            Engine::Pages(p) => &mut p.backend_mut().timeline,
        }
    }

    /// The context died, and its memory with it: segments, and pages,
    /// mappings and ranges alike (touching those afterwards crashed the
    /// driver on an H100). The pool forgets them.
    pub fn context_died(&mut self) {
        self.timeline_mut().context_died();
        if let Engine::Pages(p) = self {
            p.forget();
        }
    }

    /// Can a block be exported through IPC? (Blocks on pages only where the
    /// device made them shareable.)
    pub fn shareable(&self) -> bool {
        match self {
            Engine::Segments(_) => true,
            Engine::Pages(p) => p.backend().shareable,
        }
    }

    /// Is the block a slice of one page-backed range? (Legacy IPC cannot name it.)
    pub fn is_vmm(&self) -> bool {
        matches!(self, Engine::Pages(_))
    }

    /// What the pool held when a request failed: its fragmentation, the 10
    /// largest live requests, and the virtual addresses it had reserved (VMM).
    pub fn at_oom(&self) -> (Fragmentation, Vec<u64>, u64) {
        let (f, mut largest, addresses): (_, Vec<u64>, _) = match self {
            Engine::Segments(p) => (p.fragmentation(), p.live_blocks().map(|b| b.requested).collect(), 0),
            Engine::Pages(p) => (p.fragmentation(), p.live_requests().collect(), p.stats().va_reserved_bytes),
        };
        largest.sort_unstable_by(|a, b| b.cmp(a));
        largest.truncate(10);
        (f, largest, addresses)
    }

    /// The end record's figures (`dead`: the context died, current figures read 0).
    /// `multi_stream`: reuse waits for fences, `because` of what.
    pub fn record(
        &self,
        device: i32,
        dead: bool,
        multi_stream: bool,
        because: Option<MultiStreamBecause>,
    ) -> PoolRecord {
        let stat = |st: &Stat| log::Stat { current: if dead { 0 } else { st.current }, peak: st.peak };
        let ratio = |reserved: &Stat, requested: &Stat| {
            if requested.peak == 0 {
                1.0
            } else {
                reserved.peak as f64 / requested.peak as f64
            }
        };
        let base = PoolRecord {
            device,
            context_destroyed: dead,
            multi_stream,
            multi_stream_because: because.filter(|_| multi_stream),
            fences: FenceCounters {
                completed_unlocked: self.timeline().progress.completed_unlocked(),
                ..self.timeline().counters
            },
            ..PoolRecord::default()
        };
        match self {
            Engine::Segments(p) => {
                let s = p.stats();
                PoolRecord {
                    allocated_bytes: stat(&s.allocated_bytes),
                    requested_bytes: stat(&s.requested_bytes),
                    reserved_bytes: stat(&s.reserved_bytes),
                    active_bytes: stat(&s.active_bytes),
                    inactive_split_bytes: stat(&s.inactive_split_bytes),
                    segment: stat(&s.segment),
                    num_device_alloc: s.num_device_alloc,
                    num_device_free: s.num_device_free,
                    num_alloc_retries: s.num_alloc_retries,
                    num_ooms: s.num_ooms,
                    num_syncs: s.num_syncs,
                    num_waits: s.num_waits,
                    largest_free_block: if dead { 0 } else { p.fragmentation().largest_free_block },
                    peak_reserved_over_peak_requested: ratio(&s.reserved_bytes, &s.requested_bytes),
                    ..base
                }
            }
            Engine::Pages(p) => {
                let s = p.stats();
                // Ranges stay reserved for the pool's life.
                let ranges = p.ranges() as u64;
                let segment = Stat { current: ranges, peak: ranges, ..Stat::default() };
                let c = &p.backend().costs;
                PoolRecord {
                    allocated_bytes: stat(&s.allocated_bytes),
                    requested_bytes: stat(&s.requested_bytes),
                    reserved_bytes: stat(&s.reserved_bytes),
                    active_bytes: stat(&s.active_bytes),
                    segment: stat(&segment),
                    num_device_alloc: s.num_page_creates,
                    num_device_free: s.num_page_releases,
                    num_ooms: s.num_ooms,
                    num_syncs: s.num_syncs,
                    num_waits: s.num_waits,
                    largest_free_block: if dead { 0 } else { s.idle_bytes.current },
                    peak_reserved_over_peak_requested: ratio(&s.reserved_bytes, &s.requested_bytes),
                    backing: Backing::Vmm,
                    pages: Some(PagesRecord {
                        page_bytes: p.config().large_page,
                        va_reserved_bytes: s.va_reserved_bytes,
                        idle_bytes: stat(&s.idle_bytes),
                        pending_bytes: stat(&s.pending_bytes),
                        creates: s.num_page_creates,
                        releases: s.num_page_releases,
                        maps: s.num_maps,
                        unmaps: s.num_unmaps,
                        remaps: s.num_remaps,
                        grants: s.num_grants,
                        costs: *c,
                        aliases: s.num_aliases,
                        ghost_waits: s.num_ghost_waits,
                        at_peak: s.at_peak.into(),
                    }),
                    ..base
                }
            }
        }
    }
}
