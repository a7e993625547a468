//! Tools see through the pool. A pooled block is a slice of a segment cupool
//! got from `cuMemAlloc`, so a memory checker (compute-sanitizer) sees only
//! the segment: neither the block's bounds nor its leak. When the program
//! runs under an NVTX tool, each segment is registered with it as a
//! sub-allocator heap and each block handed to the program as a region of
//! that heap, until the program frees it (`nvtx.rs` speaks the protocol).
//!
//! The tool is looked for once, at the first segment. With none, every entry
//! point here costs one relaxed load.

mod nvtx;

use crate::runtime::diag;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static CLIENT: OnceLock<Option<nvtx::Mem>> = OnceLock::new();

struct Heap {
    end: u64,
    ctx: u64,
    /// The tool's handle for it.
    handle: usize,
}

/// Registered segments by start address.
static HEAPS: Mutex<BTreeMap<u64, Heap>> = Mutex::new(BTreeMap::new());

#[inline]
fn client() -> Option<&'static nvtx::Mem> {
    if STATE.load(Ordering::Relaxed) != ON {
        return None;
    }
    CLIENT.get()?.as_ref()
}

/// Is a tool being told about the pool's memory?
#[inline]
pub fn attached() -> bool {
    STATE.load(Ordering::Relaxed) == ON
}

#[cold]
fn attach() {
    let mem = CLIENT.get_or_init(|| match nvtx::attach() {
        Ok(mem) => {
            if mem.is_some() {
                diag::note("pool segments and blocks are registered with the NVTX tool's memory API");
            }
            mem
        }
        Err(why) => {
            diag::note(&format!("tools are not told of pooled blocks: {why}"));
            None
        }
    });
    STATE.store(if mem.is_some() { ON } else { OFF }, Ordering::Release);
}

/// Is a memory checker in the process that will not hear of pooled blocks?
/// compute-sanitizer's collection library is loaded (the driver loads it at
/// `cuInit`), and no NVTX tool took the memory API (run without
/// `--nvtx yes`): the checker would see only segments, call every cached one
/// a leak and miss accesses past a block, so the pool must stay out of its
/// way. Asked once, at the first pooled allocation.
pub fn blind_checker() -> bool {
    static BLIND: OnceLock<bool> = OnceLock::new();
    *BLIND.get_or_init(|| {
        if STATE.load(Ordering::Relaxed) == UNKNOWN {
            attach();
        }
        !attached() && loaded_object_containing("sanitizer")
    })
}

/// Is an object whose path contains `needle` loaded?
fn loaded_object_containing(needle: &str) -> bool {
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _: libc::size_t, data: *mut libc::c_void) -> libc::c_int {
        let (needle, found) = &mut *(data as *mut (&str, bool));
        let name = (*info).dlpi_name;
        if !name.is_null() {
            let path = std::ffi::CStr::from_ptr(name).to_bytes();
            if path.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                *found = true;
                return 1;
            }
        }
        0
    }
    let mut data = (needle, false);
    // SAFETY: `visit` gets back the pointer to `data`, a live local of the type it casts to, and reads only
    // the dynamic linker's entries for the duration of its call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut data as *mut (&str, bool) as *mut libc::c_void) };
    data.1
}

/// Context `ctx`'s pool got `size` bytes at `addr` from CUDA.
pub fn segment_added(ctx: u64, addr: u64, size: u64) {
    if STATE.load(Ordering::Relaxed) == UNKNOWN {
        attach();
    }
    let Some(mem) = client() else { return };
    let handle = mem.register_heap(addr, size);
    HEAPS.lock().insert(addr, Heap { end: addr + size, ctx, handle });
}

/// The segment at `addr`, wholly free, goes back to CUDA (the tool hears first).
pub fn segment_released(addr: u64) {
    let Some(mem) = client() else { return };
    let heap = HEAPS.lock().remove(&addr);
    if let Some(heap) = heap {
        mem.unregister_heap(heap.handle);
    }
}

/// A block of `size` bytes (what the program asked for) at `addr` goes to the program.
#[inline]
pub fn block_handed_out(addr: u64, size: u64) {
    if let Some(mem) = client() {
        register_block(mem, addr, size);
    }
}

#[inline(never)]
fn register_block(mem: &nvtx::Mem, addr: u64, size: u64) {
    let heap = HEAPS.lock().range(..=addr).next_back().filter(|(_, h)| addr < h.end).map(|(_, h)| h.handle);
    if let Some(heap) = heap {
        mem.register_region(heap, addr, size);
    }
}

/// The program freed the block at `addr`: called before the pool may hand it out again.
#[inline]
pub fn block_freed(addr: u64) {
    if let Some(mem) = client() {
        mem.unregister_region(addr);
    }
}

/// Context `ctx` died with its memory: its heaps go, and their regions with them.
pub fn context_died(ctx: u64) {
    let Some(mem) = client() else { return };
    let mut heaps = HEAPS.lock();
    let gone: Vec<u64> = heaps.iter().filter(|(_, h)| h.ctx == ctx).map(|(&a, _)| a).collect();
    let handles: Vec<usize> = gone.iter().filter_map(|a| heaps.remove(a)).map(|h| h.handle).collect();
    drop(heaps);
    for handle in handles {
        mem.unregister_heap(handle);
    }
}

pub fn lock_for_fork() {
    std::mem::forget(HEAPS.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    HEAPS.force_unlock();
    if in_child {
        HEAPS.lock().clear(); // the child has none of its parent's segments
    }
}
