//! Read-only views of a pool: address lookups, live blocks, snapshots for OOM
//! reports, fragmentation, and a full consistency check for tests and fuzzing.

use super::block::{BlockRec, State, NIL};
use super::{Backend, BlockId, BlockInfo, Fragmentation, Pool, MIN_BLOCK};

/// State of a block in a [`SegmentSnapshot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// Handed out and not freed.
    Allocated,
    /// Freed, waiting for GPU work queued before the free to complete.
    PendingFree,
    /// Free for reuse.
    Free,
}

/// One block of a [`SegmentSnapshot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSnapshot {
    pub addr: u64,
    pub size: u64,
    /// Size asked for (0 unless allocated or pending).
    pub requested: u64,
    pub state: BlockState,
}

/// A segment and all of its blocks in address order, from [`Pool::snapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSnapshot {
    pub addr: u64,
    pub size: u64,
    /// Does it belong to the small pool?
    pub small: bool,
    pub blocks: Vec<BlockSnapshot>,
}

impl<B: Backend> Pool<B> {
    /// Does `addr` lie inside one of this pool's segments (allocated or not)?
    pub fn owns(&self, addr: u64) -> bool {
        self.seg_by_addr
            .range(..=addr)
            .next_back()
            .is_some_and(|(_, &seg)| addr - self.segs[seg].addr < self.segs[seg].size)
    }

    /// The *allocated* block containing `addr`, with its segment, or `None`
    /// (also for free and pending blocks). O(log segments + blocks in that
    /// segment).
    pub fn lookup(&self, addr: u64) -> Option<BlockInfo> {
        let (_, &seg) = self.seg_by_addr.range(..=addr).next_back()?;
        let s = self.segs[seg];
        if addr - s.addr >= s.size {
            return None;
        }
        let mut i = s.head;
        while i != NIL {
            let b = &self.blocks[i];
            if addr < b.addr + b.size {
                return (b.state == State::Allocated).then(|| self.info(i, b));
            }
            i = b.next;
        }
        None
    }

    /// Every allocated block, in slab order. O(blocks).
    pub fn live_blocks(&self) -> impl Iterator<Item = BlockInfo> + '_ {
        self.blocks.iter().filter(|(_, b)| b.state == State::Allocated).map(|(i, b)| self.info(i, b))
    }

    /// Allocated block `id`, if it is one.
    pub fn block_info(&self, id: BlockId) -> Option<BlockInfo> {
        let b = self.blocks.get(id.0)?;
        (b.state == State::Allocated).then(|| self.info(id.0, b))
    }

    fn info(&self, i: u32, b: &BlockRec) -> BlockInfo {
        let s = &self.segs[b.seg];
        BlockInfo {
            id: BlockId(i),
            addr: b.addr,
            size: b.size,
            requested: b.requested,
            segment_addr: s.addr,
            segment_size: s.size,
        }
    }

    /// How well reserved memory is used. O(1).
    pub fn fragmentation(&self) -> Fragmentation {
        let largest_free_block = self.free.iter().filter_map(|ix| ix.largest()).map(|e| e.size).max().unwrap_or(0);
        let reserved = self.stats.reserved_bytes.current;
        let allocated = self.stats.allocated_bytes.current;
        Fragmentation {
            largest_free_block,
            free_bytes: reserved - self.stats.active_bytes.current,
            reserved,
            allocated,
            ratio: if allocated == 0 { 1.0 } else { reserved as f64 / allocated as f64 },
        }
    }

    /// Every segment with its blocks, in address order. O(blocks); allocates.
    pub fn snapshot(&self) -> Vec<SegmentSnapshot> {
        self.seg_by_addr
            .values()
            .map(|&seg| {
                let s = self.segs[seg];
                let mut blocks = Vec::new();
                let mut i = s.head;
                while i != NIL {
                    let b = &self.blocks[i];
                    blocks.push(BlockSnapshot {
                        addr: b.addr,
                        size: b.size,
                        requested: if b.state == State::Free { 0 } else { b.requested },
                        state: match b.state {
                            State::Allocated => BlockState::Allocated,
                            State::Pending => BlockState::PendingFree,
                            _ => BlockState::Free,
                        },
                    });
                    i = b.next;
                }
                SegmentSnapshot { addr: s.addr, size: s.size, small: s.small, blocks }
            })
            .collect()
    }

    /// Checks every internal invariant (links, tiling, coalescing, the free
    /// index, the pending queue, and the current value of every stat). O(n).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut t = Totals::default();
        let mut prev_end = 0u64;
        for (&addr, &seg) in &self.seg_by_addr {
            let s = self.segs[seg];
            if s.addr != addr || s.head == NIL {
                return Err(format!("segment map broken at {addr:#x}"));
            }
            if addr < prev_end {
                return Err(format!("segments overlap at {addr:#x}"));
            }
            prev_end = addr + s.size;
            t.seg(s.size, s.small);
            let (mut i, mut prev, mut at, mut prev_free) = (s.head, NIL, addr, false);
            while i != NIL {
                let b = &self.blocks[i];
                let here = format!("block {i} at {:#x} in segment {addr:#x}", b.addr);
                if b.prev != prev || b.seg != seg || b.addr != at {
                    return Err(format!("{here}: bad links or not contiguous"));
                }
                if b.size == 0 || !b.size.is_multiple_of(MIN_BLOCK) || !b.addr.is_multiple_of(MIN_BLOCK) {
                    return Err(format!("{here}: misaligned"));
                }
                let free = b.state == State::Free;
                if free && prev_free {
                    return Err(format!("{here}: two adjacent free blocks"));
                }
                if free != self.free[s.small as usize].contains(b.size, b.addr, i) {
                    return Err(format!("{here}: free index disagrees with state"));
                }
                match b.state {
                    State::Vacant => return Err(format!("{here}: vacant slot in a segment")),
                    State::Allocated => t.allocated(b),
                    State::Pending => t.pending(b),
                    State::Free => t.free(b),
                    State::Cached => return Err(format!("{here}: a cached block in a segment")),
                }
                prev_free = free;
                prev = i;
                at += b.size;
                i = b.next;
            }
            if at != addr + s.size {
                return Err(format!("segment {addr:#x}: blocks do not tile it"));
            }
        }
        let in_use = self.blocks.iter().filter(|(_, b)| b.state != State::Vacant);
        if in_use.count() as u64 != t.blocks {
            return Err("block records outside any segment".into());
        }
        let indexed = self.free[0].len() + self.free[1].len();
        if indexed as u64 != t.free_blocks {
            return Err(format!("{indexed} indexed, {} free", t.free_blocks));
        }
        if self.pending.len() as u64 != t.pending_blocks {
            return Err("pending queue disagrees with block states".into());
        }
        let mut last_tag = None;
        for &(i, tag) in &self.pending {
            if self.blocks.get(i).map(|b| b.state) != Some(State::Pending) {
                return Err(format!("pending entry {i} is not a pending block"));
            }
            if last_tag.is_some_and(|l| l > tag) {
                return Err("pending tags decrease".into());
            }
            last_tag = Some(tag);
        }
        let s = &self.stats;
        let pairs = [
            ("allocated_bytes", s.allocated_bytes.current, t.allocated_bytes),
            ("requested_bytes", s.requested_bytes.current, t.requested_bytes),
            ("reserved_bytes", s.reserved_bytes.current, t.reserved),
            ("reserved_bytes_small", s.reserved_bytes_small.current, t.reserved_small),
            ("reserved_bytes_large", s.reserved_bytes_large.current, t.reserved - t.reserved_small),
            ("active_bytes", s.active_bytes.current, t.allocated_bytes + t.pending_bytes),
            ("inactive_split_bytes", s.inactive_split_bytes.current, t.split_free_bytes),
            ("allocation", s.allocation.current, t.allocated_blocks),
            ("segment", s.segment.current, t.segments),
            ("active", s.active.current, t.allocated_blocks + t.pending_blocks),
            ("inactive_split", s.inactive_split.current, t.split_free_blocks),
        ];
        for (name, have, want) in pairs {
            if have != want {
                return Err(format!("stat {name}: {have}, recomputed {want}"));
            }
        }
        Ok(())
    }
}

#[derive(Default)]
struct Totals {
    segments: u64,
    reserved: u64,
    reserved_small: u64,
    blocks: u64,
    allocated_blocks: u64,
    allocated_bytes: u64,
    requested_bytes: u64,
    pending_blocks: u64,
    pending_bytes: u64,
    free_blocks: u64,
    split_free_blocks: u64,
    split_free_bytes: u64,
}

impl Totals {
    fn seg(&mut self, size: u64, small: bool) {
        self.segments += 1;
        self.reserved += size;
        if small {
            self.reserved_small += size;
        }
    }
    fn allocated(&mut self, b: &BlockRec) {
        self.blocks += 1;
        self.allocated_blocks += 1;
        self.allocated_bytes += b.size;
        self.requested_bytes += b.requested;
    }
    fn pending(&mut self, b: &BlockRec) {
        self.blocks += 1;
        self.pending_blocks += 1;
        self.pending_bytes += b.size;
    }
    fn free(&mut self, b: &BlockRec) {
        self.blocks += 1;
        self.free_blocks += 1;
        if b.is_split() {
            self.split_free_blocks += 1;
            self.split_free_bytes += b.size;
        }
    }
}
