//! A simulated device for everything that runs the pool without a GPU: unit,
//! model and property tests, the fuzz target, the benchmark and trace replay.
//! Compiled for the crate's own tests and with the cargo feature `testing`.
//!
//! [`SimulatedDevice::new`] is an unbounded device that lays segments out end
//! to end and never fences a free (what a benchmark or a replay wants). The
//! knobs make it stricter:
//!
//! * [`capacity`](SimulatedDevice::capacity): the bytes it can hold at once;
//!   a segment beyond that is refused (device out of memory).
//! * [`gap`](SimulatedDevice::gap): bytes left unused after each segment, so
//!   that no two segments touch (0: adjacent, so a merge across segments
//!   would show).
//! * [`fences`](SimulatedDevice::fences): whether a freed block must wait for
//!   queued GPU work, and which work ([`Fences`]).
//! * [`capturing`](SimulatedDevice::capturing): a stream capture is active,
//!   so `synchronize` and `wait_for` refuse to wait.
//!
//! The GPU timeline is two numbers: [`queued`](SimulatedDevice::queued), the
//! newest queued work, and [`completed`](SimulatedDevice::completed), the
//! newest finished; a tag is complete when it is at most `completed`. Work
//! completes only when the test says so ([`complete`](SimulatedDevice::complete),
//! [`complete_all`](SimulatedDevice::complete_all)) or when the pool
//! synchronizes outside a capture.
//!
//! What the device saw is kept for assertions: the live segments, every
//! release in order, and every segment request (refused ones included). It
//! checks the pool as it goes: every segment size is a positive multiple of
//! [`SEGMENT_ALIGN`], and every release names a live segment with its size.

use std::collections::BTreeMap;

use super::{Backend, Timeline, SEGMENT_ALIGN};

/// Address of the first segment: far from null and from small integers, so
/// that an offset mistaken for an address cannot find a block.
pub const BASE_ADDR: u64 = 1 << 40;

/// When a freed block may be handed out again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fences {
    /// At once: no GPU work can still touch it (`free_tag` is `None`).
    #[default]
    Off,
    /// After the newest queued work ([`SimulatedDevice::queued`]) completes;
    /// frees with no [`launch`](SimulatedDevice::launch) between them share a
    /// tag, as frees between two kernel launches share a point of the timeline.
    AtQueued,
    /// Each free queues work of its own: a new tag per free (1, 2, 3, ...).
    PerFree,
}

/// A device with simulated memory and a simulated GPU timeline; see the
/// module documentation for the knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct SimulatedDevice {
    /// Most bytes of segments outstanding at once; `None`: unbounded.
    pub capacity: Option<u64>,
    /// Bytes left unused after each segment (a multiple of 512).
    pub gap: u64,
    /// The simulated GPU timeline (its fields and methods are reached
    /// through the device: `dev.fences`, `dev.launch()`).
    pub gpu: SimulatedTimeline,
    next: u64,
    outstanding: u64,
    live: BTreeMap<u64, u64>,
    released: Vec<(u64, u64)>,
    segment_requests: u64,
}

impl Default for SimulatedDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl SimulatedDevice {
    /// Unbounded, segments end to end from [`BASE_ADDR`], frees never fenced.
    pub fn new() -> Self {
        SimulatedDevice {
            capacity: None,
            gap: 0,
            gpu: SimulatedTimeline::default(),
            next: BASE_ADDR,
            outstanding: 0,
            live: BTreeMap::new(),
            released: Vec::new(),
            segment_requests: 0,
        }
    }

    /// Holds at most `capacity` bytes of segments at once (`None`: unbounded).
    pub fn with_capacity(mut self, capacity: Option<u64>) -> Self {
        self.capacity = capacity;
        self
    }

    /// Leaves `gap` bytes (a multiple of 512) unused after each segment.
    pub fn with_gap(mut self, gap: u64) -> Self {
        assert!(gap.is_multiple_of(512), "gap {gap} would misalign the next segment");
        self.gap = gap;
        self
    }

    /// Fences frees as `fences` says.
    pub fn with_fences(mut self, fences: Fences) -> Self {
        self.fences = fences;
        self
    }

    /// Bytes of segments held now.
    pub fn outstanding(&self) -> u64 {
        self.outstanding
    }

    /// Segments held now: address -> size.
    pub fn live_segments(&self) -> &BTreeMap<u64, u64> {
        &self.live
    }

    /// Every segment given back, as (address, size), oldest first.
    pub fn released(&self) -> &[(u64, u64)] {
        &self.released
    }

    /// Calls of `allocate_segment`, refused ones included.
    pub fn segment_requests(&self) -> u64 {
        self.segment_requests
    }
}

impl Backend for SimulatedDevice {
    fn allocate_segment(&mut self, size: u64) -> Option<u64> {
        assert!(size > 0 && size.is_multiple_of(SEGMENT_ALIGN), "segment size {size} is not a multiple of 2 MiB");
        self.segment_requests += 1;
        if self.capacity.is_some_and(|c| self.outstanding + size > c) {
            return None;
        }
        let addr = self.next;
        self.next += size + self.gap;
        self.outstanding += size;
        self.live.insert(addr, size);
        Some(addr)
    }

    fn release_segment(&mut self, addr: u64, size: u64) {
        assert_eq!(self.live.remove(&addr), Some(size), "release of {addr:#x} ({size} bytes): not a live segment");
        self.outstanding -= size;
        self.released.push((addr, size));
    }
}

impl Timeline for SimulatedDevice {
    crate::delegate_timeline!(gpu);
}

impl std::ops::Deref for SimulatedDevice {
    type Target = SimulatedTimeline;
    fn deref(&self) -> &SimulatedTimeline {
        &self.gpu
    }
}

impl std::ops::DerefMut for SimulatedDevice {
    fn deref_mut(&mut self) -> &mut SimulatedTimeline {
        &mut self.gpu
    }
}

/// The GPU timeline of a simulated device (both pools' simulated devices
/// carry one): two numbers, [`queued`](Self::queued), the newest queued
/// work, and [`completed`](Self::completed), the newest finished; a tag is
/// complete when it is at most `completed`. Work completes only when the
/// test says so or when the pool synchronizes outside a capture.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimulatedTimeline {
    /// How frees are fenced.
    pub fences: Fences,
    /// A stream capture is active: waiting for the GPU is impossible.
    pub capturing: bool,
    /// Newest queued GPU work (the newest tag).
    pub queued: u64,
    /// Newest finished GPU work: tags up to it are complete.
    pub completed: u64,
    /// What `now_ns` answers (0 unless a caller moves it, e.g. a replay by its trace's times).
    pub now: u64,
    /// `wait_for` orders later work behind the tag on the GPU instead of
    /// waiting (the shim's GPU-side barrier): blocks become reusable, pages
    /// do not become unmappable (`is_finished` still waits for `completed`).
    pub barrier: bool,
    /// Tags up to this were ordered by a barrier.
    pub ordered: u64,
    /// `order_behind` places a barrier (as `wait_for` with `barrier`) at most
    /// once in this many ns of `now`, as the shim does once per `fence_us`;
    /// None: it places none.
    pub order_every_ns: Option<u64>,
    /// When `order_behind` last placed one, and how many it placed.
    pub last_order: Option<u64>,
    pub orders: u64,
}

impl SimulatedTimeline {
    /// Queues GPU work: frees from now on (with [`Fences::AtQueued`]) wait for it.
    pub fn launch(&mut self) {
        self.queued += 1;
    }

    /// Finishes the next `n` pieces of queued work (at most all of them).
    pub fn complete(&mut self, n: u64) {
        self.completed = self.queued.min(self.completed.saturating_add(n));
    }

    /// Finishes all queued work.
    pub fn complete_all(&mut self) {
        self.completed = self.queued;
    }
}

impl Timeline for SimulatedTimeline {
    fn free_tag(&mut self) -> Option<u64> {
        match self.fences {
            Fences::Off => None,
            Fences::AtQueued => Some(self.queued),
            Fences::PerFree => {
                self.launch();
                Some(self.queued)
            }
        }
    }

    /// The newest queued work must finish before an unmap.
    fn unmap_tag(&mut self) -> Option<u64> {
        Some(self.queued)
    }

    fn is_complete(&mut self, tag: u64) -> bool {
        tag <= self.completed.max(self.ordered)
    }

    fn is_finished(&mut self, tag: u64) -> bool {
        tag <= self.completed
    }

    fn wait_for(&mut self, tag: u64) -> bool {
        if self.capturing {
            return false;
        }
        if self.barrier {
            self.ordered = self.ordered.max(tag);
            return true;
        }
        self.synchronize()
    }

    fn wait_finished(&mut self, tag: u64) -> bool {
        if self.capturing {
            return false;
        }
        self.completed = self.completed.max(tag.min(self.queued));
        true
    }

    fn order_behind(&mut self, tag: u64) -> bool {
        let Some(every) = self.order_every_ns else { return false };
        if self.capturing || self.last_order.is_some_and(|at| self.now.saturating_sub(at) < every) {
            return false;
        }
        self.last_order = Some(self.now);
        self.orders += 1;
        self.ordered = self.ordered.max(tag);
        true
    }

    fn synchronize(&mut self) -> bool {
        if !self.capturing {
            self.complete_all();
        }
        !self.capturing
    }

    fn now_ns(&mut self) -> u64 {
        self.now
    }
}
