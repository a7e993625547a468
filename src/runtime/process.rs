//! Facts about this process for the log header.

use cupool_core::log::ProcessInfo;

/// Where launchers put a process's rank, most specific first: torchrun and
/// most launchers, Open MPI, MPICH/Intel MPI (PMI), PMIx; then torchrun's
/// per-node rank, which is the rank on a single node.
const RANK_VARIABLES: [&str; 5] = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "LOCAL_RANK"];

pub fn info() -> ProcessInfo {
    let cmdline: Vec<String> = std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
        })
        .unwrap_or_default();
    let exe = std::fs::read_link("/proc/self/exe").map(|p| p.display().to_string()).unwrap_or_default();
    ProcessInfo {
        pid: std::process::id(),
        // SAFETY: `getppid` takes no arguments and cannot fail.
        ppid: unsafe { libc::getppid() } as u32,
        cmdline,
        exe,
        start_unix_ms: super::clock::start_unix_ms(),
        rank: RANK_VARIABLES.iter().find_map(|v| std::env::var(v).ok()?.trim().parse().ok()),
    }
}
