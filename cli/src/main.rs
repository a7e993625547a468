//! `cupool`: runs programs under the preload library and reads its logs.

mod cache;
mod check;
mod replay;
mod run;
mod runs;
mod shim;
mod sites;
mod summary;
mod symbolize;
mod units;
mod views;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "cupool",
    about = "Pool, track and leak-check the CUDA device memory of any program",
    long_about = "Pool, track and leak-check the CUDA device memory of any program.\n\n\
        cupool runs a program with libcupool.so preloaded. The library sees every CUDA memory \
        allocation and free (runtime and driver API), can serve device allocations from its own \
        pool (--mode pool), and writes one JSON log per process (cupool.<pid>.json) with a \
        timeline and a leak report at exit. No change to the program is needed.",
    after_help = "Start with:  cupool run -- python train.py\n\
        Then:        cupool report          (the newest run in ./cupool-logs)\n\
        Each command has its own --help."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program with libcupool.so preloaded, then summarise its logs
    #[command(
        long_about = "Run a program with libcupool.so preloaded, then summarise its logs.\n\n\
            Every process the program starts that uses CUDA memory writes its own log into \
            --log-dir. cupool waits for the program, prints a one-screen summary of every process \
            of this run (devices, peaks, leaks) on stderr, and exits with the program's exit status \
            (128 + the signal number when the program was killed).",
        after_help = run::options_help()
    )]
    Run(run::RunArgs),
    /// Run a program and check it for CUDA memory leaks, LeakSanitizer style
    #[command(
        long_about = "Run a program and check it for CUDA memory leaks, LeakSanitizer style.\n\n\
            Runs the program as cupool run does (every process it starts is logged), then reads \
            the logs of the run and reports, on stderr, every leak grouped by allocation site, \
            largest first, with the processes it was found in. Three kinds: exit leaks (still \
            allocated when their context died or the process ended), growth leaks (sites whose \
            live bytes keep growing across the repeated phases of the run: NVTX ranges, \
            cupool_mark phases, or the loop's own periods when there are no marks), and test leaks \
            (left live by one test, under pytest). Memory that known libraries keep until exit on \
            purpose (PyTorch's cache, cuBLAS/cuDNN workspaces, NCCL buffers, CuPy and JAX pools, \
            the CUDA runtime's own) is summarised in one line and does not fail the job: those \
            rules are cupool's default suppressions, in LeakSanitizer's syntax (leak:PATTERN), which \
            --suppressions extends.",
        after_help = check::help(true)
    )]
    Check(check::CheckArgs),
    /// Check logs gathered elsewhere, as cupool check does after its run
    #[command(long_about = "Check logs gathered elsewhere, as cupool check does after its run.\n\n\
        Reads every log in the directories given (from several machines, ranks or runs) and \
        reports their leaks in one report with one exit status, by the rules of cupool check \
        (there is no program status).", after_help = check::help(false))]
    Merge(check::MergeArgs),
    /// Summarise existing logs: peaks, phases, sizes, sites, OOMs and leaks per process
    #[command(long_about = "Summarise existing logs: peaks, phases, sizes, sites, OOMs and leaks per process.\n\n\
        Reads logs written by libcupool.so, complete or cut short (a process killed by SIGKILL \
        leaves a log without its end record; its leaks are then rebuilt from the timeline). Per process \
        and device: the peaks of allocated, reserved and mapped bytes with when and in which phase; \
        the allocation sizes; reserved against allocated over the run; each phase's peak and growth; \
        out-of-memory refusals with the pool's snapshot; the top allocation sites by peak, by count and \
        by bytes still live; then the leaks as cupool check judges them. docs/report.md describes the \
        text, the --json form and the --html page (one self-contained file with interactive plots). \
        Exits with status 2 if a path does not exist, a file cannot be read as a cupool log, or a \
        directory holds no cupool logs (the others are reported all the same); each problem gets one \
        line naming the file (and line). Exits with status 73 when the --html page cannot be written.")]
    Report {
        /// Print the summary as JSON (one object per log) instead of text.
        #[arg(long, conflicts_with = "html")]
        json: bool,
        /// Write the report as one self-contained HTML page into FILE instead of printing it: per
        /// device, a plot of the bytes allocated and reserved over time (zoom, and the allocation
        /// nearest in time with its site on hover), the phases, top sites, OOMs and leaks. Exits
        /// with status 73 when FILE cannot be written (checked before anything is read).
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// Show the N allocation sites with the largest peak, the N with the most allocations and
        /// the N holding the most bytes at the end, with their frames (0: none). Logs written with
        /// trace=0 have no sites.
        #[arg(long, value_name = "N", default_value_t = 5)]
        sites: usize,
        /// Log files (cupool.<pid>.json, also gzipped as .json.gz) or directories; a directory
        /// stands for every cupool.*.json and cupool.*.json.gz in it and in its subdirectories
        /// (one per rank or machine), and a log directory of runs for its newest run. None: the
        /// newest run in ./cupool-logs.
        #[arg(value_name = "PATHS")]
        paths: Vec<PathBuf>,
    },
    /// Export logs for other viewers: Perfetto (Chrome trace JSON), PyTorch's memory_viz (pickle)
    #[command(
        long_about = "Export logs for other viewers: Perfetto (Chrome trace JSON), PyTorch's memory_viz (pickle).\n\n\
        --perfetto writes a trace that ui.perfetto.dev opens: per process and device, counter tracks of \
        the bytes allocated, reserved and mapped; the program's phases as slices; out-of-memory refusals, \
        checkpoints and notes as instant events. --memory-viz writes a snapshot in PyTorch's schema that \
        pytorch.org/memory_viz opens: segments, blocks with their allocation sites, and each device's trace \
        (in pool mode, the pool's segments are rebuilt by replaying the program's requests).",
        after_help = "Exit status: 0; 2 when a path does not exist, cannot be read or is not a cupool log (the \
        others are exported all the same; nothing is written when none can be read); 73 when an output \
        cannot be written (checked before anything is read; a file already there is replaced only by a \
        complete new one). Each problem gets one line naming the file."
    )]
    Export(views::export::ExportArgs),
    /// Watch the device memory of programs running under cupool, live in the terminal
    #[command(long_about = "Watch the device memory of programs running under cupool, live in the terminal.\n\n\
        Follows the logs the programs write while they run (every cupool log in the directories given, \
        including those that appear later) and shows, refreshed every --delay seconds, per process and \
        device: the bytes live and reserved, how fast each changes, their peaks, and the allocation sites \
        holding the most live bytes. Only new lines of each log are read; nothing is sent to the programs. \
        q or Ctrl-C quits. Without a terminal (a pipe), each refresh is printed as plain text.")]
    Top(views::top::TopArgs),
    /// Replay recorded allocation traces through cupool's pools and models of PyTorch's on the CPU
    #[command(long_about = "Replay recorded allocation traces through cupool's pools and models of \
        PyTorch's allocator on the CPU.\n\n\
        Each trace goes through four policies: cupool-segments (cupool's pool of fixed segments, \
        as the shim runs it), cupool-vmm (cupool's VMM pool: 2 MiB physical pages mapped into \
        virtual ranges, idle pages remapped where needed), pytorch-caching (PyTorch's caching \
        allocator: the segment pool with PyTorch's defaults) and pytorch-expandable (PyTorch's \
        expandable_segments: one growing virtual segment per pool kind, 2 MiB / 20 MiB pages, \
        never unmapped without empty_cache). For each trace and policy, prints the number of \
        operations, the peak of live bytes, the peak of bytes reserved from the device, their \
        ratio (the allocator's overhead), the page bound (the least ratio any allocator taking \
        memory in 2 MiB pages could reach: the peak of live bytes rounded up to whole pages, over \
        it) and the time per operation. Only device memory is replayed (kinds device, pitched, \
        async and vmm: what the program asked the device for), not managed or host memory. No \
        GPU is needed.")]
    Replay {
        /// One JSON object per line, per trace and policy: {"trace", "policy", "gpu_behind_ms", "ops",
        /// "peak_live", "peak_reserved", "ratio", "page_bound", "ns_per_op"}
        #[arg(long)]
        json: bool,
        /// Replay through this policy only: cupool-segments, cupool-vmm, pytorch-caching or
        /// pytorch-expandable; may be repeated (the order given is the order shown). Default: all four.
        #[arg(long = "policy", value_name = "POLICY", value_parser = replay::parse_policy)]
        policies: Vec<replay::Policy>,
        /// Replay cupool's pools as if the GPU ran MS milliseconds behind the program, in the
        /// trace's own clock: every call queues work on several streams, a freed block waits for
        /// a fence, pending frees are ordered behind GPU-side barriers, and idle pages that queued
        /// work may still touch are not unmapped until it is done (mapped elsewhere meanwhile,
        /// they leave a ghost mapping behind), as the shim's pool meets them on a GPU. PyTorch's
        /// models are replayed as without (one stream: their blocks come back in stream order).
        /// A trace without times is replayed with the GPU keeping up. Default 0: the GPU keeps
        /// up, every free done at once.
        #[arg(long = "gpu-behind", value_name = "MS", default_value_t = 0)]
        gpu_behind: u64,
        /// After each trace's rows, the cupool-vmm pool's pages at the moment its reserved bytes
        /// peaked: how many pages blocks fill wholly, in part or not at all, then each page they
        /// do not fill with the blocks on it (their sizes as the pool rounded them, and where
        /// each starts against the page): where the trace's fragmentation sits. Text only.
        #[arg(long = "pages-at-peak", conflicts_with = "json")]
        pages_at_peak: bool,
        /// Trace files: cupool logs or RMM logging CSV (Thread,Time,Action,Pointer,Size,Stream),
        /// plain or gzipped, or directories of them (*.json, *.csv, also .gz; the framework
        /// histories beside a log left out). None: the traces bundled in this binary (recorded
        /// from the repository's traces/), or every file in the directory $CUPOOL_TRACES when it
        /// is set. Exits with status 2 when one cannot be read.
        #[arg(value_name = "TRACES")]
        traces: Vec<PathBuf>,
    },
}

/// `cupool --version`: the tool's version and the version of the log schema it reads and writes.
fn version() -> &'static str {
    let text = format!(
        "{} (log schema {} version {}; reads versions {:?})",
        env!("CARGO_PKG_VERSION"),
        cupool_core::log::SCHEMA,
        cupool_core::log::VERSION,
        cupool_core::log::READABLE_VERSIONS
    );
    Box::leak(text.into_boxed_str()) // once per process
}

/// The hint for `cupool run ./prog` (or `check`): the program goes after `--`.
fn program_after_dashes(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let sub = std::env::args().nth(1).filter(|s| s == "run" || s == "check")?;
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else { return None };
    if e.kind() != ErrorKind::UnknownArgument || arg.starts_with('-') {
        return None;
    }
    Some(format!("the program and its arguments go after --: 'cupool {sub} [OPTIONS] -- {arg} ...'"))
}

fn main() -> ExitCode {
    use clap::error::{ContextKind, ContextValue};
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().version(version()).try_get_matches().unwrap_or_else(|mut e| {
        if let Some(tip) = program_after_dashes(&e) {
            e.insert(ContextKind::Suggested, ContextValue::StyledStrs(vec![tip.into()]));
        }
        e.exit()
    });
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Run(args) => run::run(args, check::known_caches_line),
        Command::Check(args) => check::check(args),
        Command::Merge(mut args) => match runs::resolve(std::mem::take(&mut args.paths), "cupool merge") {
            Ok(paths) => {
                args.paths = paths;
                check::merge(args)
            }
            Err(()) => ExitCode::from(check::exit::COULD_NOT_CHECK),
        },
        Command::Replay { json, policies, gpu_behind, pages_at_peak, traces } => {
            replay::run(traces, json, &policies, gpu_behind, pages_at_peak)
        }
        Command::Export(mut args) => match runs::resolve(std::mem::take(&mut args.paths), "cupool export") {
            Ok(paths) => {
                args.paths = paths;
                views::export::run(args)
            }
            Err(()) => ExitCode::from(summary::EXIT_BAD_INPUT),
        },
        Command::Top(args) => views::top::run(args),
        Command::Report { json, html, sites, paths } => match runs::resolve(paths, "cupool report") {
            Ok(paths) => views::report::run(&paths, json, html.as_deref(), sites),
            Err(()) => ExitCode::from(summary::EXIT_BAD_INPUT),
        },
    }
}
