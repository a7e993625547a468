//! Facts about this process for the log header.

use cupool_core::log::ProcessInfo;

pub fn info() -> ProcessInfo {
    let cmdline: Vec<String> = std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
        })
        .unwrap_or_default();
    let exe = std::fs::read_link("/proc/self/exe").map(|p| p.display().to_string()).unwrap_or_default();
    ProcessInfo {
        pid: std::process::id(),
        ppid: unsafe { libc::getppid() } as u32,
        cmdline,
        exe,
        start_unix_ms: super::clock::start_unix_ms(),
    }
}
