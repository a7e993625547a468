//! Rounding of requests and the size classes of the free index.
//!
//! Every block size is a multiple of [`MIN_BLOCK`] (512 B), so sizes are kept
//! in "units" of 512 B inside the free index. Classes follow TLSF: units below
//! 16 get one exact class each; above that, every power of two is cut into 16
//! equal sub-ranges. A class therefore never spans more than 1/16 of its lower
//! bound, so the few blocks one class holds are close in size.

/// Granularity of every block: requests are rounded up to a multiple of this.
pub const MIN_BLOCK: u64 = 512;
/// Granularity of every segment obtained from the backend.
pub const SEGMENT_ALIGN: u64 = 2 << 20;

const UNIT_SHIFT: u32 = MIN_BLOCK.trailing_zeros();
/// Sub-classes per power of two (log2).
const SL_BITS: u32 = 4;
const SL_COUNT: usize = 1 << SL_BITS;
/// Units 0..LINEAR get an exact class each (unit 0 is never used).
const LINEAR: u64 = SL_COUNT as u64;
/// Largest representable size in units is < 2^(64 - UNIT_SHIFT).
const MAX_FL: u32 = 64 - UNIT_SHIFT - 1;
/// Total number of classes.
pub(crate) const NUM_CLASSES: usize = SL_COUNT + (MAX_FL - SL_BITS + 1) as usize * SL_COUNT;

/// Rounds a request to the block granularity. A request of 0 is treated as 1.
/// `None` when the rounded size does not fit in a `u64`.
#[inline]
pub fn round_size(requested: u64) -> Option<u64> {
    requested.max(1).checked_next_multiple_of(MIN_BLOCK)
}

/// Rounds `size` up to a multiple of `align` (a power of two), `None` on overflow.
#[inline]
pub fn round_up(size: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    size.checked_next_multiple_of(align)
}

/// Class of a block size (a non-zero multiple of [`MIN_BLOCK`]).
#[inline]
pub(crate) fn class_of(size: u64) -> usize {
    debug_assert!(size >= MIN_BLOCK && size.is_multiple_of(MIN_BLOCK));
    let units = size >> UNIT_SHIFT;
    if units < LINEAR {
        units as usize
    } else {
        let fl = 63 - units.leading_zeros(); // >= SL_BITS
        let sl = (units >> (fl - SL_BITS)) as usize & (SL_COUNT - 1);
        SL_COUNT + (fl - SL_BITS) as usize * SL_COUNT + sl
    }
}

/// Smallest block size that falls into `class` (inverse of [`class_of`]).
#[cfg(test)]
pub(crate) fn class_floor(class: usize) -> u64 {
    let units = if class < SL_COUNT {
        class as u64
    } else {
        let c = class - SL_COUNT;
        let fl = (c / SL_COUNT) as u32 + SL_BITS;
        let sl = (c % SL_COUNT) as u64;
        (1u64 << fl) | (sl << (fl - SL_BITS))
    };
    units << UNIT_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        assert_eq!(round_size(0), Some(512));
        assert_eq!(round_size(1), Some(512));
        assert_eq!(round_size(512), Some(512));
        assert_eq!(round_size(513), Some(1024));
        assert_eq!(round_size((1 << 20) + 1), Some((1 << 20) + 512));
        assert_eq!(round_size(u64::MAX - 511), Some(u64::MAX - 511));
        assert_eq!(round_size(u64::MAX - 510), None);
        assert_eq!(round_size(u64::MAX), None);
        assert_eq!(round_up(1, SEGMENT_ALIGN), Some(SEGMENT_ALIGN));
        assert_eq!(round_up(SEGMENT_ALIGN, SEGMENT_ALIGN), Some(SEGMENT_ALIGN));
        assert_eq!(round_up(u64::MAX, SEGMENT_ALIGN), None);
    }

    #[test]
    fn classes_are_monotone_and_contiguous() {
        // Exact classes below 16 units.
        for u in 1..16u64 {
            assert_eq!(class_of(u * 512), u as usize);
        }
        // Monotone over a dense prefix and at every power-of-two boundary.
        let mut prev = class_of(512);
        for u in 2..(1u64 << 16) {
            let c = class_of(u * 512);
            assert!(c == prev || c == prev + 1, "units {u}");
            prev = c;
        }
        for fl in 4..=MAX_FL {
            let u = 1u64 << fl;
            assert_eq!(class_of((u - 1) * 512) + 1, class_of(u * 512));
        }
        let max = (u64::MAX >> UNIT_SHIFT) << UNIT_SHIFT;
        assert_eq!(class_of(max), NUM_CLASSES - 1);
    }

    #[test]
    fn class_floor_inverts() {
        for c in 1..NUM_CLASSES {
            let lo = class_floor(c);
            assert_eq!(class_of(lo), c);
            if lo > 512 {
                assert_eq!(class_of(lo - 512), c - 1);
            }
        }
    }
}
