//! Pool latency on the simulated device with its defaults: unbounded,
//! segments end to end, no fences (the backend costs next to nothing).
//!
//! * `pair/<size>`: one `allocate` + `free` of the same size, steady state.
//! * `mixed/1000_live`: free a random live block and allocate a random size
//!   (512 B..16 MiB, log-uniform, seeded), 1000 blocks live; time per free+alloc.
//! * `mutex/<threads>`: alloc+free pairs of 4 KiB through one `Mutex<Pool>`
//!   (one lock per call, as the shim does); time per pair as one thread sees it.
//! * `vmm_pair/<size>`, `vmm_mixed/1000_live`: the same on the VMM pool with
//!   the shim's settings (`VmmConfig::shim_default`, 2 MiB simulated pages):
//!   small sizes are served hot after their first regrowth.
//!
//! `cargo bench -p cupool-core --bench pool -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use cupool_core::pool::testing::SimulatedDevice;
use cupool_core::pool::{Block, BlockId, Pool, PoolConfig};
use cupool_core::vmm::testing::SimulatedPages;
use cupool_core::vmm::{VmmConfig, VmmPool};

fn new_pool() -> Pool<SimulatedDevice> {
    Pool::new(SimulatedDevice::new(), PoolConfig::default())
}

/// xorshift64*: deterministic and cheap.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// What the benches ask of either pool.
trait Allocator {
    fn alloc(&mut self, size: u64) -> Block;
    fn release(&mut self, id: BlockId);
}

impl Allocator for Pool<SimulatedDevice> {
    fn alloc(&mut self, size: u64) -> Block {
        self.allocate(size).unwrap()
    }
    fn release(&mut self, id: BlockId) {
        self.free(id)
    }
}

impl Allocator for VmmPool<SimulatedPages> {
    fn alloc(&mut self, size: u64) -> Block {
        self.allocate(size).unwrap()
    }
    fn release(&mut self, id: BlockId) {
        self.free(id)
    }
}

/// Steady-state pairs of each size, each on a fresh pool that has
/// allocated and freed the size twice (a VMM pool gives the first free's
/// page back and keeps it from the regrowth on); `after` checks each pool.
fn pair_group<P: Allocator>(
    c: &mut Criterion,
    group: &str,
    sizes: &[(&str, u64)],
    new: impl Fn() -> P,
    after: impl Fn(&P),
) {
    let mut g = c.benchmark_group(group);
    for &(name, size) in sizes {
        let mut pool = new();
        for _ in 0..2 {
            let b = pool.alloc(size);
            pool.release(b.id);
        }
        g.bench_function(name, |bench| {
            bench.iter(|| {
                let b = pool.alloc(black_box(size));
                pool.release(b.id);
                b.addr
            })
        });
        after(&pool);
    }
    g.finish();
}

/// Frees a random one of 1000 live blocks and allocates a random size
/// (512 B..16 MiB, log-uniform, seeded) in its place; returns the pool.
fn mixed_group<P: Allocator>(c: &mut Criterion, group: &str, mut pool: P) -> P {
    const LIVE: usize = 1000;
    let mut rng = Rng(0x5EED_CAFE_F00D_0001);
    let sizes: Vec<u64> = (0..4096)
        .map(|_| {
            let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
            2f64.powf(9.0 + 15.0 * u) as u64
        })
        .collect();
    let mut live: Vec<Block> = (0..LIVE).map(|i| pool.alloc(sizes[i % sizes.len()])).collect();
    let mut g = c.benchmark_group(group);
    g.bench_function("1000_live", |bench| {
        bench.iter(|| {
            let r = rng.next();
            let slot = (r % LIVE as u64) as usize;
            pool.release(live[slot].id);
            live[slot] = pool.alloc(sizes[(r >> 32) as usize % sizes.len()]);
        })
    });
    g.finish();
    pool
}

fn pairs(c: &mut Criterion) {
    let sizes = [("512B", 512u64), ("4KiB", 4 << 10), ("1MiB", 1 << 20), ("8MiB", 8 << 20), ("64MiB", 64 << 20)];
    pair_group(c, "pair", &sizes, new_pool, |pool| assert_eq!(pool.stats().num_device_alloc, 1));
}

fn mixed(c: &mut Criterion) {
    mixed_group(c, "mixed", new_pool()).check_invariants().unwrap();
}

fn contended(c: &mut Criterion) {
    let mut g = c.benchmark_group("mutex");
    for threads in [1usize, 8] {
        let pool = Mutex::new(new_pool());
        g.bench_function(format!("{threads}_threads"), |bench| {
            bench.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for _ in 0..threads {
                        s.spawn(|| {
                            for _ in 0..iters {
                                let b = pool.lock().unwrap().allocate(black_box(4096)).unwrap();
                                pool.lock().unwrap().free(b.id);
                            }
                        });
                    }
                });
                start.elapsed()
            })
        });
    }
    g.finish();
}

fn new_vmm_pool() -> VmmPool<SimulatedPages> {
    VmmPool::new(SimulatedPages::new(), VmmConfig::shim_default())
}

fn vmm_pairs(c: &mut Criterion) {
    let sizes = [("4KiB", 4u64 << 10), ("1MiB", 1 << 20), ("8MiB", 8 << 20)];
    pair_group(c, "vmm_pair", &sizes, new_vmm_pool, |_| ());
}

fn vmm_mixed(c: &mut Criterion) {
    mixed_group(c, "vmm_mixed", new_vmm_pool());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = pairs, mixed, contended, vmm_pairs, vmm_mixed
}
criterion_main!(benches);
