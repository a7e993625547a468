//! `cupool`: runs programs under the preload library and reads its logs.

mod replay;
mod run;
mod summary;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "cupool", version, about = "Pool, track and leak-check CUDA device memory of any program")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program with libcupool.so preloaded, then summarise its logs.
    #[command(after_help = run::options_help())]
    Run(run::RunArgs),
    /// Summarise existing logs (files, or directories of cupool.*.json).
    /// Replay recorded allocation traces (cupool logs, RMM logging CSV, .gz) through the pool on the CPU.
    Replay {
        /// Trace files; none: the bundled traces.
        traces: Vec<PathBuf>,
    },
    Report {
        /// Print the summary as JSON instead of text.
        #[arg(long)]
        json: bool,
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Replay { traces } => replay::run(traces),
        Command::Report { json, paths } => summary::report(&paths, json),
    }
}
