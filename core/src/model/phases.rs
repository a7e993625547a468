//! The phases of a run, defined once: where a phase came from (its
//! family, which decides how its edges pair up), the spans the edges make,
//! and the name phases of one kind share (`epoch 12` and `epoch 13` are both
//! `epoch #`).

use crate::log::Api;
use serde::Serialize;
use std::collections::BTreeMap;

/// A phase's index in [`super::Process::spans`].
pub type SpanId = usize;

/// Where a phase came from, which decides how its edges pair up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// `cupool_mark`: one at a time, process-wide.
    Mark,
    /// `cupool_phase_begin`/`_end`: a process-wide stack.
    Phase,
    /// NVTX push/pop: a stack per thread.
    NvtxPush,
    /// NVTX start/end: ranges that may overlap anyhow.
    NvtxRange,
}

impl Family {
    /// The family of a phase edge made by `api` (a name this build does not know is a `Phase`).
    pub fn of(api: Option<Api>) -> Family {
        use Api::*;
        match api {
            Some(CupoolMark) => Family::Mark,
            Some(
                NvtxRangePushA
                | NvtxRangePushW
                | NvtxRangePushEx
                | NvtxRangePop
                | NvtxDomainRangePushEx
                | NvtxDomainRangePop,
            ) => Family::NvtxPush,
            Some(
                NvtxRangeStartA
                | NvtxRangeStartW
                | NvtxRangeStartEx
                | NvtxRangeEnd
                | NvtxDomainRangeStartEx
                | NvtxDomainRangeEnd,
            ) => Family::NvtxRange,
            _ => Family::Phase,
        }
    }

    /// The word reports name the source of a family's phases by: `nvtx`, `mark` or `phase`.
    pub fn source(self) -> &'static str {
        match self {
            Family::Mark => "mark",
            Family::Phase => "phase",
            Family::NvtxPush | Family::NvtxRange => "nvtx",
        }
    }
}

/// A phase's figures on one device, from the lines of its edges.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PhaseDevice {
    pub device: i32,
    /// Bytes allocated and reserved when it began and ended, as the shim
    /// recorded them (`None` for an edge the log does not have).
    pub allocated_begin: Option<u64>,
    pub allocated_end: Option<u64>,
    pub reserved_begin: Option<u64>,
    pub reserved_end: Option<u64>,
    /// The most allocated and reserved while it ran.
    pub peak_allocated: u64,
    pub peak_reserved: u64,
}

impl PhaseDevice {
    /// Bytes allocated at its end less at its beginning.
    pub fn growth(&self) -> Option<i64> {
        Some(self.allocated_end? as i64 - self.allocated_begin? as i64)
    }
}

/// One phase of the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PhaseSpan {
    pub name: String,
    pub family: Family,
    /// The thread that began it (or ended it, for an end without a beginning).
    pub tid: u32,
    /// 0 for a phase that began before the log did (an end without a beginning).
    pub begin_ns: u64,
    /// `None`: still open when the log ends.
    pub end_ns: Option<u64>,
    /// Its edges' changes (`None`: not in the log).
    #[serde(skip)]
    pub begin: Option<usize>,
    #[serde(skip)]
    pub end: Option<usize>,
    /// The innermost phase open when it began.
    #[serde(skip)]
    pub parent: Option<SpanId>,
    pub devices: Vec<PhaseDevice>,
}

impl PhaseSpan {
    pub(super) fn device(&mut self, device: i32) -> &mut PhaseDevice {
        match self.devices.iter().position(|d| d.device == device) {
            Some(i) => &mut self.devices[i],
            None => {
                self.devices.push(PhaseDevice { device, ..Default::default() });
                self.devices.last_mut().expect("just pushed")
            }
        }
    }

    /// Whether `self` pairs with an end of `family` and `name` made on thread `tid`.
    pub(super) fn ends_with(&self, family: Family, name: &str, tid: u32) -> bool {
        self.end.is_none()
            && self.family == family
            && self.name == name
            && (family != Family::NvtxPush || self.tid == tid)
    }
}

/// The name phases of one kind share: digits do not count, so `epoch 12`
/// and `epoch 13` are both `epoch #`.
pub fn group_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_number = false;
    for c in name.chars() {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !in_number {
            out.push('#');
        }
        in_number = c.is_ascii_digit();
    }
    out
}

/// Every phase of one kind on one device: one family, one [`group_name`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PhaseGroup {
    pub name: String,
    pub family: Family,
    pub device: i32,
    pub count: u64,
    /// The highest peak of allocated bytes in any of them, and that one's name.
    pub peak_allocated: u64,
    pub peak_in: String,
    pub peak_reserved: u64,
    /// Allocated bytes at the end less at the beginning, summed over them, and the largest.
    pub growth: i64,
    pub max_growth: i64,
}

/// The phases of `spans` grouped by kind and device, the highest peak first.
pub fn groups(spans: &[PhaseSpan]) -> Vec<PhaseGroup> {
    let mut groups: BTreeMap<(String, Family, i32), PhaseGroup> = BTreeMap::new();
    for span in spans {
        let name = group_name(&span.name);
        for d in &span.devices {
            let g = groups.entry((name.clone(), span.family, d.device)).or_insert_with(|| PhaseGroup {
                name: name.clone(),
                family: span.family,
                device: d.device,
                count: 0,
                peak_allocated: 0,
                peak_in: String::new(),
                peak_reserved: 0,
                growth: 0,
                max_growth: i64::MIN,
            });
            g.count += 1;
            if d.peak_allocated > g.peak_allocated || g.peak_in.is_empty() {
                g.peak_allocated = d.peak_allocated;
                g.peak_in = span.name.clone();
            }
            g.peak_reserved = g.peak_reserved.max(d.peak_reserved);
            let growth = d.growth().unwrap_or(0);
            g.growth += growth;
            g.max_growth = g.max_growth.max(growth);
        }
    }
    let mut out: Vec<PhaseGroup> = groups.into_values().collect();
    out.sort_by_key(|g| (std::cmp::Reverse(g.peak_allocated), g.name.clone(), g.device));
    out
}

/// The phases of one kind (one family, one [`group_name`]) that ended at
/// least `min` times, each as the changes where its instances ended, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repeated {
    pub name: String,
    pub family: Family,
    pub ends: Vec<usize>,
}

/// Whether phases of this name are a compiler's work, not steps of the
/// program. XLA (under JAX, TensorFlow or PyTorch/XLA) marks each compile
/// and its stages with NVTX ranges named `Xla<Stage>:#…#`: `XlaCompile`,
/// `XlaPassPipeline` and `XlaPass` (one per pass and per fusion compiled on
/// its own), `XlaBufferAssignment`, `XlaEmitGpuAsm` and others, on the
/// compiling thread and on the threads it compiles parts of a module on,
/// and `XlaAutotuner…` while it measures: up to hundreds of one name,
/// digits aside. What a compile sets up (a math library's workspace for
/// each stream it tunes on) grows from one compile to the next, and not
/// with the loop. `XlaModule:…`, one per run of a compiled program, is the
/// program's work when it names the program (`program_id=`), but while the
/// autotuner runs its candidates (see [`repeated`]). One without is a
/// module XLA built for itself: the autotuner's candidates, a fusion each,
/// run on the threads it compiles on with no range of the compile around
/// them.
fn compiler_phase(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("Xla") else { return false };
    let stage = rest.split_once(":#");
    if rest.starts_with("Module") {
        return stage.is_some_and(|(stage, attributes)| stage == "Module" && !attributes.contains("program_id="));
    }
    rest.starts_with("Autotuner")
        || stage.is_some_and(|(s, _)| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// Whether phases of this name are operations of a compiled program, not
/// steps of the program: XLA marks each operation it runs, `Thunk:#…#`. A
/// loop compiled into the program (a `while`, a `scan`) repeats them
/// thousands of times inside one run, and what an operation sets up the
/// first time it runs (a conditional's pinned host buffer) grows with the
/// operations reached, not with the program's loop. What runs inside one
/// (a host callback's marks) is the program's. The shim does not write
/// them (two events for every operation run); a log from before it did.
pub fn operation_phase(name: &str) -> bool {
    name.starts_with("Thunk:#")
}

/// For each span, the compiler's phases ([`compiler_phase`]) open when it
/// began, itself included if it is one, found through its parents: a
/// span's parent is the innermost phase open in the process when it began,
/// on any thread, so following parents reaches every phase still open then
/// (and some closed since, left out). Computed in order, each from its
/// parent's (a parent began before its child).
fn compilers_open(spans: &[PhaseSpan]) -> Vec<Vec<SpanId>> {
    let mut open: Vec<Vec<SpanId>> = Vec::with_capacity(spans.len());
    for (id, s) in spans.iter().enumerate() {
        let inherited = s.parent.filter(|&p| p < id).map(|p| open[p].as_slice()).unwrap_or_default();
        let mut mine: Vec<SpanId> =
            inherited.iter().copied().filter(|&c| spans[c].end_ns.is_none_or(|end| end >= s.begin_ns)).collect();
        if compiler_phase(&s.name) {
            mine.push(id);
        }
        open.push(mine);
    }
    open
}

/// The repeated phases of `spans`, but for a compiler's and those inside
/// them on their thread ([`compiler_phase`]) and a compiled program's
/// operations ([`operation_phase`]), and whether `skip` left any phase out (phases
/// that are not repetitions of the program's work, such as the pytest
/// plugin's one per test).
pub fn repeated(spans: &[PhaseSpan], min: usize, skip: &dyn Fn(&str) -> bool) -> (Vec<Repeated>, bool) {
    let mut skipped = false;
    let mut out: Vec<Repeated> = Vec::new();
    // A compiler's phases, and phases inside one on its thread: XLA's
    // autotuner runs each candidate it compiled, an `XlaModule:…` range
    // inside its `XlaAutotunerMeasurement:…`.
    let compilers = compilers_open(spans);
    let in_compiler = |id: SpanId| compilers[id].iter().any(|&c| spans[c].tid == spans[id].tid);
    let program_step = |id: SpanId, s: &PhaseSpan| !in_compiler(id) && !operation_phase(&s.name);
    let mut ended: Vec<&PhaseSpan> =
        spans.iter().enumerate().filter(|&(id, s)| s.end.is_some() && program_step(id, s)).map(|(_, s)| s).collect();
    ended.sort_by_key(|s| s.end);
    for span in ended {
        if skip(&span.name) {
            skipped = true;
            continue;
        }
        let name = group_name(&span.name);
        let end = span.end.expect("filtered");
        match out.iter_mut().find(|r| r.name == name && r.family == span.family) {
            Some(r) => r.ends.push(end),
            None => out.push(Repeated { name, family: span.family, ends: vec![end] }),
        }
    }
    out.retain(|r| r.ends.len() >= min);
    (out, skipped)
}
