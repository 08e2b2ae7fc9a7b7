//! What benchmarks read about a running gpud from /proc: resident memory and the CPU time
//! of gpud's own threads.

use std::path::Path;

/// Resident set size of `pid` in KiB (0 when it cannot be read).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time of every thread of `pid` in ns, except the simulated driver's control-file
/// watcher, which a real driver does not have.
pub fn gpud_cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .map(|task| task.path())
        .filter(|path| !is_mock_thread(path))
        .filter_map(|path| {
            std::fs::read_to_string(path.join("schedstat"))
                .ok()?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn is_mock_thread(task: &Path) -> bool {
    std::fs::read_to_string(task.join("comm"))
        .is_ok_and(|comm| comm.trim().starts_with("nvml-mock-contr"))
}
