//! Live telemetry for the exporter: one sample of every GPU and GPU instance, as plain data.
//!
//! The caller says what to read ([`TelemetryPlan`]) and which devices exist ([`GpuTarget`],
//! taken from the inventory); [`Sampler::sample`] makes the NVML calls and returns readings in
//! NVML's own units (mW, mJ, bytes, KB/s, KiB, percent). Converting them into metric values is
//! the exporter's job, not this module's.
//!
//! Failure is per GPU: a GPU that answers `NVML_ERROR_GPU_IS_LOST` to any call is reported
//! [`SampleStatus::Lost`] with no readings, a GPU whose handle NVML refuses for another reason
//! is [`SampleStatus::Failed`], and a query a GPU does not support simply leaves that reading
//! out. Only a failing device count is a node-wide failure.
//!
//! GPM (GPU Performance Monitoring, Hopper and newer) metrics are computed between the sample
//! of this call and the one of the previous call, so the first call has none. The sampler
//! keeps two GPM samples per GPU and per GPU instance and alternates between them; it never
//! allocates a sample per reading.

use std::collections::HashMap;

use nvml_wrapper::Device;
use nvml_wrapper::GpmSample;
use nvml_wrapper::enum_wrappers::device::{Clock, PcieUtilCounter, TemperatureSensor};
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError as E;
use nvml_wrapper_sys::bindings::field_id as f;

use super::processes::{self, ProcessUsage, ProcessesRead};
use super::{Nvml, raw};

/// One quantity NVML reports, in NVML's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reading {
    /// SM clock, MHz.
    SmClockMhz,
    /// Memory clock, MHz.
    MemClockMhz,
    /// GPU core temperature, °C.
    GpuTempC,
    /// HBM temperature, °C.
    MemoryTempC,
    /// Board power draw, mW.
    PowerMw,
    /// Enforced power limit, mW.
    PowerLimitMw,
    /// Energy since the driver was loaded, mJ.
    EnergyMj,
    /// PCIe replays (retries) since the driver was loaded.
    PcieReplays,
    /// GPU utilisation, percent.
    GpuUtilPct,
    /// Memory-controller utilisation, percent.
    MemUtilPct,
    /// Encoder utilisation, percent.
    EncUtilPct,
    /// Decoder utilisation, percent.
    DecUtilPct,
    /// Framebuffer size, bytes (per GPU instance on MIG GPUs).
    FbTotalBytes,
    /// Framebuffer free, bytes (per GPU instance on MIG GPUs).
    FbFreeBytes,
    /// Framebuffer in use, bytes (per GPU instance on MIG GPUs).
    FbUsedBytes,
    /// Framebuffer reserved by the driver, bytes (per GPU instance on MIG GPUs).
    FbReservedBytes,
    /// PCIe transmit throughput over NVML's last sample window, KB/s.
    PcieTxKbps,
    /// PCIe receive throughput, KB/s.
    PcieRxKbps,
    /// NVLink data sent and received over all links since the driver was loaded, KiB.
    NvLinkDataKib,
    /// Rows remapped for correctable errors.
    RemappedCorrectable,
    /// Rows remapped for uncorrectable errors.
    RemappedUncorrectable,
    /// A row remap waits for a GPU reset (0/1).
    RemapPending,
    /// A row remap failed (0/1).
    RemapFailure,
    /// Corrected ECC errors since the last driver load.
    EccSbeVolatile,
    /// Uncorrected ECC errors since the last driver load.
    EccDbeVolatile,
    /// Corrected ECC errors over the GPU's life.
    EccSbeAggregate,
    /// Uncorrected ECC errors over the GPU's life.
    EccDbeAggregate,
    /// Pages retired for multiple single-bit errors.
    RetiredSbe,
    /// Pages retired for double-bit errors.
    RetiredDbe,
    /// Page retirements waiting for a reset (0/1).
    RetiredPending,
    /// NVLink flow-control CRC errors, all links.
    NvLinkCrcFlitErrors,
    /// NVLink data CRC errors, all links.
    NvLinkCrcDataErrors,
    /// NVLink replay errors, all links.
    NvLinkReplayErrors,
    /// NVLink recovery errors, all links.
    NvLinkRecoveryErrors,
    /// Performance state (0 = P0).
    PState,
    /// Fan speed, percent.
    FanSpeedPct,
}

impl Reading {
    /// Whether a GPU instance has its own value of this reading (the framebuffer); every
    /// other reading belongs to the whole GPU.
    pub fn per_instance(self) -> bool {
        matches!(
            self,
            Reading::FbTotalBytes
                | Reading::FbFreeBytes
                | Reading::FbUsedBytes
                | Reading::FbReservedBytes
        )
    }
}

/// GPM metrics a GPU instance can report on its own (engine activity); interconnect metrics
/// are per GPU.
pub fn gpm_per_instance(metric: GpmMetricId) -> bool {
    !matches!(
        metric,
        GpmMetricId::PcieTxPerSec
            | GpmMetricId::PcieRxPerSec
            | GpmMetricId::NvlinkTotalTxPerSec
            | GpmMetricId::NvlinkTotalRxPerSec
    )
}

/// What to read in every sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TelemetryPlan {
    /// Readings, without duplicates.
    pub readings: Vec<Reading>,
    /// GPM metrics, without duplicates (at most 98, NVML's limit per call).
    pub gpm: Vec<GpmMetricId>,
    /// Read the processes on each GPU, with their memory and utilisation
    /// ([`super::processes`]).
    pub processes: bool,
    /// Readings that only stand in for GPM metrics: not read on a GPU whose GPM metrics
    /// are due this cycle. They matter: `nvmlDeviceGetPcieThroughput` samples for 20 ms per
    /// call (measured on an H200), so reading both directions made a cycle take 42 ms per
    /// GPU.
    pub gpm_fallbacks: Vec<Reading>,
}

/// One GPU to sample, as the inventory describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTarget {
    /// NVML index.
    pub index: u32,
    /// The GPU's NVLink numbers (for the per-link throughput counters).
    pub nvlinks: Vec<u32>,
    /// GPU instances of a MIG-enabled GPU; empty otherwise.
    pub instances: Vec<InstanceTarget>,
}

/// One GPU instance to sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceTarget {
    /// NVML GPU-instance id.
    pub gpu_instance_id: u32,
    /// Index of one MIG device inside the instance (any; they share the instance's memory).
    pub mig_device_index: u32,
}

/// Whether a GPU could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SampleStatus {
    /// Read; unsupported queries are simply missing.
    Ok,
    /// NVML reports the GPU lost (fallen off the bus).
    Lost,
    /// NVML refused the GPU's handle for another reason.
    Failed(String),
}

/// One GPU's readings.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTelemetry {
    /// NVML index.
    pub index: u32,
    /// Whether it could be read.
    pub status: SampleStatus,
    /// Readings the GPU answered, in plan order.
    pub values: Vec<(Reading, u64)>,
    /// GPM metrics between the previous sample and this one.
    pub gpm: Vec<(GpmMetricId, f64)>,
    /// GPU instances, in target order.
    pub instances: Vec<InstanceTelemetry>,
    /// The processes on the GPU, when the plan asks for them and NVML lists them.
    pub processes: Option<Vec<ProcessUsage>>,
}

impl GpuTelemetry {
    /// A reading of the whole GPU.
    pub fn value(&self, reading: Reading) -> Option<u64> {
        find(&self.values, reading)
    }

    /// A GPM metric of the whole GPU.
    pub fn gpm(&self, metric: GpmMetricId) -> Option<f64> {
        find(&self.gpm, metric)
    }
}

/// One GPU instance's own readings (framebuffer and GPM activity).
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceTelemetry {
    /// NVML GPU-instance id.
    pub gpu_instance_id: u32,
    /// Per-instance readings.
    pub values: Vec<(Reading, u64)>,
    /// Per-instance GPM metrics.
    pub gpm: Vec<(GpmMetricId, f64)>,
}

impl InstanceTelemetry {
    /// A reading of the instance.
    pub fn value(&self, reading: Reading) -> Option<u64> {
        find(&self.values, reading)
    }

    /// A GPM metric of the instance.
    pub fn gpm(&self, metric: GpmMetricId) -> Option<f64> {
        find(&self.gpm, metric)
    }
}

fn find<K: PartialEq + Copy, V: Copy>(list: &[(K, V)], key: K) -> Option<V> {
    list.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// One sample of the node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTelemetry {
    /// Whether NVML answered the device count.
    pub nvml_up: bool,
    /// Every target GPU, in target order.
    pub gpus: Vec<GpuTelemetry>,
}

/// GPM samples of one GPU or instance: the latest, and a spare (the one before it) that the
/// next call refills, so two samples take turns for the life of the device.
struct GpmPair {
    latest: GpmSample<'static>,
    spare: Option<GpmSample<'static>>,
}

/// Takes samples; keeps the GPM state that spans samples.
pub struct Sampler {
    lib: &'static nvml_wrapper::Nvml,
    /// GPM sample pairs by `(GPU index, GPU instance)`.
    gpm: HashMap<(u32, Option<u32>), GpmPair>,
    /// Per GPU index, the newest per-process utilisation sample already read.
    process_samples_seen: HashMap<u32, u64>,
    /// Whether a GPU's process list was found unavailable (logged once).
    processes_unavailable: bool,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("gpm_pairs", &self.gpm.len())
            .finish()
    }
}

impl Nvml {
    /// A sampler for the exporter.
    pub fn sampler(&self) -> Sampler {
        Sampler {
            lib: self.lib,
            gpm: HashMap::new(),
            process_samples_seen: HashMap::new(),
            processes_unavailable: false,
        }
    }

    /// Which GPUs support GPM, by index (a GPU that does not answer counts as unsupported).
    /// Blocks on the driver.
    pub fn gpm_support(&self) -> Vec<(u32, bool)> {
        let count = self.lib.device_count().unwrap_or(0);
        (0..count)
            .map(|index| {
                let supported = self
                    .lib
                    .device_by_index(index)
                    .and_then(|d| d.gpm_support())
                    .unwrap_or(false);
                (index, supported)
            })
            .collect()
    }
}

impl Sampler {
    /// Reads every target. Blocks on the driver.
    pub fn sample(&mut self, plan: &TelemetryPlan, targets: &[GpuTarget]) -> NodeTelemetry {
        let nvml_up = self.lib.device_count().is_ok();
        let gpus = targets
            .iter()
            .map(|target| self.sample_gpu(plan, target))
            .collect();
        // GPM pairs of devices that are gone (lost, or a MIG layout that changed) are freed.
        self.gpm.retain(|(gpu, gi), _| {
            targets.iter().any(|t| {
                t.index == *gpu
                    && gi.is_none_or(|gi| t.instances.iter().any(|i| i.gpu_instance_id == gi))
            })
        });
        NodeTelemetry { nvml_up, gpus }
    }

    fn sample_gpu(&mut self, plan: &TelemetryPlan, target: &GpuTarget) -> GpuTelemetry {
        let mut out = GpuTelemetry {
            index: target.index,
            status: SampleStatus::Ok,
            values: Vec::new(),
            gpm: Vec::new(),
            instances: Vec::new(),
            processes: None,
        };
        let device = match self.lib.device_by_index(target.index) {
            Ok(device) => device,
            Err(err) => {
                out.status = match err {
                    E::GpuLost => SampleStatus::Lost,
                    other => SampleStatus::Failed(other.to_string()),
                };
                self.forget_gpu(target.index);
                return out;
            }
        };
        let mut lost = false;
        // GPM answers from the second sample of a GPU on; until then the fallbacks stand in.
        let gpm_due = !plan.gpm.is_empty() && self.gpm.contains_key(&(target.index, None));
        let skip: &[Reading] = if gpm_due { &plan.gpm_fallbacks } else { &[] };
        out.values = read_gpu(self.lib, &device, plan, skip, target, &mut lost);
        if !plan.gpm.is_empty() && !lost {
            out.gpm = self.gpm_metrics(&device, target.index, None, &plan.gpm, &mut lost);
        }
        for instance in &target.instances {
            if lost {
                break;
            }
            let values = read_instance(&device, plan, instance, &mut lost);
            let metrics: Vec<GpmMetricId> = plan
                .gpm
                .iter()
                .copied()
                .filter(|m| gpm_per_instance(*m))
                .collect();
            let gpm = if metrics.is_empty() {
                Vec::new()
            } else {
                self.gpm_metrics(
                    &device,
                    target.index,
                    Some(instance.gpu_instance_id),
                    &metrics,
                    &mut lost,
                )
            };
            out.instances.push(InstanceTelemetry {
                gpu_instance_id: instance.gpu_instance_id,
                values,
                gpm,
            });
        }
        if plan.processes && !lost {
            let seen = self.process_samples_seen.entry(target.index).or_insert(0);
            match processes::read(&device, seen) {
                ProcessesRead::Read(list) => out.processes = Some(list),
                ProcessesRead::Lost => lost = true,
                ProcessesRead::Unavailable(why) => {
                    if !self.processes_unavailable {
                        self.processes_unavailable = true;
                        tracing::warn!(gpu = target.index, error = %why, "Per-process GPU use is not available from this driver; the per-pod usage metrics are left out");
                    }
                }
            }
        }
        if lost {
            // A GPU that fell off the bus mid-sample reports nothing: half a sample would mix
            // live values with missing ones.
            out.status = SampleStatus::Lost;
            out.values.clear();
            out.gpm.clear();
            out.instances.clear();
            out.processes = None;
            self.forget_gpu(target.index);
        }
        out
    }

    fn forget_gpu(&mut self, index: u32) {
        self.gpm.retain(|(gpu, _), _| *gpu != index);
        self.process_samples_seen.remove(&index);
    }

    /// GPM metrics since the previous call for this GPU or instance (none the first time).
    fn gpm_metrics(
        &mut self,
        device: &Device<'static>,
        gpu: u32,
        instance: Option<u32>,
        metrics: &[GpmMetricId],
        lost: &mut bool,
    ) -> Vec<(GpmMetricId, f64)> {
        let key = (gpu, instance);
        let fresh = |device: &Device<'static>| match instance {
            None => device.gpm_sample(),
            Some(id) => device.gpm_mig_sample(id),
        };
        let result = match self.gpm.remove(&key) {
            // First time: one sample now, metrics from the next call on.
            None => fresh(device).map(|latest| {
                self.gpm.insert(
                    key,
                    GpmPair {
                        latest,
                        spare: None,
                    },
                );
                Vec::new()
            }),
            Some(GpmPair { latest, spare }) => {
                let next = match spare {
                    Some(spare) => {
                        raw::gpm_fill(self.lib, device, instance, &spare).map(|()| spare)
                    }
                    None => fresh(device),
                };
                next.and_then(|next| {
                    let values = nvml_wrapper::gpm::gpm_metrics_get(
                        self.lib, &latest, &next, metrics,
                    )
                    .map(|results| {
                        metrics
                            .iter()
                            .zip(results)
                            .filter_map(|(m, r)| r.ok().map(|r| (*m, r.value)))
                            .collect()
                    });
                    self.gpm.insert(
                        key,
                        GpmPair {
                            latest: next,
                            spare: Some(latest),
                        },
                    );
                    values
                })
            }
        };
        match result {
            Ok(values) => values,
            Err(err) => {
                if matches!(err, E::GpuLost) {
                    *lost = true;
                }
                self.gpm.remove(&key);
                Vec::new()
            }
        }
    }
}

/// The whole-GPU readings of the plan.
fn read_gpu(
    lib: &nvml_wrapper::Nvml,
    device: &Device<'_>,
    plan: &TelemetryPlan,
    skip: &[Reading],
    target: &GpuTarget,
    lost: &mut bool,
) -> Vec<(Reading, u64)> {
    let mut out = Vec::with_capacity(plan.readings.len());
    let mut keep = |reading: Reading, result: Result<u64, E>| match result {
        Ok(v) => out.push((reading, v)),
        Err(E::GpuLost) => *lost = true,
        Err(_) => {}
    };
    let wants = |r: Reading| plan.readings.contains(&r);

    // Calls that answer several readings at once are made once.
    let memory = [
        Reading::FbTotalBytes,
        Reading::FbFreeBytes,
        Reading::FbUsedBytes,
        Reading::FbReservedBytes,
    ]
    .into_iter()
    .any(wants)
    .then(|| device.memory_info());
    let utilization = [Reading::GpuUtilPct, Reading::MemUtilPct]
        .into_iter()
        .any(wants)
        .then(|| device.utilization_rates());
    let remap = [
        Reading::RemappedCorrectable,
        Reading::RemappedUncorrectable,
        Reading::RemapPending,
        Reading::RemapFailure,
    ]
    .into_iter()
    .any(wants)
    .then(|| raw::remapped_rows(lib, device));
    let fields = read_fields(lib, device, plan, target);

    for &reading in plan.readings.iter().filter(|r| !skip.contains(r)) {
        let value = match reading {
            Reading::SmClockMhz => device.clock_info(Clock::SM).map(u64::from),
            Reading::MemClockMhz => device.clock_info(Clock::Memory).map(u64::from),
            Reading::GpuTempC => device.temperature(TemperatureSensor::Gpu).map(u64::from),
            Reading::PowerMw => device.power_usage().map(u64::from),
            Reading::PowerLimitMw => device.enforced_power_limit().map(u64::from),
            Reading::EnergyMj => device.total_energy_consumption(),
            Reading::PcieReplays => device.pcie_replay_counter().map(u64::from),
            Reading::GpuUtilPct | Reading::MemUtilPct => match &utilization {
                Some(Ok(u)) => Ok(u64::from(if reading == Reading::GpuUtilPct {
                    u.gpu
                } else {
                    u.memory
                })),
                Some(Err(err)) => Err(clone_err(err)),
                None => continue,
            },
            Reading::EncUtilPct => device
                .encoder_utilization()
                .map(|u| u64::from(u.utilization)),
            Reading::DecUtilPct => device
                .decoder_utilization()
                .map(|u| u64::from(u.utilization)),
            Reading::FbTotalBytes
            | Reading::FbFreeBytes
            | Reading::FbUsedBytes
            | Reading::FbReservedBytes => match &memory {
                Some(Ok(m)) => Ok(memory_part(reading, m.total, m.free, m.used, m.reserved)),
                Some(Err(err)) => Err(clone_err(err)),
                None => continue,
            },
            Reading::PcieTxKbps => device.pcie_throughput(PcieUtilCounter::Send).map(u64::from),
            Reading::PcieRxKbps => device
                .pcie_throughput(PcieUtilCounter::Receive)
                .map(u64::from),
            Reading::RemappedCorrectable
            | Reading::RemappedUncorrectable
            | Reading::RemapPending
            | Reading::RemapFailure => match &remap {
                Some(Ok((corrected, uncorrected, pending, failure))) => Ok(match reading {
                    Reading::RemappedCorrectable => u64::from(*corrected),
                    Reading::RemappedUncorrectable => u64::from(*uncorrected),
                    Reading::RemapPending => u64::from(*pending),
                    _ => u64::from(*failure),
                }),
                Some(Err(err)) => Err(clone_err(err)),
                None => continue,
            },
            Reading::EccSbeVolatile => {
                device.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            }
            Reading::EccDbeVolatile => {
                device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            }
            Reading::EccSbeAggregate => {
                device.total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate)
            }
            Reading::EccDbeAggregate => {
                device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
            }
            Reading::PState => device.performance_state().map(|p| u64::from(p.as_c())),
            Reading::FanSpeedPct => device.fan_speed(0).map(u64::from),
            Reading::MemoryTempC
            | Reading::NvLinkDataKib
            | Reading::RetiredSbe
            | Reading::RetiredDbe
            | Reading::RetiredPending
            | Reading::NvLinkCrcFlitErrors
            | Reading::NvLinkCrcDataErrors
            | Reading::NvLinkReplayErrors
            | Reading::NvLinkRecoveryErrors => match fields.iter().find(|(r, _)| *r == reading) {
                Some((_, result)) => match result {
                    Ok(v) => Ok(*v),
                    Err(err) => Err(clone_err(err)),
                },
                None => continue,
            },
        };
        keep(reading, value);
    }
    out
}

/// `nvmlDeviceGetFieldValues` readings, in one call. The NVLink data counter is the sum of
/// the per-link transmit and receive counters; it is missing if any link refuses.
fn read_fields(
    lib: &nvml_wrapper::Nvml,
    device: &Device<'_>,
    plan: &TelemetryPlan,
    target: &GpuTarget,
) -> Vec<(Reading, Result<u64, E>)> {
    let simple: Vec<(Reading, u32)> = plan
        .readings
        .iter()
        .filter_map(|&r| {
            let id = match r {
                Reading::MemoryTempC => f::NVML_FI_DEV_MEMORY_TEMP,
                Reading::RetiredSbe => f::NVML_FI_DEV_RETIRED_SBE,
                Reading::RetiredDbe => f::NVML_FI_DEV_RETIRED_DBE,
                Reading::RetiredPending => f::NVML_FI_DEV_RETIRED_PENDING,
                Reading::NvLinkCrcFlitErrors => f::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
                Reading::NvLinkCrcDataErrors => f::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
                Reading::NvLinkReplayErrors => f::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
                Reading::NvLinkRecoveryErrors => f::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
                _ => return None,
            };
            Some((r, id))
        })
        .collect();
    let nvlink_data = plan.readings.contains(&Reading::NvLinkDataKib) && !target.nvlinks.is_empty();
    let mut requests: Vec<(u32, u32)> = simple.iter().map(|(_, id)| (*id, 0)).collect();
    if nvlink_data {
        for &link in &target.nvlinks {
            requests.push((f::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link));
            requests.push((f::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link));
        }
    }
    if requests.is_empty() {
        return Vec::new();
    }
    let answers = match raw::field_values(lib, device, &requests) {
        Ok(answers) => answers,
        Err(err) => {
            let mut out: Vec<(Reading, Result<u64, E>)> = simple
                .iter()
                .map(|(r, _)| (*r, Err(clone_err(&err))))
                .collect();
            if nvlink_data {
                out.push((Reading::NvLinkDataKib, Err(err)));
            }
            return out;
        }
    };
    let mut answers = answers.into_iter();
    let mut out: Vec<(Reading, Result<u64, E>)> = simple
        .iter()
        .map(|(r, _)| (*r, answers.next().unwrap_or(Err(E::Unknown))))
        .collect();
    if nvlink_data {
        let total = answers.try_fold(0u64, |sum, v| v.map(|v| sum.saturating_add(v)));
        out.push((Reading::NvLinkDataKib, total));
    }
    out
}

/// A GPU instance's own readings: its framebuffer, read through one of its MIG devices.
fn read_instance(
    device: &Device<'_>,
    plan: &TelemetryPlan,
    instance: &InstanceTarget,
    lost: &mut bool,
) -> Vec<(Reading, u64)> {
    let wanted: Vec<Reading> = plan
        .readings
        .iter()
        .copied()
        .filter(|r| r.per_instance())
        .collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let memory = device
        .mig_device_by_index(instance.mig_device_index)
        .and_then(|mig| mig.memory_info());
    match memory {
        Ok(m) => wanted
            .into_iter()
            .map(|r| (r, memory_part(r, m.total, m.free, m.used, m.reserved)))
            .collect(),
        Err(E::GpuLost) => {
            *lost = true;
            Vec::new()
        }
        Err(_) => Vec::new(),
    }
}

fn memory_part(reading: Reading, total: u64, free: u64, used: u64, reserved: u64) -> u64 {
    match reading {
        Reading::FbTotalBytes => total,
        Reading::FbFreeBytes => free,
        Reading::FbUsedBytes => used,
        _ => reserved,
    }
}

/// NVML errors are not `Clone`; the ones a shared answer can carry are re-created.
fn clone_err(err: &E) -> E {
    match err {
        E::GpuLost => E::GpuLost,
        E::NotSupported => E::NotSupported,
        E::NoPermission => E::NoPermission,
        E::InvalidArg => E::InvalidArg,
        _ => E::Unknown,
    }
}
