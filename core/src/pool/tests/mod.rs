//! Focused unit tests of the pool's rules. The long randomized comparison with
//! a reference model is in `core/tests/pool_props.rs`.

mod recovery;
mod rules;

use super::testing::{Fences, SimulatedDevice};
use super::*;

pub(super) const KIB: u64 = 1 << 10;
pub(super) const MIB: u64 = 1 << 20;

/// A pool on the simulated device, with a gap after each segment: segments
/// never touch, so a merge across two of them could not go unnoticed.
pub(super) fn pool(config: PoolConfig) -> Pool<SimulatedDevice> {
    Pool::new(SimulatedDevice::new().with_gap(SEGMENT_ALIGN), config)
}

pub(super) fn alloc(p: &mut Pool<SimulatedDevice>, n: u64) -> Block {
    let b = p.allocate(n).expect("allocation failed");
    p.check_invariants().unwrap();
    b
}

pub(super) fn free(p: &mut Pool<SimulatedDevice>, b: Block) {
    p.free(b.id);
    p.check_invariants().unwrap();
}

pub(super) fn states(p: &Pool<SimulatedDevice>) -> Vec<Vec<(u64, BlockState)>> {
    p.snapshot().iter().map(|s| s.blocks.iter().map(|b| (b.size, b.state)).collect()).collect()
}

// The shim keeps its pools in a global mutex, shared by every thread.
#[test]
fn pool_is_send() {
    fn is_send<T: Send>() {}
    is_send::<Pool<SimulatedDevice>>();
}
