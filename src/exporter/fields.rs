//! The DCGM fields gpud can export and how each maps onto NVML.
//!
//! Each field keeps dcgm-exporter's meaning and unit: power in W (NVML reports mW), energy in
//! mJ, framebuffer in MiB (NVML reports bytes), clocks in MHz, utilisation 0–100, profiling
//! (`DCGM_FI_PROF_*`) activity as a 0–1 ratio and PCIe/NVLink rates in bytes per second. The
//! profiling fields come from NVML's GPU Performance Monitoring (GPM, Hopper and newer); the
//! PCIe rates fall back to NVML's PCIe throughput counters on older GPUs.
//!
//! [`select`] turns the rows of a counters file into what the exporter collects: metrics in
//! file order, label fields, the fields skipped (with the reason, logged once at start) and
//! the NVML telemetry plan. It is pure: GPM support is passed in.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use nvml_wrapper::enums::gpm::GpmMetricId;

use super::counters::{CounterRow, CountersError, MetricKind};
use crate::nvml::sampling::{Reading, TelemetryPlan};

/// How a reading in NVML's unit becomes the metric value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conv {
    /// Integer, unchanged.
    Same,
    /// mW → W, as a decimal.
    MilliToUnit,
    /// Bytes → MiB, integer (floor).
    BytesToMib,
    /// KB/s → bytes/s, integer.
    KibToBytes,
    /// MiB/s → bytes/s, integer.
    MibToBytes,
    /// Percent → ratio 0–1, as a decimal.
    PercentToRatio,
}

/// A metric value, formatted as dcgm-exporter does: integers as integers, decimals with six
/// places.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Int(u64),
    Float(f64),
}

impl Conv {
    /// Converts an integer reading.
    pub fn int(self, raw: u64) -> Value {
        match self {
            Conv::Same => Value::Int(raw),
            Conv::MilliToUnit => Value::Float(raw as f64 / 1000.0),
            Conv::BytesToMib => Value::Int(raw >> 20),
            Conv::KibToBytes => Value::Int(raw.saturating_mul(1024)),
            Conv::MibToBytes => Value::Int(raw.saturating_mul(1 << 20)),
            Conv::PercentToRatio => Value::Float(raw as f64 / 100.0),
        }
    }

    /// Converts a decimal (GPM) reading.
    pub fn float(self, raw: f64) -> Value {
        match self {
            Conv::PercentToRatio => Value::Float(raw / 100.0),
            Conv::MibToBytes => Value::Int((raw.max(0.0) * f64::from(1u32 << 20)).round() as u64),
            Conv::KibToBytes => Value::Int((raw.max(0.0) * 1024.0).round() as u64),
            Conv::MilliToUnit => Value::Float(raw / 1000.0),
            Conv::BytesToMib | Conv::Same => Value::Int(raw.max(0.0).round() as u64),
        }
    }
}

/// Text a label field takes its value from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelSource {
    /// Kernel driver version.
    DriverVersion,
    /// NVML library version.
    NvmlVersion,
    /// CUDA driver API version (`major.minor`).
    CudaDriverVersion,
    /// The GPU's brand.
    Brand,
    /// The board serial number.
    Serial,
    /// The GPU's name.
    Name,
    /// The GPU's UUID.
    Uuid,
    /// The PCI bus id.
    PciBusId,
    /// The PCI device id.
    PciDeviceId,
}

/// Where a field's value comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Source {
    /// An NVML reading, converted.
    Reading(Reading, Conv),
    /// A GPM metric; `fallback` is a reading used on GPUs without GPM.
    Gpm {
        metric: GpmMetricId,
        conv: Conv,
        fallback: Option<(Reading, Conv)>,
    },
    /// NVLink throughput over all links, from the data counters between two samples (MB/s).
    NvLinkRate,
    /// The code of the most recent XID, with `err_code`/`err_msg`.
    LastXid,
    /// XIDs in the count window, one series per code, with `window_size_in_ms`/`xid`.
    XidCount,
    /// A text value for label rows.
    Label(LabelSource),
    /// NVML has no equivalent (or gpud does not read it); the field is skipped.
    Unavailable(&'static str),
}

/// One known DCGM field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FieldDef {
    /// DCGM's name.
    pub name: &'static str,
    /// Where the value comes from.
    pub source: Source,
}

const NOT_FROM_NVML: &str = "not available from NVML";
const NOT_READ: &str = "gpud does not collect it";

/// Every DCGM field gpud knows, in DCGM field-id order.
static CATALOG: &[FieldDef] = {
    use crate::nvml::sampling::Reading as R;
    use Conv::*;
    use Source::{Label, LastXid, NvLinkRate, Unavailable, XidCount};
    const fn f(name: &'static str, source: Source) -> FieldDef {
        FieldDef { name, source }
    }
    const fn reading(name: &'static str, reading: R, conv: Conv) -> FieldDef {
        FieldDef {
            name,
            source: Source::Reading(reading, conv),
        }
    }
    const fn gpm(
        name: &'static str,
        metric: GpmMetricId,
        conv: Conv,
        fallback: Option<(R, Conv)>,
    ) -> FieldDef {
        FieldDef {
            name,
            source: Source::Gpm {
                metric,
                conv,
                fallback,
            },
        }
    }
    &[
        f("DCGM_FI_DRIVER_VERSION", Label(LabelSource::DriverVersion)),
        f("DCGM_FI_NVML_VERSION", Label(LabelSource::NvmlVersion)),
        f(
            "DCGM_FI_CUDA_DRIVER_VERSION",
            Label(LabelSource::CudaDriverVersion),
        ),
        f("DCGM_FI_DEV_NAME", Label(LabelSource::Name)),
        f("DCGM_FI_DEV_BRAND", Label(LabelSource::Brand)),
        f("DCGM_FI_DEV_SERIAL", Label(LabelSource::Serial)),
        f("DCGM_FI_DEV_UUID", Label(LabelSource::Uuid)),
        f("DCGM_FI_DEV_PCI_BUSID", Label(LabelSource::PciBusId)),
        f(
            "DCGM_FI_DEV_PCI_COMBINED_ID",
            Label(LabelSource::PciDeviceId),
        ),
        f("DCGM_FI_DEV_OEM_INFOROM_VER", Unavailable(NOT_READ)),
        f("DCGM_FI_DEV_ECC_INFOROM_VER", Unavailable(NOT_READ)),
        f("DCGM_FI_DEV_POWER_INFOROM_VER", Unavailable(NOT_READ)),
        f("DCGM_FI_DEV_INFOROM_IMAGE_VER", Unavailable(NOT_READ)),
        f("DCGM_FI_DEV_VBIOS_VERSION", Unavailable(NOT_READ)),
        reading("DCGM_FI_DEV_SM_CLOCK", R::SmClockMhz, Same),
        reading("DCGM_FI_DEV_MEM_CLOCK", R::MemClockMhz, Same),
        reading("DCGM_FI_DEV_MEMORY_TEMP", R::MemoryTempC, Same),
        reading("DCGM_FI_DEV_GPU_TEMP", R::GpuTempC, Same),
        reading("DCGM_FI_DEV_POWER_USAGE", R::PowerMw, MilliToUnit),
        reading("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", R::EnergyMj, Same),
        reading("DCGM_FI_DEV_POWER_MGMT_LIMIT", R::PowerLimitMw, MilliToUnit),
        reading(
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
            R::PowerLimitMw,
            MilliToUnit,
        ),
        reading("DCGM_FI_DEV_PSTATE", R::PState, Same),
        reading("DCGM_FI_DEV_FAN_SPEED", R::FanSpeedPct, Same),
        reading("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", R::PcieReplays, Same),
        reading("DCGM_FI_DEV_GPU_UTIL", R::GpuUtilPct, Same),
        reading("DCGM_FI_DEV_MEM_COPY_UTIL", R::MemUtilPct, Same),
        reading("DCGM_FI_DEV_ENC_UTIL", R::EncUtilPct, Same),
        reading("DCGM_FI_DEV_DEC_UTIL", R::DecUtilPct, Same),
        f("DCGM_FI_DEV_XID_ERRORS", LastXid),
        f("DCGM_FI_DEV_POWER_VIOLATION", Unavailable(NOT_READ)),
        f("DCGM_FI_DEV_THERMAL_VIOLATION", Unavailable(NOT_READ)),
        f("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", Unavailable(NOT_READ)),
        f("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", Unavailable(NOT_READ)),
        f("DCGM_FI_DEV_LOW_UTIL_VIOLATION", Unavailable(NOT_READ)),
        f("DCGM_FI_DEV_RELIABILITY_VIOLATION", Unavailable(NOT_READ)),
        reading("DCGM_FI_DEV_FB_TOTAL", R::FbTotalBytes, BytesToMib),
        reading("DCGM_FI_DEV_FB_FREE", R::FbFreeBytes, BytesToMib),
        reading("DCGM_FI_DEV_FB_USED", R::FbUsedBytes, BytesToMib),
        reading("DCGM_FI_DEV_FB_RESERVED", R::FbReservedBytes, BytesToMib),
        reading("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", R::EccSbeVolatile, Same),
        reading("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", R::EccDbeVolatile, Same),
        reading("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", R::EccSbeAggregate, Same),
        reading("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", R::EccDbeAggregate, Same),
        reading("DCGM_FI_DEV_RETIRED_SBE", R::RetiredSbe, Same),
        reading("DCGM_FI_DEV_RETIRED_DBE", R::RetiredDbe, Same),
        reading("DCGM_FI_DEV_RETIRED_PENDING", R::RetiredPending, Same),
        reading(
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            R::RemappedUncorrectable,
            Same,
        ),
        reading(
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            R::RemappedCorrectable,
            Same,
        ),
        reading("DCGM_FI_DEV_ROW_REMAP_FAILURE", R::RemapFailure, Same),
        reading("DCGM_FI_DEV_ROW_REMAP_PENDING", R::RemapPending, Same),
        reading(
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
            R::NvLinkCrcFlitErrors,
            Same,
        ),
        reading(
            "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
            R::NvLinkCrcDataErrors,
            Same,
        ),
        reading(
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
            R::NvLinkReplayErrors,
            Same,
        ),
        reading(
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
            R::NvLinkRecoveryErrors,
            Same,
        ),
        f("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", NvLinkRate),
        f("DCGM_FI_DEV_NVLINK_BANDWIDTH_L0", Unavailable(NOT_READ)),
        f(
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
            Unavailable(NOT_FROM_NVML),
        ),
        gpm(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            GpmMetricId::GraphicsUtil,
            PercentToRatio,
            None,
        ),
        gpm(
            "DCGM_FI_PROF_SM_ACTIVE",
            GpmMetricId::SmUtil,
            PercentToRatio,
            None,
        ),
        gpm(
            "DCGM_FI_PROF_SM_OCCUPANCY",
            GpmMetricId::SmOccupancy,
            PercentToRatio,
            None,
        ),
        gpm(
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            GpmMetricId::AnyTensorUtil,
            PercentToRatio,
            None,
        ),
        gpm(
            "DCGM_FI_PROF_DRAM_ACTIVE",
            GpmMetricId::DramBwUtil,
            PercentToRatio,
            None,
        ),
        gpm(
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
            GpmMetricId::Fp64Util,
            PercentToRatio,
            None,
        ),
        gpm(
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
            GpmMetricId::Fp32Util,
            PercentToRatio,
            None,
        ),
        gpm(
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
            GpmMetricId::Fp16Util,
            PercentToRatio,
            None,
        ),
        gpm(
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            GpmMetricId::PcieTxPerSec,
            MibToBytes,
            Some((R::PcieTxKbps, KibToBytes)),
        ),
        gpm(
            "DCGM_FI_PROF_PCIE_RX_BYTES",
            GpmMetricId::PcieRxPerSec,
            MibToBytes,
            Some((R::PcieRxKbps, KibToBytes)),
        ),
        gpm(
            "DCGM_FI_PROF_NVLINK_TX_BYTES",
            GpmMetricId::NvlinkTotalTxPerSec,
            MibToBytes,
            None,
        ),
        gpm(
            "DCGM_FI_PROF_NVLINK_RX_BYTES",
            GpmMetricId::NvlinkTotalRxPerSec,
            MibToBytes,
            None,
        ),
        gpm(
            "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE",
            GpmMetricId::ImmaTensorUtil,
            PercentToRatio,
            None,
        ),
        gpm(
            "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
            GpmMetricId::HmmaTensorUtil,
            PercentToRatio,
            None,
        ),
        gpm(
            "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
            GpmMetricId::DfmaTensorUtil,
            PercentToRatio,
            None,
        ),
        gpm(
            "DCGM_FI_PROF_PIPE_INT_ACTIVE",
            GpmMetricId::IntegerUtil,
            PercentToRatio,
            None,
        ),
        f("DCGM_EXP_XID_ERRORS_COUNT", XidCount),
        f("DCGM_EXP_CLOCK_EVENTS_COUNT", Unavailable(NOT_READ)),
        f("DCGM_EXP_GPU_HEALTH_STATUS", Unavailable(NOT_READ)),
        f("DCGM_EXP_P2P_STATUS", Unavailable(NOT_READ)),
    ]
};

/// The catalog entry for a DCGM field name.
pub fn lookup(name: &str) -> Option<&'static FieldDef> {
    CATALOG.iter().find(|f| f.name == name)
}

/// Every field gpud can export.
pub fn catalog() -> &'static [FieldDef] {
    CATALOG
}

/// Whether `name` has the shape of a DCGM field name (`DCGM_FI_…` or `DCGM_EXP_…`).
fn looks_like_dcgm(name: &str) -> bool {
    ["DCGM_FI_", "DCGM_EXP_"].iter().any(|prefix| {
        name.strip_prefix(prefix).is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
    })
}

/// A metric the exporter emits.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricDef {
    /// The family name.
    pub name: String,
    /// `# TYPE`.
    pub kind: MetricKind,
    /// `# HELP`.
    pub help: String,
    /// Where values come from.
    pub source: Source,
}

/// A field emitted as a label on every metric of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelDef {
    /// Label name (the field name).
    pub name: String,
    /// Where the text comes from.
    pub source: LabelSource,
}

/// A field that is not collected, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Line in the counters file.
    pub line: usize,
    /// The field.
    pub field: String,
    /// Why, for the start-up log line.
    pub reason: String,
}

/// What the exporter collects.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// Metrics in file order.
    pub metrics: Vec<MetricDef>,
    /// Label fields, sorted by name (their order in the label set).
    pub labels: Vec<LabelDef>,
    /// Fields left out.
    pub skipped: Vec<Skipped>,
    /// What NVML must read for the metrics.
    pub plan: TelemetryPlan,
}

/// Resolves counters rows into a selection. `gpm_available` says whether any GPU of the node
/// supports GPM: without it, GPM-only fields are skipped. Unknown names that look like DCGM
/// fields are skipped (a valid dcgm-exporter file must keep working); other unknown names,
/// duplicates and type mismatches are errors.
pub fn select(
    path: &Path,
    rows: &[CounterRow],
    gpm_available: bool,
) -> Result<Selection, CountersError> {
    let mut metrics = Vec::new();
    let mut labels = Vec::new();
    let mut skipped = Vec::new();
    let mut readings = Vec::new();
    let mut gpm = Vec::new();
    let mut fallbacks = Vec::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let invalid = |row: &CounterRow, field: &'static str, value: &str, reason: String| {
        CountersError::Invalid {
            path: PathBuf::from(path),
            line: row.line,
            field,
            value: value.to_owned(),
            reason,
        }
    };
    for row in rows {
        if let Some(first) = seen.insert(row.field.as_str(), row.line) {
            return Err(invalid(
                row,
                "DCGM field",
                &row.field,
                format!("already listed on line {first}"),
            ));
        }
        let skip = |reason: &str| Skipped {
            line: row.line,
            field: row.field.clone(),
            reason: reason.to_owned(),
        };
        let Some(def) = lookup(&row.field) else {
            if looks_like_dcgm(&row.field) {
                skipped.push(skip(NOT_READ));
                continue;
            }
            return Err(invalid(
                row,
                "DCGM field",
                &row.field,
                "not a DCGM field name (DCGM_FI_… or DCGM_EXP_…)".into(),
            ));
        };
        match (def.source, row.kind) {
            (Source::Unavailable(reason), _) => skipped.push(skip(reason)),
            (Source::Label(source), MetricKind::Label) => labels.push(LabelDef {
                name: row.field.clone(),
                source,
            }),
            (Source::Label(_), kind) => {
                return Err(invalid(
                    row,
                    "type",
                    kind.as_str(),
                    format!("{} is text; its type must be label", row.field),
                ));
            }
            (_, MetricKind::Label) => {
                skipped.push(skip("a numeric field cannot be a label in gpud"));
            }
            (Source::Gpm { fallback: None, .. }, _) if !gpm_available => skipped.push(skip(
                "not available from NVML on this node (GPM needs Hopper or newer GPUs)",
            )),
            (source, kind) => {
                match source {
                    Source::Reading(reading, _) => readings.push(reading),
                    Source::Gpm {
                        metric, fallback, ..
                    } => {
                        if gpm_available {
                            gpm.push(metric);
                        }
                        if let Some((reading, _)) = fallback {
                            readings.push(reading);
                            fallbacks.push(reading);
                        }
                    }
                    Source::NvLinkRate => readings.push(Reading::NvLinkDataKib),
                    _ => {}
                }
                metrics.push(MetricDef {
                    name: row.field.clone(),
                    kind,
                    help: row.help.clone(),
                    source,
                });
            }
        }
    }
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    // A fallback that another field reads directly is needed on every GPU.
    let direct: Vec<Reading> = metrics
        .iter()
        .filter_map(|m| match m.source {
            Source::Reading(reading, _) => Some(reading),
            _ => None,
        })
        .collect();
    fallbacks.retain(|r| !direct.contains(r));
    fallbacks.sort();
    fallbacks.dedup();
    readings.sort();
    readings.dedup();
    let mut unique_gpm: Vec<GpmMetricId> = Vec::new();
    for metric in gpm {
        if !unique_gpm.contains(&metric) {
            unique_gpm.push(metric);
        }
    }
    Ok(Selection {
        metrics,
        labels,
        skipped,
        plan: TelemetryPlan {
            readings,
            gpm: unique_gpm,
            // Asked for by the per-pod usage switch, not by a counters file.
            processes: false,
            gpm_fallbacks: fallbacks,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exporter::counters::{self, DEFAULT_COUNTERS};

    fn rows(text: &str) -> Vec<CounterRow> {
        counters::parse(Path::new("c.csv"), text).unwrap()
    }

    #[test]
    fn catalog_names_are_unique_and_dcgm_shaped() {
        let mut names: Vec<&str> = catalog().iter().map(|f| f.name).collect();
        assert!(names.iter().all(|n| looks_like_dcgm(n)));
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before);
    }

    #[test]
    fn default_set_on_hopper_skips_only_vgpu_licensing() {
        let sel = select(Path::new("d"), &rows(DEFAULT_COUNTERS), true).unwrap();
        assert_eq!(
            sel.skipped,
            [Skipped {
                line: 60,
                field: "DCGM_FI_DEV_VGPU_LICENSE_STATUS".into(),
                reason: "not available from NVML".into()
            }]
        );
        assert_eq!(sel.metrics.len(), 24);
        assert_eq!(
            sel.labels,
            [LabelDef {
                name: "DCGM_FI_DRIVER_VERSION".into(),
                source: LabelSource::DriverVersion
            }]
        );
        assert_eq!(
            sel.plan.gpm,
            [
                GpmMetricId::GraphicsUtil,
                GpmMetricId::AnyTensorUtil,
                GpmMetricId::DramBwUtil,
                GpmMetricId::PcieTxPerSec,
                GpmMetricId::PcieRxPerSec
            ]
        );
        assert!(sel.plan.readings.contains(&Reading::NvLinkDataKib));
        assert!(
            sel.plan.readings.contains(&Reading::PcieTxKbps),
            "fallback read too"
        );
        assert_eq!(
            sel.plan.gpm_fallbacks,
            [Reading::PcieTxKbps, Reading::PcieRxKbps],
            "only until GPM answers"
        );
    }

    #[test]
    fn without_gpm_the_activity_fields_are_skipped_and_pcie_falls_back() {
        let sel = select(Path::new("d"), &rows(DEFAULT_COUNTERS), false).unwrap();
        let skipped: Vec<&str> = sel.skipped.iter().map(|s| s.field.as_str()).collect();
        assert_eq!(
            skipped,
            [
                "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                "DCGM_FI_PROF_DRAM_ACTIVE"
            ]
        );
        assert!(sel.plan.gpm.is_empty());
        assert!(
            sel.metrics
                .iter()
                .any(|m| m.name == "DCGM_FI_PROF_PCIE_TX_BYTES")
        );
    }

    #[test]
    fn unknown_dcgm_fields_are_skipped_but_other_names_are_errors() {
        let sel = select(
            Path::new("c.csv"),
            &rows("DCGM_FI_DEV_SOMETHING_NEW, gauge, x\nDCGM_FI_DEV_GPU_UTIL, gauge, u\n"),
            false,
        )
        .unwrap();
        assert_eq!(sel.skipped[0].reason, "gpud does not collect it");
        assert_eq!(sel.metrics.len(), 1);
        let err = select(Path::new("c.csv"), &rows("gpu_util, gauge, x\n"), false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "c.csv: line 1: field DCGM field: invalid value \"gpu_util\": not a DCGM field name (DCGM_FI_… or DCGM_EXP_…)"
        );
        let err = select(
            Path::new("c.csv"),
            &rows("DCGM_FI_DEV_GPU_UTIL, gauge, a\nDCGM_FI_DEV_GPU_UTIL, gauge, b\n"),
            false,
        )
        .unwrap_err();
        assert!(
            err.to_string().ends_with("already listed on line 1"),
            "{err}"
        );
        let err = select(
            Path::new("c.csv"),
            &rows("DCGM_FI_DRIVER_VERSION, gauge, v\n"),
            false,
        )
        .unwrap_err();
        assert!(err.to_string().contains("its type must be label"), "{err}");
    }

    #[test]
    fn conversions_keep_dcgm_units() {
        assert_eq!(Conv::MilliToUnit.int(52_636), Value::Float(52.636));
        assert_eq!(Conv::BytesToMib.int(81_559 << 20), Value::Int(81_559));
        assert_eq!(Conv::BytesToMib.int((1 << 20) - 1), Value::Int(0));
        assert_eq!(Conv::KibToBytes.int(1_000), Value::Int(1_024_000));
        assert_eq!(Conv::MibToBytes.float(1.5), Value::Int(1_572_864));
        assert_eq!(Conv::PercentToRatio.float(45.0), Value::Float(0.45));
    }
}
