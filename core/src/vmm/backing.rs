//! The pool's pages: mapping them under a block (`back`), taking the block
//! off them (`unback`), idle pages cooling until the GPU finished with
//! them, moved where a new block needs them, created, and given back.

use super::pages::Slot;
use super::{Cooling, PageBackend, Range, VmmPool};

/// Missing pages from which a block first asks whether they could be had
/// (`could_have`: one driver call; fewer pages cost little to try).
const EARLY_FAILURE_PAGES: u64 = 64;

impl<B: PageBackend> VmmPool<B> {
    /// Pages overlapping `[addr, addr + size)` of range `seg`, by address.
    pub(super) fn page_span(&self, seg: u32, addr: u64, size: u64) -> impl Iterator<Item = u64> {
        let Range { addr: base, small, .. } = self.ranges[seg as usize];
        let p = self.config.page(small);
        let first = base + (addr - base) / p * p;
        let last = base + (addr + size - 1 - base) / p * p;
        (first..=last).step_by(p as usize)
    }

    /// Maps every page under `[addr, addr + size)` that is not mapped and
    /// counts the block on each. False (nothing counted) when a page could
    /// not be had.
    pub(super) fn back(&mut self, seg: u32, addr: u64, size: u64) -> bool {
        let small = self.ranges[seg as usize].small;
        let p = self.config.page(small);
        // A multiplication, not `size / p`: this runs for every block, and a
        // division by a page size the compiler cannot see costs nanoseconds.
        if size >= EARLY_FAILURE_PAGES * p {
            // Asked before anything is counted, so that a refusal leaves no trace.
            let (mut missing, mut idle_here) = (0, 0);
            for a in self.page_span(seg, addr, size) {
                match self.pages.get(a) {
                    None => missing += 1,
                    Some(pg) if pg.refs == 0 => idle_here += 1,
                    Some(_) => {}
                }
            }
            if missing >= EARLY_FAILURE_PAGES && !self.could_have(missing * p, idle_here * p) {
                return false;
            }
        }
        let in_use_peak = self.stats.in_use_bytes.peak;
        // Pages already mapped first, so that none of them is taken as idle
        // for another page of the same block.
        let mut missing = 0;
        for a in self.page_span(seg, addr, size) {
            match self.pages.get_mut(a) {
                Some(pg) => {
                    pg.refs += 1;
                    if pg.refs == 1 {
                        // Idle, cooling or not: used in place, no unmap.
                        if pg.cooling.take().is_some() {
                            self.stats.cooling_bytes.dec(p);
                        }
                        self.idle[small as usize].remove(&a);
                        if self.doomed.remove(&a).is_some() {
                            self.doomed_bytes -= p;
                        }
                        self.stats.idle_bytes.dec(p);
                        self.stats.in_use_bytes.inc(p);
                    }
                }
                None => missing += 1,
            }
        }
        if missing == 0 {
            return true;
        }
        // The span from the first page mapped here to the last is mapped
        // throughout once they are: it is granted access in one call.
        let mut granted: Option<(u64, u64)> = None;
        // Pages mapped here that are mapped nowhere else (no ghost): should
        // the block fail, no work can have touched them. (This path maps
        // pages, tens of microseconds each: a list costs nothing here.)
        let mut fresh = Vec::new();
        let mut peaks_before = self.stats.page_peaks();
        peaks_before.in_use = in_use_peak; // before this block's pages in place were counted
        let most_reserved_before = self.most_reserved;
        let mut ok = true;
        for a in self.page_span(seg, addr, size) {
            if self.pages.get(a).is_some() {
                continue;
            }
            if self.ghosts.contains_key(&a) && !self.clear_ghost(a) {
                ok = false;
                break;
            }
            let Some((handle, from)) = self.page_for(p) else {
                ok = false;
                break;
            };
            if !self.backend.map(a, p, handle) {
                match from {
                    Some(ghost) => self.restore_ghost(ghost, handle),
                    None => self.release_unmapped(handle, p),
                }
                ok = false;
                break;
            }
            self.stats.num_maps += 1;
            match from {
                Some(ghost) => self.adopt_ghosts(ghost, a),
                None => fresh.push(a),
            }
            self.pages.insert(a, Slot { handle, refs: 1, cooling: None });
            self.stats.in_use_bytes.inc(p);
            granted = Some((granted.map_or(a, |g| g.0), a + p));
        }
        if let Some((from, to)) = granted {
            self.stats.num_grants += 1;
            ok &= self.backend.grant(from, to - from);
        }
        if !ok {
            // The pages mapped here for nothing else go back now: left to
            // cool behind queued work, they would hold device memory that
            // no block uses (a request larger than the device made it all
            // pages, and a `cudaMallocAsync` right after it failed).
            for a in fresh {
                let Slot { handle, .. } = self.pages.remove(a).expect("mapped above");
                self.backend.unmap(a, p);
                self.stats.num_unmaps += 1;
                self.stats.in_use_bytes.dec(p);
                self.release_unmapped(handle, p);
            }
            // Undo the counts: the pages of the span mapped before lose this
            // block; those it alone held become idle.
            self.unback(seg, addr, size, false);
            if granted.is_some() {
                // Pages mapped here may not be accessible: none may stay idle.
                self.trim_idle(0);
            }
            self.stats.forget_failed_peaks(peaks_before);
            self.most_reserved = most_reserved_before.max(self.stats.reserved_bytes.current);
        }
        ok
    }

    /// Could the pool have `bytes` more pages now: idle ones moved (cooling
    /// ones included), new ones within the limit and what the device has
    /// free? Made one by one until the device refuses, the pages of a
    /// request larger than the device took seconds on a large GPU and held
    /// all its memory meanwhile, where `cudaMalloc` fails at once. Never
    /// beside the pages in use when they would pass the device's total;
    /// else, within a sixteenth of what looks free, the pages are tried:
    /// the device decides (another process may be freeing memory).
    /// (`idle_here`: bytes of idle pages the block would use in place.)
    fn could_have(&mut self, bytes: u64, idle_here: u64) -> bool {
        let under_limit = self.config.limit.saturating_sub(self.stats.reserved_bytes.current);
        let (free, total) = self.backend.device_memory().unwrap_or((u64::MAX, u64::MAX));
        let in_use_after = self.stats.in_use_bytes.current.saturating_add(idle_here).saturating_add(bytes);
        if in_use_after > total {
            return false;
        }
        // Idle pages elsewhere may move under it.
        let movable = self.stats.idle_bytes.current.saturating_sub(idle_here);
        let have = movable.saturating_add(free.min(under_limit));
        bytes <= have.saturating_add(bytes / 16)
    }

    /// Gives back a page held but mapped nowhere.
    fn release_unmapped(&mut self, handle: u64, size: u64) {
        self.backend.release_page(handle);
        self.stats.num_page_releases += 1;
        self.stats.reserved_bytes.dec(size);
    }

    /// A page of `size` bytes for a block, and where it was taken from while
    /// cooling (a ghost now): an idle page the GPU is done with; else, when
    /// a new page would set a new peak of reserved bytes, a cooling page;
    /// else a new page; else, when the device or the limit refuses one, a
    /// cooling page; else a new page after giving idle pages back.
    ///
    /// A move costs the program's thread an unmap more than a new page does
    /// (on an H100, 16-25 µs per page mapping, beside 25-40 µs to grant
    /// access either way), and its ghost can make a later block wait for the
    /// GPU, so below the peak a page is made instead. At the peak a
    /// page made stays held for the rest of the run: a program that runs
    /// ahead of its GPU has its pages cooling exactly when a step peaks, and
    /// making pages there had raised the transformer's peak by 50 MiB
    /// (BENCHMARKS.md, section 12).
    fn page_for(&mut self, size: u64) -> Option<(u64, Option<u64>)> {
        if let Some(h) = self.cooled_page(size) {
            return Some((h, None));
        }
        if self.stats.reserved_bytes.current + size > self.most_reserved {
            if let Some((ghost, h)) = self.cooling_page(size) {
                return Some((h, Some(ghost)));
            }
        }
        if let Some(h) = self.new_page(size) {
            return Some((h, None));
        }
        if let Some((ghost, h)) = self.cooling_page(size) {
            return Some((h, Some(ghost)));
        }
        self.create_page_after_giving_back(size).map(|h| (h, None))
    }

    /// Takes an idle page of `size` bytes the GPU is done with from where it
    /// is mapped (the highest such page); returns its handle.
    fn cooled_page(&mut self, size: u64) -> Option<u64> {
        if !self.config.remap_idle {
            return None;
        }
        self.promote();
        let kind = [false, true].into_iter().filter(|&s| self.config.page(s) == size).max_by_key(|&s| {
            self.idle[s as usize].last().copied().unwrap_or(0) // the highest idle page of either kind
        })?;
        let a = self.idle[kind as usize].pop_last()?;
        self.stats.num_remaps += 1;
        Some(self.unmap_idle(a, size))
    }

    /// Unmaps the idle page at `a` (taken off the idle set), and its ghosts
    /// first; returns its handle.
    fn unmap_idle(&mut self, a: u64, size: u64) -> u64 {
        self.drop_ghosts_of(a);
        let Slot { handle, .. } = self.pages.remove(a).expect("an idle page is mapped");
        if self.doomed.remove(&a).is_some() {
            self.doomed_bytes -= size;
        }
        self.backend.unmap(a, size);
        self.stats.num_unmaps += 1;
        self.stats.idle_bytes.dec(size);
        handle
    }

    /// A new page of `size` bytes after the device or the limit refused one:
    /// every idle page is given back first (pages of another size, or all of
    /// them without `remap_idle`) and the device asked again, as PyTorch
    /// empties its cache before an out-of-memory error.
    #[cold]
    fn create_page_after_giving_back(&mut self, size: u64) -> Option<u64> {
        if self.stats.idle_bytes.current == 0 {
            return None;
        }
        self.trim_idle(0);
        if let Some(h) = self.new_page(size) {
            return Some(h);
        }
        // Idle pages the GPU may still touch: wait for it, then give them back.
        if !self.cool_down() {
            return None;
        }
        self.trim_idle(0);
        self.new_page(size)
    }

    /// A new page, if the limit and the device allow it now.
    fn new_page(&mut self, size: u64) -> Option<u64> {
        let h = self.try_create_page(size)?;
        self.stats.num_page_creates += 1;
        self.stats.reserved_bytes.inc(size);
        self.most_reserved = self.most_reserved.max(self.stats.reserved_bytes.current);
        if self.stats.reserved_bytes.current == self.stats.reserved_bytes.peak {
            self.note_peak();
        }
        Some(h)
    }

    pub(super) fn try_create_page(&mut self, size: u64) -> Option<u64> {
        if self.stats.reserved_bytes.current.saturating_add(size) > self.config.limit {
            return None;
        }
        self.backend.create_page(size)
    }

    /// Takes the block off every mapped page under it; pages left with no
    /// block become idle. With `doom` (a freed block of a size the program
    /// has not been seen to allocate again), those pages are to go back as
    /// soon as the GPU is done with them (a bulk free gives memory back, as
    /// `cudaFree` does), and the size is remembered, so that allocating it
    /// again soon marks it as cycling.
    pub(super) fn unback(&mut self, seg: u32, addr: u64, size: u64, doom: bool) {
        let small = self.ranges[seg as usize].small;
        let p = self.config.page(small);
        let mut tag = None;
        let mut doomed_any = false;
        for a in self.page_span(seg, addr, size) {
            // Absent only when `back` failed before it reached this page.
            let Some(pg) = self.pages.get_mut(a) else { continue };
            pg.refs -= 1;
            if pg.refs > 0 {
                continue;
            }
            self.stats.in_use_bytes.dec(p);
            self.stats.idle_bytes.inc(p);
            // Every page under the block held it, so none is doomed yet.
            if doom && self.doomed.insert(a, small).is_none() {
                self.doomed_bytes += p;
                doomed_any = true;
            }
            // Work queued for any block that lived on the page may still run:
            // the page cools until everything queued by now is done. (The
            // newest free tag of its blocks would do, and lets pages move
            // sooner; on an H200 the pool then moved pages so often that the
            // transformer ran 1.67x slower in one run: BENCHMARKS.md, section 12.)
            let cool = *tag.get_or_insert_with(|| self.backend.unmap_tag());
            let cool = cool.filter(|&t| self.finished_upto.is_none_or(|c| t > c));
            self.pages.get_mut(a).expect("looked up above").cooling = cool;
            match cool {
                Some(t) => {
                    self.cool(t, a, small);
                    self.stats.cooling_bytes.inc(p);
                }
                None => {
                    self.idle[small as usize].insert(a);
                }
            }
        }
        if doomed_any {
            let now = self.backend.now_ns();
            self.cycles.gave_back(self.cycle_key(size, small), now);
        }
    }

    /// Queues a page to cool until `tag` finished. The queue stays in tag
    /// order (a page freed by an older tag may go idle after a newer one).
    pub(super) fn cool(&mut self, tag: u64, addr: u64, small: bool) {
        let c = Cooling { tag, addr, small };
        if self.cooling.back().is_none_or(|b| b.tag <= tag) {
            self.cooling.push_back(c);
        } else {
            let at = self.cooling.partition_point(|b| b.tag <= tag);
            self.cooling.insert(at, c);
        }
    }

    /// The handle of the page a cooling entry names, unless it was used
    /// again or given back since (a stale entry).
    pub(super) fn still_cooling(&self, c: &Cooling) -> Option<u64> {
        let pg = self.pages.get(c.addr).filter(|pg| pg.refs == 0 && pg.cooling == Some(c.tag))?;
        Some(pg.handle)
    }

    /// Cooling pages whose work is done become idle pages that may be unmapped.
    pub(super) fn promote(&mut self) {
        while let Some(&c) = self.cooling.front() {
            if !self.tag_done(c.tag) {
                break;
            }
            self.cooling.pop_front();
            if self.still_cooling(&c).is_some() {
                self.pages.get_mut(c.addr).expect("still cooling").cooling = None;
                self.stats.cooling_bytes.dec(self.config.page(c.small));
                self.idle[c.small as usize].insert(c.addr);
            }
        }
        while let Some(&(tag, a)) = self.ghosts_by_tag.first() {
            if !self.tag_done(tag) {
                return;
            }
            self.drop_ghost(a);
        }
    }

    /// Has the GPU finished what was queued before `tag` (an unmap tag)?
    pub(super) fn tag_done(&mut self, tag: u64) -> bool {
        if self.finished_upto.is_some_and(|c| tag <= c) {
            return true;
        }
        if !self.backend.is_finished(tag) {
            return false;
        }
        self.finished_upto = Some(tag);
        true
    }

    /// Gives back the doomed pages the GPU is done with. When more than
    /// `keep_free` bytes of them still wait for it, the next free asks its
    /// owner to wait for it (a bulk free: `cudaFree` would have synchronized
    /// too), which the owner does with the pool's lock let go.
    pub(super) fn release_doomed(&mut self) {
        if self.doomed.is_empty() {
            return;
        }
        self.promote();
        if self.doomed_bytes > self.config.keep_free && self.doomed.keys().any(|&a| self.is_cooling(a)) {
            self.wait_asked = true;
        }
        let ready: Vec<(u64, bool)> =
            self.doomed.iter().filter(|&(&a, _)| !self.is_cooling(a)).map(|(&a, &s)| (a, s)).collect();
        for (a, small) in ready {
            if self.idle[small as usize].remove(&a) {
                let p = self.config.page(small);
                let handle = self.unmap_idle(a, p);
                self.release_unmapped(handle, p);
            }
        }
    }

    /// Records where the pages are at a new peak of reserved bytes; the
    /// block they are made for is added once it is counted (`peak_moved`).
    #[cold]
    fn note_peak(&mut self) {
        self.peak_moved = true;
        let s = &self.stats;
        self.stats.at_peak = super::PeakBreakdown {
            reserved: s.reserved_bytes.current,
            allocated: s.allocated_bytes.current,
            pending: s.pending_bytes.current,
            idle: s.idle_bytes.current,
            cooling: s.cooling_bytes.current,
        };
    }

    pub(super) fn is_cooling(&self, a: u64) -> bool {
        self.pages.get(a).is_some_and(|pg| pg.cooling.is_some())
    }

    /// The newest tag a cooling page or a ghost waits for.
    pub(super) fn newest_unmap_tag(&self) -> Option<u64> {
        let ghost = self.ghosts_by_tag.last().map(|&(t, _)| t);
        self.cooling.back().map(|c| c.tag).max(ghost)
    }

    /// Waits for the GPU so that every cooling page may be unmapped; false
    /// when waiting is impossible now (a capture).
    pub(super) fn cool_down(&mut self) -> bool {
        let newest = self.newest_unmap_tag();
        if newest.is_none() || !self.backend.synchronize() {
            return false;
        }
        self.stats.num_syncs += 1;
        self.finished_upto = self.finished_upto.max(newest);
        self.promote();
        true
    }

    /// Gives idle pages back, highest address first, while more than `keep`
    /// bytes of them are held. Returns the bytes released.
    pub(super) fn trim_idle(&mut self, keep: u64) -> u64 {
        let mut released = 0;
        if self.stats.idle_bytes.current > keep {
            self.promote();
        }
        // Cooling pages count as idle but stay until their work is done.
        while self.stats.idle_bytes.current > keep {
            let last = |s: bool| self.idle[s as usize].last().copied();
            let small = match (last(false), last(true)) {
                (Some(l), Some(s)) => s > l,
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (None, None) => break,
            };
            let a = self.idle[small as usize].pop_last().expect("checked above");
            let p = self.config.page(small);
            let handle = self.unmap_idle(a, p);
            self.release_unmapped(handle, p);
            released += p;
        }
        released
    }
}
