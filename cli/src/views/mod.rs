//! Views of logs for people and tools: `cupool report` in the terminal,
//! `cupool report --html` as one page, `cupool export` for Perfetto and
//! PyTorch's memory_viz. Every view is drawn from the core's model of each
//! process (`cupool_core::model`), built in one pass over its timeline.

pub mod export;
pub mod html;
pub mod live;
pub mod load;
pub mod memviz;
pub mod perfetto;
pub mod pickle;
pub mod progress;
pub mod report;
pub mod top;

/// What an export says when it kept fewer points than it saw: `kept` of `seen`.
pub fn downsampled_note(kept: usize, seen: usize) -> String {
    if kept < seen {
        format!(" (downsampled from {seen}, peaks kept)")
    } else {
        String::new()
    }
}

/// At most about `max` points of a step series `(t, value)`, in time order:
/// the points split into `max / 2` runs of equal length, each run kept as its
/// lowest and its highest point (the first ones when several tie), and the
/// last point of the series. So every run's maximum survives, and with it
/// the series' own peak.
pub fn downsample<T: Copy>(points: &[T], max: usize, value: impl Fn(&T) -> u64) -> Vec<T> {
    if points.len() <= max.max(3) {
        return points.to_vec();
    }
    let runs = (max / 2).max(1);
    let per = points.len().div_ceil(runs);
    let mut out = Vec::with_capacity(2 * runs + 1);
    for chunk in points.chunks(per) {
        let (mut lo, mut hi) = (0, 0);
        for (i, p) in chunk.iter().enumerate() {
            if value(p) < value(&chunk[lo]) {
                lo = i;
            }
            if value(p) > value(&chunk[hi]) {
                hi = i;
            }
        }
        out.push(chunk[lo.min(hi)]);
        if lo != hi {
            out.push(chunk[lo.max(hi)]);
        }
    }
    if let Some(&last) = points.last() {
        out.push(last);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downsampling_keeps_every_runs_maximum() {
        // A saw tooth with one spike: 10,000 points down to about 100.
        let mut points: Vec<(u64, u64)> = (0..10_000u64).map(|t| (t, t % 97)).collect();
        points[4321].1 = 1_000_000;
        let kept = downsample(&points, 100, |p| p.1);
        assert!(kept.len() <= 101, "{}", kept.len());
        assert!(kept.windows(2).all(|w| w[0].0 < w[1].0), "time order");
        assert!(kept.contains(&(4321, 1_000_000)), "the peak survives");
        let per = points.len().div_ceil(50);
        for chunk in points.chunks(per) {
            let max = chunk.iter().map(|p| p.1).max().unwrap();
            assert!(kept.iter().any(|k| chunk.contains(k) && k.1 == max), "each run's maximum survives");
        }
        assert_eq!(kept.last(), points.last());
        // Short series are left alone.
        assert_eq!(downsample(&points[..50], 100, |p| p.1), points[..50].to_vec());
    }
}
