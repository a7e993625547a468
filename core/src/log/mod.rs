//! The cupool log: event vocabulary, the typed records of the log schema
//! (`schema`), the line-oriented JSON writer used by the shim, and the reader
//! of the files, whose logs `crate::model` makes into what every reader uses.
//!
//! A log is one JSON document written one line at a time, so that a file cut
//! short by SIGKILL is still readable line by line:
//!
//! ```text
//! {"schema":"cupool-log","version":3,"process":{..},"options":{..},"events":[
//! {"seq":0,"t_ns":0,"ev":"start"}
//! ,{"seq":1,"t_ns":812,"ev":"alloc",...}
//! ],"end":{...}}
//! ```
//! `docs/log-schema.md` documents every field.

mod names;
mod read;
mod schema;
mod sites;
#[cfg(test)]
mod tests;
mod write;

pub use names::{Api, EventKind, MemKind, Named, NamedEnum};
pub use read::{
    header_line, line_of, maybe_gunzip, read_log, read_log_from, read_log_with_progress, Log, LogLine, ReadError,
    ReadErrorKind,
};
pub use schema::{
    parse_hex, Definition, DeviceCounters, End, EventRecord, ExitRecord, FenceCounters, Header, Leak, LeakSummary,
    MagazineRecord, ModuleRecord, MultiStreamBecause, OomRecord, PageCosts, PagesAtPeak, PagesRecord, PoolRecord,
    ProcessInfo, PyFrameRecord, StackRecord, Stat, StringRecord, DEFAULT_DEVICE, DEFAULT_MEM_KIND, READABLE_VERSIONS,
    SCHEMA, VERSION,
};
pub use sites::Sites;
pub use write::{write_definition, write_end, write_event, write_header, write_named_event, EventLine};

/// The file, in the log directory, that each process of a `cupool run` or
/// `check` (tagged `run_id`) which never used CUDA memory appends its pid
/// to as it leaves (one line each). With the logs it tells the check that
/// the shim was loaded, so that a check where it never was (a static
/// binary, an environment that drops `LD_PRELOAD`) is "could not check"
/// rather than a pass on nothing.
pub fn ran_without_cuda_file(run_id: &str) -> String {
    format!("cupool-ran.{run_id}")
}

/// One fixed-size record of something the shim saw. `Copy` and heap-free so
/// that recording it on the hot path never allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub seq: u64,
    pub t_ns: u64,
    pub kind: EventKind,
    pub api: Api,
    pub mem: MemKind,
    /// An `alloc` served by cupool's pool (a block of its segments or pages).
    pub pooled: bool,
    /// Device ordinal; -1 when unknown.
    pub device: i32,
    /// The pointer; bytes reserved on the device for phase events.
    pub ptr: u64,
    /// Bytes; bytes live on the device for phase events; bytes taken from
    /// or given back to CUDA for `reserve` and `release`.
    pub size: u64,
    /// Stream of stream-ordered calls, VMM handle of map/unmap, leak count of
    /// checkpoints, the name's string id of phase events.
    pub aux: u64,
    pub tid: u32,
    /// CUDA result code of failed calls.
    pub result: i32,
    /// Allocation site of an `alloc` (a stack definition's id); 0 = none.
    pub stack: u32,
}

impl Event {
    pub const fn new(kind: EventKind, api: Api) -> Event {
        Event {
            seq: 0,
            t_ns: 0,
            kind,
            api,
            mem: MemKind::Device,
            pooled: false,
            device: -1,
            ptr: 0,
            size: 0,
            aux: 0,
            tid: 0,
            result: 0,
            stack: 0,
        }
    }
}
