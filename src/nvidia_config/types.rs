//! The closed sets of values NVIDIA's config accepts, as typed enums.
//!
//! Each enum parses the exact spelling NVIDIA's device plugin and GFD accept and prints it back
//! the same way, so a value read from a file, a flag or the environment round-trips unchanged
//! into labels, logs and error messages.

use std::fmt;
use std::str::FromStr;

/// Declares an enum whose variants map one-to-one to NVIDIA's spellings, with `FromStr`
/// (the error lists the accepted values) and `Display`.
macro_rules! spelled_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every accepted spelling, in declaration order.
            pub const VALUES: &'static [&'static str] = &[$($text),+];

            /// The spelling NVIDIA uses.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl FromStr for $name {
            type Err = String;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                match text {
                    $($text => Ok($name::$variant),)+
                    _ => Err(format!("must be one of {}", $name::VALUES.join(", "))),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

spelled_enum! {
    /// How MIG devices are exposed (`flags.migStrategy`).
    MigStrategy {
        /// MIG devices are not exposed; a MIG-enabled GPU counts as a whole GPU.
        None => "none",
        /// Every MIG device is `nvidia.com/gpu`; all GPUs must have the same MIG layout.
        Single => "single",
        /// Each MIG profile is its own resource, `nvidia.com/mig-<profile>`.
        Mixed => "mixed",
    }
}

spelled_enum! {
    /// How the device plugin passes the allocated devices to the container runtime
    /// (`flags.plugin.deviceListStrategy`; several may be combined).
    DeviceListStrategy {
        /// `NVIDIA_VISIBLE_DEVICES=<ids>`.
        Envvar => "envvar",
        /// Mounts under `/var/run/nvidia-container-devices`.
        VolumeMounts => "volume-mounts",
        /// CDI device names in a pod annotation.
        CdiAnnotations => "cdi-annotations",
        /// CDI device names in the CRI `CDIDevices` field.
        CdiCri => "cdi-cri",
    }
}

impl DeviceListStrategy {
    /// Whether this is one of the CDI strategies.
    pub fn is_cdi(self) -> bool {
        matches!(
            self,
            DeviceListStrategy::CdiAnnotations | DeviceListStrategy::CdiCri
        )
    }
}

spelled_enum! {
    /// How devices are named in device lists (`flags.plugin.deviceIDStrategy`).
    DeviceIdStrategy {
        /// `GPU-…` / `MIG-…` UUIDs.
        Uuid => "uuid",
        /// NVML indices, `<gpu>` or `<gpu>:<mig>`.
        Index => "index",
    }
}

spelled_enum! {
    /// How replicas of shared GPUs are picked (`flags.plugin.sharedDevicesAllocationPolicy`).
    AllocationPolicy {
        /// Spread over GPUs: prefer the GPU with the fewest replicas in use.
        Distributed => "distributed",
        /// Fill GPUs: prefer the GPU with the most replicas in use.
        Packed => "packed",
    }
}

spelled_enum! {
    /// How devices are discovered (`flags.deviceDiscoveryStrategy`).
    DeviceDiscoveryStrategy {
        /// NVML when available, else Tegra.
        Auto => "auto",
        /// NVML.
        Nvml => "nvml",
        /// Tegra (Jetson) devices.
        Tegra => "tegra",
        /// VFIO passthrough devices (GFD only).
        Vfio => "vfio",
    }
}

spelled_enum! {
    /// The sharing in force, derived from `sharing` (never written in a file).
    SharingStrategy {
        /// No replicas.
        None => "none",
        /// Time-slicing replicas.
        TimeSlicing => "time-slicing",
        /// MPS replicas.
        Mps => "mps",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for text in MigStrategy::VALUES {
            assert_eq!(text.parse::<MigStrategy>().unwrap().to_string(), *text);
        }
        for text in DeviceListStrategy::VALUES {
            assert_eq!(
                text.parse::<DeviceListStrategy>().unwrap().to_string(),
                *text
            );
        }
        assert_eq!(
            "time-slicing".parse::<SharingStrategy>().unwrap(),
            SharingStrategy::TimeSlicing
        );
    }

    #[test]
    fn unknown_values_list_the_accepted_ones() {
        assert_eq!(
            "Mixed".parse::<MigStrategy>().unwrap_err(),
            "must be one of none, single, mixed"
        );
        assert_eq!(
            "spread".parse::<AllocationPolicy>().unwrap_err(),
            "must be one of distributed, packed"
        );
    }
}
