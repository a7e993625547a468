//! Exact best-fit index over the free blocks of one pool.
//!
//! Semantics are those of one ordered set of `(size, addr)`: [`FreeIndex::best_fit`]
//! returns the smallest free block whose size is at least the request, the
//! lowest address among equals. The set is split into TLSF size classes (see
//! `size.rs`), with a two-level bitmap of non-empty classes, so that:
//!
//! * the class of the request is searched with one ordered lookup, and if it has
//!   nothing big enough, the next non-empty class is found by two bit scans and
//!   its minimum is the answer (every block in a later class is strictly larger);
//! * each class keeps its minimum inline and only the rest in a `BTreeMap`.
//!   Most classes hold zero or one block, so the usual split/re-merge of a
//!   segment's tail never touches a B-tree at all.
//!
//! Every operation is O(log n) at worst (one B-tree operation plus O(1) bit work).

use std::collections::BTreeMap;

use super::size::{class_of, NUM_CLASSES};

const WORDS: usize = NUM_CLASSES.div_ceil(64);
const _: () = assert!(WORDS <= 64, "one summary word must cover every bitmap word");

/// An empty class has this as its inline minimum. No real key can equal it
/// because a block size is always a multiple of 512.
const EMPTY: u128 = u128::MAX;

#[inline]
fn key(size: u64, addr: u64) -> u128 {
    ((size as u128) << 64) | addr as u128
}

#[inline]
fn unkey(k: u128) -> (u64, u64) {
    ((k >> 64) as u64, k as u64)
}

/// A free block as the index sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub size: u64,
    pub addr: u64,
    pub idx: u32,
}

impl Entry {
    #[inline]
    fn from_key(k: u128, idx: u32) -> Self {
        let (size, addr) = unkey(k);
        Entry { size, addr, idx }
    }
}

struct Class {
    /// Smallest key in the class, or `EMPTY`.
    min_key: u128,
    min_idx: u32,
    /// Every other key of the class (all greater than `min_key`).
    rest: BTreeMap<u128, u32>,
}

pub(crate) struct FreeIndex {
    classes: Box<[Class]>,
    /// Bit `c % 64` of word `c / 64` is set iff class `c` is non-empty.
    words: [u64; WORDS],
    /// Bit `w` is set iff `words[w] != 0`.
    summary: u64,
    len: usize,
}

impl FreeIndex {
    pub fn new() -> Self {
        let classes =
            (0..NUM_CLASSES).map(|_| Class { min_key: EMPTY, min_idx: u32::MAX, rest: BTreeMap::new() }).collect();
        FreeIndex { classes, words: [0; WORDS], summary: 0, len: 0 }
    }

    /// Number of free blocks in the index.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn mark(&mut self, c: usize) {
        self.words[c / 64] |= 1 << (c % 64);
        self.summary |= 1 << (c / 64);
    }

    #[inline]
    fn unmark(&mut self, c: usize) {
        let w = c / 64;
        self.words[w] &= !(1 << (c % 64));
        if self.words[w] == 0 {
            self.summary &= !(1 << w);
        }
    }

    /// First non-empty class `>= from`.
    #[inline]
    fn next_class(&self, from: usize) -> Option<usize> {
        if from >= NUM_CLASSES {
            return None;
        }
        let w = from / 64;
        let bits = self.words[w] & (!0u64 << (from % 64));
        if bits != 0 {
            return Some(w * 64 + bits.trailing_zeros() as usize);
        }
        let higher = self.summary & (!0u64).checked_shl(w as u32 + 1).unwrap_or(0);
        if higher == 0 {
            return None;
        }
        let w = higher.trailing_zeros() as usize;
        Some(w * 64 + self.words[w].trailing_zeros() as usize)
    }

    /// Adds a free block. The `(size, addr)` pair must not be present.
    #[inline]
    pub fn insert(&mut self, size: u64, addr: u64, idx: u32) {
        let c = class_of(size);
        let k = key(size, addr);
        self.len += 1;
        let class = &mut self.classes[c];
        if class.min_key == EMPTY {
            class.min_key = k;
            class.min_idx = idx;
            self.mark(c);
        } else if k < class.min_key {
            let old = class.rest.insert(class.min_key, class.min_idx);
            debug_assert!(old.is_none());
            class.min_key = k;
            class.min_idx = idx;
        } else {
            let old = class.rest.insert(k, idx);
            debug_assert!(old.is_none(), "free block inserted twice");
        }
    }

    /// Removes a free block that is present.
    #[inline]
    pub fn remove(&mut self, size: u64, addr: u64) {
        let c = class_of(size);
        let k = key(size, addr);
        self.len -= 1;
        let class = &mut self.classes[c];
        if class.min_key == k {
            match class.rest.pop_first() {
                Some((k2, i2)) => {
                    class.min_key = k2;
                    class.min_idx = i2;
                }
                None => {
                    class.min_key = EMPTY;
                    self.unmark(c);
                }
            }
        } else {
            let old = class.rest.remove(&k);
            debug_assert!(old.is_some(), "removing a block that is not free");
        }
    }

    /// Smallest `(size, addr)` with `size >= req`.
    #[inline]
    pub fn best_fit(&self, req: u64) -> Option<Entry> {
        let c = class_of(req);
        let class = &self.classes[c];
        if class.min_key != EMPTY {
            if class.min_key >= key(req, 0) {
                return Some(Entry::from_key(class.min_key, class.min_idx));
            }
            if !class.rest.is_empty() {
                if let Some((&k, &i)) = class.rest.range(key(req, 0)..).next() {
                    return Some(Entry::from_key(k, i));
                }
            }
        }
        let c = self.next_class(c + 1)?;
        let class = &self.classes[c];
        Some(Entry::from_key(class.min_key, class.min_idx))
    }

    /// Free blocks of at least `req` bytes in best-fit order: smallest
    /// first, lowest address among equals (the first is [`Self::best_fit`]).
    pub fn fits(&self, req: u64) -> impl Iterator<Item = Entry> + '_ {
        let lo = key(req, 0);
        std::iter::successors(self.next_class(class_of(req)), move |&c| self.next_class(c + 1))
            .flat_map(move |c| {
                let class = &self.classes[c];
                std::iter::once((class.min_key, class.min_idx)).chain(class.rest.range(lo..).map(|(&k, &i)| (k, i)))
            })
            .filter(move |&(k, _)| k >= lo)
            .map(|(k, i)| Entry::from_key(k, i))
    }

    /// The largest free block (highest address among equals).
    pub fn largest(&self) -> Option<Entry> {
        if self.summary == 0 {
            return None;
        }
        let w = 63 - self.summary.leading_zeros() as usize;
        let c = w * 64 + 63 - self.words[w].leading_zeros() as usize;
        let class = &self.classes[c];
        Some(match class.rest.last_key_value() {
            Some((&k, &i)) => Entry::from_key(k, i),
            None => Entry::from_key(class.min_key, class.min_idx),
        })
    }

    /// Every free block, in `(size, addr)` order.
    pub fn iter(&self) -> impl Iterator<Item = Entry> + '_ {
        let mut next = self.next_class(0);
        std::iter::from_fn(move || {
            let c = next?;
            next = self.next_class(c + 1);
            Some(c)
        })
        .flat_map(move |c| {
            let class = &self.classes[c];
            std::iter::once(Entry::from_key(class.min_key, class.min_idx))
                .chain(class.rest.iter().map(|(&k, &i)| Entry::from_key(k, i)))
        })
    }

    /// Is this exact block in the index under `idx`? O(log n); for checks.
    pub fn contains(&self, size: u64, addr: u64, idx: u32) -> bool {
        let class = &self.classes[class_of(size)];
        let k = key(size, addr);
        (class.min_key == k && class.min_idx == idx) || class.rest.get(&k) == Some(&idx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Deterministic pseudo-random sizes against a plain `BTreeSet` oracle.
    #[test]
    fn matches_ordered_set() {
        let mut ix = FreeIndex::new();
        let mut oracle = BTreeSet::new();
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for step in 0..20_000u32 {
            let r = rnd();
            let size = 512 * (1 + (r % 64) * (1 + (r >> 20) % 3) * if r & 1 == 0 { 1 } else { 300 });
            let addr = 512 * (rnd() % 256);
            if rnd() % 3 != 0 {
                if oracle.insert((size, addr)) {
                    ix.insert(size, addr, step);
                }
            } else if let Some(&(s2, a2)) = oracle.range((size, 0)..).next() {
                oracle.remove(&(s2, a2));
                ix.remove(s2, a2);
            }
            let q = 512 * (1 + rnd() % 20_000);
            let want = oracle.range((q, 0)..).next().copied();
            assert_eq!(ix.best_fit(q).map(|e| (e.size, e.addr)), want);
            assert_eq!(ix.len(), oracle.len());
            assert_eq!(ix.largest().map(|e| (e.size, e.addr)), oracle.last().copied());
        }
        let all: Vec<_> = ix.iter().map(|e| (e.size, e.addr)).collect();
        assert_eq!(all, oracle.iter().copied().collect::<Vec<_>>());
    }

    #[test]
    fn huge_sizes() {
        let mut ix = FreeIndex::new();
        let big = (u64::MAX >> 9) << 9;
        ix.insert(big, 0, 7);
        ix.insert(512, 512, 8);
        assert_eq!(ix.best_fit(1024).unwrap().idx, 7);
        assert_eq!(ix.best_fit(512).unwrap().idx, 8);
        assert_eq!(ix.largest().unwrap().idx, 7);
        ix.remove(big, 0);
        assert_eq!(ix.best_fit(1024), None);
    }
}
