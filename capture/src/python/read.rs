//! Reads of the interpreter's memory. Callers check every address with
//! [`plausible`] first; what makes the reads safe beyond that is that they
//! only follow a layout positively identified for this interpreter, and only
//! the calling thread's own frames, which cannot change while it is inside
//! the hook.

/// Non-null, outside the first page, below the top of x86_64 / aarch64 user
/// space, and aligned: what any pointer CPython stores in these fields is.
/// A garbage value usually fails this, and an address that passes it cannot
/// overflow when a field offset is added.
#[inline(always)]
pub(crate) fn plausible(addr: usize, align: usize) -> bool {
    (4096..1 << 47).contains(&addr) && addr.is_multiple_of(align)
}

/// # Safety
/// `addr` is 8-aligned and points into live interpreter memory.
#[inline(always)]
pub(crate) unsafe fn word(addr: usize) -> usize {
    // Volatile: this is memory another part of the process owns; the reads
    // must happen as written, not be merged or assumed.
    std::ptr::read_volatile(addr as *const usize)
}

/// # Safety
/// As [`word`], 4-aligned.
#[inline(always)]
pub(crate) unsafe fn i32_at(addr: usize) -> i32 {
    std::ptr::read_volatile(addr as *const i32)
}

/// # Safety
/// As [`word`], 4-aligned.
#[inline(always)]
pub(crate) unsafe fn u32_at(addr: usize) -> u32 {
    std::ptr::read_volatile(addr as *const u32)
}

/// # Safety
/// As [`word`], any alignment.
#[inline(always)]
pub(crate) unsafe fn u8_at(addr: usize) -> u8 {
    std::ptr::read_volatile(addr as *const u8)
}
