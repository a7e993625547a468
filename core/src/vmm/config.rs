//! The VMM pool's tunables.

use super::MIB;

/// Tunables of a [`VmmPool`](super::VmmPool). Every size is in bytes; [`VmmPool::new`](super::VmmPool::new) applies
/// [`VmmConfig::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmmConfig {
    /// Requests whose rounded size is at most this go to the small ranges (1 MiB).
    pub small_max: u64,
    /// Page size of the small ranges (2 MiB).
    pub small_page: u64,
    /// Page size of the large ranges (2 MiB).
    pub large_page: u64,
    /// Size of each virtual range reserved (64 GiB; a larger request gets a
    /// range of its own size).
    pub va_chunk: u64,
    /// Take an idle page from elsewhere before creating one (on). Off, every
    /// page stays where it was first mapped until it is given back.
    pub remap_idle: bool,
    /// With `remap_idle`, when a new page would set a new peak or cannot be
    /// had: take a page that queued work may still touch, leaving a ghost
    /// mapping where it was until that work finished (on).
    pub alias_cooling: bool,
    /// A small request that would put a page of the small ranges into use
    /// goes where it fits in pages of the large ranges in use already, when
    /// there is such a place (on).
    pub fill_scraps: bool,
    /// Idle page bytes always kept after a free (64 MiB; `u64::MAX`: only
    /// `empty_cache` gives pages back).
    pub keep_free: u64,
    /// Idle pages up to the high-water mark of in-use bytes over the last
    /// one to two windows of this length are kept too (5 s; 0: only `keep_free`).
    pub window_ns: u64,
    /// Cap on physical bytes; a page that would pass it is treated as a
    /// device out-of-memory (`u64::MAX`: no cap).
    pub limit: u64,
    /// A request that needs new pages waits for pending frees
    /// ([`Timeline::wait_for`](crate::pool::Timeline::wait_for)) instead, while they cover it and are at
    /// least 1/`wait_share` of the reserved bytes (4; at least 1).
    pub wait_share: u64,
    /// Pages a free leaves idle go back at once (once the GPU finished with
    /// them), unless the freed block's size is one the program allocated
    /// again within this many ns of its pages going back: then they stay,
    /// under the high-water rule (the segment pool's `GiveBack::Auto`, by
    /// block size). `None`: every idle page stays under the high-water rule.
    pub cycle_regret_ns: Option<u64>,
}

impl Default for VmmConfig {
    fn default() -> Self {
        VmmConfig {
            small_max: MIB,
            small_page: 2 * MIB,
            large_page: 2 * MIB,
            va_chunk: 64 << 30,
            remap_idle: true,
            alias_cooling: true,
            fill_scraps: true,
            keep_free: 64 * MIB,
            window_ns: 5_000_000_000,
            limit: u64::MAX,
            wait_share: 4,
            cycle_regret_ns: None,
        }
    }
}

impl VmmConfig {
    /// The settings the shim runs `backing=vmm` with: memory freed in bulk
    /// goes back at once, memory the program frees and allocates again
    /// within a second stays (as the segment pool's `give_back=auto`).
    pub fn shim_default() -> VmmConfig {
        VmmConfig {
            cycle_regret_ns: Some(1_000_000_000),
            // As the segment pool in the shim: wait for (or order behind)
            // pending frees unless they are a sliver of what is held.
            wait_share: crate::pool::PoolConfig::shim_default().wait_share,
            ..VmmConfig::default()
        }
    }

    /// A model of PyTorch's `expandable_segments:True` for one stream: the
    /// small pool maps 2 MiB pages and the large pool 20 MiB pages into one
    /// growing range each; a page stays where it was mapped, and pages are
    /// given back only by `empty_cache`.
    pub fn pytorch_expandable() -> VmmConfig {
        VmmConfig {
            large_page: 20 * MIB,
            // PyTorch reserves 1⅛ of the device memory per segment: 90 GiB on 80 GiB.
            va_chunk: 90 << 30,
            remap_idle: false,
            fill_scraps: false,
            keep_free: u64::MAX,
            ..VmmConfig::default()
        }
    }

    /// Returns a copy with page sizes rounded up to multiples of 64 KiB
    /// (between 64 KiB and 1 TiB), `small_max` a multiple of 512 B between
    /// 512 B and the small page, and `va_chunk` a multiple of both page sizes
    /// of at least 1 GiB (at most 2^48).
    pub fn validate(self) -> VmmConfig {
        let page = |p: u64| p.clamp(64 << 10, 1 << 40).next_multiple_of(64 << 10);
        let (small_page, large_page) = (page(self.small_page), page(self.large_page));
        let small_max = self.small_max.clamp(512, small_page).next_multiple_of(512);
        let va_chunk = self.va_chunk.clamp(1 << 30, 1 << 48).next_multiple_of(small_page.max(large_page));
        VmmConfig { small_max, small_page, large_page, va_chunk, wait_share: self.wait_share.max(1), ..self }
    }

    pub(super) fn page(&self, small: bool) -> u64 {
        if small {
            self.small_page
        } else {
            self.large_page
        }
    }
}
