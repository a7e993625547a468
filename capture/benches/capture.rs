//! Cost of one native capture: a few frames, and a 64-frame recursion cut
//! at 64 and at 32 frames.

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
