//! Python frames of the calling thread, read without the GIL.

/// One Python frame as captured: enough to tell frames apart cheaply. Names
/// and lines are worked out by [`describe`] only for stacks not seen before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// Address of the code object.
    pub code: u64,
    /// Tells a code object from a later one at the same address.
    pub tag: u64,
    /// Instruction offset in the code object, in bytes.
    pub lasti: u32,
}

/// What a report shows of one Python frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameInfo {
    pub file: String,
    pub function: String,
    /// 0 when unknown.
    pub line: u32,
}

/// Fills `out` with the calling thread's Python frames, innermost first.
/// Returns 0 when the thread runs no Python, or Python is of a version this
/// build cannot read.
pub fn capture(out: &mut [PyFrame]) -> usize {
    let _ = out;
    0
}

/// Names and line of a frame `capture` returned, read on the same thread
/// before the hook returns (while the frame is still alive).
pub fn describe(frame: &PyFrame) -> Option<FrameInfo> {
    let _ = frame;
    None
}

/// Whether Python frames can be read in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// No Python interpreter is loaded.
    NoPython,
    /// Python of this version ("3.12"), read.
    Supported(String),
    /// Python of this version, which this build cannot read.
    Unsupported(String),
}

pub fn status() -> Status {
    Status::NoPython
}
