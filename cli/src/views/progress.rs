//! A progress bar on stderr for work that takes more than a second, as
//! `indicatif` draws it. Nothing is drawn when stderr is not a terminal (a
//! pipe, a file, CI) or when the work ends within the first second.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Work shorter than this never shows a bar.
const DELAY: Duration = Duration::from_secs(1);

pub struct Progress {
    bar: ProgressBar,
    start: Instant,
    /// The bar may be drawn (stderr is a terminal) / is drawn.
    drawable: bool,
    shown: bool,
}

impl Progress {
    /// A bar for `total` units of `what` (`reading`, `exporting`, ...), hidden for now.
    pub fn new(what: &str, total: u64) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total.max(1)), ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template("cupool: {msg:<20} [{wide_bar}] {percent:>3}% {eta:>4}") {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(what.to_string());
        Progress { bar, start: Instant::now(), drawable: std::io::stderr().is_terminal(), shown: false }
    }

    /// A new stage of the same work: `total` units of `what`. The second
    /// before a bar shows counts from the start of the work, not of the stage.
    pub fn stage(&mut self, what: &str, total: u64) {
        self.bar.set_length(total.max(1));
        self.bar.set_position(0);
        self.bar.reset_eta();
        self.bar.set_message(what.to_string());
        self.set(0);
    }

    /// `done` units of the total are done.
    pub fn set(&mut self, done: u64) {
        self.bar.set_position(done);
        if self.drawable && !self.shown && self.start.elapsed() >= DELAY {
            self.shown = true;
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }

    /// Removes the bar (if it was drawn).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
