//! `GiveBack::Auto`: which segment sizes the program cycles through. A
//! segment given back and grown again (same size) within `regret_ns` shows a
//! program that frees and reallocates that memory over and over; segments of
//! that size stay cached from then on, while every other size still goes
//! back at once (a bulk free of memory never reallocated so soon). The VMM
//! pool keeps the same books by block size (`VmmConfig::cycle_regret_ns`).

/// Sizes whose last give-back is remembered, and sizes kept, at most (past
/// `KEPT`, every size is kept). A training step frees hundreds of blocks of a
/// few dozen sizes between two growths of one size: the books are by size,
/// not by event, so that none of them pushes another out.
const RECENT: usize = 256;
const KEPT: usize = 64;

#[derive(Default)]
pub(crate) struct Cycles {
    /// Sizes given back, each with its latest give-back, as (size, when).
    recent: Vec<(u64, u64)>,
    /// Sizes that cycled.
    kept: Vec<u64>,
    all: bool,
}

impl Cycles {
    pub fn gave_back(&mut self, size: u64, now_ns: u64) {
        if let Some(e) = self.recent.iter_mut().find(|(s, _)| *s == size) {
            e.1 = now_ns;
            return;
        }
        if self.recent.len() == RECENT {
            // The size given back longest ago makes room.
            let oldest = (0..RECENT).min_by_key(|&i| self.recent[i].1).unwrap_or(0);
            self.recent.swap_remove(oldest);
        }
        self.recent.push((size, now_ns));
    }

    /// Was a segment of `size` given back lately (cheap: asked on every growth)?
    pub fn gave_back_lately(&self, size: u64) -> bool {
        !self.all && self.recent.iter().any(|&(s, _)| s == size)
    }

    /// Was anything given back, and not yet kept?
    pub fn gave_back_any(&self) -> bool {
        !self.all && !self.recent.is_empty()
    }

    /// Every size given back at `since` or later is kept from now on.
    pub fn regret_since(&mut self, since: u64) {
        let regretted: Vec<u64> = self.recent.iter().filter(|&&(_, t)| t >= since).map(|&(s, _)| s).collect();
        for size in regretted {
            self.keep(size);
        }
    }

    fn keep(&mut self, size: u64) {
        if self.keeps(size) {
            return;
        }
        if self.kept.len() == KEPT {
            self.all = true;
        } else {
            self.kept.push(size);
        }
    }

    /// The pool grows by a segment of `size` now.
    pub fn growing(&mut self, size: u64, now_ns: u64, regret_ns: u64) {
        if self.recent.iter().any(|&(s, t)| s == size && now_ns.saturating_sub(t) < regret_ns) {
            self.keep(size);
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
    fn a_cycle_is_seen_among_many_other_give_backs() {
        let mut c = Cycles::default();
        c.gave_back(64, 100);
        for other in 1000..1300 {
            c.gave_back(other % 40 + 1000, 110); // a step's many frees of 40 other sizes
        }
        c.growing(64, 150, 100);
        assert!(c.keeps(64));
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
