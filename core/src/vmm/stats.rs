//! The VMM pool's counters.

use crate::pool::Stat;

/// Counters of a [`VmmPool`](super::VmmPool).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmmStats {
    /// Rounded sizes of the blocks handed out and not yet freed.
    pub allocated_bytes: Stat,
    /// Sizes as requested by the caller of the blocks handed out.
    pub requested_bytes: Stat,
    /// Bytes of physical pages held (mapped, live or idle).
    pub reserved_bytes: Stat,
    /// Bytes of pages that some allocated block overlaps.
    pub in_use_bytes: Stat,
    /// Bytes of idle pages: mapped, no allocated block on them.
    pub idle_bytes: Stat,
    /// Bytes of idle pages that queued GPU work may still touch (part of
    /// `idle_bytes`): usable again in place, not elsewhere.
    pub cooling_bytes: Stat,
    /// Number of blocks handed out and not yet freed.
    pub allocation: Stat,
    /// Bytes of virtual ranges reserved.
    pub va_reserved_bytes: u64,
    /// Pages created / released.
    pub num_page_creates: u64,
    pub num_page_releases: u64,
    /// Page mappings / unmappings.
    pub num_maps: u64,
    pub num_unmaps: u64,
    /// Idle pages unmapped from one place and mapped at another (stitching).
    pub num_remaps: u64,
    /// Of those, pages taken while cooling, left mapped where they were
    /// (a ghost) until the GPU finished with them there.
    pub num_aliases: u64,
    /// Placements that had to wait for the GPU to finish with a ghost.
    pub num_ghost_waits: u64,
    /// Allocations that failed.
    pub num_ooms: u64,
    /// Rounded sizes of blocks freed and waiting for their fence.
    pub pending_bytes: Stat,
    /// Allocated and pending blocks' rounded sizes (PyTorch's "active").
    pub active_bytes: Stat,
    /// Waits for the oldest pending free, and whole-device synchronisations.
    pub num_waits: u64,
    pub num_syncs: u64,
    /// `grant` calls (one `cuMemSetAccess` each on a GPU).
    pub num_grants: u64,
    /// What the pages held when `reserved_bytes` last reached its peak.
    pub at_peak: PeakBreakdown,
}

/// The page peaks a failed request may raise, and where the pages were at
/// the reserved one: what [`VmmStats::forget_failed_peaks`] puts back.
#[derive(Clone, Copy, Debug)]
pub(super) struct PagePeaks {
    pub reserved: u64,
    pub in_use: u64,
    pub idle: u64,
    pub cooling: u64,
    pub at_peak: PeakBreakdown,
}

impl VmmStats {
    pub(super) fn page_peaks(&self) -> PagePeaks {
        PagePeaks {
            reserved: self.reserved_bytes.peak,
            in_use: self.in_use_bytes.peak,
            idle: self.idle_bytes.peak,
            cooling: self.cooling_bytes.peak,
            at_peak: self.at_peak,
        }
    }

    /// Lowers the page peaks that a failed request raised back to `before`
    /// (taken before it made or moved pages), as far as the current figures
    /// allow: its pages were held for microseconds and used by no block, and
    /// a request larger than the device would otherwise leave the device's
    /// whole memory as the run's peak. Counts of driver calls stay.
    pub(super) fn forget_failed_peaks(&mut self, before: PagePeaks) {
        for (now, then) in [
            (&mut self.reserved_bytes, before.reserved),
            (&mut self.in_use_bytes, before.in_use),
            (&mut self.idle_bytes, before.idle),
            (&mut self.cooling_bytes, before.cooling),
        ] {
            now.peak = then.max(now.current);
        }
        // Reserved bytes are back to at most what they were, so their peak
        // is the earlier one (a failed attempt that only reached it had
        // written its own breakdown over it).
        self.at_peak = before.at_peak;
    }
}

/// Where a pool's physical bytes were when they peaked: under allocated
/// blocks, under blocks freed but still waiting for queued GPU work, or on
/// idle pages (cooling: queued work may still touch them, so they could be
/// used again only where they are). `reserved` minus `allocated` is what the
/// pool cost beyond the program's own bytes at its peak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeakBreakdown {
    pub reserved: u64,
    pub allocated: u64,
    pub pending: u64,
    pub idle: u64,
    pub cooling: u64,
}

impl From<PeakBreakdown> for crate::log::PagesAtPeak {
    fn from(b: PeakBreakdown) -> Self {
        let PeakBreakdown { reserved, allocated, pending, idle, cooling } = b;
        crate::log::PagesAtPeak { reserved, allocated, pending, idle, cooling }
    }
}
