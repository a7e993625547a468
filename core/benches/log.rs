//! Formatting one event line, as the shim's writer thread does for every
//! traced allocation and free: the writer must keep up with the program.
//!
//! `cargo bench -p cupool-core --bench log -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use cupool_core::log::{write_event, Api, Event, EventKind, EventLine, MemKind};

fn event(kind: EventKind, seq: u64) -> Event {
    let mut e = Event::new(kind, Api::CudaMalloc);
    (e.seq, e.t_ns, e.mem, e.device) = (seq, 1_234_567_890 + seq * 97, MemKind::Device, 0);
    (e.ptr, e.size, e.tid, e.stack) = (0x7f3a_2000_0000 + (seq << 12), 4096, 41_237, 12);
    e
}

fn lines(c: &mut Criterion) {
    let mut out = String::with_capacity(1 << 20);
    for kind in [EventKind::Alloc, EventKind::Free] {
        let mut seq = 1;
        c.bench_function(&format!("write_event/{}", kind.as_str()), |b| {
            b.iter(|| {
                if out.len() > (1 << 19) {
                    out.clear();
                }
                seq += 1;
                write_event(&mut out, black_box(&event(kind, seq)), EventLine::Later);
            })
        });
    }
}

criterion_group!(benches, lines);
criterion_main!(benches);
