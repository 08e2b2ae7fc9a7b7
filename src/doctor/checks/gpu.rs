//! Per-GPU health: answering at all, persistence, ECC and memory repair, what NVML asks to be
//! done, the PCIe link, NVLinks, clocks, temperature and the kernel log's XIDs. Each check
//! judges every GPU and reports the worst, naming the GPUs concerned.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::{gpu_list, joined};
use crate::doctor::env::Env;
use crate::doctor_report::{Status, Verdict};
use crate::inventory::health::HealthState;
use crate::inventory::{RecoveryAction, Snapshot};
use crate::nvml::GpuPreflight;
use crate::xid::catalog as xid;
use crate::xid::kmsg::{self, KmsgEvent};

/// Fewer degrees than this below the slowdown threshold is a warning.
const TEMPERATURE_MARGIN_C: u32 = 5;

/// Clock event reasons that mean something is wrong (not idle, not an application's clock
/// setting, not the power cap working as designed).
const BAD_THROTTLE: [(u64, &str); 4] = [
    (0x08, "hardware slowdown"),
    (0x20, "software thermal slowdown"),
    (0x40, "hardware thermal slowdown"),
    (0x80, "hardware power brake"),
];
const GPU_IDLE: u64 = 0x01;

/// The GPUs' preflight facts, or the verdict to return when NVML gave none.
fn facts(env: &Env) -> Result<Vec<&GpuPreflight>, Verdict> {
    let all = env.preflight().ok_or_else(|| env.no_nvml())?;
    if all.is_empty() {
        return Err(Verdict::skip("NVML reports no GPUs"));
    }
    Ok(all.iter().filter(|g| !g.signals.lost).collect())
}

/// `gpu.present`
pub fn present(env: &Env) -> Verdict {
    let Some(all) = env.preflight() else {
        return env.no_nvml();
    };
    let uuid = |gpu: u32| {
        env.snapshot()
            .and_then(|s| s.gpu(gpu))
            .map(|g| g.uuid.clone())
            .filter(|u| !u.is_empty())
    };
    let lost: Vec<String> = all
        .iter()
        .filter(|g| g.signals.lost)
        .map(|g| match uuid(g.signals.gpu) {
            Some(uuid) => format!("GPU {} ({uuid})", g.signals.gpu),
            None => format!("GPU {}", g.signals.gpu),
        })
        .collect();
    if lost.is_empty() {
        Verdict::ok(format!("{} GPUs answer", all.len()))
    } else {
        Verdict::fail(
            format!(
                "{} fell off the bus (NVML_ERROR_GPU_IS_LOST)",
                lost.join(", ")
            ),
            "drain the node and reboot it; if it happens again, have the GPU and its slot inspected",
        )
    }
}

/// `gpu.persistence`
pub fn persistence(env: &Env) -> Verdict {
    let gpus = match facts(env) {
        Ok(gpus) => gpus,
        Err(verdict) => return verdict,
    };
    let off: Vec<u32> = gpus
        .iter()
        .filter(|g| g.persistence_mode == Some(false))
        .map(|g| g.signals.gpu)
        .collect();
    if gpus.iter().all(|g| g.persistence_mode.is_none()) {
        Verdict::skip("the driver does not report persistence mode")
    } else if off.is_empty() {
        Verdict::ok("persistence mode on for every GPU")
    } else {
        Verdict::warn(
            format!("persistence mode off on GPU {}", gpu_list(&off)),
            "run nvidia-persistenced (or nvidia-smi -pm 1): without it the driver tears the GPU down between jobs",
        )
    }
}

fn on_off(on: bool) -> &'static str {
    if on { "enabled" } else { "disabled" }
}

/// `gpu.ecc`
pub fn ecc(env: &Env) -> Verdict {
    let gpus = match facts(env) {
        Ok(gpus) => gpus,
        Err(verdict) => return verdict,
    };
    let pending: Vec<String> = gpus
        .iter()
        .filter_map(|g| {
            let (now, after) = g.ecc_mode?;
            (now != after).then(|| {
                format!(
                    "GPU {}: ECC {} now, {} after the next reboot",
                    g.signals.gpu,
                    on_off(now),
                    on_off(after)
                )
            })
        })
        .collect();
    if gpus.iter().all(|g| g.ecc_mode.is_none()) {
        Verdict::skip("no GPU has ECC memory")
    } else if pending.is_empty() {
        Verdict::ok("ECC mode is what it will be after a reboot on every GPU")
    } else {
        Verdict::warn(
            joined(&pending),
            "reboot the node to apply the pending ECC mode (or set it back with nvidia-smi -e)",
        )
    }
}

/// `gpu.memory`
pub fn memory(env: &Env) -> Verdict {
    let gpus = match facts(env) {
        Ok(gpus) => gpus,
        Err(verdict) => return verdict,
    };
    let failed: Vec<String> = gpus
        .iter()
        .filter(|g| g.signals.remap_failure == Some(true))
        .map(|g| format!("GPU {}: row remapping failed", g.signals.gpu))
        .collect();
    if !failed.is_empty() {
        return Verdict::fail(
            joined(&failed),
            "replace the GPU: its memory has no spare rows left and cannot be repaired in the field",
        );
    }
    let pending: Vec<String> = gpus
        .iter()
        .filter_map(|g| {
            let s = &g.signals;
            match (
                s.remap_pending == Some(true),
                s.retired_pages_pending == Some(true),
            ) {
                (true, _) => Some(format!("GPU {}: a row remap is pending", s.gpu)),
                (false, true) => Some(format!("GPU {}: a page retirement is pending", s.gpu)),
                (false, false) => None,
            }
        })
        .collect();
    if pending.is_empty() {
        Verdict::ok("no row remap or page retirement pending")
    } else {
        Verdict::warn(
            joined(&pending),
            "drain the GPU and reset it (nvidia-smi -r -i <index>) or reboot, so the repair takes effect",
        )
    }
}

/// `gpu.recovery`
pub fn recovery(env: &Env) -> Verdict {
    let gpus = match facts(env) {
        Ok(gpus) => gpus,
        Err(verdict) => return verdict,
    };
    if gpus.iter().all(|g| g.recovery_action.is_none()) {
        return Verdict::skip("the driver does not report a recovery action (NVML field 230)");
    }
    let mut worst: Option<(Status, &str)> = None;
    let mut asks = Vec::new();
    for g in &gpus {
        let Some(asked) = g.recovery_action.and_then(RecoveryAction::from_nvml) else {
            continue;
        };
        // Draining peer-to-peer traffic leaves the GPU usable; an unknown action is unproved.
        let status = match asked {
            RecoveryAction::DrainPeerToPeer | RecoveryAction::Unknown(_) => Status::Warn,
            RecoveryAction::Reset | RecoveryAction::Reboot | RecoveryAction::DrainAndReset => {
                Status::Fail
            }
        };
        let action = asked.phrase();
        asks.push(format!("GPU {}: NVML asks for {action}", g.signals.gpu));
        if worst.is_none_or(|(s, _)| status > s) {
            worst = Some((status, action));
        }
    }
    match worst {
        None => Verdict::ok("NVML asks for no recovery action"),
        Some((status, action)) => Verdict {
            status,
            found: joined(&asks),
            fix: Some(format!("drain the node's GPU workloads, then do {action}")),
        },
    }
}

/// `gpu.pcie`
pub fn pcie(env: &Env) -> Verdict {
    let gpus = match facts(env) {
        Ok(gpus) => gpus,
        Err(verdict) => return verdict,
    };
    let mut degraded = Vec::new();
    for g in &gpus {
        let Some(link) = g.pcie else { continue };
        let narrow = link.width < link.max_width;
        // An idle GPU lowers its link generation to save power; only a busy one is judged.
        let idle = g.throttle_reasons.is_some_and(|r| r & GPU_IDLE != 0);
        let slow = link.generation < link.max_generation && !idle;
        if narrow || slow {
            degraded.push(format!(
                "GPU {}: PCIe Gen{} x{}, maximum Gen{} x{}",
                g.signals.gpu, link.generation, link.width, link.max_generation, link.max_width
            ));
        }
    }
    if gpus.iter().all(|g| g.pcie.is_none()) {
        Verdict::skip("the driver does not report PCIe link state")
    } else if degraded.is_empty() {
        Verdict::ok("every PCIe link at its maximum width (and generation under load)")
    } else {
        Verdict::warn(
            joined(&degraded),
            "reseat the GPU and check its riser, slot and BIOS PCIe settings: a degraded link cuts host-to-GPU bandwidth",
        )
    }
}

/// `gpu.nvlink`
pub fn nvlink(env: &Env) -> Verdict {
    let gpus = match facts(env) {
        Ok(gpus) => gpus,
        Err(verdict) => return verdict,
    };
    // Links past the last one that is up or has a known peer were never trained (a board
    // with fewer links wired than the chip has); below it, an inactive link is down.
    let last_wired = |g: &GpuPreflight| {
        let known = env
            .snapshot()
            .and_then(|s| s.gpu(g.signals.gpu))
            .map(|gpu| {
                gpu.nvlinks
                    .iter()
                    .filter(|l| l.remote.is_some())
                    .map(|l| l.link)
                    .max()
            });
        let up = g
            .signals
            .nvlinks_up
            .iter()
            .filter(|(_, up)| *up)
            .map(|(l, _)| *l)
            .max();
        known.flatten().max(up)
    };
    let wired = |g: &GpuPreflight, link: u32| last_wired(g).is_some_and(|last| link <= last);
    let mut down = Vec::new();
    let mut up = 0;
    for g in &gpus {
        let links: Vec<u32> = g
            .signals
            .nvlinks_up
            .iter()
            .filter(|(link, _)| wired(g, *link))
            .filter_map(|(link, is_up)| {
                if *is_up {
                    up += 1;
                    None
                } else {
                    Some(*link)
                }
            })
            .collect();
        if !links.is_empty() {
            let plural = if links.len() == 1 { "" } else { "s" };
            down.push(format!(
                "GPU {}: NVLink{plural} {} down",
                g.signals.gpu,
                gpu_list(&links)
            ));
        }
    }
    if down.is_empty() && up == 0 {
        Verdict::skip("no NVLinks")
    } else if down.is_empty() {
        Verdict::ok(format!("all {up} NVLinks up"))
    } else {
        Verdict::fail(
            joined(&down),
            "drain the GPU and reset it; if the link stays down, inspect the NVLink cabling or baseboard (nvidia-smi nvlink -s)",
        )
    }
}

/// `gpu.throttle`
pub fn throttle(env: &Env) -> Verdict {
    let gpus = match facts(env) {
        Ok(gpus) => gpus,
        Err(verdict) => return verdict,
    };
    let held: Vec<String> = gpus
        .iter()
        .filter_map(|g| {
            let reasons = g.throttle_reasons?;
            let names: Vec<&str> = BAD_THROTTLE
                .iter()
                .filter(|(bit, _)| reasons & bit != 0)
                .map(|(_, name)| *name)
                .collect();
            (!names.is_empty()).then(|| format!("GPU {}: {}", g.signals.gpu, names.join(", ")))
        })
        .collect();
    if gpus.iter().all(|g| g.throttle_reasons.is_none()) {
        Verdict::skip("the driver does not report clock event reasons")
    } else if held.is_empty() {
        Verdict::ok("no thermal or hardware slowdown")
    } else {
        Verdict::warn(
            joined(&held),
            "check cooling, airflow and power supplies (nvidia-smi -q -d PERFORMANCE shows the reasons)",
        )
    }
}

/// `gpu.temperature`
pub fn temperature(env: &Env) -> Verdict {
    let gpus = match facts(env) {
        Ok(gpus) => gpus,
        Err(verdict) => return verdict,
    };
    let mut worst = Status::Ok;
    let mut hot = Vec::new();
    let mut lowest_margin: Option<u32> = None;
    for g in &gpus {
        let (Some(t), Some(slowdown)) = (g.signals.temperature_c, g.signals.slowdown_c) else {
            continue;
        };
        let margin = slowdown.saturating_sub(t);
        lowest_margin = Some(lowest_margin.map_or(margin, |m| m.min(margin)));
        let status = if t >= slowdown {
            Status::Fail
        } else if margin < TEMPERATURE_MARGIN_C {
            Status::Warn
        } else {
            continue;
        };
        worst = worst.max(status);
        hot.push(format!(
            "GPU {}: {t} °C, slowdown at {slowdown} °C",
            g.signals.gpu
        ));
    }
    match lowest_margin {
        None => Verdict::skip("the driver does not report temperatures"),
        Some(margin) if hot.is_empty() => {
            Verdict::ok(format!("at least {margin} °C below the slowdown threshold"))
        }
        Some(_) => Verdict {
            status: worst,
            found: joined(&hot),
            fix: Some(
                "check cooling and airflow; a GPU at its slowdown threshold runs at reduced clocks"
                    .to_owned(),
            ),
        },
    }
}

/// The kernel log to read: `--kmsg`, else the host's `/dev/kmsg`.
fn kmsg_path(env: &Env) -> PathBuf {
    env.options
        .kmsg
        .clone()
        .unwrap_or_else(|| env.host.path("/dev/kmsg"))
}

/// Everything in the kernel log now: `/dev/kmsg` record by record without waiting for more,
/// or a file's whole text.
pub fn read_kernel_log(path: &Path) -> std::io::Result<String> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)?;
    if !file.metadata()?.file_type().is_char_device() {
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        return Ok(text);
    }
    let mut text = String::new();
    let mut record = vec![0u8; 8192];
    loop {
        match file.read(&mut record) {
            Ok(0) => break,
            Ok(n) => {
                text.push_str(&String::from_utf8_lossy(&record[..n]));
                if !text.ends_with('\n') {
                    text.push('\n');
                }
            }
            // Records overwritten before this read: carry on with the next one.
            Err(err) if err.raw_os_error() == Some(nix::libc::EPIPE) => {}
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(err) => return Err(err),
        }
    }
    Ok(text)
}

/// `gpu.xid`: inside `gpud run`, the health watcher's verdicts (the XIDs of the boot listed
/// as information); standalone, the kernel log's XIDs judged by the node's XID policy.
pub fn xid(env: &Env) -> Verdict {
    let path = kmsg_path(env);
    let logged = read_kernel_log(&path)
        .map_err(|err| format!("cannot read the kernel log {}: {err}", path.display()));
    match &env.options.watched {
        Some(watched) => {
            let (policy, _) = node_policy(env);
            let listed = logged
                .as_deref()
                .map(|text| logged_xids(env, text, Some(&policy)));
            from_watcher(watched, listed)
        }
        None => match logged {
            Ok(text) => from_kernel_log(env, &text),
            Err(why) => Verdict::skip(why),
        },
    }
}

/// One kernel-log XID on one GPU, as counted for the report.
struct Logged {
    gpu: String,
    code: u32,
    count: u64,
    /// The policy's judgement (`None`: ignored), when it was asked.
    judged: Option<Option<HealthState>>,
}

impl Logged {
    /// The state the policy gives this XID; `None` when ignored or not judged.
    fn state(&self) -> Option<HealthState> {
        self.judged.flatten()
    }

    fn line(&self) -> String {
        let info = xid::lookup(self.code);
        let ignored = match self.judged {
            Some(None) => "(ignored by policy) ",
            _ => "",
        };
        let times = if self.count == 1 {
            String::new()
        } else {
            format!(" ({} times)", self.count)
        };
        format!(
            "{}: XID {} {ignored}{}{times}",
            self.gpu, self.code, info.description
        )
    }
}

/// The kernel log's XIDs per GPU and code, judged by `policy` when one is given.
fn logged_xids(env: &Env, text: &str, policy: Option<&xid::XidPolicy>) -> Vec<Logged> {
    let gpu_of = |event: &KmsgEvent| {
        env.snapshot()
            .and_then(|s| {
                // The kernel prints no function number: match domain, bus and device.
                let slot = |id: &crate::inventory::PciBusId| {
                    id.address().map(|a| (a.domain, a.bus, a.device))
                };
                let wanted = slot(event.pci_bus_id())?;
                s.gpus.iter().find(|g| slot(&g.pci.bus_id) == Some(wanted))
            })
            .map_or_else(
                || format!("PCI {}", event.pci_bus_id().nvml()),
                |g| format!("GPU {}", g.index),
            )
    };
    let mut seen: BTreeMap<(String, u32), u64> = BTreeMap::new();
    for event in kmsg::parse_text(text) {
        if let KmsgEvent::Xid { code, .. } = &event {
            *seen.entry((gpu_of(&event), *code)).or_default() += 1;
        }
    }
    seen.into_iter()
        .map(|((gpu, code), count)| Logged {
            gpu,
            code,
            count,
            judged: policy.map(|p| p.judge(code)),
        })
        .collect()
}

/// The XID policy `gpud run` would apply: its config file's `health.xid` (when the run was
/// given one and it reads) with the `DP_*` variables. A file that does not read is
/// `config.gpud`'s finding; here the variables alone apply, and the note says so.
fn node_policy(env: &Env) -> (xid::XidPolicy, Option<String>) {
    let (section, note) = match crate::config::load_optional(env.options.gpud_config.as_deref()) {
        Ok(config) => (config.health.xid, None),
        Err(_) => (
            xid::XidPolicyConfig::default(),
            Some(
                "gpud's config file does not read (see config.gpud): judged without its health.xid"
                    .to_owned(),
            ),
        ),
    };
    (crate::xid::configured::policy(&section).0, note)
}

/// The standalone verdict: every XID of the boot judged as the health watcher would judge it.
fn from_kernel_log(env: &Env, text: &str) -> Verdict {
    let (policy, note) = node_policy(env);
    let logged = logged_xids(env, text, Some(&policy));
    if logged.is_empty() {
        return Verdict::ok("no XIDs in the kernel log since boot");
    }
    // The worst by the state the policy gives, then by the catalog's severity.
    let worst = logged
        .iter()
        .filter(|l| l.state().is_some())
        .max_by_key(|l| (l.state(), xid::lookup(l.code).severity));
    let mut found: Vec<String> = logged.iter().map(Logged::line).collect();
    found.extend(note);
    let status = match worst.and_then(Logged::state) {
        None | Some(HealthState::Healthy) => Status::Ok,
        Some(HealthState::Degraded) => Status::Warn,
        Some(HealthState::Unhealthy) => Status::Fail,
    };
    Verdict {
        status,
        found: joined(&found),
        fix: worst.filter(|_| status != Status::Ok).map(|w| {
            let info = xid::lookup(w.code);
            format!(
                "{} (XID {}, the most severe)",
                info.action.phrase(),
                info.code
            )
        }),
    }
}

/// Inside `gpud run`: the GPUs (and MIG devices) the health watcher holds out of service, or
/// degraded, for an XID. A GPU the watcher saw recover passes, whatever the kernel log still
/// holds.
fn from_watcher(watched: &Snapshot, logged: Result<Vec<Logged>, &String>) -> Verdict {
    let mut worst = HealthState::Healthy;
    let mut action = None;
    let mut held = Vec::new();
    let devices = watched.gpus.iter().flat_map(|gpu| {
        std::iter::once((format!("GPU {}", gpu.index), &gpu.health)).chain(
            gpu.mig
                .devices
                .iter()
                .map(move |m| (format!("GPU {} MIG {}", gpu.index, m.index), &m.health)),
        )
    });
    for (name, health) in devices {
        let Some(code) = health.xid.filter(|_| !health.is_healthy()) else {
            continue;
        };
        held.push(format!(
            "{name}: {} ({})",
            health.state.word(),
            health
                .reason
                .clone()
                .unwrap_or_else(|| format!("XID {code}"))
        ));
        if health.state > worst {
            worst = health.state;
            action = health.action.clone();
        }
    }
    let since_boot = match logged {
        Ok(logged) if logged.is_empty() => "no XIDs in the kernel log since boot".to_owned(),
        Ok(logged) => format!(
            "in the kernel log since boot: {}",
            logged
                .iter()
                .map(Logged::line)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Err(why) => why.clone(),
    };
    if held.is_empty() {
        return Verdict::ok(format!(
            "the health watcher holds no GPU out of service for an XID; {since_boot}"
        ));
    }
    held.push(since_boot);
    Verdict {
        status: match worst {
            HealthState::Unhealthy => Status::Fail,
            _ => Status::Warn,
        },
        found: joined(&held),
        fix: Some(action.unwrap_or_else(|| "drain the GPU and reset it".to_owned())),
    }
}
