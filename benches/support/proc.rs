//! What benchmarks read about a running process from /proc: resident memory and the CPU time
//! of its threads.

#![allow(dead_code)] // each bench uses its own subset

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
    threads_cpu_ns(pid, |comm| !comm.starts_with("nvml-mock-contr"))
}

/// CPU time of the threads of `pid` whose name `counted` accepts, in ns.
pub fn threads_cpu_ns(pid: u32, counted: impl Fn(&str) -> bool) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .map(|task| task.path())
        .filter(|path| {
            let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            counted(comm.trim())
        })
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

/// CPU time of process `pid` and its children (nginx's master and workers), in ns.
pub fn tree_cpu_ns(pid: u32) -> u64 {
    let children = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            // The parent pid is the second field after the parenthesised command name.
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        });
    let all = |_: &str| true;
    threads_cpu_ns(pid, all)
        + children
            .map(|child| threads_cpu_ns(child, all))
            .sum::<u64>()
}
