//! Focused unit tests of the pool's rules. The long randomized comparison with
//! a reference model is in `core/tests/pool_props.rs`.

mod recovery;
mod rules;

use super::*;

pub(super) const KIB: u64 = 1 << 10;
pub(super) const MIB: u64 = 1 << 20;
const BASE: u64 = 1 << 40;

/// Bump-allocating backend with an optional capacity and optional deferred tags.
#[derive(Default)]
pub(super) struct Fake {
    next: u64,
    cap: Option<u64>,
    outstanding: u64,
    /// Hand out tags on free.
    deferred: bool,
    tag: u64,
    done: u64,
    capture: bool,
    released: Vec<(u64, u64)>,
    calls: usize,
}

impl Backend for Fake {
    fn allocate_segment(&mut self, size: u64) -> Option<u64> {
        self.calls += 1;
        if self.cap.is_some_and(|c| self.outstanding + size > c) {
            return None;
        }
        self.outstanding += size;
        let addr = BASE + self.next;
        self.next += size + SEGMENT_ALIGN; // leave a gap: segments never touch
        Some(addr)
    }
    fn release_segment(&mut self, addr: u64, size: u64) {
        self.outstanding -= size;
        self.released.push((addr, size));
    }
    fn free_tag(&mut self) -> Option<u64> {
        self.deferred.then(|| {
            self.tag += 1;
            self.tag
        })
    }
    fn is_complete(&mut self, tag: u64) -> bool {
        tag <= self.done
    }
    fn synchronize(&mut self) -> bool {
        if !self.capture {
            self.done = self.tag;
        }
        !self.capture
    }
}

pub(super) fn pool(config: PoolConfig) -> Pool<Fake> {
    Pool::new(Fake::default(), config)
}

pub(super) fn alloc(p: &mut Pool<Fake>, n: u64) -> Block {
    let b = p.allocate(n).expect("allocation failed");
    p.check_invariants().unwrap();
    b
}

pub(super) fn free(p: &mut Pool<Fake>, b: Block) {
    p.free(b.id);
    p.check_invariants().unwrap();
}

pub(super) fn states(p: &Pool<Fake>) -> Vec<Vec<(u64, BlockState)>> {
    p.snapshot().iter().map(|s| s.blocks.iter().map(|b| (b.size, b.state)).collect()).collect()
}

#[test]
fn pool_is_send() {
    fn is_send<T: Send>() {}
    is_send::<Pool<Fake>>();
}
