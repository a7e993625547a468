//! Block and segment records.
//!
//! Blocks live in a slab (`Vec<BlockRec>`) addressed by `u32` indices; vacant
//! slots form a LIFO list threaded through `next`, so steady-state splitting
//! and merging never touches the heap. The blocks of one segment form a doubly
//! linked list in address order, which is what coalescing walks.

/// "No block": end of a list.
pub(crate) const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Slot on the vacant list.
    Vacant,
    /// Handed out to the caller.
    Allocated,
    /// Freed by the caller, waiting for its tag to complete.
    Pending,
    /// In the free index.
    Free,
    /// Freed by the caller and kept whole, on its pages, for the next
    /// request of its size (the VMM pool's hot blocks).
    Cached,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockRec {
    pub addr: u64,
    pub size: u64,
    /// Size asked for by the caller (allocated blocks only).
    pub requested: u64,
    /// Neighbours in the segment, by address; `NIL` at the ends.
    pub prev: u32,
    pub next: u32,
    /// Segment slot.
    pub seg: u32,
    pub state: State,
}

impl BlockRec {
    /// Is this block only part of its segment?
    #[inline]
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct SegRec {
    pub addr: u64,
    pub size: u64,
    pub small: bool,
    /// First block (lowest address); `NIL` when the slot is vacant.
    pub head: u32,
    /// Blocks of it handed out and not yet freed.
    pub allocated: u32,
}

/// Slab of block records with a vacant-slot list.
pub(crate) struct BlockSlab {
    recs: Vec<BlockRec>,
    vacant: u32,
}

impl BlockSlab {
    pub fn new() -> Self {
        BlockSlab { recs: Vec::new(), vacant: NIL }
    }

    /// Stores `rec` in a vacant slot (or a new one) and returns its index.
    #[inline]
    pub fn insert(&mut self, rec: BlockRec) -> u32 {
        if self.vacant != NIL {
            let i = self.vacant;
            let slot = &mut self.recs[i as usize];
            debug_assert_eq!(slot.state, State::Vacant);
            self.vacant = slot.next;
            *slot = rec;
            i
        } else {
            let i = self.recs.len();
            assert!(i < NIL as usize, "cupool: more than 2^32 - 1 blocks");
            self.recs.push(rec);
            i as u32
        }
    }

    /// Cuts block `i` at `at` bytes: the rest becomes a free block of its own
    /// (not indexed), linked after `i`; returns the rest's slot.
    #[inline]
    pub fn split_off(&mut self, i: u32, at: u64) -> u32 {
        let b = self[i];
        let rest = self.insert(BlockRec {
            addr: b.addr + at,
            size: b.size - at,
            requested: 0,
            prev: i,
            next: b.next,
            seg: b.seg,
            state: State::Free,
        });
        if b.next != NIL {
            self[b.next].prev = rest;
        }
        let r = &mut self[i];
        r.next = rest;
        r.size = at;
        rest
    }

    /// Makes block `i` free, merged with its free neighbours; `unindex` is
    /// shown each neighbour (as it is, before its links change) so that the
    /// caller can take it out of its free index. Returns the merged block's
    /// slot (not indexed).
    #[inline]
    pub fn merge_free(&mut self, mut i: u32, mut unindex: impl FnMut(&BlockRec)) -> u32 {
        let b = self[i];
        if b.prev != NIL && self[b.prev].state == State::Free {
            unindex(&self[b.prev]);
            self.absorb_next(b.prev);
            i = b.prev;
        }
        let n = self[i].next;
        if n != NIL && self[n].state == State::Free {
            unindex(&self[n]);
            self.absorb_next(i);
        }
        self[i].state = State::Free;
        i
    }

    /// Merges the block after `i` into `i`, which keeps its address.
    #[inline]
    fn absorb_next(&mut self, i: u32) {
        let n = self[i].next;
        let nr = self[n];
        let r = &mut self[i];
        r.size += nr.size;
        r.next = nr.next;
        if nr.next != NIL {
            self[nr.next].prev = i;
        }
        self.remove(n);
    }

    /// Puts slot `i` on the vacant list.
    #[inline]
    pub fn remove(&mut self, i: u32) {
        let vacant = self.vacant;
        let slot = &mut self.recs[i as usize];
        slot.state = State::Vacant;
        slot.next = vacant;
        slot.prev = NIL;
        self.vacant = i;
    }

    /// The record at `i` if that slot is in use.
    #[inline]
    pub fn get(&self, i: u32) -> Option<&BlockRec> {
        self.recs.get(i as usize).filter(|r| r.state != State::Vacant)
    }

    /// Every slot, vacant ones included, with its index.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &BlockRec)> + '_ {
        self.recs.iter().enumerate().map(|(i, r)| (i as u32, r))
    }
}

/// Slab of segment records (segments come and go rarely).
pub(crate) struct SegSlab {
    recs: Vec<SegRec>,
    vacant: Vec<u32>,
}

impl SegSlab {
    pub fn new() -> Self {
        SegSlab { recs: Vec::new(), vacant: Vec::new() }
    }

    pub fn insert(&mut self, rec: SegRec) -> u32 {
        match self.vacant.pop() {
            Some(i) => {
                self.recs[i as usize] = rec;
                i
            }
            None => {
                self.recs.push(rec);
                (self.recs.len() - 1) as u32
            }
        }
    }

    pub fn remove(&mut self, i: u32) {
        self.recs[i as usize].head = NIL;
        self.vacant.push(i);
    }
}

/// `slab[i]` for a slab of `$rec` records in a `recs` vector.
macro_rules! index_by_u32 {
    ($slab:ty => $rec:ty) => {
        impl std::ops::Index<u32> for $slab {
            type Output = $rec;
            #[inline]
            fn index(&self, i: u32) -> &$rec {
                &self.recs[i as usize]
            }
        }

        impl std::ops::IndexMut<u32> for $slab {
            #[inline]
            fn index_mut(&mut self, i: u32) -> &mut $rec {
                &mut self.recs[i as usize]
            }
        }
    };
}

index_by_u32!(BlockSlab => BlockRec);
index_by_u32!(SegSlab => SegRec);
