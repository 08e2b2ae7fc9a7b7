//! Each GPU's remediation kept across a restart (`<state-dir>/remediation.json`): its phase,
//! and the resets gpud ran on it. A gpud killed in the middle of a reset comes back knowing it
//! started one, so it never resets the GPU again blindly; the resets in the window survive,
//! so a GPU that keeps failing escalates however often gpud restarts.
//!
//! Stamped with the boot ID: after a reboot every GPU was reset, so the phases of the last
//! boot are dropped (an escalation asking for that reboot is answered); the reset history is
//! kept, since a GPU that needed three resets before a reboot is no less suspect after it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::metrics::{Metrics, Reading, Saved};
use super::reset_marks::ResetMarks;
use super::{GpuRemediation, Phase};
use crate::files;

/// The record's file in gpud's state directory.
pub fn file_of(state_dir: &Path) -> PathBuf {
    state_dir.join("remediation.json")
}

/// Where Linux says which boot this is.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// The largest record read back (thousands of resets per GPU fit).
const MAX_BYTES: u64 = 1024 * 1024;

/// One GPU's remediation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuRecord {
    pub phase: Phase,
    /// When it entered the phase (seconds since the epoch).
    pub since: u64,
    /// Why it is there.
    pub reason: String,
    /// When it left service (the fault), for the time-to-return histogram.
    #[serde(default)]
    pub out_since: Option<u64>,
    /// When each reset gpud ran on it started (seconds since the epoch), oldest first.
    #[serde(default)]
    pub resets: Vec<u64>,
    /// Resets ever run (the history above is trimmed to the window).
    #[serde(default)]
    pub reset_count: u32,
    /// The escalation's reason (`RebootRequired`, `ResetFailed`, `HardwareSuspected`, …).
    #[serde(default)]
    pub escalation: Option<String>,
    /// The reboot command ran for this escalation (it runs once).
    #[serde(default)]
    pub reboot_asked: bool,
    /// When the last reset gpud ran finished (milliseconds since the epoch), published to the
    /// health watchers (which clear what it cleared) only once the reset GPU passed every
    /// check: a reset not proved never clears a fault.
    #[serde(default)]
    pub last_reset_ms: Option<u64>,
    /// When the reset command gpud ran last exited 0 (milliseconds since the epoch): the time
    /// [`last_reset_ms`](Self::last_reset_ms) takes once the GPU passed its checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_ended_ms: Option<u64>,
    /// What NVML showed that a reset clears, read just before gpud's last reset started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marks_before_reset: Option<ResetMarks>,
    /// The GPU (UUID) whose reset takes this sound one too, as its NVLink peer: while set,
    /// this GPU follows that one's phases and is held out of service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// Why it is held, in words (stable while held: the health verdict quotes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_for: Option<String>,
}

impl GpuRecord {
    /// The inventory's view of it.
    pub fn view(&self) -> GpuRemediation {
        let since = SystemTime::UNIX_EPOCH + Duration::from_secs(self.since);
        GpuRemediation {
            phase: self.phase,
            since: humantime::format_rfc3339_seconds(since).to_string(),
            reason: self.reason.clone(),
            resets: self.reset_count,
            last_reset_ms: self.last_reset_ms,
            held_for: self.held_for.clone().or_else(|| self.out_of_service()),
        }
    }

    /// Why a GPU is held out of service by its phase alone: on its way back (draining,
    /// resetting, verifying) it is not offered to the kubelet before every check passed, and
    /// an escalated one waits for its health verdict to clear without gpud's help. Every
    /// health watcher withdraws a GPU held so; the reason is stable within a phase (the
    /// verdict quotes it).
    fn out_of_service(&self) -> Option<String> {
        match self.phase {
            Phase::Healthy | Phase::Quarantined => None,
            Phase::Draining | Phase::Resetting | Phase::Verifying => Some(format!(
                "it is {} on its way back; it returns to service once its reset passed every check",
                self.phase
            )),
            Phase::Escalated => Some(
                "escalated; it returns to service when its health verdict clears without gpud's reset (a reboot, a person's reset)"
                    .to_owned(),
            ),
        }
    }

    /// A GPU in service.
    pub fn healthy() -> Self {
        GpuRecord {
            phase: Phase::Healthy,
            since: 0,
            reason: String::new(),
            out_since: None,
            resets: Vec::new(),
            reset_count: 0,
            escalation: None,
            reboot_asked: false,
            last_reset_ms: None,
            reset_ended_ms: None,
            marks_before_reset: None,
            leader: None,
            held_for: None,
        }
    }

    /// Resets run within `window` of `now`.
    pub fn resets_within(&self, window: Duration, now: SystemTime) -> usize {
        let now = seconds(now);
        self.resets
            .iter()
            .filter(|&&at| now.saturating_sub(at) < window.as_secs())
            .count()
    }
}

/// The file's shape.
#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    boot_id: String,
    /// By GPU UUID.
    gpus: BTreeMap<String, GpuRecord>,
    /// The counters of this boot, for a restarted gpud and the exporter of another container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    counters: Option<Saved>,
}

/// The records of every GPU and where they are kept.
#[derive(Debug)]
pub struct Records {
    path: Option<PathBuf>,
    boot_id: String,
    pub gpus: BTreeMap<String, GpuRecord>,
    failing: bool,
    /// The counters written with the records, when they are kept.
    counters: Option<Metrics>,
    /// What the file held of this boot's counters.
    loaded_counters: Option<Reading>,
}

impl Records {
    /// What `path` holds for this boot (nothing when `None`, missing or unreadable; said once).
    pub fn load(path: Option<PathBuf>) -> Self {
        let boot_id = std::fs::read_to_string(BOOT_ID)
            .map(|id| id.trim().to_owned())
            .unwrap_or_default();
        Self::load_for_boot(path, boot_id)
    }

    /// [`load`](Self::load) for a given boot ID.
    pub fn load_for_boot(path: Option<PathBuf>, boot_id: String) -> Self {
        let mut records = Records {
            path,
            boot_id,
            gpus: BTreeMap::new(),
            failing: false,
            counters: None,
            loaded_counters: None,
        };
        let Some(path) = records.path.clone() else {
            return records;
        };
        let file: File = match files::read_bytes(&path, MAX_BYTES) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(file) => file,
                Err(err) => {
                    warn!(path = %path.display(), error = %err, "The remediation record is not valid JSON; starting from no record (resets in the window are forgotten)");
                    return records;
                }
            },
            Err(err) if err.is_not_found() => return records,
            Err(err) => {
                warn!(path = %path.display(), error = %crate::logging::error_chain(&err), "Cannot read the remediation record; starting from no record");
                return records;
            }
        };
        let rebooted = file.boot_id != records.boot_id;
        if !rebooted {
            records.loaded_counters = file.counters.map(Reading::from);
        }
        if rebooted {
            info!(path = %path.display(), "The node rebooted since the remediation record was written (every GPU was reset): phases start over, the reset history is kept");
        }
        records.gpus = file
            .gpus
            .into_iter()
            .map(|(uuid, record)| {
                let record = if rebooted {
                    GpuRecord {
                        resets: record.resets,
                        reset_count: record.reset_count,
                        ..GpuRecord::healthy()
                    }
                } else {
                    record
                };
                (uuid, record)
            })
            .collect();
        records
    }

    /// Writes the records (atomically); a failure is said once per failing streak.
    pub fn save(&mut self) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let file = File {
            boot_id: self.boot_id.clone(),
            gpus: self.gpus.clone(),
            counters: self.counters.as_ref().map(|m| Saved::from(&m.read())),
        };
        let written = serde_json::to_vec_pretty(&file)
            .map_err(|e| e.to_string())
            .and_then(|bytes| write(&path, &bytes));
        match written {
            Ok(()) if self.failing => {
                info!(path = %path.display(), "The remediation record is written again");
                self.failing = false;
            }
            Ok(()) => {}
            Err(why) => {
                if !self.failing {
                    warn!(path = %path.display(), error = %why, "Cannot write the remediation record: a restart in the middle of a reset would not know it; give gpud a writable --state-dir");
                }
                self.failing = true;
            }
        }
    }

    /// Keeps `metrics` with the records from now on, counting on from what the file held of
    /// this boot.
    pub fn keep_counters(&mut self, metrics: &Metrics) {
        if let Some(earlier) = self.loaded_counters.take() {
            metrics.restore(earlier);
        }
        self.counters = Some(metrics.clone());
    }

    /// The record of `uuid`.
    pub fn get(&self, uuid: &str) -> GpuRecord {
        self.gpus
            .get(uuid)
            .cloned()
            .unwrap_or_else(GpuRecord::healthy)
    }

    /// Replaces the record of `uuid`.
    pub fn set(&mut self, uuid: &str, record: GpuRecord) {
        self.gpus.insert(uuid.to_owned(), record);
    }
}

/// What another process reads of the record: each GPU's remediation by UUID and the
/// counters.
#[derive(Debug, Clone, Default)]
pub struct View {
    pub gpus: BTreeMap<String, GpuRemediation>,
    pub counters: Option<Reading>,
}

/// The record file, read again when it changes (size or modification time): how the health
/// watchers and the exporter of other containers follow the remediation.
#[derive(Debug)]
pub struct Follower {
    path: PathBuf,
    stamp: Option<(SystemTime, u64)>,
}

impl Follower {
    pub fn new(path: PathBuf) -> Self {
        Follower { path, stamp: None }
    }

    /// The record, when the file changed since the last look.
    pub fn changed(&mut self) -> Option<View> {
        let meta = std::fs::metadata(&self.path).ok()?;
        let stamp = (meta.modified().ok()?, meta.len());
        if self.stamp == Some(stamp) {
            return None;
        }
        self.stamp = Some(stamp);
        let mut records = Records::load(Some(self.path.clone()));
        Some(View {
            gpus: records
                .gpus
                .iter()
                .map(|(uuid, record)| (uuid.clone(), record.view()))
                .collect(),
            counters: records.loaded_counters.take(),
        })
    }
}

/// Each GPU's remediation by UUID as the record in `state_dir` has it, for display (`gpud
/// inventory`): nothing when there is no record of this boot.
pub fn views_in(state_dir: &Path) -> BTreeMap<String, GpuRemediation> {
    Records::load(Some(file_of(state_dir)))
        .gpus
        .iter()
        .map(|(uuid, record)| (uuid.clone(), record.view()))
        .collect()
}

/// Each GPU's remediation by UUID as the record at `path` has it for this boot, read
/// strictly, for a reader that must not take "unreadable" for "nothing held" (`gpud health
/// --once`): no record, or one from another boot, is `Ok` and empty; a record that cannot be
/// read or is not a remediation record is `Err`, a sentence naming the file and what is wrong.
pub fn views_checked(path: &Path) -> Result<BTreeMap<String, GpuRemediation>, String> {
    let bytes = match files::read_bytes(path, MAX_BYTES) {
        Ok(bytes) => bytes,
        Err(err) if err.is_not_found() => return Ok(BTreeMap::new()),
        Err(err) => return Err(crate::logging::error_chain(&err)),
    };
    let file: File = serde_json::from_slice(&bytes)
        .map_err(|err| format!("{}: not a remediation record: {err}", path.display()))?;
    let boot_id = std::fs::read_to_string(BOOT_ID)
        .map(|id| id.trim().to_owned())
        .unwrap_or_default();
    Ok(views_for_boot(file, &boot_id))
}

/// The views a record holds for boot `boot_id`: none when it was written in another boot
/// (the reboot reset every GPU, as [`Records::load`] drops those phases).
fn views_for_boot(file: File, boot_id: &str) -> BTreeMap<String, GpuRemediation> {
    if file.boot_id != boot_id {
        return BTreeMap::new();
    }
    file.gpus
        .iter()
        .map(|(uuid, record)| (uuid.clone(), record.view()))
        .collect()
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    files::write_atomic(path, bytes, 0o600).map_err(|e| crate::logging::error_chain(&e))
}

/// Milliseconds since the epoch.
pub fn millis(at: SystemTime) -> u64 {
    u64::try_from(
        at.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX)
}

/// Seconds since the epoch.
pub fn seconds(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counters_are_kept_with_the_records_for_this_boot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("remediation.json");
        let first = Metrics::default();
        // This boot's ID, as the follower compares with it.
        let mut records = Records::load(Some(path.clone()));
        records.keep_counters(&first);
        first.count("reset", "success");
        records.save();
        // A restarted gpud counts on; the exporter of another container reads them.
        let again = Metrics::default();
        Records::load(Some(path.clone())).keep_counters(&again);
        assert_eq!(again.read(), first.read());
        let view = Follower::new(path.clone()).changed().unwrap();
        assert_eq!(view.counters, Some(first.read()));
        // After a reboot they start from zero.
        let fresh = Metrics::default();
        Records::load_for_boot(Some(path), "another boot".into()).keep_counters(&fresh);
        assert_eq!(fresh.read(), Reading::default());
    }

    #[test]
    fn phases_are_kept_for_this_boot_and_the_reset_history_across_boots() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("remediation.json");
        let mut records = Records::load_for_boot(Some(path.clone()), "boot-a".into());
        records.set(
            "GPU-1",
            GpuRecord {
                phase: Phase::Resetting,
                since: 100,
                reason: "XID 79".into(),
                out_since: Some(90),
                resets: vec![100],
                reset_count: 1,
                escalation: None,
                reboot_asked: false,
                last_reset_ms: None,
                reset_ended_ms: None,
                marks_before_reset: None,
                leader: None,
                held_for: None,
            },
        );
        records.save();
        let same = Records::load_for_boot(Some(path.clone()), "boot-a".into());
        assert_eq!(same.get("GPU-1").phase, Phase::Resetting);
        assert_eq!(same.get("GPU-1").out_since, Some(90));
        let next = Records::load_for_boot(Some(path.clone()), "boot-b".into());
        let gpu = next.get("GPU-1");
        assert_eq!(gpu.phase, Phase::Healthy);
        assert_eq!((gpu.resets, gpu.reset_count), (vec![100], 1));
        assert_eq!(next.get("GPU-2"), GpuRecord::healthy());
    }

    #[test]
    fn a_corrupt_record_starts_from_nothing_and_is_replaced_on_save() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("remediation.json");
        std::fs::write(&path, "{not json").unwrap();
        let mut records = Records::load_for_boot(Some(path.clone()), "b".into());
        assert!(records.gpus.is_empty());
        records.set("GPU-1", GpuRecord::healthy());
        records.save();
        assert!(std::fs::read_to_string(&path).unwrap().contains("GPU-1"));
    }

    #[test]
    fn a_strict_read_fails_on_damage_and_ignores_another_boot() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_of(dir.path());
        assert_eq!(views_checked(&path), Ok(BTreeMap::new()), "no record");
        std::fs::write(&path, "{not json").unwrap();
        let err = views_checked(&path).unwrap_err();
        assert!(
            err.starts_with(&format!("{}: not a remediation record: ", path.display())),
            "{err}"
        );
        let file = |boot: &str| File {
            boot_id: boot.into(),
            gpus: BTreeMap::from([(
                "GPU-1".to_owned(),
                GpuRecord {
                    phase: Phase::Escalated,
                    reason: "XID 79".into(),
                    ..GpuRecord::healthy()
                },
            )]),
            counters: None,
        };
        let views = views_for_boot(file("boot-a"), "boot-a");
        assert_eq!(views["GPU-1"].phase, Phase::Escalated);
        assert_eq!(views["GPU-1"].reason, "XID 79");
        assert!(
            views_for_boot(file("boot-a"), "boot-b").is_empty(),
            "another boot"
        );
    }

    #[test]
    fn resets_count_within_the_window_only() {
        let record = GpuRecord {
            resets: vec![1_000, 5_000, 9_000],
            ..GpuRecord::healthy()
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        assert_eq!(record.resets_within(Duration::from_secs(6_000), now), 2);
        assert_eq!(record.resets_within(Duration::from_secs(100_000), now), 3);
    }
}
