//! Native stacks: DWARF (`.eh_frame`) unwinding of the calling thread.

/// One loaded module (executable or shared object), for the log: reports map
/// return addresses back to a file and symbolise them from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    /// Path as the dynamic linker has it (the executable's resolved path for "").
    pub path: String,
    /// Load bias: runtime address = file virtual address + `base`.
    pub base: u64,
    /// Runtime address range of the module's mapped segments, `[start, end)`.
    pub start: u64,
    pub end: u64,
    /// The GNU build id, empty when the module has none.
    pub build_id: Vec<u8>,
}

/// Fills `out` with the calling thread's return addresses, innermost first,
/// without the frames of cupool, the CUDA runtime and the driver at the top.
/// Returns how many it wrote (0 when nothing could be unwound).
pub fn capture(out: &mut [u64]) -> usize {
    let _ = out;
    0
}

/// The modules loaded now.
pub fn loaded_modules() -> Vec<ModuleInfo> {
    Vec::new()
}

/// Call before `fork`: holds what a forked child must not inherit locked.
pub fn lock_for_fork() {}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork() {}
