//! The command-line flags that mirror NVIDIA's config keys, with NVIDIA's names and aliases,
//! as clap argument groups an applet flattens into its own parser.
//!
//! Every field is an `Option`: `Some` only when the flag was given, so that
//! [`resolve`](super::resolve) can apply NVIDIA's precedence (flag > environment > file >
//! default). Environment variables are deliberately not declared through clap: several keys
//! have two names (`GFD_MIG_STRATEGY`, then `MIG_STRATEGY`) and which ones apply depends on
//! the component, so [`resolve`](super::resolve) reads them from a table.
//!
//! Boolean flags take an optional value like NVIDIA's (`--oneshot`, `--oneshot=false`).

use std::path::PathBuf;

use clap::Args;

use super::duration::SleepInterval;
use super::types::{
    AllocationPolicy, DeviceDiscoveryStrategy, DeviceIdStrategy, DeviceListStrategy, MigStrategy,
};

/// Parses a boolean the way Go's `strconv.ParseBool` does (`1`, `t`, `true`, `TRUE`, `0`,
/// `f`, `false` …), which is what NVIDIA's flags and environment accept.
pub fn parse_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err("must be true or false".into()),
    }
}

/// Parses a comma-separated list of device-list strategies (`envvar,cdi-cri`).
pub fn parse_device_list(text: &str) -> Result<Vec<DeviceListStrategy>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect::<Result<Vec<_>, _>>()
        .and_then(|list| {
            if list.is_empty() {
                Err("must name at least one strategy".into())
            } else {
                Ok(list)
            }
        })
}

/// Parses a comma-separated list of IMEX channel ids.
pub fn parse_channel_ids(text: &str) -> Result<Vec<u32>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .map_err(|_| format!("{s:?} is not a channel id"))
        })
        .collect()
}

/// Flags for the `flags` keys both components share.
#[derive(Debug, Clone, Default, Args)]
pub struct SharedFlags {
    /// How MIG devices are exposed: none, single or mixed [default: none].
    /// [env: MIG_STRATEGY; the labeller reads GFD_MIG_STRATEGY first]
    #[arg(long, value_name = "STRATEGY", value_parser = str::parse::<MigStrategy>)]
    pub mig_strategy: Option<MigStrategy>,

    /// Fail when NVML cannot be initialised [default: true].
    /// [env: FAIL_ON_INIT_ERROR; the labeller reads GFD_FAIL_ON_INIT_ERROR first]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub fail_on_init_error: Option<bool>,

    /// Root of the NVIDIA driver installation on the host [default: /].
    /// [env: NVIDIA_DRIVER_ROOT]
    #[arg(
        long = "driver-root",
        visible_alias = "nvidia-driver-root",
        value_name = "PATH"
    )]
    pub nvidia_driver_root: Option<PathBuf>,

    /// Root of the NVIDIA device nodes on the host [default: the driver root].
    /// [env: NVIDIA_DEV_ROOT]
    #[arg(
        long = "dev-root",
        visible_alias = "nvidia-dev-root",
        value_name = "PATH"
    )]
    pub nvidia_dev_root: Option<PathBuf>,

    /// Host path for MPS pipes and shared memory.
    /// [env: MPS_ROOT]
    #[arg(long, value_name = "PATH")]
    pub mps_root: Option<PathBuf>,

    /// Inject GDRCopy devices [default: false].
    /// [env: GDRCOPY_ENABLED]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub gdrcopy_enabled: Option<bool>,

    /// Inject GPUDirect Storage devices [default: false].
    /// [env: GDS_ENABLED]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub gds_enabled: Option<bool>,

    /// Inject Mellanox OFED devices [default: false].
    /// [env: MOFED_ENABLED]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub mofed_enabled: Option<bool>,

    /// Publish through NFD's NodeFeature API instead of a features file.
    /// [env: USE_NODE_FEATURE_API; the labeller reads GFD_USE_NODE_FEATURE_API first]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub use_node_feature_api: Option<bool>,

    /// How devices are discovered: auto, nvml, tegra (or vfio for GFD) [default: auto].
    /// [env: DEVICE_DISCOVERY_STRATEGY]
    #[arg(long, value_name = "STRATEGY", value_parser = str::parse::<DeviceDiscoveryStrategy>)]
    pub device_discovery_strategy: Option<DeviceDiscoveryStrategy>,
}

/// Flags for `flags.plugin` (device plugin only) and the IMEX settings.
#[derive(Debug, Clone, Default, Args)]
pub struct PluginFlags {
    /// Pass the device nodes to the kubelet in Allocate responses [default: false].
    /// [env: PASS_DEVICE_SPECS]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub pass_device_specs: Option<bool>,

    /// How devices reach the container: envvar, volume-mounts, cdi-annotations, cdi-cri;
    /// repeat or separate with commas [default: envvar].
    /// [env: DEVICE_LIST_STRATEGY]
    #[arg(long, value_name = "STRATEGY", value_delimiter = ',',
          value_parser = str::parse::<DeviceListStrategy>)]
    pub device_list_strategy: Option<Vec<DeviceListStrategy>>,

    /// How devices are named: uuid or index [default: uuid].
    /// [env: DEVICE_ID_STRATEGY]
    #[arg(long, value_name = "STRATEGY", value_parser = str::parse::<DeviceIdStrategy>)]
    pub device_id_strategy: Option<DeviceIdStrategy>,

    /// Prefix of the CDI annotation key [default: cdi.k8s.io/].
    /// [env: CDI_ANNOTATION_PREFIX]
    #[arg(long, value_name = "PREFIX")]
    pub cdi_annotation_prefix: Option<String>,

    /// Path of nvidia-cdi-hook / nvidia-ctk [default: /usr/bin/nvidia-ctk, as NVIDIA's device
    /// plugin; `gpud cdi generate` defaults to /usr/bin/nvidia-cdi-hook, as nvidia-ctk does].
    /// [env: NVIDIA_CDI_HOOK_PATH, NVIDIA_CTK_PATH]
    #[arg(
        long = "nvidia-cdi-hook-path",
        visible_alias = "nvidia-ctk-path",
        value_name = "PATH"
    )]
    pub nvidia_ctk_path: Option<PathBuf>,

    /// Where the driver root is mounted in this container [default: /driver-root].
    /// [env: DRIVER_ROOT_CTR_PATH, CONTAINER_DRIVER_ROOT]
    #[arg(
        long = "driver-root-ctr-path",
        visible_alias = "container-driver-root",
        value_name = "PATH"
    )]
    pub container_driver_root: Option<PathBuf>,

    /// How replicas of shared GPUs are picked: distributed or packed [default: distributed].
    /// [env: SHARED_DEVICES_ALLOCATION_POLICY]
    #[arg(long, value_name = "POLICY", value_parser = str::parse::<AllocationPolicy>)]
    pub shared_devices_allocation_policy: Option<AllocationPolicy>,

    /// IMEX channels to inject, comma-separated ([] or 0).
    /// [env: IMEX_CHANNEL_IDS]
    #[arg(long, value_name = "IDS", value_parser = parse_channel_ids)]
    pub imex_channel_ids: Option<Vec<u32>>,

    /// Fail when a requested IMEX channel is missing [default: false].
    /// [env: IMEX_REQUIRED]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub imex_required: Option<bool>,
}

/// Flags for `flags.gfd` (feature discovery only).
#[derive(Debug, Clone, Default, Args)]
pub struct GfdFlags {
    /// Label once and exit [default: false].
    /// [env: GFD_ONESHOT]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub oneshot: Option<bool>,

    /// Leave out the nvidia.com/gfd.timestamp label [default: false].
    /// [env: GFD_NO_TIMESTAMP]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub no_timestamp: Option<bool>,

    /// Time between relabelling passes, e.g. 60s, or "infinite" [default: 60s].
    /// [env: GFD_SLEEP_INTERVAL]
    #[arg(long, value_name = "DURATION", value_parser = SleepInterval::parse)]
    pub sleep_interval: Option<SleepInterval>,

    /// Features file to write; "" or "-" prints to stdout
    /// [default: /etc/kubernetes/node-feature-discovery/features.d/gfd].
    /// [env: GFD_OUTPUT_FILE]
    #[arg(
        long = "output-file",
        short = 'o',
        visible_alias = "output",
        value_name = "PATH"
    )]
    pub output_file: Option<String>,

    /// File holding the machine type [default: /sys/class/dmi/id/product_name].
    /// [env: GFD_MACHINE_TYPE_FILE]
    #[arg(long, value_name = "PATH")]
    pub machine_type_file: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        shared: SharedFlags,
        #[command(flatten)]
        plugin: PluginFlags,
        #[command(flatten)]
        gfd: GfdFlags,
    }

    fn cli(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
    }

    #[test]
    fn unset_flags_are_none() {
        let parsed = cli(&[]).unwrap();
        assert_eq!(parsed.shared.mig_strategy, None);
        assert_eq!(parsed.gfd.oneshot, None);
        assert_eq!(parsed.plugin.device_list_strategy, None);
    }

    #[test]
    fn nvidia_names_and_aliases() {
        let parsed = cli(&[
            "--mig-strategy",
            "mixed",
            "--nvidia-driver-root",
            "/run/nvidia/driver",
            "--fail-on-init-error=false",
            "--oneshot",
            "-o",
            "-",
            "--sleep-interval",
            "infinite",
            "--device-list-strategy",
            "envvar,cdi-cri",
            "--nvidia-ctk-path",
            "/usr/local/bin/nvidia-ctk",
        ])
        .unwrap();
        assert_eq!(parsed.shared.mig_strategy, Some(MigStrategy::Mixed));
        assert_eq!(
            parsed.shared.nvidia_driver_root,
            Some(PathBuf::from("/run/nvidia/driver"))
        );
        assert_eq!(parsed.shared.fail_on_init_error, Some(false));
        assert_eq!(parsed.gfd.oneshot, Some(true));
        assert_eq!(parsed.gfd.output_file.as_deref(), Some("-"));
        assert_eq!(parsed.gfd.sleep_interval, Some(SleepInterval::Infinite));
        assert_eq!(
            parsed.plugin.device_list_strategy,
            Some(vec![DeviceListStrategy::Envvar, DeviceListStrategy::CdiCri])
        );
        assert_eq!(
            parsed.plugin.nvidia_ctk_path,
            Some(PathBuf::from("/usr/local/bin/nvidia-ctk"))
        );
        let output = cli(&["--output", "/tmp/x"]).unwrap();
        assert_eq!(output.gfd.output_file.as_deref(), Some("/tmp/x"));
    }

    #[test]
    fn bad_flag_values_are_usage_errors() {
        let err = cli(&["--mig-strategy", "both"]).unwrap_err().to_string();
        assert!(err.contains("must be one of none, single, mixed"), "{err}");
        assert!(cli(&["--sleep-interval", "soon"]).is_err());
        assert!(cli(&["--oneshot=maybe"]).is_err());
    }

    #[test]
    fn go_booleans() {
        assert_eq!(parse_bool("T"), Ok(true));
        assert_eq!(parse_bool("0"), Ok(false));
        assert!(parse_bool("yes").is_err());
    }
}
