//! The pool's side of CUDA IPC: sealed handles (a block past the start of its
//! segment, named so that only cupool can open it at the block) and, in a
//! receiving process, the blocks opened from them. See `intercept::ipc`.

use parking_lot::Mutex;
use std::collections::HashMap;

pub type Handle = [u8; 64];

/// Blocks opened from sealed handles: block address → (mapped segment base, opens).
static OPENED: Mutex<Option<HashMap<u64, (u64, u32)>>> = Mutex::new(None);

const MARK: [u8; 2] = *b"cp";
const SEAL_VERSION: u8 = 1;
/// Offsets are kept in units of the pool's block alignment.
const OFFSET_SHIFT: u32 = 9;

/// Scrambles the driver's bytes so no driver accepts them.
fn scramble(h: &mut Handle) {
    for (i, b) in h[1..56].iter_mut().enumerate() {
        *b ^= 0xa5 ^ (i as u8).wrapping_mul(0x3b);
    }
}

fn checksum(h: &Handle) -> u8 {
    h[..59].iter().chain(&h[60..]).fold(0x5a, |acc: u8, &b| acc.rotate_left(3) ^ b)
}

/// Seals `h`, the driver's handle of a block's segment, with the block's
/// offset; `false` when this driver's handle format leaves no room.
pub fn seal(h: &mut Handle, offset: u64) -> bool {
    let units = offset >> OFFSET_SHIFT;
    if h[56..].iter().any(|&b| b != 0) || offset & ((1 << OFFSET_SHIFT) - 1) != 0 || units > u32::MAX as u64 {
        return false;
    }
    scramble(h);
    h[56..58].copy_from_slice(&MARK);
    h[58] = SEAL_VERSION;
    h[60..64].copy_from_slice(&(units as u32).to_le_bytes());
    h[59] = checksum(h);
    true
}

/// The driver's handle and the block's offset, when `h` was sealed by cupool.
pub fn unseal(h: &Handle) -> Option<(Handle, u64)> {
    if h[56..58] != MARK || h[58] != SEAL_VERSION || h[59] != checksum(h) {
        return None;
    }
    let units = u32::from_le_bytes([h[60], h[61], h[62], h[63]]);
    let mut driver = *h;
    driver[56..].fill(0);
    scramble(&mut driver);
    Some((driver, (units as u64) << OFFSET_SHIFT))
}

/// A block was opened from a sealed handle; its segment is mapped at `base`.
pub fn opened(block: u64, base: u64) {
    OPENED.lock().get_or_insert_with(HashMap::new).entry(block).or_insert((base, 0)).1 += 1;
}

/// The segment mapping behind `ptr` when it is a block opened from a sealed handle.
pub fn opened_at(ptr: u64) -> Option<u64> {
    OPENED.lock().as_ref()?.get(&ptr).map(|&(base, _)| base)
}

/// One open of the block at `ptr` was closed.
pub fn closed(ptr: u64) {
    let mut opened = OPENED.lock();
    let Some(table) = opened.as_mut() else { return };
    if let Some((_, count)) = table.get_mut(&ptr) {
        *count -= 1;
        if *count == 0 {
            table.remove(&ptr);
        }
    }
}

pub fn lock_for_fork() {
    std::mem::forget(OPENED.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    OPENED.force_unlock();
    if in_child {
        // CUDA mappings do not survive fork.
        *OPENED.lock() = None;
    }
}
