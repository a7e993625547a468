//! What `cupool check` found: the one model every output (the text report,
//! `--json`, `--sarif`, GitHub annotations) is written from.

use crate::sites::ShownFrame;
use crate::units::human_bytes;
use cupool_core::model::AllocId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The three kinds of leak, each with its own rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LeakKind {
    /// Still allocated when its context was destroyed or the process ended.
    #[default]
    Exit,
    /// A site whose live bytes keep growing across the repeated phases of the run.
    Growth,
    /// Allocated during one test and still live after it.
    Test,
}

impl LeakKind {
    /// Stable rule id (SARIF `ruleId`, JSON `rule`).
    pub fn rule_id(self) -> &'static str {
        match self {
            LeakKind::Exit => "cupool/exit-leak",
            LeakKind::Growth => "cupool/growth-leak",
            LeakKind::Test => "cupool/test-leak",
        }
    }

    /// The word `fail_on` names it by.
    pub fn name(self) -> &'static str {
        match self {
            LeakKind::Exit => "exit",
            LeakKind::Growth => "growth",
            LeakKind::Test => "test",
        }
    }
}

/// The process a finding comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessRef {
    pub pid: u32,
    /// `RANK` of a torchrun / MPI rank, when the process had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// The command line, joined by spaces.
    pub cmdline: String,
}

impl ProcessRef {
    /// The process that wrote `log`.
    pub fn of(log: &cupool_core::log::Log) -> ProcessRef {
        let p = &log.header.process;
        ProcessRef { pid: p.pid, rank: p.rank, cmdline: p.cmdline.join(" ") }
    }
}

/// How a growth leak grew.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Growth {
    /// Bytes the site gained per phase: its gain from the end of the warm-up
    /// to the last phase, over the phases in between.
    pub bytes_per_phase: u64,
    /// How many phases the run had (the growth was measured over them).
    pub phases: u64,
    /// Where the phases came from: `nvtx`, `mark`, `phase` or `repetition` (found without marks).
    pub phases_from: String,
    /// The phase's name, digits shown as `#` (`epoch #`); for `repetition`,
    /// the allocations that begin each period of the loop
    /// (`cudaMalloc (device) of 4096 byte(s)`, `cudaMalloc (device) at one site`).
    pub phase: String,
    /// 1 when one site grew; more when the process's memory grew but no
    /// single site explains it (a pool's segments go to whichever allocation
    /// misses its cache): the frames are those of the site that gained most.
    pub sites: u64,
}

/// What a finding holds, so that the verdict counts each thing once however
/// many findings name it: an allocation of a process's log, an object of a
/// framework's history (PyTorch's tensors, JAX's arrays), an exit leak the timeline does not have (a log written
/// with `trace=0`), or bytes a test measured with a framework's counters,
/// which name no allocation. `process` indexes the processes checked.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Held {
    Allocation {
        process: usize,
        id: AllocId,
    },
    /// An object (a tensor, an array) of the framework history `history` of the process.
    Object {
        process: usize,
        history: usize,
        id: AllocId,
    },
    ExitLeak {
        process: usize,
        index: usize,
    },
    Measured {
        process: usize,
        test: String,
    },
}

/// One thing a finding holds, with its bytes and how many allocations it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub what: Held,
    pub bytes: u64,
    pub allocations: u64,
}

/// Bytes and allocations, each allocation counted once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub bytes: u64,
    pub allocations: u64,
}

impl Totals {
    /// The totals of what `findings` hold, each thing once (a finding that
    /// names nothing it holds counts its own figures).
    pub fn of<'a>(findings: impl IntoIterator<Item = &'a Finding>) -> Totals {
        let mut once: BTreeMap<&Held, &Holding> = BTreeMap::new();
        let mut t = Totals::default();
        for f in findings {
            if f.holdings.is_empty() {
                t.bytes += f.bytes;
                t.allocations += f.count;
            }
            for h in &f.holdings {
                once.entry(&h.what).or_insert(h);
            }
        }
        t.bytes += once.values().map(|h| h.bytes).sum::<u64>();
        t.allocations += once.values().map(|h| h.allocations).sum::<u64>();
        t
    }
}

/// One finding: leaks of one kind from one site (identical frames), in one
/// or more processes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub kind: LeakKind,
    /// Bytes leaked (for growth: bytes live from the site at the end of the last phase).
    pub bytes: u64,
    /// Allocations leaked.
    pub count: u64,
    /// The allocation site, innermost frame first, as people read it
    /// (`sites::collapse`); empty when none was recorded.
    pub frames: Vec<ShownFrame>,
    /// Frames of the site left out of `frames`: cupool's own, the
    /// interpreter's under Python code, the test runner's.
    #[serde(skip_serializing_if = "is_zero")]
    pub hidden_frames: u64,
    /// What was allocated: the API and kind, `cudaMalloc (device)`; for a
    /// site without frames, all that tells it apart.
    pub what: String,
    /// Every process it was found in.
    pub processes: Vec<ProcessRef>,
    /// The test it belongs to (`path::test_name`), for test leaks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth: Option<Growth>,
    /// A growth leak whose memory, held at the last phase, was all freed
    /// later, before the process ended (in every process it was found in):
    /// a list kept for the loop's end, frees deferred over the whole loop.
    /// The loop's memory still grows with its length.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub freed_later: bool,
    /// The suppression pattern that matched it, if one did: a suppressed
    /// finding is reported in a line, not as a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suppressed_by: Option<String>,
    /// What it holds (its `bytes` and `count` are their sum).
    #[serde(skip)]
    pub holdings: Vec<Holding>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Finding {
    /// Adds what `h` holds to the finding's figures.
    pub fn hold(&mut self, h: Holding) {
        self.bytes += h.bytes;
        self.count += h.allocations;
        self.holdings.push(h);
    }

    /// Takes in `other`, a finding of the same site: what it holds (or its
    /// figures, when it names nothing it holds) and its processes.
    pub fn absorb(&mut self, other: Finding) {
        if other.holdings.is_empty() {
            self.bytes += other.bytes;
            self.count += other.count;
        }
        for h in other.holdings {
            self.hold(h);
        }
        for p in other.processes {
            if !self.processes.contains(&p) {
                self.processes.push(p);
            }
        }
    }
}

impl Finding {
    /// A key that stays the same for the same site across runs (SARIF
    /// `partialFingerprints`): the kind and the frames, without addresses.
    pub fn fingerprint(&self) -> String {
        let mut text = String::from(self.kind.rule_id());
        if self.frames.is_empty() {
            text.push('|');
            text.push_str(&self.what);
        }
        for f in &self.frames {
            text.push('|');
            text.push_str(f.function.as_deref().unwrap_or("?"));
            text.push('@');
            text.push_str(f.file.as_deref().unwrap_or(""));
        }
        if let Some(t) = &self.test {
            text.push('|');
            text.push_str(t);
        }
        // FNV-1a: stable across builds and platforms, unlike std's hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        format!("{h:016x}")
    }

    /// The innermost frame that is the user's code: for a test leak, one in
    /// the test's own file where there is one; else the first Python frame
    /// the user wrote, else the first native one (`sites::user_frame`).
    pub fn user_frame(&self) -> Option<&ShownFrame> {
        let test_file = self.test.as_deref().and_then(|t| t.split("::").next()).filter(|p| !p.is_empty());
        crate::sites::user_frame(&self.frames, test_file)
    }
}

/// Everything one check found, and what it needs to decide the exit status.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Findings {
    /// Largest first, unsuppressed before suppressed.
    pub findings: Vec<Finding>,
    /// What fails the job, and whether it does.
    pub verdict: Verdict,
    /// Each suppression pattern that matched, with how many findings and bytes it matched.
    pub suppressions_used: Vec<SuppressionUse>,
    /// What the suppressed findings hold, each allocation once.
    pub suppressed: Totals,
    /// Processes whose logs were read.
    pub processes: Vec<ProcessRef>,
    /// Lines about what could not be checked (a log cut short, a Python version without frames, ...).
    pub notes: Vec<String>,
    /// Each test's and process's peak of device memory.
    pub peaks: Peaks,
    /// The peaks over their budgets: each fails the job.
    pub budgets: Vec<Over>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SuppressionUse {
    pub pattern: String,
    /// `default` (shipped with cupool) or the file it came from.
    pub source: String,
    pub findings: u64,
    /// Allocations and bytes of what it matched (LeakSanitizer's `count` and `bytes`).
    pub allocations: u64,
    pub bytes: u64,
}

/// Whether the leaks fail the job (`exitcode`), by the options `fail_on` and `max_leak_bytes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// The kinds that fail the job; findings of other kinds are reported only.
    pub fail_on: Vec<LeakKind>,
    pub max_leak_bytes: u64,
    /// Bytes and allocations of the failing findings, each allocation once
    /// (a growing site also leaked at exit, a test's leak also live at exit).
    pub leaked_bytes: u64,
    pub leaked_allocations: u64,
    /// `leaked_bytes > max_leak_bytes`, or a peak over its budget.
    pub fails: bool,
}

impl Findings {
    /// The findings that count against the job: not suppressed, and of a kind `fail_on` names.
    pub fn failing(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.suppressed_by.is_none() && self.verdict.fail_on.contains(&f.kind))
    }
}

// Peaks and budgets: computed in `budget`, held by `Findings`.

/// One test's peak.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestPeak {
    pub test: String,
    /// Bytes above what was allocated when the test began, on the device it used most.
    pub bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    #[serde(skip_deserializing)]
    pub process: ProcessRef,
}

/// One process's peak on one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessPeak {
    #[serde(skip_deserializing)]
    pub process: ProcessRef,
    /// The process's command line and rank: what names it across runs.
    pub cmdline: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    pub device: i32,
    pub bytes: u64,
}

/// Every peak of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peaks {
    pub tests: Vec<TestPeak>,
    pub processes: Vec<ProcessPeak>,
}

/// Which budget a peak passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    /// A test's own `cupool_limit_memory`.
    TestLimit,
    /// The job's `max_peak_bytes`.
    MaxPeakBytes,
    /// The baseline's peak, by more than `baseline_growth` percent and `baseline_slack` bytes.
    Baseline,
}

/// A peak over its budget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Over {
    pub budget: Budget,
    /// What peaked: a test's node id, or a process (`pid P (rank R): CMD, device D`).
    pub what: String,
    pub bytes: u64,
    /// The most allowed.
    pub allowed: u64,
    /// The baseline's peak, for `baseline`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<u64>,
}

impl Over {
    /// One sentence.
    pub fn text(&self) -> String {
        let by = match self.budget {
            Budget::TestLimit => format!("over its limit of {}", human_bytes(self.allowed)),
            Budget::MaxPeakBytes => format!("over max_peak_bytes={}", self.allowed),
            Budget::Baseline => format!(
                "{} in the baseline, more than the {} allowed",
                human_bytes(self.baseline.unwrap_or(0)),
                human_bytes(self.allowed)
            ),
        };
        format!("{} peaked at {}, {by}", self.what, human_bytes(self.bytes))
    }
}
