//! `GiveBack::Auto`: which segment sizes the program cycles through. A
//! segment given back and grown again (same size) within `regret_ns` shows a
//! program that frees and reallocates that memory over and over; segments of
//! that size stay cached from then on, while every other size still goes
//! back at once (a bulk free of memory never reallocated so soon). The VMM
//! pool keeps the same books by block size (`VmmConfig::cycle_regret_ns`).

use std::collections::VecDeque;

/// Give-backs remembered, and sizes kept, at most (then every size is kept).
const RECENT: usize = 32;
const KEPT: usize = 64;

#[derive(Default)]
pub(crate) struct Cycles {
    /// Recent give-backs as (segment size, when), oldest first.
    recent: VecDeque<(u64, u64)>,
    /// Sizes that cycled.
    kept: Vec<u64>,
    all: bool,
}

impl Cycles {
    pub fn gave_back(&mut self, size: u64, now_ns: u64) {
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((size, now_ns));
    }

    /// Was a segment of `size` given back lately (cheap: asked on every growth)?
    pub fn gave_back_lately(&self, size: u64) -> bool {
        !self.all && self.recent.iter().any(|&(s, _)| s == size)
    }

    /// The pool grows by a segment of `size` now.
    pub fn growing(&mut self, size: u64, now_ns: u64, regret_ns: u64) {
        let cycled = self.recent.iter().any(|&(s, t)| s == size && now_ns.saturating_sub(t) < regret_ns);
        if cycled && !self.keeps(size) {
            if self.kept.len() == KEPT {
                self.all = true;
            } else {
                self.kept.push(size);
            }
        }
    }

    #[inline]
    pub fn keeps(&self, size: u64) -> bool {
        self.all || self.kept.contains(&size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_size_that_cycles_is_kept() {
        let mut c = Cycles::default();
        c.gave_back(64, 100);
        c.gave_back(1000, 100);
        c.growing(64, 150, 100);
        assert!(c.keeps(64) && !c.keeps(1000), "regrown 50 ns after its give-back");
        c.growing(1000, 300, 100);
        assert!(!c.keeps(1000), "regrown 200 ns after: not a cycle");
    }

    #[test]
    fn past_the_bound_every_size_is_kept() {
        let mut c = Cycles::default();
        for size in 1..=KEPT as u64 + 1 {
            c.gave_back(size, 0);
            c.growing(size, 0, 1);
        }
        assert!(c.keeps(u64::MAX));
    }
}
