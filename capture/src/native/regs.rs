//! Where a capture starts: the registers read at the capture point.

/// Registers read at the capture point, inside the function whose frame is
/// live while the walk runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}
