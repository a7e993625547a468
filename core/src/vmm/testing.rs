//! A simulated VMM device for tests and trace replay. Compiled for the
//! crate's own tests and with the cargo feature `testing`.
//!
//! It hands out virtual ranges end to end from [`BASE_ADDR`] and page handles
//! 1, 2, 3, ..., and checks the pool as it goes (panicking on a violation):
//! every range is aligned and every mapping is a whole page of its range; a page is mapped only inside a
//! reserved range, at an address where nothing is mapped; a page mapped
//! again elsewhere keeps its older mappings as ghosts, which must all go
//! before its newest place does; an unmap names a mapping with its size; a
//! released page is not mapped. [`capacity`](SimulatedPages::capacity) bounds the
//! bytes of pages held at once.

use std::collections::BTreeMap;

use super::PageBackend;
use crate::pool::testing::SimulatedTimeline;
use crate::pool::Timeline;

/// Address of the first range, far from null.
pub const BASE_ADDR: u64 = 1 << 44;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimulatedPages {
    /// Most bytes of pages held at once; `None`: unbounded.
    pub capacity: Option<u64>,
    /// Bytes of that capacity held by others (another process).
    pub others: u64,
    /// The simulated GPU timeline (fences, clock), reached through the
    /// device as `dev.fences`, `dev.launch()`, `dev.now`.
    pub gpu: SimulatedTimeline,
    /// Spans granted access, in order.
    pub granted: Vec<(u64, u64)>,
    /// Every unmap as (address, newest completed work then), in order.
    pub unmapped: Vec<(u64, u64)>,
    /// Most bytes of virtual ranges reserved in all (as `ulimit -v` bounds
    /// a process's address space); `None`: unbounded.
    pub address_space: Option<u64>,
    /// `map` / `grant` fail (as a device may refuse them).
    pub refuse_maps: bool,
    pub refuse_grants: bool,
    next_addr: u64,
    next_handle: u64,
    /// Reserved ranges: start -> size.
    ranges: BTreeMap<u64, u64>,
    /// Pages held: handle -> (size, where it is mapped).
    pages: BTreeMap<u64, (u64, Option<u64>)>,
    /// Mappings: address -> (size, handle).
    mapped: BTreeMap<u64, (u64, u64)>,
    /// Older mappings of pages mapped again elsewhere (ghosts): address -> handle.
    ghosts: BTreeMap<u64, u64>,
    held: u64,
}

impl SimulatedPages {
    pub fn new() -> Self {
        SimulatedPages { next_addr: BASE_ADDR, next_handle: 1, ..Default::default() }
    }

    /// Holds at most `capacity` bytes of pages at once (`None`: unbounded).
    pub fn with_capacity(mut self, capacity: Option<u64>) -> Self {
        self.capacity = capacity;
        self
    }

    /// Bytes of pages held (mapped or not).
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Pages held: handle -> (size, address where it is mapped).
    pub fn pages(&self) -> &BTreeMap<u64, (u64, Option<u64>)> {
        &self.pages
    }

    /// Ghost mappings: address -> handle.
    pub fn ghosts(&self) -> &BTreeMap<u64, u64> {
        &self.ghosts
    }

    /// The handle mapped over `addr`, if any, with the mapping's start.
    pub fn handle_at(&self, addr: u64) -> Option<(u64, u64)> {
        let (&start, &(size, handle)) = self.mapped.range(..=addr).next_back()?;
        (addr < start + size).then_some((start, handle))
    }
}

impl PageBackend for SimulatedPages {
    fn reserve(&mut self, size: u64, align: u64) -> Option<u64> {
        assert!(align.is_power_of_two() && size > 0 && size.is_multiple_of(align), "reserve({size}, {align})");
        let reserved: u64 = self.ranges.values().sum();
        if self.address_space.is_some_and(|most| reserved + size > most) {
            return None;
        }
        let addr = self.next_addr.next_multiple_of(align);
        self.next_addr = addr.checked_add(size)?;
        self.ranges.insert(addr, size);
        Some(addr)
    }

    fn create_page(&mut self, size: u64) -> Option<u64> {
        assert!(size > 0, "an empty page");
        if self.capacity.is_some_and(|c| self.held + self.others + size > c) {
            return None;
        }
        let h = self.next_handle;
        self.next_handle += 1;
        self.pages.insert(h, (size, None));
        self.held += size;
        Some(h)
    }

    fn map(&mut self, addr: u64, size: u64, handle: u64) -> bool {
        if self.refuse_maps {
            return false;
        }
        let (&start, &len) = self.ranges.range(..=addr).next_back().expect("map below every range");
        assert!((addr - start).is_multiple_of(size), "map at {addr:#x}: not a page of the range at {start:#x}");
        assert!(addr + size <= start + len, "map at {addr:#x} outside the reserved ranges");
        let page = self.pages.get_mut(&handle).expect("map of a page never created or released");
        assert_eq!(page.0, size, "page {handle} mapped with another size");
        if let Some(old) = page.1 {
            self.ghosts.insert(old, handle);
        }
        assert!(self.handle_at(addr).is_none() && self.handle_at(addr + size - 1).is_none(), "{addr:#x} mapped twice");
        let page = self.pages.get_mut(&handle).expect("checked above");
        page.1 = Some(addr);
        self.mapped.insert(addr, (size, handle));
        true
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        let (len, handle) = self.mapped.remove(&addr).unwrap_or_else(|| panic!("unmap of {addr:#x}: not mapped"));
        self.unmapped.push((addr, self.gpu.completed));
        assert_eq!(len, size, "unmap of {addr:#x} with the wrong size");
        if self.ghosts.remove(&addr).is_none() {
            assert!(!self.ghosts.values().any(|&h| h == handle), "page {handle} unmapped before its ghost");
            self.pages.get_mut(&handle).expect("a mapped page exists").1 = None;
        }
    }

    fn release_page(&mut self, handle: u64) {
        let (size, at) = self.pages.remove(&handle).expect("release of a page not held");
        assert_eq!(at, None, "release of page {handle} while mapped");
        self.held -= size;
    }

    fn device_memory(&mut self) -> Option<(u64, u64)> {
        self.capacity.map(|c| (c.saturating_sub(self.held + self.others), c))
    }

    fn grant(&mut self, addr: u64, size: u64) -> bool {
        assert!(size > 0, "an empty grant");
        if self.refuse_grants {
            return false;
        }
        let mut a = addr;
        while a < addr + size {
            let (start, handle) = self.handle_at(a).unwrap_or_else(|| panic!("grant over {a:#x}: not mapped"));
            a = start + self.pages[&handle].0;
        }
        self.granted.push((addr, size));
        true
    }
}

impl Timeline for SimulatedPages {
    crate::delegate_timeline!(gpu);
}

impl std::ops::Deref for SimulatedPages {
    type Target = SimulatedTimeline;
    fn deref(&self) -> &SimulatedTimeline {
        &self.gpu
    }
}

impl std::ops::DerefMut for SimulatedPages {
    fn deref_mut(&mut self) -> &mut SimulatedTimeline {
        &mut self.gpu
    }
}
