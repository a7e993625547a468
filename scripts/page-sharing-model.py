#!/usr/bin/env python3
"""A model, not the pool: a page pool whose physical pages may be mapped at
several virtual places at once (CUDA's VMM allows it). A block is virtually
contiguous, but its first and last pages may be pages that other blocks use
too, at other bytes: a block of k pages and r bytes takes its r bytes from
the free end of one page, the free start of another, or both, and a small
block may lie across two such pieces. Greedy: fewest new pages, then fewest
pieces, then best fit. Pages are never given back (as in `cupool replay`,
whose clock stands still). Prints peak pages held / peak live per trace,
with the page bound, for comparing against `cupool replay --policy
cupool-vmm`: what sharing pages could win before it is built.

usage: python3 scripts/page-sharing-model.py TRACE...
       (cupool logs, .json or .json.gz, or RMM logging CSVs)"""
import bisect
import gzip
import json
import sys


class SortedList:
    """The few operations of a sorted list the model needs."""

    def __init__(self, items=()):
        self.items = sorted(items)

    def add(self, x):
        bisect.insort(self.items, x)

    def remove(self, x):
        del self.items[bisect.bisect_left(self.items, x)]

    def bisect_left(self, x):
        return bisect.bisect_left(self.items, x)

    def bisect_right(self, x):
        return bisect.bisect_right(self.items, x)

    def __getitem__(self, i):
        return self.items[i]

    def __len__(self):
        return len(self.items)

P = 2 << 20
ALIGN = 512


def load(path):
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw.startswith(b"Thread,"):
        ops = []
        lines = raw.decode().splitlines()
        cols = [c.strip() for c in lines[0].split(",")]
        a, p, s = cols.index("Action"), cols.index("Pointer"), cols.index("Size")
        for line in lines[1:]:
            f = [x.strip() for x in line.split(",")]
            if len(f) != len(cols):
                continue
            if f[a] == "allocate":
                ops.append(("a", int(f[p], 16), int(f[s])))
            elif f[a] == "free":
                ops.append(("f", int(f[p], 16), 0))
        return ops
    log = json.loads(raw)
    ops = []
    for e in log["events"]:
        if e.get("ev") == "alloc" and e.get("kind", "device") in ("device", "pitched", "async", "vmm"):
            ops.append(("a", int(e["ptr"], 16), e["size"]))
        elif e.get("ev") == "free" and e.get("kind", "device") in ("device", "pitched", "async", "vmm"):
            ops.append(("f", int(e["ptr"], 16), 0))
    return ops


class Pool:
    def __init__(self):
        self.pages = 0  # created (never released: the high-water mark)
        self.idle = []  # page ids with nothing on them
        self.free = {}  # page -> SortedList of (start, end) free intervals
        self.used = {}  # page -> bytes used
        self.by_len = SortedList()  # (length, page, start) of every free interval of pages in use
        self.suffix = SortedList()  # (length, page) of free intervals ending at P
        self.prefix = SortedList()  # (length, page) of free intervals starting at 0

    def _index(self, page, iv, add):
        a, b = iv
        op = self.by_len.add if add else self.by_len.remove
        op((b - a, page, a))
        if b == P:
            (self.suffix.add if add else self.suffix.remove)((b - a, page))
        if a == 0:
            (self.prefix.add if add else self.prefix.remove)((b - a, page))

    def new_page(self):
        if self.idle:
            pg = self.idle.pop()
        else:
            pg = self.pages
            self.pages += 1
        self.free[pg] = SortedList([(0, P)])
        self.used[pg] = 0
        self._index(pg, (0, P), True)
        return pg

    def take(self, page, a, b):
        """Marks [a, b) of `page` used (it lies in one free interval)."""
        fl = self.free[page]
        i = fl.bisect_right((a, P + 1)) - 1
        s, e = fl[i]
        assert s <= a and b <= e, (page, a, b, s, e)
        fl.remove((s, e))
        self._index(page, (s, e), False)
        for iv in ((s, a), (b, e)):
            if iv[1] > iv[0]:
                fl.add(iv)
                self._index(page, iv, True)
        self.used[page] += b - a
        return (page, a, b)

    def give(self, piece):
        page, a, b = piece
        fl = self.free[page]
        i = fl.bisect_left((a, 0))
        if i > 0 and fl[i - 1][1] == a:
            s, e = fl[i - 1]
            fl.remove((s, e))
            self._index(page, (s, e), False)
            a = s
        i = fl.bisect_left((b, 0))
        if i < len(fl) and fl[i][0] == b:
            s, e = fl[i]
            fl.remove((s, e))
            self._index(page, (s, e), False)
            b = e
        fl.add((a, b))
        self._index(page, (a, b), True)
        self.used[page] -= piece[2] - piece[1]
        if self.used[page] == 0:
            self._index(page, (0, P), False)
            del self.free[page]
            del self.used[page]
            self.idle.append(page)

    def best(self, sl, n, exclude=None):
        """The smallest entry of `sl` of length >= n (not on page `exclude`)."""
        i = sl.bisect_left((n, -1))
        while i < len(sl):
            if sl[i][1] != exclude:
                return sl[i]
            i += 1
        return None

    def largest(self, sl, exclude=None):
        for i in range(len(sl) - 1, -1, -1):
            if sl[i][1] != exclude:
                return sl[i]
        return None

    def alloc(self, s):
        s = -(-s // ALIGN) * ALIGN
        k, r = divmod(s, P)
        if k == 0:
            fit = self.best(self.by_len, s)
            if fit:
                return [self.take(fit[1], fit[2], fit[2] + s)]
        # (pages needed, pieces, head (entry, h), tail (entry, t), fresh page's bytes)
        options = []
        if r == 0:
            options.append((k, 0, None, None, 0))
        else:
            pre = self.best(self.prefix, r)
            if pre:
                options.append((k, 1, None, (pre, r), 0))
            suf = self.best(self.suffix, r)
            if suf:
                options.append((k, 1, (suf, r), None, 0))
            bs = self.largest(self.suffix)
            bp = self.largest(self.prefix, exclude=bs[1]) if bs else None
            if bs and bp and bs[0] < r and bs[0] + bp[0] >= r:
                options.append((k, 2, (bs, bs[0]), (bp, r - bs[0]), 0))
            if k >= 1 and bs and bp and bs[0] + bp[0] >= r + P:
                h = bs[0]
                options.append((k - 1, 2, (bs, h), (bp, r + P - h), 0))
            options.append((k + 1, 1, None, None, r))
        options.sort(key=lambda o: (o[0], o[1]))
        whole, _, head, tail, fresh = options[0]
        pieces = []
        if head:
            (_, pg), h = head
            pieces.append(self.take(pg, P - h, P))
        if tail:
            (_, pg), t = tail
            pieces.append(self.take(pg, 0, t))
        if fresh:
            pieces.append(self.take(self.new_page(), 0, fresh))
            whole -= 1
        for _ in range(whole):
            pieces.append(self.take(self.new_page(), 0, P))
        assert sum(b - a for _, a, b in pieces) == s, (s, pieces, options[0])
        return pieces

    def free_block(self, pieces):
        for piece in pieces:
            self.give(piece)


def run(path):
    ops = load(path)
    pool = Pool()
    live, cur, peak_live = {}, 0, 0
    for op, ptr, size in ops:
        if op == "a":
            live[ptr] = (size, pool.alloc(size))
            cur += size
            peak_live = max(peak_live, cur)
        elif ptr in live:
            size, pieces = live.pop(ptr)
            cur -= size
            pool.free_block(pieces)
    held = pool.pages * P
    bound = -(-peak_live // P) * P
    return peak_live, held, held / peak_live, bound / peak_live


if __name__ == "__main__":
    print(f"{'trace':28} {'peak live':>10} {'held':>10} {'ratio':>6} {'bound':>6}")
    for path in sys.argv[1:]:
        live, held, ratio, bound = run(path)
        name = path.rsplit("/", 1)[-1]
        print(f"{name:28} {live / 2**20:9.1f}M {held / 2**20:9.1f}M {ratio:6.3f} {bound:6.3f}")
