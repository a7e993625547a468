//! Pool configuration and the size rules that depend on it.

use super::size::{round_up, MIN_BLOCK, SEGMENT_ALIGN};

const MIB: u64 = 1 << 20;
/// Upper bound for segment sizes set in the configuration (1 TiB): keeps all
/// sums of sizes far from overflowing.
const MAX_CONFIG_SEGMENT: u64 = 1 << 40;

/// Tunables of a [`super::Pool`]. Defaults are PyTorch's caching allocator.
/// Every size is in bytes. [`super::Pool::new`] applies [`PoolConfig::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Requests whose rounded size is at most this go to the small pool (1 MiB).
    pub small_max: u64,
    /// Size of every small-pool segment (2 MiB).
    pub small_segment: u64,
    /// Size of the large-pool segments made for requests below
    /// `large_segment_threshold` (20 MiB). Also the slack allowed when a
    /// request of at least `max_split_size` takes an oversize block: the block
    /// must be smaller than the request plus this (PyTorch's `kLargeBuffer`).
    pub large_segment: u64,
    /// Large requests below this get a `large_segment`; larger ones get a
    /// segment of their own, rounded up to 2 MiB (10 MiB).
    pub large_segment_threshold: u64,
    /// A large-pool block is split only if the remainder is at least this (1 MiB).
    pub min_split_remainder_large: u64,
    /// Large-pool blocks of at least this size are never split, and requests
    /// below it never take them (`u64::MAX`: off).
    pub max_split_size: u64,
    /// Cap on reserved bytes; a segment that would pass it is treated as a
    /// device out-of-memory (`u64::MAX`: no cap).
    pub limit: u64,
    /// Before growing past the peak of reserved bytes, give back completely
    /// free segments worth the new one (largest first). Off in PyTorch's
    /// allocator; cupool turns it on.
    pub release_before_grow: bool,
    /// A miss waits for pending frees (`Backend::wait_for`) instead of growing
    /// while they cover the request and are at least 1/`wait_share` of the
    /// reserved bytes (4; at least 1).
    pub wait_share: u64,
    /// When a segment that frees leave completely free goes back to the device.
    pub give_back: GiveBack,
}

/// When completely free segments go back to the device (besides before
/// growing past the peak and on out-of-memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveBack {
    /// Kept for reuse (PyTorch's caching allocator).
    Never,
    /// At once, as `cudaFree` would: another process can use the memory.
    Always,
    /// At once, but a segment size the pool has to grow again less than
    /// `regret_ns` after giving one of that size back (the program frees and
    /// reallocates it in cycles) stays cached from then on.
    Auto { regret_ns: u64 },
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            small_max: MIB,
            small_segment: 2 * MIB,
            large_segment: 20 * MIB,
            large_segment_threshold: 10 * MIB,
            min_split_remainder_large: MIB,
            max_split_size: u64::MAX,
            limit: u64::MAX,
            release_before_grow: false,
            wait_share: 4,
            give_back: GiveBack::Never,
        }
    }
}

fn clamp_aligned(v: u64, align: u64, lo: u64, hi: u64) -> u64 {
    round_up(v.clamp(lo, hi), align).unwrap_or(hi)
}

impl PoolConfig {
    /// What cupool runs with: PyTorch's sizes, plus releasing idle cached
    /// segments before growing (see `release_before_grow`) and giving
    /// segments back when frees empty them (see `GiveBack::Auto`).
    pub fn shim_default() -> PoolConfig {
        PoolConfig {
            release_before_grow: true,
            wait_share: 256,
            give_back: GiveBack::Auto { regret_ns: 1_000_000_000 },
            ..PoolConfig::default()
        }
    }

    /// Returns a copy with every nonsensical value clamped to the nearest
    /// sensible one:
    /// * segment sizes are multiples of 2 MiB, between 2 MiB and 1 TiB;
    /// * `small_max` is a multiple of 512 B, at least 512 B and at most `small_segment`;
    /// * `large_segment_threshold` is at most `large_segment` (a request below
    ///   it must fit in one large segment);
    /// * `min_split_remainder_large` is a multiple of 512 B, at least 512 B;
    /// * `max_split_size`, unless `u64::MAX`, is a multiple of 512 B and larger
    ///   than `large_segment` (so that a fresh large segment can be split);
    /// * `limit` is kept as given.
    pub fn validate(self) -> PoolConfig {
        let small_segment = clamp_aligned(self.small_segment, SEGMENT_ALIGN, SEGMENT_ALIGN, MAX_CONFIG_SEGMENT);
        let small_max = clamp_aligned(self.small_max, MIN_BLOCK, MIN_BLOCK, small_segment);
        let large_segment = clamp_aligned(self.large_segment, SEGMENT_ALIGN, SEGMENT_ALIGN, MAX_CONFIG_SEGMENT);
        let large_segment_threshold = self.large_segment_threshold.min(large_segment);
        let min_split_remainder_large =
            clamp_aligned(self.min_split_remainder_large, MIN_BLOCK, MIN_BLOCK, MAX_CONFIG_SEGMENT);
        let max_split_size = if self.max_split_size == u64::MAX {
            u64::MAX
        } else {
            let lo = large_segment + MIN_BLOCK;
            round_up(self.max_split_size.max(lo), MIN_BLOCK).unwrap_or(u64::MAX)
        };
        PoolConfig {
            small_max,
            small_segment,
            large_segment,
            large_segment_threshold,
            min_split_remainder_large,
            max_split_size,
            limit: self.limit,
            release_before_grow: self.release_before_grow,
            wait_share: self.wait_share.max(1),
            give_back: self.give_back,
        }
    }

    /// Does a request of this rounded size go to the small pool?
    #[inline]
    pub fn is_small(&self, rounded: u64) -> bool {
        rounded <= self.small_max
    }

    /// Size of the segment to obtain for a request of this rounded size that
    /// found no free block; `None` if it overflows.
    #[inline]
    pub fn segment_size(&self, rounded: u64) -> Option<u64> {
        if self.is_small(rounded) {
            Some(self.small_segment)
        } else if rounded < self.large_segment_threshold {
            Some(self.large_segment)
        } else {
            round_up(rounded, SEGMENT_ALIGN)
        }
    }

    /// May a free block of `block` bytes serve a request of `rounded` bytes?
    /// (`block >= rounded` is assumed.) Only the max-split rules can refuse.
    #[inline]
    pub fn may_use(&self, small: bool, block: u64, rounded: u64) -> bool {
        if small || block < self.max_split_size {
            true
        } else {
            // An oversize block: only for requests that are oversize too, and
            // only if little of it is left unused.
            rounded >= self.max_split_size && block < rounded.saturating_add(self.large_segment)
        }
    }

    /// Should a block of `block` bytes be split to serve `rounded` bytes?
    #[inline]
    pub fn should_split(&self, small: bool, block: u64, rounded: u64) -> bool {
        let rest = block - rounded;
        if small {
            rest >= MIN_BLOCK
        } else {
            rest >= self.min_split_remainder_large && block < self.max_split_size
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        assert_eq!(PoolConfig::default().validate(), PoolConfig::default());
    }

    #[test]
    fn validate_clamps() {
        let c = PoolConfig {
            small_max: 0,
            small_segment: 1,
            large_segment: 3 * MIB,
            large_segment_threshold: 100 * MIB,
            min_split_remainder_large: 0,
            max_split_size: 5,
            limit: 7,
            release_before_grow: true,
            wait_share: 0,
            give_back: GiveBack::Always,
        }
        .validate();
        assert_eq!(c.wait_share, 1);
        assert_eq!(c.small_max, 512);
        assert_eq!(c.small_segment, 2 * MIB);
        assert_eq!(c.large_segment, 4 * MIB);
        assert_eq!(c.large_segment_threshold, 4 * MIB);
        assert_eq!(c.min_split_remainder_large, 512);
        assert_eq!(c.max_split_size, 4 * MIB + 512);
        assert_eq!(c.limit, 7);
        let c = PoolConfig {
            small_max: u64::MAX,
            small_segment: u64::MAX,
            large_segment: u64::MAX,
            min_split_remainder_large: u64::MAX,
            max_split_size: u64::MAX - 1,
            ..PoolConfig::default()
        }
        .validate();
        assert_eq!(c.small_segment, MAX_CONFIG_SEGMENT);
        assert_eq!(c.small_max, MAX_CONFIG_SEGMENT);
        assert_eq!(c.large_segment, MAX_CONFIG_SEGMENT);
        assert_eq!(c.max_split_size, u64::MAX);
        assert_eq!(c.min_split_remainder_large, MAX_CONFIG_SEGMENT);
    }

    #[test]
    fn segment_sizes() {
        let c = PoolConfig::default();
        assert_eq!(c.segment_size(512), Some(2 * MIB));
        assert_eq!(c.segment_size(MIB), Some(2 * MIB));
        assert_eq!(c.segment_size(MIB + 512), Some(20 * MIB));
        assert_eq!(c.segment_size(10 * MIB - 512), Some(20 * MIB));
        assert_eq!(c.segment_size(10 * MIB), Some(10 * MIB));
        assert_eq!(c.segment_size(10 * MIB + 512), Some(12 * MIB));
        assert_eq!(c.segment_size(u64::MAX - 511), None);
    }

    #[test]
    fn split_thresholds() {
        let c = PoolConfig::default();
        assert!(c.should_split(true, 2 * MIB, 2 * MIB - 512));
        assert!(!c.should_split(true, 1024, 1024));
        assert!(c.should_split(false, 20 * MIB, 19 * MIB));
        assert!(!c.should_split(false, 20 * MIB, 19 * MIB + 512));
        let c = PoolConfig { max_split_size: 32 * MIB, ..c };
        assert!(c.should_split(false, 32 * MIB - 512, MIB));
        assert!(!c.should_split(false, 32 * MIB, MIB));
        assert!(c.may_use(false, 32 * MIB - 512, MIB));
        assert!(!c.may_use(false, 32 * MIB, 32 * MIB - 512));
        assert!(c.may_use(false, 52 * MIB - 512, 32 * MIB));
        assert!(!c.may_use(false, 52 * MIB, 32 * MIB));
        assert!(c.may_use(true, 2 * MIB, 512));
    }
}
