//! The fault-injection control file (`NVML_MOCK_CONTROL`): its line syntax, and tailing the
//! file as it grows.
//!
//! One command per line; `#` starts a comment; blank lines are ignored. A `<gpu>` is an index,
//! a GPU UUID, a GPU's PCI bus id, or a MIG device UUID (which attributes the fault to that MIG instance); an index
//! or GPU UUID followed by `/gi<G>` names GPU instance G (compute instance 0) of that GPU the
//! same way. What each command does is decided by the driver runtime; this module only parses
//! and reads.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Which GPU (or MIG device) a command is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Index(usize),
    /// `GPU-…` or `MIG-…`.
    Uuid(String),
    /// `<index or GPU-…>/gi<G>`: GPU instance `gi` of that GPU, compute instance 0.
    Instance {
        gpu: Box<Target>,
        gi: u32,
    },
}

/// What a compute process started by `process` uses of its GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessUsage {
    /// Framebuffer memory in use, bytes (`usedGpuMemory`).
    pub memory_bytes: u64,
    /// SM, memory, encoder and decoder utilisation, percent.
    pub sm: u32,
    pub mem: u32,
    pub enc: u32,
    pub dec: u32,
}

/// One control command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `xid <gpu> <code> [<gi> <ci>]`: a critical XID event.
    Xid {
        target: Target,
        code: u64,
        instance: Option<(u32, u32)>,
    },
    /// `sbe <gpu>`: a corrected (single-bit) ECC error.
    Sbe(Target),
    /// `dbe <gpu>`: an uncorrected (double-bit) ECC error.
    Dbe(Target),
    /// `lost <gpu>`: the GPU falls off the bus.
    Lost(Target),
    /// `recover <gpu>`: the GPU answers again, as after a reset.
    Recover(Target),
    /// `remap-pending <gpu>`: an uncorrectable row remap (and page retirement) awaits reset.
    RemapPending(Target),
    /// `remap-failure <gpu>`: row remapping failed.
    RemapFailure(Target),
    /// `nvlink-down <gpu> <link>` / `nvlink-up <gpu> <link>`.
    NvLink { target: Target, link: u32, up: bool },
    /// `temp <gpu> <celsius>` or `temp <gpu> auto` (back to simulated readings).
    Temp {
        target: Target,
        celsius: Option<u32>,
    },
    /// `reset <gpu>`: applies the pending MIG mode and clears what a reset clears.
    Reset(Target),
    /// `ecc-pending <gpu> on|off`: the ECC mode after the next reboot.
    EccPending { target: Target, on: bool },
    /// `pcie-link <gpu> <gen> <width>` or `pcie-link <gpu> auto`: the trained PCIe link.
    PcieLink {
        target: Target,
        link: Option<(u32, u32)>,
    },
    /// `mig-fail <gpu> <op> [kill]` / `mig-ok <gpu> <op>`: MIG administration call `op`
    /// (`set-mode`, `create-gi`, `destroy-gi`, `create-ci`, `destroy-ci`) on that GPU fails
    /// with `NVML_ERROR_UNKNOWN` (or, with `kill`, SIGKILLs the calling process before the
    /// change) until the matching `mig-ok`.
    MigFail {
        target: Target,
        op: String,
        kill: bool,
        fail: bool,
    },
    /// `process <gpu> <pid> [<memory MiB> [<sm %> [<mem %> [<enc %> [<dec %>]]]]]` /
    /// `process-end <gpu> <pid>`: a compute process starts (or changes its numbers) or ends on
    /// the GPU, or in the GPU instance the target names (listed by
    /// `nvmlDeviceGetComputeRunningProcesses`, sampled by `nvmlDeviceGetProcessUtilization`).
    Process {
        target: Target,
        pid: u32,
        running: bool,
        /// All zero for `process-end`.
        usage: ProcessUsage,
    },
    /// `recovery-action <gpu> <action>`: what `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` reports.
    RecoveryAction { target: Target, action: u32 },
}

/// MIG administration calls `mig-fail` can break.
pub const MIG_OPS: [&str; 5] = [
    "set-mode",
    "create-gi",
    "destroy-gi",
    "create-ci",
    "destroy-ci",
];

impl Command {
    pub fn target(&self) -> &Target {
        match self {
            Command::Xid { target, .. }
            | Command::NvLink { target, .. }
            | Command::Temp { target, .. }
            | Command::EccPending { target, .. }
            | Command::PcieLink { target, .. }
            | Command::MigFail { target, .. }
            | Command::Process { target, .. }
            | Command::RecoveryAction { target, .. } => target,
            Command::Sbe(t)
            | Command::Dbe(t)
            | Command::Lost(t)
            | Command::Recover(t)
            | Command::RemapPending(t)
            | Command::RemapFailure(t)
            | Command::Reset(t) => t,
        }
    }
}

fn target(word: &str) -> Target {
    if let Some((gpu, gi)) = word.split_once("/gi")
        && let Ok(gi) = gi.parse()
    {
        return Target::Instance {
            gpu: Box::new(gpu_target(gpu)),
            gi,
        };
    }
    gpu_target(word)
}

/// An index or a UUID; anything that is no index is taken for a UUID, which the runtime looks
/// up (and reports when no GPU has it).
fn gpu_target(word: &str) -> Target {
    match word.parse() {
        Ok(i) => Target::Index(i),
        Err(_) => Target::Uuid(word.to_owned()),
    }
}

fn number<T: std::str::FromStr>(word: &str, what: &str) -> Result<T, String> {
    word.parse()
        .map_err(|_| format!("{what} must be a number, got {word:?}"))
}

/// A utilisation in percent, 0 to 100.
fn percent(word: &str, what: &str) -> Result<u32, String> {
    match number(word, what)? {
        p @ 0..=100 => Ok(p),
        p => Err(format!("{what} must be 0 to 100 percent, got {p}")),
    }
}

/// The optional numbers of `process`: memory in MiB, then SM, memory, encoder and decoder
/// utilisation in percent; missing ones are 0.
fn process_usage(numbers: &[&str]) -> Result<ProcessUsage, String> {
    let at = |i: usize| numbers.get(i).copied().unwrap_or("0");
    let mib: u64 = number(at(0), "memory (MiB)")?;
    Ok(ProcessUsage {
        memory_bytes: mib
            .checked_mul(1 << 20)
            .ok_or_else(|| format!("memory {mib} MiB is too large"))?,
        sm: percent(at(1), "sm")?,
        mem: percent(at(2), "mem")?,
        enc: percent(at(3), "enc")?,
        dec: percent(at(4), "dec")?,
    })
}

/// An `nvmlDeviceGpuRecoveryAction_t` by name or number.
fn recovery_action(word: &str) -> Result<u32, String> {
    match word {
        "none" => Ok(0),
        "reset" => Ok(1),
        "reboot" => Ok(2),
        "drain-p2p" => Ok(3),
        "drain-and-reset" => Ok(4),
        _ => number(
            word,
            "action (none, reset, reboot, drain-p2p, drain-and-reset)",
        ),
    }
}

/// Parses one line: `Ok(None)` for blank and comment-only lines.
pub fn parse_line(line: &str) -> Result<Option<Command>, String> {
    let line = line.split('#').next().unwrap_or("").trim();
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some((&verb, args)) = words.split_first() else {
        return Ok(None);
    };
    let cmd = match (verb, args) {
        ("xid", [gpu, code]) => Command::Xid {
            target: target(gpu),
            code: number(code, "code")?,
            instance: None,
        },
        ("xid", [gpu, code, gi, ci]) => Command::Xid {
            target: target(gpu),
            code: number(code, "code")?,
            instance: Some((number(gi, "gi")?, number(ci, "ci")?)),
        },
        ("sbe", [gpu]) => Command::Sbe(target(gpu)),
        ("dbe", [gpu]) => Command::Dbe(target(gpu)),
        ("lost", [gpu]) => Command::Lost(target(gpu)),
        ("recover", [gpu]) => Command::Recover(target(gpu)),
        ("remap-pending", [gpu]) => Command::RemapPending(target(gpu)),
        ("remap-failure", [gpu]) => Command::RemapFailure(target(gpu)),
        ("nvlink-down" | "nvlink-up", [gpu, link]) => Command::NvLink {
            target: target(gpu),
            link: number(link, "link")?,
            up: verb == "nvlink-up",
        },
        ("temp", [gpu, "auto"]) => Command::Temp {
            target: target(gpu),
            celsius: None,
        },
        ("temp", [gpu, c]) => Command::Temp {
            target: target(gpu),
            celsius: Some(number(c, "celsius")?),
        },
        ("reset", [gpu]) => Command::Reset(target(gpu)),
        ("ecc-pending", [gpu, state @ ("on" | "off")]) => Command::EccPending {
            target: target(gpu),
            on: *state == "on",
        },
        ("pcie-link", [gpu, "auto"]) => Command::PcieLink {
            target: target(gpu),
            link: None,
        },
        ("pcie-link", [gpu, generation, width]) => Command::PcieLink {
            target: target(gpu),
            link: Some((number(generation, "gen")?, number(width, "width")?)),
        },
        ("mig-fail" | "mig-ok", [gpu, op, rest @ ..])
            if MIG_OPS.contains(op)
                && matches!(rest, [] | ["kill"])
                && (verb == "mig-fail" || rest.is_empty()) =>
        {
            Command::MigFail {
                target: target(gpu),
                op: (*op).to_owned(),
                kill: !rest.is_empty(),
                fail: verb == "mig-fail",
            }
        }
        ("process", [gpu, pid, numbers @ ..]) if numbers.len() <= 5 => Command::Process {
            target: target(gpu),
            pid: number(pid, "pid")?,
            running: true,
            usage: process_usage(numbers)?,
        },
        ("process-end", [gpu, pid]) => Command::Process {
            target: target(gpu),
            pid: number(pid, "pid")?,
            running: false,
            usage: ProcessUsage::default(),
        },
        ("recovery-action", [gpu, action]) => Command::RecoveryAction {
            target: target(gpu),
            action: recovery_action(action)?,
        },
        _ => return Err("unknown command or wrong number of arguments".into()),
    };
    Ok(Some(cmd))
}

/// What a poll of the control file found.
#[derive(Debug, PartialEq, Eq)]
pub enum Growth {
    /// Complete new lines since the last poll (possibly none).
    Lines(Vec<String>),
    /// The file shrank or was replaced: the caller should start over from its beginning.
    Truncated,
}

/// Follows a file the way `tail -f` does, handing out complete lines only.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    /// Bytes consumed so far (always at a line boundary).
    offset: u64,
    /// Inode of the file being followed, to notice it being replaced.
    inode: Option<u64>,
}

impl Tail {
    pub fn new(path: &Path) -> Tail {
        Tail {
            path: path.to_owned(),
            offset: 0,
            inode: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Cheap check: has the file's length changed since the last read?
    pub fn poll(&mut self) -> Growth {
        use std::os::unix::fs::MetadataExt;
        let (len, inode) = match std::fs::metadata(&self.path) {
            Ok(m) => (m.len(), m.ino()),
            // Not created yet (or removed): nothing to do until it appears.
            Err(_) => return Growth::Lines(Vec::new()),
        };
        let replaced = self.inode.is_some_and(|old| old != inode);
        self.inode = Some(inode);
        if len < self.offset || replaced {
            self.offset = 0;
            return Growth::Truncated;
        }
        if len == self.offset {
            return Growth::Lines(Vec::new());
        }
        match self.read_from_offset() {
            Ok(lines) => Growth::Lines(lines),
            Err(_) => Growth::Lines(Vec::new()),
        }
    }

    fn read_from_offset(&mut self) -> std::io::Result<Vec<String>> {
        let mut file = File::open(&self.path)?;
        file.seek(SeekFrom::Start(self.offset))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        // Only consume up to the last newline: a writer may be mid-line.
        let Some(end) = bytes.iter().rposition(|b| *b == b'\n') else {
            return Ok(Vec::new());
        };
        self.offset += end as u64 + 1;
        let text = String::from_utf8_lossy(&bytes[..end]);
        Ok(text.lines().map(str::to_owned).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn parses_every_command() {
        let t0 = Target::Index(0);
        assert_eq!(parse_line("  # just a comment"), Ok(None));
        assert_eq!(parse_line(""), Ok(None));
        assert_eq!(
            parse_line("xid 0 79 # fell off the bus"),
            Ok(Some(Command::Xid {
                target: t0.clone(),
                code: 79,
                instance: None
            }))
        );
        assert_eq!(
            parse_line("xid MIG-abc 31 1 0"),
            Ok(Some(Command::Xid {
                target: Target::Uuid("MIG-abc".into()),
                code: 31,
                instance: Some((1, 0))
            }))
        );
        assert_eq!(
            parse_line("nvlink-down 0 3"),
            Ok(Some(Command::NvLink {
                target: t0.clone(),
                link: 3,
                up: false
            }))
        );
        assert_eq!(
            parse_line("temp 0 auto"),
            Ok(Some(Command::Temp {
                target: t0.clone(),
                celsius: None
            }))
        );
        assert_eq!(
            parse_line("remap-pending 0"),
            Ok(Some(Command::RemapPending(t0)))
        );
        assert_eq!(
            parse_line("ecc-pending 0 off"),
            Ok(Some(Command::EccPending {
                target: Target::Index(0),
                on: false
            }))
        );
        assert_eq!(
            parse_line("pcie-link 0 3 8"),
            Ok(Some(Command::PcieLink {
                target: Target::Index(0),
                link: Some((3, 8))
            }))
        );
        assert_eq!(
            parse_line("recovery-action 2 reboot"),
            Ok(Some(Command::RecoveryAction {
                target: Target::Index(2),
                action: 2
            }))
        );
        assert!(parse_line("recovery-action 2 later").is_err());
        assert!(parse_line("ecc-pending 0 maybe").is_err());
        assert_eq!(
            parse_line("mig-fail 1 create-gi kill"),
            Ok(Some(Command::MigFail {
                target: Target::Index(1),
                op: "create-gi".into(),
                kill: true,
                fail: true
            }))
        );
        assert!(parse_line("mig-fail 1 explode").is_err());
        assert!(parse_line("mig-ok 1 create-gi kill").is_err());
        assert_eq!(
            parse_line("process 0 4242").unwrap(),
            Some(Command::Process {
                target: Target::Index(0),
                pid: 4242,
                running: true,
                usage: ProcessUsage::default(),
            })
        );
        assert!(parse_line("process 0 x").is_err());
        assert!(parse_line("xid 0").is_err());
        assert!(parse_line("explode 0").is_err());
        assert!(parse_line("temp 0 hot").is_err());
    }

    fn process(line: &str) -> (Target, u32, bool, ProcessUsage) {
        match parse_line(line) {
            Ok(Some(Command::Process {
                target,
                pid,
                running,
                usage,
            })) => (target, pid, running, usage),
            other => panic!("{line:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn parses_process_usage_and_instances() {
        let usage = |memory_mib: u64, sm, mem, enc, dec| ProcessUsage {
            memory_bytes: memory_mib << 20,
            sm,
            mem,
            enc,
            dec,
        };
        assert_eq!(
            process("process 3 4242 2048 35"),
            (Target::Index(3), 4242, true, usage(2048, 35, 0, 0, 0))
        );
        assert_eq!(
            process("process 1 7 1 100 0 12 100 # every number"),
            (Target::Index(1), 7, true, usage(1, 100, 0, 12, 100))
        );
        let gi1 = Target::Instance {
            gpu: Box::new(Target::Index(0)),
            gi: 1,
        };
        assert_eq!(
            process("process 0/gi1 4242 1024"),
            (gi1.clone(), 4242, true, usage(1024, 0, 0, 0, 0))
        );
        assert_eq!(
            process("process GPU-abc/gi12 9"),
            (
                Target::Instance {
                    gpu: Box::new(Target::Uuid("GPU-abc".into())),
                    gi: 12
                },
                9,
                true,
                ProcessUsage::default()
            )
        );
        assert_eq!(
            process("process-end 0/gi1 4242"),
            (gi1.clone(), 4242, false, ProcessUsage::default())
        );
        assert_eq!(
            process("process-end 2 4242"),
            (Target::Index(2), 4242, false, ProcessUsage::default())
        );
        // Every other command takes the instance form too.
        assert_eq!(parse_line("sbe 0/gi1"), Ok(Some(Command::Sbe(gi1))));
        // Not an instance: left for the runtime to report as an unknown GPU.
        assert_eq!(
            parse_line("sbe 0/gix"),
            Ok(Some(Command::Sbe(Target::Uuid("0/gix".into()))))
        );
        for bad in [
            "process 0 1 0 101",
            "process 0 1 0 0 0 0 200",
            "process 0 1 0 -1",
            "process 0 1 lots",
            "process 0 1 18446744073709551615",
            "process 0 1 0 0 0 0 0 0",
            "process 0",
            "process-end 0 1 5",
        ] {
            assert!(parse_line(bad).is_err(), "{bad:?} parsed");
        }
        assert!(
            parse_line("process 0 1 0 101")
                .unwrap_err()
                .contains("0 to 100")
        );
    }

    #[test]
    fn tail_hands_out_complete_lines_and_notices_truncation() {
        let path = std::env::temp_dir().join(format!("nvml-mock-tail-{}", std::process::id()));
        std::fs::write(&path, "lost 0\nsbe").unwrap();
        let mut tail = Tail::new(&path);
        assert_eq!(tail.poll(), Growth::Lines(vec!["lost 0".into()]));
        assert_eq!(tail.poll(), Growth::Lines(vec![]));
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b" 1\nxid 0 13\n").unwrap();
        assert_eq!(
            tail.poll(),
            Growth::Lines(vec!["sbe 1".into(), "xid 0 13".into()])
        );
        std::fs::write(&path, "").unwrap();
        assert_eq!(tail.poll(), Growth::Truncated);
        std::fs::remove_file(&path).unwrap();
    }
}
