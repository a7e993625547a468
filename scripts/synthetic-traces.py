#!/usr/bin/env python3
"""Writes synthetic allocation traces (RMM's CSV format) that `cupool replay`
reads, for judging a placement policy on shapes the bundled traces do not
have: random lifetimes over a wide spread of sizes, size-doubling phases
with a few odd-sized blocks (as NumPy-style scripts make), CuPy-like FFT
steps, and serving mixes of request sizes.

    python3 scripts/synthetic-traces.py DIR
    ./target/release/cupool replay --policy cupool-vmm DIR

The traces are seeded: the same DIR contents every run.
"""
import os
import random
import sys


def write(path, ops):
    with open(path, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for t, (action, ptr, size) in enumerate(ops, start=1):
            ns = t * 1000
            h, rem = divmod(ns, 3600 * 10**9)
            m, rem = divmod(rem, 60 * 10**9)
            f.write(f"0,{h:02d}:{m:02d}:{rem / 1e9:012.9f},{action},{ptr:#x},{size},0\n")


class Trace:
    def __init__(self):
        self.ops, self.next = [], 0x1000

    def alloc(self, size):
        block = (self.next, size)
        self.next += 1 << 30
        self.ops.append(("allocate", *block))
        return block

    def free(self, block):
        self.ops.append(("free", *block))


def fft_steps(seed, steps=60, keep=12):
    r, t, kept = random.Random(seed), Trace(), []
    for it in range(steps):
        n = 1 << (14 + it % 8)
        a = t.alloc(4 * n)
        tmp = [t.alloc(4 * n) for _ in range(r.randint(2, 5))]
        spec, srt, top = t.alloc(8 * (n // 2 + 1)), t.alloc(4 * (n // 2 + 1)), t.alloc(64)
        side = 256 + 32 * (it % 5)
        m, p, s = t.alloc(4 * side * 256), t.alloc(4 * side * side), t.alloc(1024)
        for b in tmp + [spec, srt, m, p, a]:
            t.free(b)
        kept.append((top, s))
        if len(kept) > keep:
            for b in kept.pop(0):
                t.free(b)
    return t.ops


def random_lifetimes(seed, steps=400, lo=12, hi=24, live=60):
    r, t, held = random.Random(seed), Trace(), []
    for _ in range(steps):
        held.append(t.alloc(int(2 ** r.uniform(lo, hi)) // 256 * 256 + 256))
        while len(held) > live or (held and r.random() < 0.3):
            t.free(held.pop(r.randrange(len(held)) if r.random() < 0.5 else 0))
    return t.ops


def doubling(seed, rounds=6):
    r, t, kept = random.Random(seed), Trace(), []
    for _ in range(3):
        t.alloc(r.randint(1, 20) << 20 | r.randint(0, 1 << 20))
    for _ in range(rounds):
        for k in range(4):
            odd = r.choice([0, 0, 4, 8, 1536])
            tmp = [t.alloc((1 << 20 << k) + odd) for _ in range(r.randint(2, 5))]
            small = [t.alloc(r.choice([512, 4096, 65536, 131072, 262144])) for _ in range(r.randint(1, 6))]
            for b in tmp[:-1] + small[1:]:
                t.free(b)
            kept += [tmp[-1], small[0]]
            while len(kept) > r.randint(6, 14):
                t.free(kept.pop(r.randrange(len(kept))))
    return t.ops


def serving(seed, steps=3000):
    r, t, held = random.Random(seed), Trace(), []
    unit = [int(2 ** r.uniform(16, 23)) for _ in range(6)]
    for _ in range(steps):
        held.append(t.alloc(r.choice(unit) * r.randint(1, 8) + r.choice([0, 0, 256, 4])))
        for _ in range(r.randint(0, 2)):
            if len(held) > r.randint(20, 60):
                t.free(held.pop(r.randrange(len(held))))
    return t.ops


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: synthetic-traces.py DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    traces = {}
    for s in range(3):
        traces[f"fft{s}"] = fft_steps(s, keep=8 + 4 * s)
        traces[f"mixed{s}"] = random_lifetimes(s, live=30 + 30 * s)
        traces[f"mixedsmall{s}"] = random_lifetimes(s, lo=9, hi=21, live=200)
    for s in list(range(10, 14)) + list(range(20, 32)):
        traces[f"fft{s}"] = fft_steps(s, keep=6 + s % 4 * 3)
        traces[f"mixed{s}"] = random_lifetimes(s, lo=11 + s % 3, hi=22 + s % 3, live=20 + 20 * (s % 4))
        traces[f"doubling{s}"] = doubling(s)
        traces[f"serving{s}"] = serving(s)
    for name, ops in traces.items():
        write(os.path.join(out, f"{name}.csv"), ops)
    print(f"{len(traces)} traces in {out}")


if __name__ == "__main__":
    main()
