//! Hot blocks: a small block freed with no fence (its reuse is ordered by
//! the one stream all work goes to) is kept whole, on its pages, for the
//! next request of its exact rounded size. A loop that allocates and frees
//! one size then skips placement, splitting, merging and page counting, so
//! its pair costs about what the segment pool's does. Under the give-back
//! rule (`cycle_regret_ns`) only sizes the program was seen to allocate
//! again after their pages went back are kept. At most `HOT_BYTES` stay
//! hot, and they are given up before a block needs pages, and by
//! `empty_cache`.

use super::{PageBackend, VmmPool};
use crate::pool::block::{State, NIL};

const HOT_SLOTS: usize = 16;
/// Most bytes kept hot (half a small page by default).
const HOT_BYTES: u64 = 1 << 20;
/// Largest block kept hot.
const HOT_MAX: u64 = 256 << 10;

/// One hot block per slot, found by its size.
#[derive(Debug)]
pub(super) struct HotBlocks {
    slots: [u32; HOT_SLOTS],
    pub bytes: u64,
}

impl Default for HotBlocks {
    fn default() -> Self {
        HotBlocks { slots: [NIL; HOT_SLOTS], bytes: 0 }
    }
}

fn slot(size: u64) -> usize {
    (size >> 9) as usize % HOT_SLOTS
}

impl<B: PageBackend> VmmPool<B> {
    /// Keeps freed block `i` (its stats already counted out) hot, in place
    /// of the hot block of its slot. False: it does not qualify; release it.
    pub(super) fn keep_hot(&mut self, i: u32) -> bool {
        let b = self.blocks[i];
        if self.forgotten || b.size > HOT_MAX || !self.ranges[b.seg as usize].small {
            return false;
        }
        // Under the give-back rule, only a size the program is known to
        // allocate again: the last free of any other may give its page back.
        if self.goes_back(b.size, b.seg) {
            return false;
        }
        let k = slot(b.size);
        let old = self.hot.slots[k];
        let old_size = if old == NIL { 0 } else { self.blocks[old].size };
        if self.hot.bytes - old_size + b.size > HOT_BYTES {
            return false;
        }
        if old != NIL {
            self.hot.bytes -= old_size;
            self.unlist_hot(old);
            self.release_block(old);
            self.trim_after_free();
        }
        self.blocks[i].state = State::Cached;
        self.hot.slots[k] = i;
        self.hot.bytes += b.size;
        true
    }

    /// Takes the hot block of exactly `rounded` bytes, if there is one.
    #[inline]
    pub(super) fn take_hot(&mut self, rounded: u64) -> Option<u32> {
        let k = slot(rounded);
        let i = self.hot.slots[k];
        if i == NIL || self.blocks[i].size != rounded {
            return None;
        }
        self.hot.slots[k] = NIL;
        self.hot.bytes -= rounded;
        Some(i)
    }

    /// Releases every hot block. Never while a block is being placed: a
    /// released block merges with free neighbours, which must all be in
    /// the free index.
    pub(super) fn flush_hot(&mut self) {
        for k in 0..HOT_SLOTS {
            let i = std::mem::replace(&mut self.hot.slots[k], NIL);
            if i != NIL {
                self.unlist_hot(i);
                self.release_block(i);
            }
        }
        self.hot.bytes = 0;
    }

    /// A hot block leaves `live`, where it stayed listed while hot.
    fn unlist_hot(&mut self, i: u32) {
        self.live.remove(&self.blocks[i].addr);
    }

    /// Blocks kept hot, by slot.
    pub fn hot_blocks(&self) -> impl Iterator<Item = crate::pool::Block> + '_ {
        self.hot.slots.iter().filter(|&&i| i != NIL).map(|&i| self.block(i))
    }
}
