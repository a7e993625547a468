//! The model of a log that is still being written: `cupool top` feeds it the
//! lines a running program's log gained since the last look, and reads what
//! is live now. It is the same one pass over the timeline as
//! [`super::Process::new`] (the same table of live allocations, the same
//! rule for an address handed out again, the same figures per device), kept
//! without history: what is live and the phases open now, each device's
//! latest figures and its peaks. So it stays as small as what the program
//! holds, however long it runs.

use super::build::Builder;
use super::{Allocation, DeviceSeries};
use crate::log::{End, EventRecord, Header};

/// A log's model, fed event by event in `seq` order.
pub struct Following {
    header: Header,
    builder: Builder,
    events: usize,
    end: Option<End>,
}

impl Following {
    pub fn new(header: Header) -> Following {
        let builder = Builder::new(&header, None, 0, false);
        Following { header, builder, events: 0, end: None }
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The next event of the timeline.
    pub fn event(&mut self, e: &EventRecord) {
        self.builder.event(self.events, e);
        self.events += 1;
    }

    /// The end record: the process finished its log.
    pub fn finish(&mut self, end: End) {
        self.end = Some(end);
    }

    pub fn end(&self) -> Option<&End> {
        self.end.as_ref()
    }

    /// Events seen so far.
    pub fn events(&self) -> usize {
        self.events
    }

    /// Per device (by ordinal, -1 for an unknown device): the figures now
    /// (`now()`), the counts and the peaks.
    pub fn devices(&self) -> impl Iterator<Item = &DeviceSeries> {
        self.builder.device_series()
    }

    /// Pinned host memory.
    pub fn host(&self) -> &DeviceSeries {
        self.builder.host_series()
    }

    /// The allocations live now, in no order.
    pub fn live(&self) -> impl Iterator<Item = &Allocation> {
        self.builder.live()
    }

    /// The innermost phase open now.
    pub fn phase(&self) -> Option<&str> {
        self.builder.phase_name()
    }

    /// Nanoseconds from the start to the latest event.
    pub fn last_t(&self) -> u64 {
        self.builder.last_t()
    }

    /// Allocation slots and phases held (for tests: they stay bounded).
    pub fn held(&self) -> (usize, usize) {
        self.builder.held()
    }
}
