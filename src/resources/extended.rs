//! The extended resource names gpud's DeviceClasses serve through DRA (`extendedResourceName`,
//! KEP-5004), and which path owns such a name on a node that runs the device plugin too.
//!
//! | DeviceClass | `extendedResourceName` |
//! |---|---|
//! | `gpu.nvidia.com` | `nvidia.com/gpu` |
//! | `mig-<profile, dots and + as ->.gpu.nvidia.com` | `nvidia.com/mig-<profile, + as .>` (the device plugin's `mixed`-strategy names) |
//!
//! The scheduler serves a name through the device plugin on every node whose allocatable has
//! it, and through DRA elsewhere, so a node must offer each name one way only: with both the
//! device plugin and the DRA plugin on, [`Owner`] says which path keeps the names both could
//! offer.

use super::GPU_RESOURCE;

/// The DeviceClass of whole GPUs.
pub const GPU_CLASS: &str = "gpu.nvidia.com";

/// Which path offers the names both could offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Owner {
    /// The device plugin advertises them; DRA serves ResourceClaims only.
    DevicePlugin,
    /// The device plugin leaves them out; pods asking for them are served through DRA.
    Dra,
}

impl Owner {
    /// As the flag spells it.
    pub fn flag_value(self) -> &'static str {
        match self {
            Owner::DevicePlugin => "device-plugin",
            Owner::Dra => "dra",
        }
    }
}

/// The resource name of MIG profile `profile` (`1g.10gb+me` → `nvidia.com/mig-1g.10gb.me`).
pub fn mig_resource(profile: &str) -> String {
    format!("nvidia.com/mig-{}", profile.replace('+', "."))
}

/// The DeviceClass of gpud's that serves resource `name` through DRA, if one does.
pub fn dra_class(name: &str) -> Option<String> {
    if name == GPU_RESOURCE {
        return Some(GPU_CLASS.to_owned());
    }
    let profile = name.strip_prefix("nvidia.com/mig-")?;
    Some(format!("mig-{}.{GPU_CLASS}", profile.replace('.', "-")))
}

/// A name the device plugin would advertise that a DeviceClass serves through DRA, on a node
/// where nobody said which path owns it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the device plugin would advertise {resource}, which DeviceClass {class} also serves \
     through DRA (extendedResourceName): a node must offer a name one way only, else the \
     scheduler serves it through the device plugin here and the DRA path is never used. Say \
     which path owns the names both could offer: --extended-resource-owner=device-plugin (the \
     device plugin keeps advertising {resource}; DRA serves ResourceClaims only) or \
     --extended-resource-owner=dra (the device plugin leaves {resource} out; pods asking for \
     it are served through DRA)"
)]
pub struct OfferedBothWays {
    pub resource: String,
    pub class: String,
}

/// The first of `names` (the device plugin's resources) a DeviceClass serves through DRA.
pub fn both_ways<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), OfferedBothWays> {
    for name in names {
        if let Some(class) = dra_class(name) {
            return Err(OfferedBothWays {
                resource: name.to_owned(),
                class,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_their_device_classes() {
        assert_eq!(
            dra_class("nvidia.com/gpu").as_deref(),
            Some("gpu.nvidia.com")
        );
        assert_eq!(mig_resource("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me");
        assert_eq!(
            dra_class(&mig_resource("1g.10gb+me")).as_deref(),
            Some("mig-1g-10gb-me.gpu.nvidia.com")
        );
        assert_eq!(
            dra_class("nvidia.com/mig-7g.141gb").as_deref(),
            Some("mig-7g-141gb.gpu.nvidia.com")
        );
        // Renamed (time-sliced) resources are the device plugin's alone.
        assert_eq!(dra_class("nvidia.com/gpu.shared"), None);
        assert!(both_ways(["nvidia.com/gpu.shared"]).is_ok());
        let refused = both_ways(["nvidia.com/gpu.shared", "nvidia.com/mig-3g.40gb"])
            .unwrap_err()
            .to_string();
        assert!(
            refused.starts_with(
                "the device plugin would advertise nvidia.com/mig-3g.40gb, which DeviceClass \
                 mig-3g-40gb.gpu.nvidia.com also serves through DRA"
            ),
            "{refused}"
        );
        assert_eq!(Owner::Dra.flag_value(), "dra");
    }
}
