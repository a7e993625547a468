//! The records of a cupool log, defined once: the shim writes them, the CLI,
//! replay and the tests read them. `docs/log-schema.md` documents every field
//! (a test checks that the two agree).
//!
//! Pointers, handles and streams are hex strings (`"0x7f3a40000000"`) in the
//! JSON: readers in other languages lose precision above 2^53.
//!
//! Names (`ev`, `api`, `kind`) are [`Named`]: a name this build does not know
//! is kept as a string rather than making the whole log unreadable.

use super::{Api, Event, EventKind, MemKind, Named};
use crate::options::{Backing, Options};
use serde::{Deserialize, Serialize};

/// The `schema` of every cupool log.
pub const SCHEMA: &str = "cupool-log";
/// The version this build writes. 2: `end.pools[].fences` became an object.
/// 3: allocation sites (`stack` of alloc events and leaks, definition lines).
/// 4: what the pool took from CUDA and gave back (`reserve`, `release`) and
/// which allocations it served (`pooled`). 5: an event's `api` is left out
/// when it is `cudaMalloc` (alloc) or `cudaFree` (free), its `kind` when it
/// is `device`, and its `device` when it is 0 (a third of the bytes of an
/// allocation's and a free's lines, which the writer thread copies).
pub const VERSION: u32 = 5;
/// The version from which lines leave fields out at their defaults
/// ([`EventRecord::with_defaults`]): `api` at [`EventKind::default_api`],
/// `kind` at [`DEFAULT_MEM_KIND`], `device` at [`DEFAULT_DEVICE`].
pub const DEFAULTS_LEFT_OUT_SINCE: u32 = 5;
/// The `kind` a line leaves out (version 5).
pub const DEFAULT_MEM_KIND: MemKind = MemKind::Device;
/// The `device` a line leaves out (version 5).
pub const DEFAULT_DEVICE: i32 = 0;
/// The versions this build reads.
pub const READABLE_VERSIONS: &[u32] = &[1, 2, 3, 4, 5];

/// `process`: the process that wrote the log. A field missing from a log reads as 0 / empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: u32,
    pub cmdline: Vec<String>,
    pub exe: String,
    pub start_unix_ms: u64,
    /// The rank of a distributed job (torchrun, MPI), from the environment
    /// when the log was started; absent when the process had none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// Everything on the header line except the `events` array.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Always [`SCHEMA`].
    pub schema: String,
    pub version: u32,
    pub process: ProcessInfo,
    pub options: Options,
}

/// One line of the timeline as read back. Which fields an event has depends
/// on `ev` (see `docs/log-schema.md`); the others are `None`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    pub seq: u64,
    pub t_ns: u64,
    pub ev: Named<EventKind>,
    /// Absent from an `alloc` line when it is `cudaMalloc`, from a `free`
    /// line when `cudaFree` ([`EventRecord::with_defaults`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<Named<Api>>,
    /// Absent from a line when it is `device` ([`EventRecord::with_defaults`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Named<MemKind>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "hex_opt")]
    pub ptr: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Absent from a line when it is 0 ([`EventRecord::with_defaults`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "hex_opt")]
    pub stream: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "hex_opt")]
    pub handle: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaked_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaked_count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<u64>,
    /// The allocation site (a `stack` definition) of an `alloc`; absent when none was captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
    /// An `alloc` that cupool's pool served (version 4; absent: CUDA served it,
    /// or the log is older and does not say).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pooled: bool,
    /// Always written; `None` only in hand-made logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
}

impl EventRecord {
    /// An event with only `seq`, `t_ns` and `ev`.
    pub fn new(seq: u64, t_ns: u64, ev: EventKind) -> EventRecord {
        EventRecord {
            seq,
            t_ns,
            ev: ev.into(),
            api: None,
            kind: None,
            ptr: None,
            size: None,
            device: None,
            stream: None,
            handle: None,
            result: None,
            leaked_bytes: None,
            leaked_count: None,
            name: None,
            live: None,
            reserved: None,
            stack: None,
            pooled: false,
            tid: None,
        }
    }
}

impl EventRecord {
    /// The record as read from its line: the fields its kind of event
    /// carries but the line leaves out at their defaults (`api` the
    /// runtime's `cudaMalloc` or `cudaFree`, `kind` device, `device` 0,
    /// since version 5) filled in. Every reader of a line goes
    /// through it; the record itself, serialized, writes them out.
    /// A line of an older `version` is taken as written: its writer left
    /// nothing out, and a field missing there is missing.
    pub fn with_defaults(mut self, version: u32) -> EventRecord {
        if version < DEFAULTS_LEFT_OUT_SINCE {
            return self;
        }
        if let Some(ev) = self.ev.known() {
            if self.api.is_none() {
                self.api = ev.default_api().map(Into::into);
            }
            if ev.has_mem_kind() && self.kind.is_none() {
                self.kind = Some(DEFAULT_MEM_KIND.into());
            }
            if ev.has_device() && self.device.is_none() {
                self.device = Some(DEFAULT_DEVICE);
            }
        }
        self
    }

    /// The record `write_named_event` writes for `e` and `name`.
    pub fn named(e: &Event, name: &str) -> EventRecord {
        let mut r = EventRecord::from(e);
        if r.name.is_some() {
            r.name = Some(name.to_string());
        }
        r
    }
}

impl From<&Event> for EventRecord {
    /// The record `write_event` writes for `e` (a test holds the two together).
    fn from(e: &Event) -> EventRecord {
        let mut r = EventRecord::new(e.seq, e.t_ns, e.kind);
        r.tid = Some(e.tid);
        if e.kind.has_api() {
            r.api = Some(e.api.into());
        }
        let aux = (e.aux != 0).then_some(e.aux);
        match e.kind {
            EventKind::Start => {}
            EventKind::Alloc | EventKind::Free | EventKind::Map | EventKind::Unmap => {
                r.kind = Some(e.mem.into());
                r.ptr = Some(e.ptr);
                r.size = Some(e.size);
                r.device = Some(e.device);
                if matches!(e.kind, EventKind::Map | EventKind::Unmap) {
                    r.handle = aux;
                } else {
                    r.stream = aux;
                }
                if e.kind == EventKind::Alloc && e.stack != 0 {
                    r.stack = Some(e.stack);
                }
                r.pooled = e.kind == EventKind::Alloc && e.pooled;
            }
            EventKind::AllocFailed | EventKind::Oom => {
                r.kind = Some(e.mem.into());
                r.size = Some(e.size);
                r.device = Some(e.device);
                r.result = Some(e.result);
            }
            EventKind::InvalidFree => {
                r.ptr = Some(e.ptr);
                r.device = Some(e.device);
                r.result = Some(e.result);
            }
            EventKind::Checkpoint => {
                r.device = Some(e.device);
                r.leaked_bytes = Some(e.size);
                r.leaked_count = Some(e.aux);
            }
            EventKind::Reserve | EventKind::Release => {
                r.size = Some(e.size);
                r.device = Some(e.device);
            }
            EventKind::PhaseBegin | EventKind::PhaseEnd => {
                r.name = Some(String::new());
                r.device = Some(e.device);
                r.live = Some(e.size);
                r.reserved = Some(e.ptr);
            }
        }
        r
    }
}

/// `end.exit`: how the process ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "how", rename_all = "lowercase")]
pub enum ExitRecord {
    /// `{"how":"exit","status":N}`; `status` is `null` when unknown.
    Exit { status: Option<i32> },
    /// `{"how":"signal","signal":15,"name":"SIGTERM"}`.
    Signal { signal: i32, name: String },
}

/// `end.devices[]` and `end.host`: what one device (or pinned host memory, device -1) saw.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCounters {
    pub device: i32,
    pub allocs: u64,
    pub frees: u64,
    pub failures: u64,
    pub current_bytes: u64,
    pub peak_bytes: u64,
    pub current_count: u64,
    pub peak_count: u64,
    /// Bytes held from CUDA: pool segments plus allocations CUDA made
    /// directly (0 in logs written before it was recorded).
    #[serde(default)]
    pub reserved_bytes: u64,
    #[serde(default)]
    pub peak_reserved_bytes: u64,
}

impl DeviceCounters {
    /// All zero, for `device`.
    pub fn new(device: i32) -> DeviceCounters {
        DeviceCounters { device, ..Default::default() }
    }
}

/// `end.leak_summary`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakSummary {
    pub bytes: u64,
    pub count: u64,
}

/// `end.leaks[]`: an allocation still live when its context died or the process ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leak {
    /// The address; `None` for VMM memory, which has `handle` instead.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "hex_opt")]
    pub ptr: Option<u64>,
    /// The `cuMemCreate` handle of VMM memory.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "hex_opt")]
    pub handle: Option<u64>,
    pub size: u64,
    pub device: i32,
    pub kind: Named<MemKind>,
    pub api: Named<Api>,
    /// Milliseconds between the allocation and `at`.
    pub age_ms: u64,
    pub tid: u32,
    /// `exit`, the API of the checkpoint that found it, or `not finished`
    /// when rebuilt from the timeline of a log cut short.
    pub at: String,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "hex_opt")]
    pub stream: Option<u64>,
    /// Its allocation site (a `stack` definition), when one was captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
}

/// A line of the `events` array that defines what events refer to (version 3):
/// written once, before the first event that uses it, so a log cut short
/// still resolves what it holds. Tagged by `def`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "def", rename_all = "lowercase")]
pub enum Definition {
    Module(ModuleRecord),
    String(StringRecord),
    Stack(StackRecord),
}

/// `{"def":"module"}`: a loaded executable or shared object, to symbolise
/// native frames from its file when a report is made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleRecord {
    pub id: u32,
    pub path: String,
    /// Load bias: an address in the process = the file's virtual address + `base`.
    #[serde(with = "hex")]
    pub base: u64,
    /// The process's addresses `[start, end)` the module occupies.
    #[serde(with = "hex")]
    pub start: u64,
    #[serde(with = "hex")]
    pub end: u64,
    /// GNU build id in hex; empty when the file has none.
    #[serde(default)]
    pub build_id: String,
}

/// `{"def":"string"}`: a text that other records name by `id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StringRecord {
    pub id: u32,
    pub text: String,
}

/// `{"def":"stack"}`: one allocation site, innermost frame first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackRecord {
    pub id: u32,
    /// Return addresses (cupool's, the CUDA runtime's and the driver's own
    /// frames at the top already removed).
    #[serde(default, with = "hex_vec")]
    pub native: Vec<u64>,
    /// Python frames of the allocating thread, innermost first.
    #[serde(default)]
    pub python: Vec<PyFrameRecord>,
}

/// A Python frame, `[file, function, line]`: string ids, and the line (0 when unknown).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PyFrameRecord(pub u32, pub u32, pub u32);

/// A `{current, peak}` figure of a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    pub current: u64,
    pub peak: u64,
}

/// `end.pools[].fences`: how a pool's reuse fences fared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceCounters {
    pub recorded: u64,
    pub completed: u64,
    pub skipped_for_capture: u64,
    pub record_errors: u64,
    pub gpu_barriers: u64,
    pub waits: u64,
    pub syncs: u64,
    /// Nanoseconds the program's threads spent blocked in those waits and
    /// synchronizations.
    #[serde(default)]
    pub wait_ns: u64,
    /// Nanoseconds spent recording fences (an event and a capture question
    /// per stream), under the pool's lock.
    #[serde(default)]
    pub record_ns: u64,
    /// Fences that a thread found completed by asking the driver itself,
    /// without the pool's lock (the oldest queued fence); most of them are
    /// counted in `completed` too, when the pool drops them.
    #[serde(default)]
    pub completed_unlocked: u64,
}

impl FenceCounters {
    /// Version 1 wrote the counters as Rust's `Debug` text,
    /// `FenceCounters { recorded: 2, completed: 1, ... }`; absent counters read as 0.
    pub fn from_debug_text(s: &str) -> FenceCounters {
        let get = |name: &str| -> u64 {
            let pat = format!("{name}: ");
            let Some(at) = s.find(&pat) else { return 0 };
            let digits: String = s[at + pat.len()..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse().unwrap_or(0)
        };
        FenceCounters {
            recorded: get("recorded"),
            completed: get("completed"),
            skipped_for_capture: get("skipped_for_capture"),
            record_errors: get("record_errors"),
            gpu_barriers: get("gpu_barriers"),
            waits: get("waits"),
            syncs: get("syncs"),
            wait_ns: get("wait_ns"),
            record_ns: 0,
            completed_unlocked: 0,
        }
    }
}

/// `end.magazines`: what threads' magazines (option `magazines`) did, over
/// every thread that started one. A pooled block a magazine handed out came
/// from its thread's own frees or from its stock; a free that found its
/// class's waiting room full pushed the oldest one back to the pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MagazineRecord {
    /// Threads that started a magazine.
    pub threads: u64,
    /// Blocks handed out again from their thread's own frees, without the pool's lock.
    pub own_frees_reused: u64,
    /// Blocks handed out from the stock taken from the pool.
    pub stock_handed_out: u64,
    /// Times a thread took blocks from the pool, under its lock, to fill its stock.
    pub refills: u64,
    /// Frees pushed back to the pool because their class's waiting room was
    /// full before the fence of the oldest completed.
    pub overflowed: u64,
}

impl std::ops::AddAssign for MagazineRecord {
    fn add_assign(&mut self, o: MagazineRecord) {
        self.threads += o.threads;
        self.own_frees_reused += o.own_frees_reused;
        self.stock_handed_out += o.stock_handed_out;
        self.refills += o.refills;
        self.overflowed += o.overflowed;
    }
}

/// `end.pools[]`: one pool (one CUDA context) in pool mode. Named after PyTorch's statistics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolRecord {
    pub device: i32,
    pub context_destroyed: bool,
    pub allocated_bytes: Stat,
    pub requested_bytes: Stat,
    pub reserved_bytes: Stat,
    pub active_bytes: Stat,
    pub inactive_split_bytes: Stat,
    pub segment: Stat,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_syncs: u64,
    pub num_waits: u64,
    pub largest_free_block: u64,
    pub multi_stream: bool,
    /// What first made reuse wait for fences (logs before it: absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_stream_because: Option<MultiStreamBecause>,
    /// An object since version 2; version 1's text form is read too.
    #[serde(deserialize_with = "fences_v1_or_v2")]
    pub fences: FenceCounters,
    pub peak_reserved_over_peak_requested: f64,
    /// What its blocks were carved from (logs before it: segments).
    #[serde(default)]
    pub backing: Backing,
    /// A VMM-backed pool's pages (only then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pages: Option<PagesRecord>,
    /// Times an allocation or a free found the pool's lock taken and waited
    /// for it (logs before it: absent, read as 0).
    #[serde(default)]
    pub lock_waits: u64,
    /// Nanoseconds those waits took, all threads together (logs before it:
    /// absent, read as 0).
    #[serde(default)]
    pub lock_wait_ns: u64,
}

/// `end.pools[].multi_stream_because`: what showed the process that its
/// work may run on more than one stream, the first time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum MultiStreamBecause {
    /// The program created a stream.
    StreamCreated = 1,
    /// Work was queued on a second stream (per-thread default streams included).
    SecondStream = 2,
    /// Pooled allocations came through the driver API from a second thread.
    DriverThreads = 3,
    /// A second thread made a context current, with no kernel launch seen.
    BoundThread = 4,
    /// A reason this reader does not know (a newer writer's).
    #[serde(other)]
    Unknown = 5,
}

impl MultiStreamBecause {
    /// A code for keeping it in an atomic (0 is left for "none yet").
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The one with `code`; `None` for 0 (none yet) or a code out of range.
    pub fn from_code(code: u8) -> Option<MultiStreamBecause> {
        use MultiStreamBecause::*;
        [StreamCreated, SecondStream, DriverThreads, BoundThread, Unknown].into_iter().find(|b| b.code() == code)
    }
}

/// `end.pools[].pages`: a VMM-backed pool's physical pages, its mappings
/// and what the driver calls cost.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PagesRecord {
    /// Bytes per page.
    pub page_bytes: u64,
    /// Bytes of virtual address ranges reserved.
    pub va_reserved_bytes: u64,
    /// Pages mapped with no block on them.
    pub idle_bytes: Stat,
    /// Blocks freed and waiting for queued GPU work.
    pub pending_bytes: Stat,
    pub creates: u64,
    pub releases: u64,
    pub maps: u64,
    pub unmaps: u64,
    /// Idle pages moved to where a new block needed them.
    pub remaps: u64,
    /// Access grants (`cuMemSetAccess`), one per span of pages mapped together.
    pub grants: u64,
    pub costs: PageCosts,
    /// Of the moves, pages taken while queued GPU work might still touch
    /// them where they were: mapped at both places until it finished.
    #[serde(default)]
    pub aliases: u64,
    /// Placements that waited for the GPU before mapping over such an old place.
    #[serde(default)]
    pub ghost_waits: u64,
    /// Where the pages were when they peaked.
    #[serde(default)]
    pub at_peak: PagesAtPeak,
}

/// `end.pools[].pages.at_peak`: a VMM-backed pool's bytes of pages when
/// they peaked, by what held them. `reserved - allocated` is what the pool
/// cost beyond the program's blocks then.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PagesAtPeak {
    pub reserved: u64,
    /// Blocks handed out (rounded sizes).
    pub allocated: u64,
    /// Blocks freed and waiting for queued GPU work.
    pub pending: u64,
    /// Pages with no block on them ...
    pub idle: u64,
    /// ... of which queued work could still touch (usable only in place).
    pub cooling: u64,
}

/// `end.pools[].pages.costs`: nanoseconds spent in each driver call of the
/// VMM backing, in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageCosts {
    pub create_ns: u64,
    pub map_ns: u64,
    pub access_ns: u64,
    pub unmap_ns: u64,
    pub release_ns: u64,
}

fn fences_v1_or_v2<'de, D: serde::Deserializer<'de>>(d: D) -> Result<FenceCounters, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        V2(FenceCounters),
        V1(String),
    }
    Ok(match Either::deserialize(d)? {
        Either::V2(f) => f,
        Either::V1(s) => FenceCounters::from_debug_text(&s),
    })
}

/// `end.ooms[]`: what the device memory looked like when the pool ran out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomRecord {
    pub t_ns: u64,
    pub device: i32,
    pub requested: u64,
    pub reserved: u64,
    pub allocated: u64,
    pub free_in_pool: u64,
    pub largest_free_block: u64,
    /// The 10 largest live requests, largest first.
    pub largest_live: Vec<u64>,
    /// Virtual addresses the pool had reserved (VMM backing; 0 for
    /// segments, whose reserved bytes are their addresses).
    #[serde(default)]
    pub address_reserved: u64,
}

/// `end`: the record written when the process ends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct End {
    pub end_unix_ms: u64,
    pub duration_ms: u64,
    pub exit: ExitRecord,
    pub devices: Vec<DeviceCounters>,
    pub host: DeviceCounters,
    pub leak_summary: LeakSummary,
    /// Largest first.
    pub leaks: Vec<Leak>,
    pub dropped_events: u64,
    pub pools: Vec<PoolRecord>,
    /// Only when some thread started a magazine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub magazines: Option<MagazineRecord>,
    pub ooms: Vec<OomRecord>,
    pub complete: bool,
    /// What cupool could not do in this process, one sentence each (e.g. a
    /// Python version whose frames it cannot read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// `0x…` strings for `u64` fields. Reading also accepts a plain number.
pub(crate) mod hex {
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        super::hex_opt::serialize(&Some(*v), s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        super::hex_opt::deserialize(d)?.ok_or_else(|| serde::de::Error::custom("expected a 0x… hex string, got null"))
    }
}

/// `["0x…", ...]` for `Vec<u64>` fields.
pub(crate) mod hex_vec {
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u64], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(v.len()))?;
        for n in v {
            seq.serialize_element(&format_args!("{n:#x}").to_string())?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
        #[derive(Deserialize)]
        struct Hex(#[serde(with = "super::hex")] u64);
        Ok(Vec::<Hex>::deserialize(d)?.into_iter().map(|h| h.0).collect())
    }
}

/// `0x…` strings for `Option<u64>` fields. Reading also accepts a plain number.
pub(crate) mod hex_opt {
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(n) => s.collect_str(&format_args!("{n:#x}")),
            None => s.serialize_none(),
        }
    }

    /// A visitor rather than an untagged enum: serde buffers every value of an
    /// untagged enum before trying its variants, which made pointers the
    /// costliest fields of a log to read.
    struct HexOrNumber;

    impl<'de> serde::de::Visitor<'de> for HexOrNumber {
        type Value = Option<u64>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a 0x… hex string, a number or null")
        }

        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Option<u64>, E> {
            Ok(Some(n))
        }

        fn visit_str<E: serde::de::Error>(self, t: &str) -> Result<Option<u64>, E> {
            super::parse_hex(t).map(Some).ok_or_else(|| E::custom(format!("expected a 0x… hex string, got {t:?}")))
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
            d.deserialize_any(HexOrNumber)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_option(HexOrNumber)
    }
}

/// `"0x1f"` → 31.
pub fn parse_hex(s: &str) -> Option<u64> {
    let h = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
    u64::from_str_radix(h, 16).ok()
}
