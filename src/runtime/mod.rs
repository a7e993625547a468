//! The leaf every other layer stands on: options, clocks, the per-thread
//! guard, cupool's own diagnostics, facts about the process, and the one
//! "off / starting / on / finished" switch that both the session and the log
//! file use. Nothing here calls CUDA or imports another layer of the shim.

pub mod bias;
pub mod clock;
pub mod diag;
pub mod fds;
pub mod guard;
pub mod options;
pub mod process;
pub mod switch;
pub mod tls;

/// The recording session: on from the first CUDA memory call until the end
/// of the log is written. Turned on and off by `lifecycle`; everyone else
/// only asks whether it is on.
pub static SESSION: switch::Switch = switch::Switch::new();
