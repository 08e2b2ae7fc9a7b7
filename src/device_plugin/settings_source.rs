//! Where the device plugin's settings come from: NVIDIA's flags and environment variables,
//! over NVIDIA's config file, over the defaults — the precedence of NVIDIA's plugin.

use std::path::PathBuf;

use clap::Args;

use super::settings::{IdStrategy, ListStrategy, MigStrategy, Settings, SharedPolicy};

/// NVIDIA's device-plugin flags. Each is optional so that "not given" can fall back to the
/// config file.
#[derive(Debug, Clone, Args)]
pub struct PluginFlags {
    /// NVIDIA config file (YAML or JSON, `version: v1`).
    #[arg(long, value_name = "PATH", env = "CONFIG_FILE")]
    pub config_file: Option<PathBuf>,

    /// none | single | mixed.
    #[arg(long, value_name = "STRATEGY", env = "MIG_STRATEGY")]
    pub mig_strategy: Option<String>,

    /// Comma-separated: envvar, volume-mounts, cdi-annotations, cdi-cri.
    #[arg(long, value_name = "LIST", env = "DEVICE_LIST_STRATEGY")]
    pub device_list_strategy: Option<String>,

    /// uuid | index.
    #[arg(long, value_name = "STRATEGY", env = "DEVICE_ID_STRATEGY")]
    pub device_id_strategy: Option<String>,

    /// Pass the device nodes in the Allocate response.
    #[arg(long, value_name = "BOOL", env = "PASS_DEVICE_SPECS", num_args = 0..=1, default_missing_value = "true")]
    pub pass_device_specs: Option<bool>,

    /// Host root of the driver installation.
    #[arg(
        long,
        visible_alias = "nvidia-driver-root",
        value_name = "PATH",
        env = "NVIDIA_DRIVER_ROOT"
    )]
    pub driver_root: Option<PathBuf>,

    /// Host root of the device nodes (defaults to the driver root).
    #[arg(
        long,
        visible_alias = "nvidia-dev-root",
        value_name = "PATH",
        env = "NVIDIA_DEV_ROOT"
    )]
    pub dev_root: Option<PathBuf>,

    /// Prefix of the CDI annotation key.
    #[arg(long, value_name = "PREFIX", env = "CDI_ANNOTATION_PREFIX")]
    pub cdi_annotation_prefix: Option<String>,

    /// distributed | packed: how replicas of shared GPUs are picked.
    #[arg(long, value_name = "POLICY", env = "SHARED_DEVICES_ALLOCATION_POLICY")]
    pub shared_devices_allocation_policy: Option<String>,
}

/// A setting that cannot be used, named by where it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: invalid value {value:?}: {why}")]
pub struct SettingError {
    /// `--flag / ENV` or `FILE: field`.
    pub origin: String,
    pub value: String,
    pub why: String,
}

fn invalid(origin: &str, value: &str, why: &str) -> SettingError {
    SettingError {
        origin: origin.to_owned(),
        value: value.to_owned(),
        why: why.to_owned(),
    }
}

/// Resolves the settings.
pub fn load(flags: &PluginFlags) -> Result<Settings, SettingError> {
    let mut settings = Settings::default();
    if let Some(text) = &flags.mig_strategy {
        settings.mig_strategy = parse_mig_strategy(text)
            .map_err(|why| invalid("--mig-strategy / MIG_STRATEGY", text, why))?;
    }
    if let Some(text) = &flags.device_list_strategy {
        settings.list_strategies = parse_list_strategies(text)
            .map_err(|why| invalid("--device-list-strategy / DEVICE_LIST_STRATEGY", text, why))?;
    }
    if let Some(text) = &flags.device_id_strategy {
        settings.id_strategy = parse_id_strategy(text)
            .map_err(|why| invalid("--device-id-strategy / DEVICE_ID_STRATEGY", text, why))?;
    }
    if let Some(pass) = flags.pass_device_specs {
        settings.pass_device_specs = pass;
    }
    if let Some(root) = flags.dev_root.as_ref().or(flags.driver_root.as_ref()) {
        settings.dev_root = root.clone();
    }
    if let Some(prefix) = &flags.cdi_annotation_prefix {
        settings.cdi_annotation_prefix = prefix.clone();
    }
    if let Some(text) = &flags.shared_devices_allocation_policy {
        settings.shared_policy = parse_policy(text).map_err(|why| {
            invalid(
                "--shared-devices-allocation-policy / SHARED_DEVICES_ALLOCATION_POLICY",
                text,
                why,
            )
        })?;
    }
    Ok(settings)
}

fn parse_mig_strategy(text: &str) -> Result<MigStrategy, &'static str> {
    match text {
        "none" => Ok(MigStrategy::None),
        "single" => Ok(MigStrategy::Single),
        "mixed" => Ok(MigStrategy::Mixed),
        _ => Err("expected none, single or mixed"),
    }
}

fn parse_list_strategies(text: &str) -> Result<Vec<ListStrategy>, &'static str> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let strategy = match part {
            "envvar" => ListStrategy::EnvVar,
            "volume-mounts" => ListStrategy::VolumeMounts,
            "cdi-annotations" => ListStrategy::CdiAnnotations,
            "cdi-cri" => ListStrategy::CdiCri,
            _ => return Err("expected envvar, volume-mounts, cdi-annotations or cdi-cri"),
        };
        if !out.contains(&strategy) {
            out.push(strategy);
        }
    }
    if out.is_empty() {
        return Err("at least one strategy is needed");
    }
    Ok(out)
}

fn parse_id_strategy(text: &str) -> Result<IdStrategy, &'static str> {
    match text {
        "uuid" => Ok(IdStrategy::Uuid),
        "index" => Ok(IdStrategy::Index),
        _ => Err("expected uuid or index"),
    }
}

fn parse_policy(text: &str) -> Result<SharedPolicy, &'static str> {
    match text {
        "distributed" => Ok(SharedPolicy::Distributed),
        "packed" => Ok(SharedPolicy::Packed),
        _ => Err("expected distributed or packed"),
    }
}
