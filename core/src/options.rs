//! `CUPOOL_OPTIONS=key=value:key=value`, parsed in LeakSanitizer style.
//!
//! Entries are separated by `:`. A value runs to the next `:`, with the
//! whitespace around it dropped, unless it starts with a quote: `'...'` holds
//! any text but `'` as it is, and `"..."` holds any text with `\"` for `"` and
//! `\\` for `\`. So `log_dir='/tmp/a:b'` names the directory `/tmp/a:b`.
//! [`format`] writes options back in this form, and `parse(&format(&o))`
//! gives `o` again (a property test checks it).
//!
//! [`parse`] never fails: a bad entry produces one human-readable complaint
//! and the option keeps its default, because a typo in an environment variable
//! must never take down the program being observed. The CLI uses
//! [`parse_into`] and [`set`], which say what is wrong, to refuse bad input
//! before it starts anything.

use serde::{Deserialize, Serialize};

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

/// When the pool gives completely free segments back to the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GiveBack {
    /// At once, but a segment size the program grows again within a second
    /// of one going back stays cached from then on.
    Auto,
    /// At once, always (as `cudaFree` does).
    Always,
    /// Never (only before growing past the peak and on out-of-memory), as PyTorch's cache.
    Never,
}

impl GiveBack {
    pub fn as_str(self) -> &'static str {
        match self {
            GiveBack::Auto => "auto",
            GiveBack::Always => "always",
            GiveBack::Never => "never",
        }
    }
}

/// Which threads keep small blocks in a magazine of their own (pool mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Magazines {
    /// A thread that keeps finding the pool's lock taken by another, or
    /// whose small frees of the same few sizes keep waiting for fences.
    #[default]
    Auto,
    /// Every thread, from its first pooled allocation.
    Always,
    Never,
}

impl Magazines {
    pub fn as_str(self) -> &'static str {
        match self {
            Magazines::Auto => "auto",
            Magazines::Always => "always",
            Magazines::Never => "never",
        }
    }
}

/// What pooled blocks are carved from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backing {
    /// Fixed segments from `cuMemAlloc`.
    #[default]
    Segments,
    /// Physical pages (`cuMemCreate`) mapped into reserved virtual ranges;
    /// segments where the device has no VMM support.
    Vmm,
}

impl Backing {
    /// What a log written before the option existed was pooled on.
    fn before_the_option() -> Backing {
        Backing::Segments
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Backing::Segments => "segments",
            Backing::Vmm => "vmm",
        }
    }
}

/// How an option's text is read (and what a bad one is told it should be)
/// and written back.
#[derive(Clone, Copy)]
enum Rule {
    /// One of an enum's words (its `as_str`); `expected` names them.
    Word(&'static str),
    /// `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`; written `1` or `0`.
    Flag,
    /// Any text, taken as it is.
    Text,
    /// Any text but the empty one.
    NonEmpty(&'static str),
    /// A whole number in `lo..=hi`.
    Range(u64, u64, &'static str),
    /// Bytes ([`parse_bytes`]), written back as a plain number.
    Bytes(&'static str),
    /// Bytes, written back in the largest unit that holds them exactly (`1g`).
    ShortBytes(&'static str),
    /// Kinds of leak ([`parse_fail_on`]).
    LeakKinds(&'static str),
}

impl Rule {
    /// What a bad value is told the option takes.
    fn expected(self) -> &'static str {
        match self {
            Rule::Flag => "1 or 0",
            Rule::Text => "any text",
            Rule::Word(e) | Rule::NonEmpty(e) | Rule::Range(_, _, e) | Rule::Bytes(e) | Rule::ShortBytes(e) => e,
            Rule::LeakKinds(e) => e,
        }
    }
}

/// A type an option holds, read from its `CUPOOL_OPTIONS` text and written
/// back to it by the option's [`Rule`]. A rule that does not fit the type
/// reads nothing, which the declared default shows at once
/// (`Options::default` reads every default).
trait OptionValue: Sized {
    fn read(text: &str, rule: Rule) -> Option<Self>;
    fn write(&self, rule: Rule) -> String;
}

impl OptionValue for bool {
    fn read(text: &str, rule: Rule) -> Option<bool> {
        match rule {
            Rule::Flag => parse_bool(text),
            _ => None,
        }
    }
    fn write(&self, _: Rule) -> String {
        u8::from(*self).to_string()
    }
}

impl OptionValue for String {
    fn read(text: &str, rule: Rule) -> Option<String> {
        match rule {
            Rule::Text => Some(text.to_string()),
            Rule::NonEmpty(_) => (!text.is_empty()).then(|| text.to_string()),
            Rule::LeakKinds(_) => parse_fail_on(text),
            _ => None,
        }
    }
    fn write(&self, _: Rule) -> String {
        self.clone()
    }
}

impl OptionValue for u64 {
    fn read(text: &str, rule: Rule) -> Option<u64> {
        match rule {
            Rule::Range(lo, hi, _) => text.parse::<u64>().ok().filter(|n| (lo..=hi).contains(n)),
            Rule::Bytes(_) | Rule::ShortBytes(_) => parse_bytes(text),
            _ => None,
        }
    }
    fn write(&self, rule: Rule) -> String {
        match rule {
            Rule::ShortBytes(_) => bytes_text(*self),
            _ => self.to_string(),
        }
    }
}

/// Smaller integers: read as a `u64` in their option's range.
macro_rules! narrow_option_value {
    ($($t:ty),*) => {$(
        impl OptionValue for $t {
            fn read(text: &str, rule: Rule) -> Option<$t> {
                match rule {
                    Rule::Range(..) => <$t>::try_from(u64::read(text, rule)?).ok(),
                    _ => None,
                }
            }
            fn write(&self, _: Rule) -> String {
                self.to_string()
            }
        }
    )*};
}
narrow_option_value!(u8, u32);

/// Enums: one word per variant, the variant's `as_str`.
macro_rules! word_option_value {
    ($($t:ident: [$($variant:ident),*];)*) => {$(
        impl OptionValue for $t {
            fn read(text: &str, rule: Rule) -> Option<$t> {
                match rule {
                    Rule::Word(_) => [$($t::$variant),*].into_iter().find(|v| v.as_str() == text),
                    _ => None,
                }
            }
            fn write(&self, _: Rule) -> String {
                self.as_str().to_string()
            }
        }
    )*};
}
word_option_value! {
    Mode: [Passthrough, Pool];
    GiveBack: [Auto, Always, Never];
    Backing: [Segments, Vmm];
    Magazines: [Auto, Always, Never];
}

/// Declares every option once: its field (and key, the same name), type,
/// default as `CUPOOL_OPTIONS` writes it, rule, and one line of help. From
/// that come the `Options` struct (the help is each field's documentation),
/// its `Default`, [`OPTION_HELP`], [`value_of`] and [`set`]; the README's
/// table and the Python package's defaults are checked against it
/// (`tests/docs.rs`).
macro_rules! options {
    ($(
        $(#[$attr:meta])*
        $field:ident: $ty:ty = $default:literal, $rule:expr,
            $help:expr;
    )*) => {
        /// The options in force. Also the `options` record of the log header: an
        /// option missing from an older log reads as its default, and a key this
        /// build does not know (an option since removed) is ignored.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct Options {
            $(
                #[doc = $help]
                $(#[$attr])*
                pub $field: $ty,
            )*
        }

        impl Default for Options {
            fn default() -> Self {
                Options {
                    $($field: match OptionValue::read($default, $rule) {
                        Some(v) => v,
                        None => panic!(concat!("the declared default of `", stringify!($field), "` does not read")),
                    },)*
                }
            }
        }

        /// One line per option: (key, default, help), as shown by `cupool run
        /// --help`, in the order declared.
        pub const OPTION_HELP: &[(&str, &str, &str)] = &[$((stringify!($field), $default, $help)),*];

        /// The value of option `key` in `opts`, written as `CUPOOL_OPTIONS` takes it
        /// (without quotes); `None` for a key no option has.
        pub fn value_of(opts: &Options, key: &str) -> Option<String> {
            match key {
                $(stringify!($field) => Some(opts.$field.write($rule)),)*
                _ => None,
            }
        }

        /// Sets option `key` to `value` (taken as it is: no quotes, no trimming).
        /// On error `opts` is unchanged.
        pub fn set(opts: &mut Options, key: &str, value: &str) -> Result<(), OptionError> {
            let bad = |rule: Rule| OptionError::BadValue { key: key.into(), value: value.into(), expected: rule.expected() };
            match key {
                $(stringify!($field) => opts.$field = OptionValue::read(value, $rule).ok_or_else(|| bad($rule))?,)*
                _ => return Err(OptionError::Unknown { key: key.to_string() }),
            }
            Ok(())
        }
    };
}

options! {
    mode: Mode = "pool", Rule::Word("pool or passthrough"),
        "pool | passthrough: serve device allocations from cupool's pool, or only observe";
    log_dir: String = ".", Rule::NonEmpty("a directory"),
        "directory for cupool.<pid>.json (created if missing)";
    log: bool = "1", Rule::Flag,
        "1 | 0: write the JSON log at all";
    trace: bool = "1", Rule::Flag,
        "1 | 0: stream every alloc/free into the log's timeline (failures, checkpoints and leaks are kept either way)";
    run_id: String = "", Rule::Text,
        "tag written into every log of one run (set by the cupool CLI)";
    flush_ms: u64 = "100", Rule::Range(10, 10_000, "a number of milliseconds, 10..10000"),
        "milliseconds between background flushes of the event stream (10..10000)";
    limit: u64 = "0", Rule::Bytes("bytes such as 16g, 512m or 4096; 0 = none"),
        "per-device byte cap, e.g. 16g or 512m; 0 = the device's own size";
    verbosity: u8 = "1", Rule::Range(0, 2, "0, 1 or 2"),
        "0 silent, 1 errors, 2 also notes from the shim on stderr";
    fence_us: u64 = "100", Rule::Range(10, 100_000, "a number of microseconds, 10..100000"),
        "pool mode, once streams exist: microseconds between the fences that make freed blocks reusable, and \
         between the GPU-side barriers that let them be reused where they were freed (10..100000)";
    give_back: GiveBack = "auto", Rule::Word("auto, always or never"),
        "pool mode: auto | always | never: when segments that frees leave empty go back to the device (auto: at \
         once, but a size the program regrows within a second of one going back stays cached)";
    /// A log from before the option was pooled on segments.
    #[serde(default = "Backing::before_the_option")]
    backing: Backing = "vmm", Rule::Word("segments or vmm"),
        "pool mode: vmm | segments: carve blocks from physical pages mapped into reserved address ranges \
         (cuMemCreate/cuMemMap; segments where the device has no VMM or a memory tool is attached), or from fixed \
         cuMemAlloc segments";
    /// 0 in a log from before the option: those builds pooled every request.
    #[serde(default)]
    direct_min: u64 = "1g", Rule::ShortBytes("bytes such as 1g, 256m or 4096; 0 = none"),
        "pool mode, backing=vmm: requests of at least this many bytes go to CUDA as they are (cudaMalloc's own \
         memory, freed by cudaFree), e.g. 1g or 256m; 0 = none do";
    magazines: Magazines = "auto", Rule::Word("auto, always or never"),
        "pool mode: auto | always | never: threads that keep small blocks (up to 64 KiB) in a magazine of their own, \
         taken from the pool in batches, their own frees taken back once no queued GPU work can touch them (auto: a \
         thread that keeps finding the pool's lock taken by another, or whose small frees of the same few sizes keep \
         waiting for fences)";
    nvtx: bool = "1", Rule::Flag,
        "1 | 0: take the program's NVTX ranges as phases (cupool run attaches the shim as the NVTX tool)";
    stack_depth: u32 = "32", Rule::Range(0, 128, "a number of frames, 0..128"),
        "native frames recorded per allocation site (0..128); 0 = no native stacks";
    python_depth: u32 = "16", Rule::Range(0, 64, "a number of frames, 0..64"),
        "Python frames recorded per allocation site (0..64); 0 = no Python frames";
    // The options of `cupool check` and `cupool merge`. The shim reads and
    // ignores them; they are not its options, so the log does not record them.
    #[serde(skip)]
    exitcode: u8 = "23", Rule::Range(0, 255, "an exit status, 0..255"),
        "cupool check/merge: exit status when leaks fail the job (0..255)";
    #[serde(skip)]
    max_leak_bytes: u64 = "0", Rule::Bytes("bytes such as 0, 4096 or 1m"),
        "cupool check/merge: leaked bytes tolerated before the job fails, e.g. 1m";
    /// Written by [`set`] in one form: `exit,growth,test` in that order, a
    /// subset of it, or `none`.
    #[serde(skip)]
    fail_on: String = "exit,growth,test", Rule::LeakKinds("exit, growth, test separated by commas, or none"),
        "cupool check/merge: the kinds of leak that fail the job, comma-separated, or none";
    #[serde(skip)]
    max_peak_bytes: u64 = "0", Rule::Bytes("bytes such as 0, 512m or 16g"),
        "cupool check/merge: the most device memory any process may peak at (the framework's objects where it \
         recorded them: PyTorch's tensors, JAX's arrays), e.g. 16g; 0 = no such budget";
    #[serde(skip)]
    baseline_growth: u32 = "10", Rule::Range(0, 1000, "a percentage, 0..1000"),
        "cupool check/merge with --baseline: how many percent above the baseline's a test's or process's peak may \
         be (0..1000)";
    #[serde(skip)]
    baseline_slack: u64 = "2m", Rule::ShortBytes("bytes such as 2m or 0"),
        "cupool check/merge with --baseline: bytes above the baseline's a peak may always be, however small it \
         was, e.g. 2m";
    #[serde(skip)]
    growth_phases: u32 = "4", Rule::Range(3, 1000, "a number of phases, 3..1000"),
        "cupool check/merge: fewest repeated phases a growth leak needs (3..1000)";
    #[serde(skip)]
    torch_history: u64 = "200000", Rule::Range(0, 10_000_000, "a number of events, 0..10000000"),
        "cupool check: events of PyTorch's allocation history each Python process keeps per device, for growth \
         inside its cache (0..10000000); 0 = not recorded";
    #[serde(skip)]
    jax_history_ms: u64 = "100", Rule::Range(0, 60_000, "a number of milliseconds, 0..60000"),
        "cupool check: milliseconds between looks at JAX's live arrays in each Python process that uses JAX, for \
         growth inside its arena by array (0..60000); 0 = not recorded";
    #[serde(skip)]
    jax_history: u64 = "200000", Rule::Range(0, 10_000_000, "a number of events, 0..10000000"),
        "cupool check: events of JAX's record (arrays seen to appear and go) each Python process keeps per \
         device, for growth inside its arena by array (0..10000000); 0 = not recorded";
    #[serde(skip)]
    cupy_history: u64 = "200000", Rule::Range(0, 10_000_000, "a number of events, 0..10000000"),
        "cupool check: events of CuPy's arrays (made and let go, with their Python lines) each Python process \
         keeps per device, for growth inside its memory pool by array (0..10000000); 0 = not recorded";
}

/// The kinds of leak `fail_on` can name, in the order it writes them.
pub const LEAK_KINDS: [&str; 3] = ["exit", "growth", "test"];

/// `fail_on`'s value in its one written form: the kinds in [`LEAK_KINDS`]
/// order, or `none`; `None` when a word is not a kind.
pub fn parse_fail_on(value: &str) -> Option<String> {
    let words: Vec<&str> = value.split(',').map(str::trim).filter(|w| !w.is_empty()).collect();
    if words == ["none"] {
        return Some("none".into());
    }
    if words.is_empty() || words.iter().any(|w| !LEAK_KINDS.contains(w)) {
        return None;
    }
    let kinds: Vec<&str> = LEAK_KINDS.iter().copied().filter(|k| words.contains(k)).collect();
    Some(kinds.join(","))
}

/// Why one option or one entry of `CUPOOL_OPTIONS` was not taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OptionError {
    /// A key no option has.
    Unknown { key: String },
    /// A known key with a value it does not accept (`expected` says what it does).
    BadValue { key: String, value: String, expected: &'static str },
    /// An entry that cannot be read as `key=value` (`why` says what is wrong).
    Syntax { entry: String, why: &'static str },
}

/// User text in a complaint, control characters escaped: a complaint stays
/// one line whatever the value held (a quoted value may hold a newline).
struct Shown<'a>(&'a str);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for OptionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OptionError::Unknown { key } => {
                write!(f, "unknown option '{}' (options: ", Shown(key))?;
                for (i, (k, _, _)) in OPTION_HELP.iter().enumerate() {
                    write!(f, "{}{k}", if i == 0 { "" } else { ", " })?;
                }
                write!(f, ")")
            }
            OptionError::BadValue { key, value, expected } if value.is_empty() => {
                write!(f, "no value for '{}' (expected {expected})", Shown(key))
            }
            OptionError::BadValue { key, value, expected } => {
                write!(f, "bad value '{}' for '{}' (expected {expected})", Shown(value), Shown(key))
            }
            OptionError::Syntax { entry, why } => write!(f, "'{}': {why}", Shown(entry)),
        }
    }
}

impl std::error::Error for OptionError {}

/// Parses `spec`; every complaint is appended to the returned vector as one
/// line, and the option it concerns keeps its value (the default, unless an
/// earlier entry set it).
pub fn parse(spec: &str) -> (Options, Vec<String>) {
    let mut opts = Options::default();
    let lines = parse_into(&mut opts, spec)
        .into_iter()
        .map(|e| match &e {
            OptionError::BadValue { key, .. } => {
                let kept = value_of(&opts, key).unwrap_or_default();
                format!("{e}; using {}", if kept.is_empty() { "''" } else { &kept })
            }
            _ => format!("ignoring {e}"),
        })
        .collect();
    (opts, lines)
}

/// Applies every entry of `spec` to `opts`, in order; returns what was not
/// taken (the options concerned keep their values).
pub fn parse_into(opts: &mut Options, spec: &str) -> Vec<OptionError> {
    let mut errors = Vec::new();
    for entry in entries(spec) {
        if let Err(e) = entry.and_then(|(key, value)| set(opts, &key, &value)) {
            errors.push(e);
        }
    }
    errors
}

/// The entries of `spec` in order: `(key, value)` with the value's quotes
/// undone, or why the entry cannot be read. See the module's documentation.
pub fn entries(spec: &str) -> Vec<Result<(String, String), OptionError>> {
    let mut out = Vec::new();
    let mut rest = spec;
    loop {
        rest = rest.trim_start_matches(|c: char| c == ':' || c.is_whitespace());
        if rest.is_empty() {
            break;
        }
        let stop = rest.find([':', '=']).unwrap_or(rest.len());
        if !rest[stop..].starts_with('=') {
            let entry = rest[..stop].trim().to_string();
            out.push(Err(OptionError::Syntax { entry, why: "expected key=value" }));
            rest = &rest[stop..];
            continue;
        }
        let key = rest[..stop].trim().to_string();
        let after = rest[stop + 1..].trim_start();
        let (value, tail) = match after.chars().next() {
            Some(q @ ('\'' | '"')) => match unquote(after, q) {
                Some(v) => v,
                None => {
                    let entry = format!("{key}={after}");
                    out.push(Err(OptionError::Syntax { entry, why: "the quote is never closed" }));
                    break;
                }
            },
            _ => {
                let end = after.find(':').unwrap_or(after.len());
                (after[..end].trim().to_string(), &after[end..])
            }
        };
        let tail = tail.trim_start();
        if !tail.is_empty() && !tail.starts_with(':') {
            let end = tail.find(':').unwrap_or(tail.len());
            let entry = format!("{key}={}", &after[..after.len() - tail.len() + end]);
            out.push(Err(OptionError::Syntax { entry, why: "text after the closing quote" }));
            rest = &tail[end..];
            continue;
        }
        out.push(Ok((key, value)));
        rest = tail;
    }
    out
}

/// `s` starts with the quote `q`: the text inside, and what follows the closing quote.
fn unquote(s: &str, q: char) -> Option<(String, &str)> {
    let body = &s[1..];
    let mut value = String::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        if c == q {
            return Some((value, &body[i + 1..]));
        }
        if c == '\\' && q == '"' {
            value.push(chars.next()?.1);
        } else {
            value.push(c);
        }
    }
    None
}

/// `value` as it must be written in `CUPOOL_OPTIONS` to read back unchanged:
/// as it is where that is safe, else in `'...'`, else in `"..."` with `\"` and `\\`.
pub fn quote(value: &str) -> String {
    let plain = !value.contains(':') && value.trim() == value && !value.starts_with(['\'', '"']);
    if plain {
        value.to_string()
    } else if !value.contains('\'') {
        format!("'{value}'")
    } else {
        let mut s = String::with_capacity(value.len() + 4);
        s.push('"');
        for c in value.chars() {
            if c == '"' || c == '\\' {
                s.push('\\');
            }
            s.push(c);
        }
        s.push('"');
        s
    }
}

/// `opts` as a `CUPOOL_OPTIONS` value: every option that differs from its
/// default, quoted where needed. `parse(&format(&o)).0 == o`.
pub fn format(opts: &Options) -> String {
    let defaults = Options::default();
    let mut entries = Vec::new();
    for (key, _, _) in OPTION_HELP {
        let value = value_of(opts, key).unwrap_or_default();
        if value_of(&defaults, key).as_deref() != Some(value.as_str()) {
            entries.push(format!("{key}={}", quote(&value)));
        }
    }
    entries.join(":")
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// `4096`, `64k`, `512m`, `16g`, `1t`: binary multiples, case-insensitive,
/// optionally followed by `b` (`16gb`, `4096b`) or `ib` (`512MiB`). Anything
/// else, trailing text included, is not a size.
pub fn parse_bytes(v: &str) -> Option<u64> {
    let lower = v.trim().to_ascii_lowercase();
    let end = lower.find(|c: char| !c.is_ascii_digit()).unwrap_or(lower.len());
    let (digits, suffix) = lower.split_at(end);
    let shift = match suffix {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    if digits.is_empty() {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// `n` bytes in the largest unit that holds it exactly (`1g`, `4097`), as
/// [`parse_bytes`] reads it back.
fn bytes_text(n: u64) -> String {
    for (shift, unit) in [(40, "t"), (30, "g"), (20, "m"), (10, "k")] {
        if n != 0 && n.trailing_zeros() >= shift {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        // A quoted value may hold any character; its complaint is still one line.
        let (o, e) = parse("mode='pool\nturbo':flush_ms=\"5\r\"");
        assert_eq!(o, Options::default());
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].contains(r"'pool\nturbo'") && e[1].contains(r"'5\r'"), "{e:?}");
        assert!(e.iter().all(|l| !l.contains(['\n', '\r'])), "{e:?}");
    }

    #[test]
    fn options_record_round_trips_and_tolerates_old_logs() {
        let (o, _) = parse("mode=pool:limit=1g:fence_us=2000:run_id=r");
        let v = serde_json::to_value(&o).unwrap();
        assert_eq!(v["mode"], "pool");
        assert_eq!(v["fence_us"], 2000);
        assert_eq!(serde_json::from_value::<Options>(v).unwrap(), o);
        // A version-1 log: no fence_us yet, and strict_streams since removed;
        // nor backing and direct_min: those builds pooled every request on segments.
        let old: Options =
            serde_json::from_str(r#"{"mode":"passthrough","flush_ms":50,"strict_streams":true}"#).unwrap();
        let then = Options {
            mode: Mode::Passthrough,
            flush_ms: 50,
            backing: Backing::Segments,
            direct_min: 0,
            ..Options::default()
        };
        assert_eq!(old, then);
    }

    #[test]
    fn byte_suffixes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64k"), Some(64 << 10));
        assert_eq!(parse_bytes("512MiB"), Some(512 << 20));
        assert_eq!(parse_bytes("2G"), Some(2 << 30));
        assert_eq!(parse_bytes("16gb"), Some(16 << 30));
        assert_eq!(parse_bytes("4096b"), Some(4096));
        assert_eq!(parse_bytes("0"), Some(0));
        for bad in ["x", "lots", "1bbbbb", "1ib", "16gg", "16 g", "", "k", "-1", "1.5g", "99999999999t", "4096x"] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn quoted_values_keep_colons_and_equals() {
        let (o, e) = parse("log_dir='/tmp/a:b=c':run_id=\"x\\\"y:z\"  :  mode = pool ");
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(o.log_dir, "/tmp/a:b=c");
        assert_eq!(o.run_id, "x\"y:z");
        assert_eq!(o.mode, Mode::Pool);
        // Unquoted, a value runs to the next colon; an `=` in it is kept.
        let (o, e) = parse("run_id=a=b:log_dir=/x");
        assert!(e.is_empty(), "{e:?}");
        assert_eq!((o.run_id.as_str(), o.log_dir.as_str()), ("a=b", "/x"));
    }

    #[test]
    fn quoting_mistakes_are_reported() {
        let (o, e) = parse("mode=pool:log_dir='/tmp/a");
        assert_eq!(o.mode, Mode::Pool);
        assert_eq!(o.log_dir, ".");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("never closed") && e[0].contains("/tmp/a"), "{e:?}");
        let (o, e) = parse("log_dir='/a'b:mode=pool");
        assert_eq!(o.log_dir, ".");
        assert_eq!(o.mode, Mode::Pool);
        assert!(e.len() == 1 && e[0].contains("after the closing quote"), "{e:?}");
    }

    #[test]
    fn errors_name_the_option_and_what_it_takes() {
        let mut o = Options::default();
        let e = set(&mut o, "limit", "1bbbbb").unwrap_err();
        assert_eq!(
            e.to_string(),
            "bad value '1bbbbb' for 'limit' (expected bytes such as 16g, 512m or 4096; 0 = none)"
        );
        assert!(set(&mut o, "mode", "").unwrap_err().to_string().starts_with("no value for 'mode'"));
        let e = set(&mut o, "bogus", "1").unwrap_err().to_string();
        assert!(e.starts_with("unknown option 'bogus' (options: mode, log_dir,"), "{e}");
        assert_eq!(o, Options::default(), "errors change nothing");
        let errs = parse_into(&mut o, "noequals:flush_ms=5");
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[0], OptionError::Syntax { entry: "noequals".into(), why: "expected key=value" });
    }

    #[test]
    fn fail_on_takes_kinds_in_any_order_and_writes_them_in_one() {
        assert_eq!(parse_fail_on("test, exit").as_deref(), Some("exit,test"));
        assert_eq!(parse_fail_on("growth").as_deref(), Some("growth"));
        assert_eq!(parse_fail_on("none").as_deref(), Some("none"));
        assert_eq!(parse_fail_on("exit,exit,growth,test").as_deref(), Some("exit,growth,test"));
        for bad in ["", ",", "leaks", "exit,none", "exit;growth"] {
            assert_eq!(parse_fail_on(bad), None, "{bad:?}");
        }
        let mut o = Options::default();
        let e = set(&mut o, "fail_on", "exit,oom").unwrap_err().to_string();
        assert!(e.contains("'exit,oom'") && e.contains("exit, growth, test"), "{e}");
        assert_eq!(set(&mut o, "max_leak_bytes", "1m"), Ok(()));
        assert_eq!(o.max_leak_bytes, 1 << 20);
        assert!(set(&mut o, "exitcode", "256").is_err() && set(&mut o, "growth_phases", "2").is_err());
    }

    /// OPTION_HELP, the parser and `value_of` know the same options with the same defaults.
    #[test]
    fn option_help_matches_the_parser() {
        let defaults = Options::default();
        for (key, default, _) in OPTION_HELP {
            assert_eq!(value_of(&defaults, key).as_deref(), Some(*default), "{key}");
            let mut o = Options::default();
            assert_eq!(set(&mut o, key, default), Ok(()), "{key}");
            assert_eq!(o, defaults, "{key}");
        }
        assert_eq!(format(&defaults), "");
    }

    /// Each option's complaint about a bad value, word for word (the CLI
    /// shows them), and where each range ends.
    #[test]
    fn every_option_says_what_it_takes() {
        let expected = [
            ("mode", "pool or passthrough"),
            ("log_dir", "a directory"),
            ("log", "1 or 0"),
            ("trace", "1 or 0"),
            ("flush_ms", "a number of milliseconds, 10..10000"),
            ("limit", "bytes such as 16g, 512m or 4096; 0 = none"),
            ("verbosity", "0, 1 or 2"),
            ("fence_us", "a number of microseconds, 10..100000"),
            ("give_back", "auto, always or never"),
            ("backing", "segments or vmm"),
            ("direct_min", "bytes such as 1g, 256m or 4096; 0 = none"),
            ("magazines", "auto, always or never"),
            ("nvtx", "1 or 0"),
            ("stack_depth", "a number of frames, 0..128"),
            ("python_depth", "a number of frames, 0..64"),
            ("exitcode", "an exit status, 0..255"),
            ("max_leak_bytes", "bytes such as 0, 4096 or 1m"),
            ("fail_on", "exit, growth, test separated by commas, or none"),
            ("max_peak_bytes", "bytes such as 0, 512m or 16g"),
            ("baseline_growth", "a percentage, 0..1000"),
            ("baseline_slack", "bytes such as 2m or 0"),
            ("growth_phases", "a number of phases, 3..1000"),
            ("torch_history", "a number of events, 0..10000000"),
            ("jax_history_ms", "a number of milliseconds, 0..60000"),
            ("jax_history", "a number of events, 0..10000000"),
            ("cupy_history", "a number of events, 0..10000000"),
        ];
        let keys: Vec<&str> = OPTION_HELP.iter().map(|(k, _, _)| *k).filter(|k| *k != "run_id").collect();
        assert_eq!(expected.map(|(k, _)| k), keys[..], "every option but run_id, which takes any text");
        let mut o = Options::default();
        for (key, takes) in expected {
            // `log_dir` takes any text but the empty one.
            let bad = if key == "log_dir" { "" } else { "x" };
            let e = set(&mut o, key, bad).unwrap_err().to_string();
            let want = if bad.is_empty() {
                format!("no value for '{key}' (expected {takes})")
            } else {
                format!("bad value '{bad}' for '{key}' (expected {takes})")
            };
            assert_eq!(e, want);
        }
        assert_eq!(o, Options::default());
        assert_eq!(set(&mut o, "run_id", "any: text"), Ok(()), "run_id takes any text");
        for (key, lo, hi) in [
            ("flush_ms", 10, 10_000),
            ("verbosity", 0, 2),
            ("fence_us", 10, 100_000),
            ("stack_depth", 0, 128),
            ("python_depth", 0, 64),
            ("exitcode", 0, 255),
            ("growth_phases", 3, 1000),
            ("baseline_growth", 0, 1000),
            ("torch_history", 0, 10_000_000),
            ("jax_history_ms", 0, 60_000),
            ("jax_history", 0, 10_000_000),
            ("cupy_history", 0, 10_000_000),
        ] {
            for (n, ok) in
                [(lo, true), (hi, true), (hi + 1, false)].into_iter().chain((lo > 0).then_some((lo - 1, false)))
            {
                assert_eq!(set(&mut o, key, &n.to_string()).is_ok(), ok, "{key}={n}");
                assert_eq!(value_of(&o, key).filter(|_| ok), ok.then(|| n.to_string()), "{key}={n}");
            }
        }
        for (text, on) in [("1", true), ("true", true), ("yes", true), ("on", true), ("0", false), ("off", false)] {
            assert_eq!(set(&mut o, "trace", text), Ok(()));
            assert_eq!(o.trace, on, "{text}");
        }
        assert_eq!((set(&mut o, "limit", "16g"), value_of(&o, "limit").unwrap()), (Ok(()), (16u64 << 30).to_string()));
        assert_eq!((set(&mut o, "direct_min", "256m"), value_of(&o, "direct_min").unwrap()), (Ok(()), "256m".into()));
    }

    fn any_text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[ -~]{0,12}",       // printable ASCII: quotes, colons, backslashes, spaces
            "[:='\"\\ a/]{0,8}", // mostly the characters that matter
            any::<String>(),
        ]
    }

    proptest! {
        #[test]
        fn format_then_parse_gives_the_options_back(
            pool in any::<bool>(),
            log_dir in any_text().prop_filter("a directory is never empty", |s| !s.is_empty()),
            log in any::<bool>(),
            trace in any::<bool>(),
            run_id in any_text(),
            flush_ms in 10u64..=10_000,
            limit in any::<u64>(),
            verbosity in 0u8..=2,
            fence_us in 10u64..=100_000,
            nvtx in any::<bool>(),
            give_back in proptest::sample::select(vec![GiveBack::Auto, GiveBack::Always, GiveBack::Never]),
            backing in proptest::sample::select(vec![Backing::Segments, Backing::Vmm]),
            direct_min in any::<u64>(),
            magazines in proptest::sample::select(vec![Magazines::Auto, Magazines::Always, Magazines::Never]),
            stack_depth in 0u32..=128,
            python_depth in 0u32..=64,
            check in (any::<u8>(), any::<u64>(), proptest::sample::subsequence(LEAK_KINDS.to_vec(), 0..=3), 3u32..=1000),
            budgets in (any::<u64>(), 0u32..=1000, any::<u64>()),
            histories in (0u64..=10_000_000, 0u64..=60_000, 0u64..=10_000_000, 0u64..=10_000_000),
        ) {
            let (torch_history, jax_history_ms, jax_history, cupy_history) = histories;
            let (exitcode, max_leak_bytes, kinds, growth_phases) = check;
            let (max_peak_bytes, baseline_growth, baseline_slack) = budgets;
            let fail_on = if kinds.is_empty() { "none".to_string() } else { kinds.join(",") };
            let o = Options {
                mode: if pool { Mode::Pool } else { Mode::Passthrough },
                log_dir, log, trace, run_id, flush_ms, limit, verbosity, fence_us, give_back, backing, direct_min, magazines, nvtx,
                stack_depth, python_depth, exitcode, max_leak_bytes, fail_on, max_peak_bytes, baseline_growth,
                baseline_slack, growth_phases, torch_history, jax_history_ms, jax_history,
                cupy_history,
            };
            let spec = format(&o);
            let (back, errors) = parse(&spec);
            prop_assert!(errors.is_empty(), "{spec:?}: {errors:?}");
            prop_assert_eq!(back, o, "{:?}", spec);
        }

        #[test]
        fn any_value_survives_quoting(value in any_text()) {
            let spec = format!("run_id={}:mode=pool", quote(&value));
            let got = entries(&spec);
            prop_assert_eq!(got, vec![Ok(("run_id".to_string(), value)), Ok(("mode".to_string(), "pool".to_string()))]);
        }
    }
}
