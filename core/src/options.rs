//! `CUPOOL_OPTIONS=key=value:key=value`, parsed in LeakSanitizer style.
//!
//! Parsing never fails: a bad entry produces one human-readable complaint and
//! the option keeps its default, because a typo in an environment variable must
//! never take down the program being observed.

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// How device allocations are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every call goes straight to CUDA; cupool only observes.
    Passthrough,
    /// Device allocations are carved from cupool's pool.
    Pool,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Passthrough => "passthrough",
            Mode::Pool => "pool",
        }
    }
}

/// The options in force. Also the `options` record of the log header: an
/// option missing from an older log reads as its default, and a key this
/// build does not know (an option since removed) is ignored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Options {
    pub mode: Mode,
    /// Directory for `cupool.<pid>.json`; created if missing.
    pub log_dir: String,
    /// Write a log file at all.
    pub log: bool,
    /// Stream every alloc/free into the timeline (failures, checkpoints and the
    /// leak report are written either way).
    pub trace: bool,
    /// Opaque tag the CLI uses to find the logs of one run.
    pub run_id: String,
    /// Milliseconds between background flushes of the event stream.
    pub flush_ms: u64,
    /// Per-device cap on the bytes cupool lets a process hold; 0 = none.
    pub limit: u64,
    /// Report problems of the shim itself on stderr (0 = silent, 1 = errors, 2 = chatty).
    pub verbosity: u8,
    /// Pool mode with streams: microseconds between reuse fences.
    pub fence_us: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: Mode::Passthrough,
            log_dir: ".".into(),
            log: true,
            trace: true,
            run_id: String::new(),
            flush_ms: 100,
            limit: 0,
            verbosity: 1,
            fence_us: 500,
        }
    }
}

/// One line per option, as shown by `cupool run --help` and the README.
pub const OPTION_HELP: &[(&str, &str, &str)] = &[
    ("mode", "passthrough", "pool | passthrough: serve device allocations from cupool's pool, or only observe"),
    ("log_dir", ".", "directory for cupool.<pid>.json (created if missing)"),
    ("log", "1", "1 | 0: write the JSON log at all"),
    (
        "trace",
        "1",
        "1 | 0: stream every alloc/free into the log's timeline (failures, checkpoints and leaks are kept either way)",
    ),
    ("run_id", "", "tag written into every log of one run (set by the cupool CLI)"),
    ("flush_ms", "100", "milliseconds between background flushes of the event stream (10..10000)"),
    ("limit", "0", "per-device byte cap, e.g. 16g or 512m; 0 = the device's own size"),
    ("verbosity", "1", "0 silent, 1 errors, 2 also notes from the shim on stderr"),
    (
        "fence_us",
        "500",
        "pool mode, once streams exist: microseconds between the fences that make freed blocks reusable (10..100000)",
    ),
];

/// Parses `spec`; every complaint is appended to the returned vector as one line.
pub fn parse(spec: &str) -> (Options, Vec<String>) {
    let mut opts = Options::default();
    let mut errors = Vec::new();
    for entry in spec.split(':').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((key, value)) = entry.split_once('=') else {
            errors.push(format!("ignoring '{entry}': expected key=value"));
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        let mut bad = |expected: &str, default: &dyn std::fmt::Display| {
            let mut line = String::new();
            let _ = write!(line, "bad value '{value}' for '{key}' (expected {expected}); using {default}");
            errors.push(line);
        };
        match key {
            "mode" => match value {
                "pool" => opts.mode = Mode::Pool,
                "passthrough" => opts.mode = Mode::Passthrough,
                _ => bad("pool|passthrough", &opts.mode.as_str()),
            },
            "log_dir" if !value.is_empty() => opts.log_dir = value.to_string(),
            "log_dir" => bad("a directory", &opts.log_dir),
            "log" => match parse_bool(value) {
                Some(b) => opts.log = b,
                None => bad("0|1", &u8::from(opts.log)),
            },
            "trace" => match parse_bool(value) {
                Some(b) => opts.trace = b,
                None => bad("0|1", &u8::from(opts.trace)),
            },
            "run_id" => opts.run_id = value.to_string(),
            "flush_ms" => match value.parse::<u64>() {
                Ok(ms) if (10..=10_000).contains(&ms) => opts.flush_ms = ms,
                _ => bad("10..10000", &opts.flush_ms),
            },
            "fence_us" => match value.parse::<u64>() {
                Ok(us) if (10..=100_000).contains(&us) => opts.fence_us = us,
                _ => bad("10..100000", &opts.fence_us),
            },
            "limit" => match parse_bytes(value) {
                Some(b) => opts.limit = b,
                None => bad("bytes such as 16g, 512m, 4096", &opts.limit),
            },
            "verbosity" => match value.parse::<u8>() {
                Ok(v) if v <= 2 => opts.verbosity = v,
                _ => bad("0|1|2", &opts.verbosity),
            },
            _ => errors.push(format!("ignoring unknown option '{key}'")),
        }
    }
    (opts, errors)
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// `4096`, `64k`, `512m`, `16g`, `1t` (binary multiples, case-insensitive, optional `b`/`ib`).
pub fn parse_bytes(v: &str) -> Option<u64> {
    let lower = v.to_ascii_lowercase();
    let s = lower.trim_end_matches('b').trim_end_matches('i');
    let (digits, shift) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 10),
        'm' => (&s[..s.len() - 1], 20),
        'g' => (&s[..s.len() - 1], 30),
        't' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    let n: u64 = digits.trim().parse().ok()?;
    n.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_spec_gives_defaults() {
        let (o, e) = parse("");
        assert_eq!(o, Options::default());
        assert!(e.is_empty());
    }

    #[test]
    fn all_keys_parse() {
        let (o, e) = parse(
            "mode=pool:log_dir=/tmp/x:log=0:trace=off:run_id=abc:flush_ms=50:limit=16g:verbosity=2:fence_us=2000",
        );
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(o.mode, Mode::Pool);
        assert_eq!(o.log_dir, "/tmp/x");
        assert!(!o.log && !o.trace);
        assert_eq!(o.run_id, "abc");
        assert_eq!(o.flush_ms, 50);
        assert_eq!(o.limit, 16 << 30);
        assert_eq!(o.verbosity, 2);
        assert_eq!(o.fence_us, 2000);
    }

    #[test]
    fn bad_values_keep_defaults_with_one_line_each() {
        let (o, e) = parse("mode=turbo:flush_ms=1:limit=lots:bogus=1:noequals");
        assert_eq!(o, Options::default());
        assert_eq!(e.len(), 5, "{e:?}");
        assert!(e[0].contains("'turbo'") && e[0].contains("mode"));
        assert!(e.iter().all(|l| !l.contains('\n')));
    }

    #[test]
    fn options_record_round_trips_and_tolerates_old_logs() {
        let (o, _) = parse("mode=pool:limit=1g:fence_us=2000:run_id=r");
        let v = serde_json::to_value(&o).unwrap();
        assert_eq!(v["mode"], "pool");
        assert_eq!(v["fence_us"], 2000);
        assert_eq!(serde_json::from_value::<Options>(v).unwrap(), o);
        // A version-1 log: no fence_us yet, and strict_streams since removed.
        let old: Options =
            serde_json::from_str(r#"{"mode":"passthrough","flush_ms":50,"strict_streams":true}"#).unwrap();
        assert_eq!(old, Options { flush_ms: 50, ..Options::default() });
    }

    #[test]
    fn byte_suffixes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64k"), Some(64 << 10));
        assert_eq!(parse_bytes("512MiB"), Some(512 << 20));
        assert_eq!(parse_bytes("2G"), Some(2 << 30));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes("99999999999t"), None);
    }
}
