//! The pool's segments, rebuilt from a pool-mode log.
//!
//! Logs written before version 4 record the program's allocations and frees,
//! not the segments its pool reserved from CUDA (those show only as the
//! `reserved` figure of phase events and the end record); and no log records
//! where the blocks sit in the segments, which the memory_viz export shows.
//! The pool is `cupool-core`'s deterministic
//! allocator, so running the same requests through it again, with the log's
//! options, lays out the same segments and blocks. The replay checks itself
//! against the log: the first block of each segment fixes the segment's real
//! address, and every later block must then land where the program saw it
//! (`placed` / `misplaced`). What it cannot see: a process whose frees waited
//! for the GPU (several streams), segments given back because the program asked
//! for free memory (`cudaMemGetInfo`), allocations CUDA served during a stream
//! capture. The report says how close the rebuilt peak is to the recorded one.

use super::AllocId;
use crate::log::{EventRecord, MemKind};
use crate::options::{GiveBack as Policy, Mode, Options};
use crate::pool::{Backend, BlockId, GiveBack, Pool, PoolConfig, SegmentSnapshot, Timeline};
use std::collections::{BTreeMap, HashMap};

/// Where rebuilt segments start: far from where CUDA or a fake driver put memory.
const REPLAY_BASE: u64 = 0x6000_0000_0000;

/// A device that hands out fresh addresses (never reused) and tells what it did.
struct ReplayDevice {
    next: u64,
    now_ns: u64,
    changes: Vec<(bool, u64, u64)>,
}

impl Backend for ReplayDevice {
    fn allocate_segment(&mut self, size: u64) -> Option<u64> {
        let addr = self.next;
        self.next += size;
        self.changes.push((true, addr, size));
        Some(addr)
    }

    fn release_segment(&mut self, addr: u64, size: u64) {
        self.changes.push((false, addr, size));
    }
}

impl Timeline for ReplayDevice {
    fn now_ns(&mut self) -> u64 {
        self.now_ns
    }
}

/// A segment reserved or given back, at its replay address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentChange {
    pub alloc: bool,
    pub addr: u64,
    pub size: u64,
}

/// Where a pooled allocation went in the replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// Replay address of the block, and its size (the request rounded).
    pub addr: u64,
    pub size: u64,
}

/// What one allocation or free did to the pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    pub block: Option<Placed>,
    /// Segments reserved or given back on the way, in order.
    pub segments: Vec<SegmentChange>,
}

struct DevicePool {
    pool: Pool<ReplayDevice>,
    /// The allocations it serves, and their blocks.
    blocks: HashMap<AllocId, BlockId>,
}

/// The pools of one process, one per device (the log does not name contexts).
pub struct PoolReplay {
    config: PoolConfig,
    pools: BTreeMap<i32, DevicePool>,
    /// Every segment ever made: replay start -> (size, real start once known).
    segments: BTreeMap<u64, (u64, Option<u64>)>,
    /// Blocks that landed where the log says / elsewhere.
    pub placed: u64,
    pub misplaced: u64,
}

/// Would the pool of a pool-mode process have served `e` (an `alloc`), in a
/// log written before allocations said so themselves?
pub fn pooled(e: &EventRecord) -> bool {
    matches!(e.kind.as_ref().and_then(|k| k.known()), Some(MemKind::Device | MemKind::Pitched))
        && e.ptr.is_some()
        && e.size.unwrap_or(0) > 0
}

impl PoolReplay {
    /// A replay for a log written with `opts`; `None` unless in pool mode.
    pub fn new(opts: &Options) -> Option<PoolReplay> {
        if opts.mode != Mode::Pool {
            return None;
        }
        let defaults = PoolConfig::shim_default();
        let give_back = match opts.give_back {
            Policy::Auto => defaults.give_back,
            Policy::Always => GiveBack::Always,
            Policy::Never => GiveBack::Never,
        };
        let limit = if opts.limit == 0 { u64::MAX } else { opts.limit };
        Some(PoolReplay {
            config: PoolConfig { limit, give_back, ..defaults },
            pools: BTreeMap::new(),
            segments: BTreeMap::new(),
            placed: 0,
            misplaced: 0,
        })
    }

    fn pool(&mut self, device: i32, t_ns: u64) -> &mut DevicePool {
        let next = REPLAY_BASE + ((device.max(-1) + 1) as u64) * (1 << 40);
        let config = self.config;
        let p = self.pools.entry(device).or_insert_with(|| DevicePool {
            pool: Pool::new(ReplayDevice { next, now_ns: 0, changes: Vec::new() }, config),
            blocks: HashMap::new(),
        });
        p.pool.backend_mut().now_ns = t_ns;
        p
    }

    /// The program's allocation `id` of `size` bytes at `ptr` on `device`.
    pub fn alloc(&mut self, id: AllocId, device: i32, ptr: u64, size: u64, t_ns: u64) -> Step {
        let p = self.pool(device, t_ns);
        let block = p.pool.allocate(size).ok();
        let info = block.and_then(|b| p.pool.block_info(b.id));
        if let Some(b) = block {
            p.blocks.insert(id, b.id);
        }
        let changes = std::mem::take(&mut p.pool.backend_mut().changes);
        let step = self.record(changes, block.map(|b| Placed { addr: b.addr, size: b.size }));
        if let Some(info) = info {
            let entry = self.segments.entry(info.segment_addr).or_insert((info.segment_size, None));
            let offset = info.addr - info.segment_addr;
            match entry.1 {
                None => {
                    entry.1 = ptr.checked_sub(offset);
                    self.placed += 1;
                }
                Some(real) if real + offset == ptr => self.placed += 1,
                Some(_) => self.misplaced += 1,
            }
        }
        step
    }

    /// The program's allocation `alloc` on `device` ended; `None` when the
    /// replay never placed it (the pool did not serve it).
    pub fn free(&mut self, alloc: AllocId, device: i32, t_ns: u64) -> Option<Step> {
        let p = self.pool(device, t_ns);
        let id = p.blocks.remove(&alloc)?;
        let info = p.pool.block_info(id);
        p.pool.free(id);
        let changes = std::mem::take(&mut p.pool.backend_mut().changes);
        Some(self.record(changes, info.map(|b| Placed { addr: b.addr, size: b.size })))
    }

    /// The pool ran out on `device`: the real one releases its cache (and the
    /// program's next requests start from there).
    pub fn out_of_memory(&mut self, device: i32, t_ns: u64) -> Step {
        let p = self.pool(device, t_ns);
        p.pool.empty_cache();
        let changes = std::mem::take(&mut p.pool.backend_mut().changes);
        self.record(changes, None)
    }

    fn record(&mut self, changes: Vec<(bool, u64, u64)>, block: Option<Placed>) -> Step {
        let segments = changes.into_iter().map(|(alloc, addr, size)| SegmentChange { alloc, addr, size }).collect();
        Step { block, segments }
    }

    /// Bytes the pool of `device` holds from the device now.
    pub fn reserved(&self, device: i32) -> u64 {
        self.pools.get(&device).map_or(0, |p| p.pool.stats().reserved_bytes.current)
    }

    /// Every device with a pool.
    pub fn devices(&self) -> Vec<i32> {
        self.pools.keys().copied().collect()
    }

    /// The segments of `device` now, with their blocks.
    pub fn snapshot(&self, device: i32) -> Vec<SegmentSnapshot> {
        self.pools.get(&device).map(|p| p.pool.snapshot()).unwrap_or_default()
    }

    /// Did every block land where the program saw it?
    pub fn consistent(&self) -> bool {
        self.misplaced == 0
    }

    /// The real address of replay address `addr`: where the program saw the
    /// memory, when the replay agrees with the log; else `addr` itself.
    pub fn real(&self, addr: u64) -> u64 {
        if !self.consistent() {
            return addr;
        }
        match self.segments.range(..=addr).next_back() {
            Some((&start, &(size, Some(real)))) if addr < start + size => real + (addr - start),
            _ => addr,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool_opts() -> Options {
        Options { mode: Mode::Pool, ..Options::default() }
    }

    #[test]
    fn passthrough_logs_have_no_pool() {
        assert!(PoolReplay::new(&Options { mode: Mode::Passthrough, ..Options::default() }).is_none());
    }

    #[test]
    fn small_blocks_share_a_segment_at_the_programs_addresses() {
        let mut r = PoolReplay::new(&pool_opts()).unwrap();
        let base = 0x7f00_0000_0000;
        let a = r.alloc(0, 0, base, 4096, 1);
        assert_eq!(a.segments, vec![SegmentChange { alloc: true, addr: a.block.unwrap().addr, size: 2 << 20 }]);
        let b = r.alloc(1, 0, base + 4096, 1000, 2);
        assert!(b.segments.is_empty(), "the second block fits in the first segment");
        assert_eq!(b.block.unwrap().size, 1024, "rounded to 512 bytes");
        assert!(r.consistent() && r.placed == 2);
        assert_eq!(r.real(b.block.unwrap().addr), base + 4096);
        assert_eq!(r.reserved(0), 2 << 20);
        // Freeing both empties the segment, which goes back (give_back=auto).
        r.free(0, 0, 3).unwrap();
        let last = r.free(1, 0, 4).unwrap();
        assert_eq!(last.segments.len(), 1);
        assert!(!last.segments[0].alloc);
        assert_eq!(r.reserved(0), 0);
        assert!(r.free(7, 0, 5).is_none(), "never placed");
    }

    #[test]
    fn a_block_elsewhere_than_the_log_says_is_counted() {
        let mut r = PoolReplay::new(&pool_opts()).unwrap();
        r.alloc(0, 0, 0x1000_0000, 4096, 1);
        r.alloc(1, 0, 0x2000_0000, 4096, 2); // the real pool put it in another segment
        assert_eq!((r.placed, r.misplaced), (1, 1));
        assert!(!r.consistent());
        let addr = r.snapshot(0)[0].blocks[1].addr;
        assert_eq!(r.real(addr), addr, "replay addresses when the replay disagrees with the log");
    }
}
