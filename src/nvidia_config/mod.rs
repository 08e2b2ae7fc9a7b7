//! NVIDIA's v1 config file, shared by the device plugin and the labeller (GFD).
//!
//! gpud reads the same file NVIDIA's k8s-device-plugin and gpu-feature-discovery read (the
//! Helm chart's ConfigMap, the config-manager's `/config/config.yaml`), so a cluster keeps its
//! configs when it switches. Keys, defaults, flag names, aliases and environment variables are
//! NVIDIA's; see the tables in `README.md`.
//!
//! Differences, all stricter:
//! - unknown keys are errors (NVIDIA ignores them), so a typo cannot silently fall back to a
//!   default; keys are case-sensitive;
//! - `sleepInterval` must be positive (a zero interval would make the labeller spin);
//! - `sharing.timeSlicing` and `sharing.mps` cannot both list resources.
//!
//! Every error names the file (or environment variable), the field path — e.g.
//! `sharing.timeSlicing.resources[0].replicas` — and the value.
//!
//! Use: [`load`] the file named by [`config_file`], then [`resolve`] it with the applet's
//! flags ([`SharedFlags`], [`PluginFlags`], [`GfdFlags`], flattened into its clap parser) and
//! the environment. Everything here is pure apart from [`load`] reading the file.

mod duration;
mod error;
mod file;
mod flags;
mod resolve;
mod sharing;
mod types;

pub use duration::{INFINITE, SleepInterval, parse_go_duration};
pub use error::{NvidiaConfigError, Origin};
pub use file::{
    FileConfig, FileFlags, FileGfdFlags, FilePluginFlags, Imex, NamedPattern, RESOURCES_IGNORED,
    Resources, VERSION, load, parse,
};
pub use flags::{GfdFlags, PluginFlags, SharedFlags, parse_bool};
pub use resolve::{
    Component, Config, DEFAULT_MACHINE_TYPE_FILE, DEFAULT_OUTPUT_FILE, DEFAULT_SLEEP_INTERVAL, Env,
    Flags, GfdSettings, GivenFlags, OutputTarget, PluginSettings, ProcessEnv, config_file,
    config_file_env, resolve,
};
pub use sharing::{
    ReplicatedDevices, ReplicatedResource, ReplicatedResources, Sharing, resource_name,
};
pub use types::{
    AllocationPolicy, DeviceDiscoveryStrategy, DeviceIdStrategy, DeviceListStrategy, MigStrategy,
    SharingStrategy,
};

/// Reads (when `path` is given) and resolves a component's configuration in one step.
pub fn load_and_resolve(
    path: Option<&std::path::Path>,
    given: GivenFlags<'_>,
    env: &dyn Env,
    component: Component,
) -> Result<Config, NvidiaConfigError> {
    let file = path
        .map(|p| load(p).map(|config| (p, config)))
        .transpose()?;
    resolve(
        file.as_ref().map(|(p, config)| (*p, config)),
        given,
        env,
        component,
    )
}
