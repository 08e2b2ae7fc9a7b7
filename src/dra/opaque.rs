//! NVIDIA's opaque device configuration (`resource.nvidia.com/v1beta1`, kinds `GpuConfig`
//! and `MigDeviceConfig`) as it arrives in a claim's allocation, so claims written for
//! NVIDIA's driver carry over.
//!
//! Supported: `sharing.strategy: TimeSlicing` with `timeSlicingConfig.interval` (`Default`,
//! `Short`, `Medium`, `Long`) on a full GPU, recorded with the prepared device and applied by
//! [`super::timeslice`]. On a MIG device the strategy is accepted and sets nothing, and a
//! `timeSlicingConfig` is refused, as NVIDIA's driver does. `sharing.strategy: MPS` on a full
//! GPU, with `mpsConfig` (`defaultActiveThreadPercentage`, `defaultPinnedDeviceMemoryLimit`,
//! `defaultPerDevicePinnedMemoryLimit`), runs a control daemon for the claim
//! ([`super::claim_mps`]). Refused with a per-claim error that says so: MPS on a MIG device
//! (gpud would have to put the whole parent GPU in EXCLUSIVE_PROCESS under its other MIG
//! devices' users), a thread percentage outside 1–100, a limit that is not a quantity, another
//! API version or kind, and a config of the wrong kind for the device (`GpuConfig` on a MIG
//! device, `MigDeviceConfig` on a GPU).
//!
//! Entries apply in allocation order — the class's first, then the claim's — so a claim's
//! setting overrides its class's, as in NVIDIA's driver.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::objects::AllocationConfig;

/// The API version of NVIDIA's device configs.
pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";

/// The time-slice intervals NVIDIA's config accepts.
pub const INTERVALS: [&str; 4] = ["Default", "Short", "Medium", "Long"];

/// What the configs ask of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceSettings {
    /// The time-slice interval, when time-slicing was asked for.
    pub time_slice: Option<String>,
    /// MPS's limits, when MPS was asked for.
    pub mps: Option<MpsSettings>,
}

/// What `mpsConfig` asks of a claim's control daemon; limits in MiB.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MpsSettings {
    /// `defaultActiveThreadPercentage`, 1–100.
    pub active_thread_percentage: Option<u32>,
    /// `defaultPinnedDeviceMemoryLimit`: every GPU of the claim without its own limit.
    pub pinned_default_mib: Option<u64>,
    /// `defaultPerDevicePinnedMemoryLimit`, keyed as given: a GPU's UUID, or its position
    /// among the claim's GPUs.
    pub pinned_per_device_mib: BTreeMap<String, u64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Parameters {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    sharing: Option<Sharing>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Sharing {
    #[serde(default)]
    strategy: String,
    #[serde(default)]
    time_slicing_config: Option<TimeSlicing>,
    #[serde(default)]
    mps_config: Option<MpsConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MpsConfig {
    #[serde(default)]
    default_active_thread_percentage: Option<i64>,
    #[serde(default)]
    default_pinned_device_memory_limit: Option<serde_json::Value>,
    #[serde(default)]
    default_per_device_pinned_memory_limit: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct TimeSlicing {
    #[serde(default)]
    interval: Option<String>,
}

/// The settings for a device allocated for `request`, from the allocation's configs for
/// `driver`; `mig` says whether the device is a MIG device. The error is the claim's.
pub fn settings(
    configs: &[AllocationConfig],
    driver: &str,
    request: &str,
    mig: bool,
) -> Result<DeviceSettings, String> {
    let mut out = DeviceSettings::default();
    let applicable = configs.iter().filter(|c| {
        c.requests.is_empty()
            || c.requests
                .iter()
                .any(|r| r == request || r.starts_with(&format!("{request}/")))
    });
    for config in applicable {
        let Some(opaque) = config.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        let parameters: Parameters = serde_json::from_value(opaque.parameters.clone())
            .map_err(|e| format!("opaque config for request {request:?}: {e}"))?;
        if parameters.api_version != API_VERSION {
            return Err(format!(
                "opaque config for request {request:?}: apiVersion {:?} is not supported (use {API_VERSION})",
                parameters.api_version
            ));
        }
        let expected = if mig { "MigDeviceConfig" } else { "GpuConfig" };
        if parameters.kind != expected {
            return Err(format!(
                "opaque config for request {request:?}: kind {:?} cannot configure a {} (use {expected})",
                parameters.kind,
                if mig { "MIG device" } else { "GPU" }
            ));
        }
        let Some(sharing) = parameters.sharing else {
            continue;
        };
        match sharing.strategy.as_str() {
            // A MIG device is scheduled by its GPU instance: NVIDIA's MigDeviceConfig takes
            // the strategy but has no interval to set, and refuses one.
            "TimeSlicing" if mig => {
                if sharing.time_slicing_config.is_some() {
                    return Err(format!(
                        "opaque config for request {request:?}: sharing.timeSlicingConfig \
                         cannot configure a MIG device (a time-slice interval applies to a \
                         full GPU); leave it out of the MigDeviceConfig"
                    ));
                }
            }
            "TimeSlicing" => {
                let interval = sharing
                    .time_slicing_config
                    .and_then(|t| t.interval)
                    .unwrap_or_else(|| "Default".to_owned());
                if !INTERVALS.contains(&interval.as_str()) {
                    return Err(format!(
                        "opaque config for request {request:?}: sharing.timeSlicingConfig.interval \
                         {interval:?} is not one of {}",
                        INTERVALS.join(", ")
                    ));
                }
                out.time_slice = Some(interval);
            }
            "MPS" if mig => {
                return Err(format!(
                    "opaque config for request {request:?}: sharing.strategy MPS on a MIG device \
                     is not supported by gpud (its control daemon would put the whole GPU in \
                     compute mode EXCLUSIVE_PROCESS under the other MIG devices' users); \
                     allocate a full GPU for MPS or leave sharing out"
                ));
            }
            "MPS" => {
                let config = sharing.mps_config.unwrap_or_default();
                out.mps = Some(mps_settings(config).map_err(|why| {
                    format!("opaque config for request {request:?}: sharing.mpsConfig.{why}")
                })?);
            }
            other => {
                return Err(format!(
                    "opaque config for request {request:?}: sharing.strategy {other:?} is not one \
                     of TimeSlicing, MPS"
                ));
            }
        }
    }
    Ok(out)
}

/// The checked limits of `config`; the error names the field and the value.
fn mps_settings(config: MpsConfig) -> Result<MpsSettings, String> {
    let active_thread_percentage = match config.default_active_thread_percentage {
        None => None,
        Some(p) if (1..=100).contains(&p) => u32::try_from(p).ok(),
        Some(p) => {
            return Err(format!(
                "defaultActiveThreadPercentage {p} is not a percentage from 1 to 100"
            ));
        }
    };
    let pinned_default_mib = config
        .default_pinned_device_memory_limit
        .map(|q| mebibytes(&q).map_err(|why| format!("defaultPinnedDeviceMemoryLimit {why}")))
        .transpose()?;
    let mut pinned_per_device_mib = BTreeMap::new();
    for (key, q) in &config.default_per_device_pinned_memory_limit {
        let mib = mebibytes(q)
            .map_err(|why| format!("defaultPerDevicePinnedMemoryLimit[{key:?}] {why}"))?;
        pinned_per_device_mib.insert(key.clone(), mib);
    }
    Ok(MpsSettings {
        active_thread_percentage,
        pinned_default_mib,
        pinned_per_device_mib,
    })
}

/// A Kubernetes quantity (`10Gi`, `512Mi`, `1G`, a number of bytes) in whole MiB, at least 1.
fn mebibytes(quantity: &serde_json::Value) -> Result<u64, String> {
    let text = match quantity {
        serde_json::Value::String(s) => s.trim().to_owned(),
        serde_json::Value::Number(n) => n.to_string(),
        other => return Err(format!("{other} is not a quantity (e.g. 10Gi)")),
    };
    let bytes = super::quantity::bytes(&text)
        .ok_or_else(|| format!("{text:?} is not a quantity (e.g. 10Gi)"))?;
    match bytes / (1024 * 1024) {
        0 => Err(format!(
            "{text:?} is below 1Mi, the smallest limit MPS takes"
        )),
        mib => Ok(mib),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::objects::Opaque;
    use serde_json::json;

    fn config(requests: &[&str], parameters: serde_json::Value) -> AllocationConfig {
        AllocationConfig {
            source: "FromClaim".into(),
            requests: requests.iter().map(|r| (*r).to_owned()).collect(),
            opaque: Some(Opaque {
                driver: "gpu.nvidia.com".into(),
                parameters,
            }),
        }
    }

    #[test]
    fn time_slicing_is_taken_and_the_claim_overrides_the_class() {
        let configs = [
            config(
                &[],
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}}),
            ),
            config(
                &["gpu"],
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}),
            ),
        ];
        let got = settings(&configs, "gpu.nvidia.com", "gpu", false).unwrap();
        assert_eq!(got.time_slice.as_deref(), Some("Long"));
        let got = settings(&configs, "gpu.nvidia.com", "other", false).unwrap();
        assert_eq!(got.time_slice.as_deref(), Some("Short"));
        let got = settings(&configs, "other.driver", "gpu", false).unwrap();
        assert_eq!(got, DeviceSettings::default());
    }

    #[test]
    fn mps_limits_are_read_and_checked() {
        let mps = |mps_config: serde_json::Value| {
            [config(
                &[],
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": mps_config}}),
            )]
        };
        let got = settings(
            &mps(json!({"defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "defaultPerDevicePinnedMemoryLimit": {"1": "512Mi", "GPU-x": "1G"}})),
            "gpu.nvidia.com",
            "gpu",
            false,
        )
        .unwrap();
        assert_eq!(
            got.mps,
            Some(MpsSettings {
                active_thread_percentage: Some(50),
                pinned_default_mib: Some(10240),
                pinned_per_device_mib: [("1".to_owned(), 512), ("GPU-x".to_owned(), 953)]
                    .into_iter()
                    .collect(),
            })
        );
        let err = settings(
            &mps(json!({"defaultActiveThreadPercentage": 150})),
            "gpu.nvidia.com",
            "gpu",
            false,
        )
        .unwrap_err();
        assert_eq!(
            err,
            "opaque config for request \"gpu\": sharing.mpsConfig.defaultActiveThreadPercentage \
             150 is not a percentage from 1 to 100"
        );
        let err = settings(
            &mps(json!({"defaultPinnedDeviceMemoryLimit": "lots"})),
            "gpu.nvidia.com",
            "gpu",
            false,
        )
        .unwrap_err();
        assert!(
            err.ends_with("\"lots\" is not a quantity (e.g. 10Gi)"),
            "{err}"
        );
        let err = settings(
            &mps(json!({"defaultPinnedDeviceMemoryLimit": "100Ki"})),
            "gpu.nvidia.com",
            "gpu",
            false,
        )
        .unwrap_err();
        assert!(
            err.ends_with("below 1Mi, the smallest limit MPS takes"),
            "{err}"
        );
    }

    #[test]
    fn mps_on_mig_wrong_kinds_and_bad_intervals_are_refused_by_name() {
        let mps = [config(
            &[],
            json!({"apiVersion": API_VERSION, "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS"}}),
        )];
        let err = settings(&mps, "gpu.nvidia.com", "gpu", true).unwrap_err();
        assert!(
            err.contains("MPS on a MIG device is not supported"),
            "{err}"
        );
        let gpu_on_mig = [config(
            &[],
            json!({"apiVersion": API_VERSION, "kind": "GpuConfig"}),
        )];
        let err = settings(&gpu_on_mig, "gpu.nvidia.com", "gpu", true).unwrap_err();
        assert!(err.contains("use MigDeviceConfig"), "{err}");
        let mig = |sharing: serde_json::Value| {
            [config(
                &[],
                json!({"apiVersion": API_VERSION, "kind": "MigDeviceConfig", "sharing": sharing}),
            )]
        };
        let plain = mig(json!({"strategy": "TimeSlicing"}));
        assert_eq!(
            settings(&plain, "gpu.nvidia.com", "gpu", true),
            Ok(DeviceSettings::default())
        );
        let interval =
            mig(json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}));
        let err = settings(&interval, "gpu.nvidia.com", "gpu", true).unwrap_err();
        assert!(
            err.contains("timeSlicingConfig cannot configure a MIG device"),
            "{err}"
        );
        let bad = [config(
            &[],
            json!({"apiVersion": API_VERSION, "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Huge"}}}),
        )];
        let err = settings(&bad, "gpu.nvidia.com", "gpu", false).unwrap_err();
        assert!(
            err.contains("\"Huge\" is not one of Default, Short, Medium, Long"),
            "{err}"
        );
    }
}
