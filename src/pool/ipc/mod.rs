//! The pool's side of CUDA IPC: sealed handles, which only cupool opens at
//! the exported block, and, in a receiving process, the blocks opened from
//! them. See `intercept::ipc` for the rules.
//!
//! Two kinds of sealed handle:
//! - a block past the start of its segment: the driver's handle of the
//!   segment, scrambled, with the block's offset (version 1);
//! - a block on VMM pages, which legacy IPC cannot name at all: a ticket
//!   (exporter's pid, export number, random token) with which the receiver
//!   asks the exporter's broker for the pages' shareable handles
//!   (`broker.rs`) and maps them itself (`pages.rs`) (version 2).

pub mod broker;
pub mod pages;

use parking_lot::Mutex;
use std::collections::HashMap;

pub type Handle = [u8; 64];

const MARK: [u8; 2] = *b"cp";
const SEAL_SEGMENT: u8 = 1;
const SEAL_PAGES: u8 = 2;
const PAGES_KIND: u8 = 0xc9;
/// Offsets are kept in units of the pool's block alignment.
const OFFSET_SHIFT: u32 = 9;

/// An exported block on VMM pages, as a receiver names it to the exporter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub pid: u32,
    /// The exporter's broker, among processes of the same pid (PID namespaces).
    pub nonce: u64,
    pub id: u32,
    /// Random per export: a broker that is not the exporter (a reused pid)
    /// refuses the ticket instead of serving other memory.
    pub token: u64,
}

/// What a sealed handle names.
pub enum Sealed {
    /// The driver's handle of a segment, and the block's offset in it.
    Segment {
        driver: Handle,
        offset: u64,
    },
    Pages(Ticket),
}

/// Scrambles the driver's bytes so no driver accepts them.
fn scramble(h: &mut Handle) {
    for (i, b) in h[1..56].iter_mut().enumerate() {
        *b ^= 0xa5 ^ (i as u8).wrapping_mul(0x3b);
    }
}

fn checksum(h: &Handle) -> u8 {
    h[..59].iter().chain(&h[60..]).fold(0x5a, |acc: u8, &b| acc.rotate_left(3) ^ b)
}

fn mark(h: &mut Handle, version: u8) {
    h[56..58].copy_from_slice(&MARK);
    h[58] = version;
    h[59] = checksum(h);
}

/// Seals `h`, the driver's handle of a block's segment, with the block's
/// offset; `false` when this driver's handle format leaves no room.
pub fn seal(h: &mut Handle, offset: u64) -> bool {
    let units = offset >> OFFSET_SHIFT;
    if h[56..].iter().any(|&b| b != 0) || offset & ((1 << OFFSET_SHIFT) - 1) != 0 || units > u32::MAX as u64 {
        return false;
    }
    scramble(h);
    h[60..64].copy_from_slice(&(units as u32).to_le_bytes());
    mark(h, SEAL_SEGMENT);
    true
}

/// The handle of a block on VMM pages.
pub fn seal_pages(t: Ticket) -> Handle {
    let mut h = [0u8; 64];
    // The kind, in the one byte a segment seal leaves as the driver wrote it.
    h[0] = PAGES_KIND;
    h[1..5].copy_from_slice(&t.pid.to_le_bytes());
    h[5..9].copy_from_slice(&t.id.to_le_bytes());
    h[9..17].copy_from_slice(&t.token.to_le_bytes());
    h[17..25].copy_from_slice(&t.nonce.to_le_bytes());
    scramble(&mut h);
    mark(&mut h, SEAL_PAGES);
    h
}

/// What `h` names, when cupool sealed it.
pub fn unseal(h: &Handle) -> Option<Sealed> {
    if h[56..58] != MARK || h[59] != checksum(h) {
        return None;
    }
    let mut plain = *h;
    plain[56..60].fill(0);
    scramble(&mut plain);
    let word = |r: std::ops::Range<usize>| plain[r].iter().rev().fold(0u64, |acc, &b| acc << 8 | b as u64);
    match h[58] {
        SEAL_SEGMENT => {
            let offset = word(60..64) << OFFSET_SHIFT;
            plain[60..].fill(0);
            Some(Sealed::Segment { driver: plain, offset })
        }
        SEAL_PAGES if h[0] == PAGES_KIND && h[25..56] == seal_pages_tail() => Some(Sealed::Pages(Ticket {
            pid: word(1..5) as u32,
            id: word(5..9) as u32,
            token: word(9..17),
            nonce: word(17..25),
        })),
        _ => None,
    }
}

/// Bytes 25..56 of every pages seal (zeros, scrambled).
fn seal_pages_tail() -> [u8; 31] {
    let mut h = [0u8; 64];
    scramble(&mut h);
    h[25..56].try_into().expect("31 bytes")
}

/// How a block opened from a sealed handle is mapped in this process.
#[derive(Clone, Debug)]
pub enum Mapping {
    /// The driver mapped the exporter's segment at `base`.
    Segment { base: u64 },
    /// cupool mapped the block's pages into its own range.
    Pages(pages::Imported),
}

struct Opened {
    mapping: Mapping,
    opens: u32,
}

/// Blocks opened from sealed handles, by the address the program got.
static OPENED: Mutex<Option<HashMap<u64, Opened>>> = Mutex::new(None);

/// A block was opened from a sealed handle, mapped as `mapping`. The
/// driver counts opens of one segment itself (same base); a new pages
/// mapping at an address replaces whatever was recorded there (a mapping
/// that died with its context).
pub fn opened(block: u64, mapping: Mapping) {
    let mut opened = OPENED.lock();
    let table = opened.get_or_insert_with(HashMap::new);
    match mapping {
        Mapping::Pages(_) => drop(table.insert(block, Opened { mapping, opens: 1 })),
        Mapping::Segment { .. } => table.entry(block).or_insert(Opened { mapping, opens: 0 }).opens += 1,
    }
}

/// The block of `ticket` when it is open already in context `ctx`: one more
/// open of it.
pub fn reopen(ticket: Ticket, ctx: u64) -> Option<u64> {
    let mut opened = OPENED.lock();
    let (&block, entry) = opened
        .as_mut()?
        .iter_mut()
        .find(|(_, o)| matches!(&o.mapping, Mapping::Pages(p) if p.ticket == ticket && p.ctx() == ctx))?;
    entry.opens += 1;
    Some(block)
}

/// Forgets the block at `ptr` (its mapping died with its context).
pub fn forget_opened(ptr: u64) {
    if let Some(table) = OPENED.lock().as_mut() {
        table.remove(&ptr);
    }
}

/// How the block at `ptr` is mapped, when it was opened from a sealed handle.
pub fn opened_at(ptr: u64) -> Option<Mapping> {
    OPENED.lock().as_ref()?.get(&ptr).map(|o| o.mapping.clone())
}

/// What closing one open of a block did.
pub enum Closed {
    /// The block was not open (never, or closed meanwhile by another thread).
    NotOpen,
    /// Other opens of it remain.
    StillOpen,
    /// That was its last open: its mapping, now forgotten.
    LastClose(Mapping),
}

/// One open of the block at `ptr` was closed.
pub fn closed(ptr: u64) -> Closed {
    let mut opened = OPENED.lock();
    let Some(table) = opened.as_mut() else { return Closed::NotOpen };
    let std::collections::hash_map::Entry::Occupied(mut entry) = table.entry(ptr) else {
        return Closed::NotOpen;
    };
    entry.get_mut().opens -= 1;
    if entry.get().opens > 0 {
        return Closed::StillOpen;
    }
    Closed::LastClose(entry.remove().mapping)
}

pub fn lock_for_fork() {
    std::mem::forget(OPENED.lock());
    pages::lock_for_fork();
    broker::lock_for_fork();
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    broker::unlock_after_fork(in_child);
    pages::unlock_after_fork(in_child);
    OPENED.force_unlock();
    if in_child {
        // CUDA mappings do not survive fork.
        *OPENED.lock() = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_round_trip_and_differ_by_kind() {
        let mut driver = [0u8; 64];
        for (i, b) in driver[..56].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(7);
        }
        let mut h = driver;
        assert!(seal(&mut h, 3 << 20));
        match unseal(&h) {
            Some(Sealed::Segment { driver: d, offset }) => assert_eq!((d, offset), (driver, 3 << 20)),
            _ => panic!("a segment seal"),
        }
        let t = Ticket { pid: 4242, id: 7, token: 0x0123_4567_89ab_cdef, nonce: 0xfeed_beef_0000_0042 };
        let p = seal_pages(t);
        match unseal(&p) {
            Some(Sealed::Pages(back)) => assert_eq!(back, t),
            _ => panic!("a pages seal"),
        }
        assert!(unseal(&driver).is_none(), "a driver handle is not a seal");
        let mut bent = p;
        bent[3] ^= 1;
        assert!(unseal(&bent).is_none(), "a changed byte breaks the checksum");
    }
}
