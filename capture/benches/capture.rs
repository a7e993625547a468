//! Cost of one native capture: a few frames, the whole stack under
//! criterion, eight sites in turn (each capture walks), the same with a first
//! frame whose unwind rule is not cached, and a 64-frame recursion cut at 64
//! and at 32 frames. A site captured again with its stack unchanged is
//! answered from the thread's remembered walks.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use cupool_capture::native::capture;

#[inline(never)]
fn shallow_3(out: &mut [u64]) -> usize {
    black_box(capture(black_box(out)))
}

#[inline(never)]
fn shallow_2(out: &mut [u64]) -> usize {
    black_box(shallow_3(out))
}

#[inline(never)]
fn shallow_1(out: &mut [u64]) -> usize {
    black_box(shallow_2(out))
}

/// A distinct function (and return address) per `N`.
#[inline(never)]
fn site<const N: usize>(out: &mut [u64]) -> usize {
    black_box(N);
    black_box(capture(black_box(out)))
}

type Site = fn(&mut [u64]) -> usize;

macro_rules! row {
    ($hi:literal; $($lo:literal)*) => { [$(site::<{ $hi * 32 + $lo }> as Site),*] };
}

macro_rules! rows {
    ($($hi:literal)*) => { [$(row!($hi; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31)),*] };
}

/// 1024 call sites: more return addresses than framehop's rule cache (509
/// slots) holds, so that cycling through them misses it on the first frame.
fn sites() -> Vec<Site> {
    let rows: [[Site; 32]; 32] =
        rows!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
    rows.iter().flatten().copied().collect()
}

/// Runs `at_bottom` under `depth` frames of this function.
#[inline(never)]
fn recurse(depth: usize, at_bottom: &mut dyn FnMut()) {
    if depth == 0 {
        at_bottom();
    } else {
        recurse(black_box(depth - 1), at_bottom);
    }
    black_box(depth);
}

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("native_capture");
    group.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));

    group.bench_function("5_frames", |b| {
        let mut out = [0u64; 5];
        assert_eq!(shallow_1(&mut out), 5);
        b.iter(|| shallow_1(&mut out))
    });
    // The whole stack under criterion (its own frames, main, libc): ~15 frames.
    group.bench_function("criterion_stack_len32", |b| {
        let mut out = [0u64; 32];
        let n = shallow_1(&mut out);
        assert!((8..32).contains(&n), "{n} frames");
        b.iter(|| shallow_1(&mut out))
    });
    // Eight sites in turn: more than a thread remembers walks of, so every
    // capture walks, with every rule cached (the rows above repeat one site,
    // which is answered from memory: `memo.rs`).
    group.bench_function("eight_sites_walked_len32", |b| {
        let sites = &sites()[..8];
        let mut out = [0u64; 32];
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % sites.len();
            sites[i](&mut out)
        })
    });
    // Every capture unwinds one frame whose rule is not cached.
    group.bench_function("uncached_first_frame_len32", |b| {
        let sites = sites();
        let mut out = [0u64; 32];
        assert!(sites.iter().all(|site| site(&mut out) > 8));
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % sites.len();
            sites[i](&mut out)
        })
    });
    for len in [64, 32] {
        group.bench_function(format!("depth64_len{len}"), |b| {
            recurse(64, &mut || {
                let mut out = vec![0u64; len];
                assert_eq!(capture(&mut out), len);
                b.iter(|| capture(black_box(&mut out)))
            })
        });
    }
    group.finish();
}

criterion_group!(capture_benches, benches);
criterion_main!(capture_benches);
