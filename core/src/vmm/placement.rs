//! Where a block goes in the VMM pool's virtual ranges (see the module
//! documentation of `vmm`): the first few fits, weighed at their ends and
//! the page boundaries next to them by what the place costs in pages, in
//! waits for the GPU and in driver calls.

use super::ghosts::Ghost;
use super::{PageBackend, Range, VmmPool};
use crate::pool::free_index::Entry;

/// Free blocks weighed for a request (`VmmPool::placement`).
const PLACEMENT_CANDIDATES: usize = 4;
/// Free blocks of the large ranges searched for room, in pages in use, for
/// a small block that would otherwise put a page into use.
const SCRAP_CANDIDATES: usize = 8;
/// What a ghost under a placement weighs against pages to map.
const GHOST_COST: u64 = 1 << 32;

/// Whether blocks of `rounded` bytes, placed from the start of pages of
/// `page` bytes and never across a boundary, leave at most an eighth of
/// each page over. Then keeping a block within one page costs little room
/// and spares the tie a straddle makes between two pages. Otherwise the room
/// left at every page's end is larger than a straddle's cost: a serving mix's
/// blocks of 0.38 pages, two to a page, left 0.23 of each page empty (1.031 of
/// live at the peak; packed end to end, 1.019).
fn packs_a_page(rounded: u64, page: u64) -> bool {
    page % rounded <= page / 8
}

/// What placing a block somewhere costs, compared field by field in this
/// order (`VmmPool::place_cost`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct PlaceCost {
    /// Pages it puts into use: no other block touches them. Pages in use
    /// are what the pool's peak is made of; a block that shares a page a
    /// neighbour uses costs that page nothing.
    added: u64,
    /// Ghosts under it: the block would wait for the GPU to finish with
    /// them (about 20 ms), which a place that costs as many pages spares.
    ghosts: u64,
    /// For a small block whose size packs a page nearly whole (see
    /// [`packs_a_page`]), the pages it touches: one that straddles a page
    /// boundary it need not cross ties two pages together, each mapped
    /// while either side is live (on CuPy's trace a 1 MiB block across two
    /// small pages left one more page mapped at the peak, 1.056 → 1.028 of
    /// live). Not for large blocks, nor small ones that leave much of a page
    /// over: packed end to end they share the pages at their ends.
    spans: u64,
    /// For a block of whole pages, the free rests of a page or more that it
    /// leaves beginning or ending off the page grid. On the grid, the block
    /// leaves whole free pages behind when it goes, which blocks of whole
    /// pages fill again; off it, every hole it leaves keeps a partly used
    /// page at each end (a CuPy trace's 1, 2, 4 and 8 MiB arrays, placed
    /// behind one odd-sized block, left such a page at every hole).
    misaligned_rest: u64,
    /// Pages not mapped: each is a driver call, where mapped idle pages are
    /// used in place with none.
    missing: u64,
}

impl<B: PageBackend> VmmPool<B> {
    /// Where a block of `rounded` bytes goes, with the pages it lacks
    /// there: the cheapest place in the ranges of kind `k`
    /// ([`Self::cheapest_place`]), unless a small block would put a page of
    /// its own into use there while it fits in pages that the large ranges
    /// use already.
    pub(super) fn placement(&self, k: usize, rounded: u64) -> Option<(Entry, u64, u64)> {
        let mut best = self.cheapest_place(k, rounded, PLACEMENT_CANDIDATES);
        if k == 1 && self.config.fill_scraps && best.is_some_and(|(c, ..)| c.added > 0) {
            // Large blocks rarely end on a page boundary: the free ends of
            // their pages serve small blocks for nothing.
            let scrap = self.cheapest_place(0, rounded, SCRAP_CANDIDATES);
            if let Some(place) = scrap.filter(|(c, ..)| c.added == 0 && c.ghosts == 0 && c.missing == 0) {
                best = Some(place);
            }
        }
        // The pages it lacks, a ghost counting as more than any number of
        // them (a block placed over one waits for the GPU).
        let best = best.map(|(c, e, start)| (c.missing + c.ghosts * GHOST_COST, e, start));
        // A wait for the GPU costs the program's thread about 20 ms; addresses
        // cost nothing. An exact fit is worth the wait: it leaves no remainder.
        let waits = best.filter(|&(m, hole, _)| m >= GHOST_COST && hole.size != rounded);
        if let Some((over_ghost, ..)) = waits.filter(|_| self.config.limit == u64::MAX) {
            let pages_there = over_ghost % GHOST_COST;
            let past = self.past_ghosts_in_largest(k, rounded).filter(|&(m, ..)| m <= pages_there);
            if let Some((missing, e, start)) = past {
                return Some((e, start, missing));
            }
        }
        best.map(|(missing, e, start)| (e, start, missing))
    }

    /// The cheapest place for a block of `rounded` bytes among the first
    /// `candidates` fits of kind `k` (best fit first), at either end of each
    /// and at the page boundaries next to them, by [`PlaceCost`]; among
    /// equals, the better fit and its lower end.
    fn cheapest_place(&self, k: usize, rounded: u64, candidates: usize) -> Option<(PlaceCost, Entry, u64)> {
        // Nothing beats a place that costs no page, no wait and no mapping,
        // and touches one page if the block is small: the first such ends
        // the search (blocks placed under the pool's lock, as a multi-stream
        // program's small ones all are, must not weigh every candidate).
        let floor = PlaceCost { spans: u64::from(self.weighs_spans(k == 1, rounded)), ..PlaceCost::default() };
        let mut best: Option<(PlaceCost, Entry, u64)> = None;
        'fits: for e in self.free[k].fits(rounded).take(candidates) {
            let seg = self.blocks[e.idx].seg;
            for start in self.starts_in(seg, e, rounded) {
                let mut cost = self.place_cost(seg, e, start, rounded);
                // Counting the pages to map walks the block's pages: only
                // for a place that is not worse already.
                if best.is_some_and(|(c, ..)| cost > PlaceCost { missing: u64::MAX, ..c }) {
                    continue;
                }
                cost.missing = self.unmapped_pages(seg, start, rounded);
                if best.is_none_or(|(c, ..)| cost < c) {
                    best = Some((cost, e, start));
                    if cost == floor {
                        break 'fits;
                    }
                }
            }
        }
        best
    }

    /// The places weighed for a block of `rounded` bytes in free block `e`:
    /// its start and the first page boundary after it; and where what it
    /// leaves of the hole is no larger than the block, its end and the last
    /// page boundary before that. (At the far end of a much larger hole, a
    /// block is an island that splits the hole: on the bundled traces
    /// replayed with the GPU behind, that cost pages.)
    fn starts_in(&self, seg: u32, e: Entry, rounded: u64) -> impl Iterator<Item = u64> {
        let Range { addr: base, small, .. } = self.ranges[seg as usize];
        let p = self.config.page(small);
        let (low, last) = (e.addr, e.addr + e.size - rounded);
        let high = if e.size - rounded <= rounded { last } else { low };
        let up = Some(base + (low - base).next_multiple_of(p)).filter(|&u| u <= last).unwrap_or(low);
        let down = base + (high - base) / p * p;
        let starts = [low, up, down.max(low), high];
        starts.into_iter().enumerate().filter(move |&(i, s)| !starts[..i].contains(&s)).map(|(_, s)| s)
    }

    /// What placing a block of `rounded` bytes at `start` in free block `e`
    /// (of range `seg`) costs, but for the pages to map (`missing`: 0, a
    /// walk over the block's pages that the caller takes only if needed).
    fn place_cost(&self, seg: u32, e: Entry, start: u64, rounded: u64) -> PlaceCost {
        let Range { addr: base, small, .. } = self.ranges[seg as usize];
        let p = self.config.page(small);
        let (s, end) = (start - base, start - base + rounded);
        let (h0, h1) = (e.addr - base, e.addr - base + e.size);
        // The hole's neighbours use the pages its ends share with them.
        let shared = |page: u64| page < h0 || page + p > h1;
        let (first, last) = (s / p * p, (end - 1) / p * p);
        let touched = (last - first) / p + 1;
        let added = touched - u64::from(shared(first)) - u64::from(last != first && shared(last));
        let off_grid = |at: u64, rest: u64| rest >= p && !at.is_multiple_of(p);
        let misaligned_rest = if rounded.is_multiple_of(p) {
            u64::from(off_grid(s, s - h0)) + u64::from(off_grid(end, h1 - end))
        } else {
            0
        };
        let ghosts = if self.ghosts.is_empty() { 0 } else { self.ghosts_over(start, rounded).count() as u64 };
        let spans = if self.weighs_spans(small, rounded) { touched } else { 0 };
        PlaceCost { added, ghosts, spans, misaligned_rest, missing: 0 }
    }

    /// Whether a place for a block of `rounded` bytes in ranges of kind
    /// `small` weighs the pages it touches ([`PlaceCost::spans`]).
    fn weighs_spans(&self, small: bool, rounded: u64) -> bool {
        rounded <= self.config.small_max && packs_a_page(rounded, self.config.page(small))
    }

    /// Where a block of `rounded` bytes goes in the largest free block of
    /// kind `k` (most often a range's free tail) past the ghosts in its way,
    /// with the pages it lacks there; `None` when it does not fit past them.
    /// Asked when every placement weighed would lie over a ghost, and so
    /// wait for the GPU to finish the work queued before that page moved:
    /// 6-15 such waits of about 20 ms blocked the transformer's thread each
    /// run (an H100 and an H200), where a start further on costs nothing
    /// when it lacks no more pages. Not under a cap (the `limit`): there the
    /// wait lets cooling pages cool before the next one is needed, which is
    /// how capped runs were measured on the GPU; this rule was not.
    fn past_ghosts_in_largest(&self, k: usize, rounded: u64) -> Option<(u64, Entry, u64)> {
        let e = self.free[k].largest().filter(|e| e.size >= rounded)?;
        let seg = self.blocks[e.idx].seg;
        let mut start = e.addr;
        loop {
            let Some(past) = self.ghosts_over(start, rounded).map(|(g, gh)| g + gh.size).max() else {
                let missing = self.unmapped_pages(seg, start, rounded);
                return Some((missing, e, start));
            };
            // Ghosts are whole pages of their range: `past` is a page boundary.
            if past + rounded > e.addr + e.size {
                return None;
            }
            start = past;
        }
    }

    /// Pages under `[addr, addr + size)` of range `seg` that are not mapped.
    fn unmapped_pages(&self, seg: u32, addr: u64, size: u64) -> u64 {
        self.page_span(seg, addr, size).filter(|&a| self.pages.get(a).is_none()).count() as u64
    }

    /// The ghosts that overlap `[addr, addr + size)`, as (address, ghost).
    fn ghosts_over(&self, addr: u64, size: u64) -> impl Iterator<Item = (u64, &Ghost)> {
        // A ghost is one page: one that starts up to a page before `addr` may reach it.
        let widest = self.config.page(false).max(self.config.page(true));
        let near = self.ghosts.range(addr.saturating_sub(widest)..addr + size);
        near.filter(move |(&g, gh)| g + gh.size > addr).map(|(&g, gh)| (g, gh))
    }
}
