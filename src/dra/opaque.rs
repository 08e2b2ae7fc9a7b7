//! NVIDIA's opaque device configuration (`resource.nvidia.com/v1beta1`, kinds `GpuConfig`
//! and `MigDeviceConfig`) as it arrives in a claim's allocation, so claims written for
//! NVIDIA's driver carry over.
//!
//! Supported: `sharing.strategy: TimeSlicing` with `timeSlicingConfig.interval` (`Default`,
//! `Short`, `Medium`, `Long`) on a full GPU, recorded with the prepared device and applied by
//! [`super::timeslice`]. On a MIG device the strategy is accepted and sets nothing, and a
//! `timeSlicingConfig` is refused, as NVIDIA's driver does. Refused with a per-claim
//! error that says so: `sharing.strategy: MPS` (gpud's MPS support is separate work), another
//! API version or kind, and a config of the wrong kind for the device (`GpuConfig` on a MIG
//! device, `MigDeviceConfig` on a GPU).
//!
//! Entries apply in allocation order — the class's first, then the claim's — so a claim's
//! setting overrides its class's, as in NVIDIA's driver.

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
            "MPS" => {
                return Err(format!(
                    "opaque config for request {request:?}: sharing.strategy MPS is not supported \
                     by gpud's DRA plugin yet; use TimeSlicing or leave sharing out"
                ));
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
    fn mps_wrong_kinds_and_bad_intervals_are_refused_by_name() {
        let mps = [config(
            &[],
            json!({"apiVersion": API_VERSION, "kind": "GpuConfig",
            "sharing": {"strategy": "MPS"}}),
        )];
        let err = settings(&mps, "gpu.nvidia.com", "gpu", false).unwrap_err();
        assert!(err.contains("MPS is not supported"), "{err}");
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
