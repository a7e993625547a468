//! The pool's page table: for each reserved range, one slot per page,
//! indexed by page number (a range is found by address in a small ordered
//! map). Looking a page up is O(log ranges), with a handful of ranges.

use std::collections::BTreeMap;

/// A mapped page: its handle and the allocated blocks over it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Slot {
    pub handle: u64,
    pub refs: u32,
    /// Idle, and not to be unmapped before this tag completes.
    pub cooling: Option<u64>,
}

/// A slot with nothing mapped.
const UNMAPPED: Slot = Slot { handle: u64::MAX, refs: 0, cooling: None };

struct RangePages {
    base: u64,
    page: u64,
    /// Grown on demand up to the highest page mapped so far.
    slots: Vec<Slot>,
}

/// Up to this many ranges, a page's range is found by a linear scan.
const SCAN_RANGES: usize = 8;

#[derive(Default)]
pub(super) struct PageTable {
    ranges: Vec<RangePages>,
    /// Range start -> index in `ranges`.
    by_addr: BTreeMap<u64, usize>,
}

impl PageTable {
    /// A new range of pages of `page` bytes from `base`.
    pub fn add_range(&mut self, base: u64, page: u64) {
        self.by_addr.insert(base, self.ranges.len());
        self.ranges.push(RangePages { base, page, slots: Vec::new() });
    }

    /// (range, page number) of the page starting at `addr` (a page start
    /// inside a range). Every allocation and free looks its pages up: a pool
    /// has a handful of ranges, scanned faster than the map is searched.
    #[inline]
    fn locate(&self, addr: u64) -> (usize, usize) {
        let r = if self.ranges.len() <= SCAN_RANGES {
            let mut found = None;
            for (i, rp) in self.ranges.iter().enumerate() {
                if rp.base <= addr && found.is_none_or(|f: usize| self.ranges[f].base < rp.base) {
                    found = Some(i);
                }
            }
            found.expect("a page inside a range")
        } else {
            *self.by_addr.range(..=addr).next_back().expect("a page inside a range").1
        };
        let rp = &self.ranges[r];
        debug_assert!((addr - rp.base).is_multiple_of(rp.page));
        let n = if rp.page.is_power_of_two() {
            (addr - rp.base) >> rp.page.trailing_zeros()
        } else {
            (addr - rp.base) / rp.page
        };
        (r, n as usize)
    }

    /// The page mapped at `addr`, if any.
    pub fn get(&self, addr: u64) -> Option<&Slot> {
        let (r, n) = self.locate(addr);
        self.ranges[r].slots.get(n).filter(|s| **s != UNMAPPED)
    }

    /// The page mapped at `addr`, if any.
    pub fn get_mut(&mut self, addr: u64) -> Option<&mut Slot> {
        let (r, n) = self.locate(addr);
        self.ranges[r].slots.get_mut(n).filter(|s| **s != UNMAPPED)
    }

    /// Records a page mapped at `addr` (where none is).
    pub fn insert(&mut self, addr: u64, slot: Slot) {
        let (r, n) = self.locate(addr);
        let slots = &mut self.ranges[r].slots;
        if slots.len() <= n {
            slots.resize(n + 1, UNMAPPED);
        }
        debug_assert_eq!(slots[n], UNMAPPED);
        slots[n] = slot;
    }

    /// Forgets the page mapped at `addr`; returns it.
    pub fn remove(&mut self, addr: u64) -> Option<Slot> {
        let s = *self.get_mut(addr)?;
        let (r, n) = self.locate(addr);
        self.ranges[r].slots[n] = UNMAPPED;
        Some(s)
    }

    /// Every mapped page as (address, size, slot), by address.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64, Slot)> + '_ {
        self.by_addr.values().flat_map(move |&r| {
            let rp = &self.ranges[r];
            rp.slots
                .iter()
                .enumerate()
                .filter(|(_, s)| **s != UNMAPPED)
                .map(move |(n, s)| (rp.base + n as u64 * rp.page, rp.page, *s))
        })
    }
}
