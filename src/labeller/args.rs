//! The labeller's command line: GFD's `flags.gfd` and gpud's sinks, resolved from NVIDIA's
//! config file at start and on SIGHUP.

use std::path::{Path, PathBuf};

use clap::ValueEnum;
use tracing::{debug, info, warn};

use super::service::Labeller;
use super::{ApiSink, NodeFeatureSink, NodeSink, Settings};
use crate::daemon::Error;
use crate::kube::ApiError;
use crate::nvidia_config::{
    self, Component, GfdFlags, GivenFlags, NvidiaConfigError, ProcessEnv, SharedFlags,
};

/// The labeller's own options (GFD's `flags.gfd` and gpud's sinks), shared with `gpud run`.
#[derive(Debug, Clone, clap::Args)]
pub struct LabellerArgs {
    #[command(flatten)]
    gfd: GfdFlags,

    /// Where labels go [default: node-feature when useNodeFeatureAPI is set to true by flag,
    /// environment or config file; else file].
    #[arg(long, value_enum, env = "GPUD_LABELLER_SINK")]
    sink: Option<Sink>,

    /// Namespace of the NodeFeature object (and of the labeller's pod).
    #[arg(
        long,
        value_name = "NAMESPACE",
        env = "NAMESPACE",
        default_value = "default"
    )]
    namespace: String,

    /// The labeller's own pod: its DaemonSet and the pod own the NodeFeature object, so it is
    /// deleted with the DaemonSet.
    #[arg(long, value_name = "NAME", env = "POD_NAME")]
    pod_name: Option<String>,

    /// Where sysfs is mounted (PCI classes for nvidia.com/gpu.mode).
    #[arg(long, value_name = "PATH", env = "GPUD_SYSFS_ROOT",
          default_value = super::pci::DEFAULT_SYSFS_ROOT)]
    sysfs_root: PathBuf,

    /// Add gpud's health-summary labels (gpud.io/gpu.health …); --health-labels=false
    /// leaves them out.
    #[arg(long, value_name = "BOOL", env = "GPUD_HEALTH_LABELS", default_value = "true",
          action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = nvidia_config::parse_bool)]
    health_labels: bool,
}

/// Where labels are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Sink {
    /// The NFD features file (--output-file), or stdout.
    File,
    /// The Node object's labels, through the Kubernetes API.
    Node,
    /// The features file and the Node.
    Both,
    /// NFD's NodeFeature object (GFD's useNodeFeatureAPI), through the Kubernetes API.
    NodeFeature,
}

impl Sink {
    /// The sink used when `--sink` is not given: the NodeFeature object only when
    /// `useNodeFeatureAPI` was asked for, since GFD's default of true would otherwise make
    /// every plain run need API access; the features file needs none.
    fn chosen(given: Option<Sink>, flags: &nvidia_config::Flags) -> Sink {
        given.unwrap_or(
            if flags.use_node_feature_api && flags.use_node_feature_api_explicit {
                Sink::NodeFeature
            } else {
                Sink::File
            },
        )
    }

    fn writes_file(self) -> bool {
        matches!(self, Sink::File | Sink::Both)
    }

    pub fn name(self) -> &'static str {
        match self {
            Sink::File => "file",
            Sink::Node => "node",
            Sink::Both => "both",
            Sink::NodeFeature => "node-feature",
        }
    }
}

impl LabellerArgs {
    /// Reads NVIDIA's config file and resolves GFD's view of it (at start and on SIGHUP).
    pub fn config(
        &self,
        config_file: Option<&Path>,
        shared: &SharedFlags,
    ) -> Result<nvidia_config::Config, NvidiaConfigError> {
        let path =
            nvidia_config::config_file(config_file, &ProcessEnv, Component::FeatureDiscovery);
        nvidia_config::load_and_resolve(
            path.as_deref(),
            GivenFlags {
                shared: Some(shared),
                plugin: None,
                gfd: Some(&self.gfd),
            },
            &ProcessEnv,
            Component::FeatureDiscovery,
        )
    }

    /// The sink `config` and `--sink` select.
    pub fn sink(&self, config: &nvidia_config::Config) -> Sink {
        Sink::chosen(self.sink, &config.flags)
    }

    /// The labeller's settings for `config` writing to `sink`.
    pub fn settings(&self, config: &nvidia_config::Config, sink: Sink) -> Settings {
        Settings::from_config(
            config,
            sink.writes_file(),
            self.sysfs_root.clone(),
            self.health_labels,
        )
    }

    /// What selected `sink`, for messages.
    fn sink_source(&self, sink: Sink) -> String {
        match self.sink {
            Some(_) => format!("--sink {}", sink.name()),
            None => "useNodeFeatureAPI (the node-feature sink)".to_owned(),
        }
    }

    /// Checks that `sink` has what it needs and says how it was chosen; the usage error
    /// otherwise.
    pub fn check(
        &self,
        config: &nvidia_config::Config,
        sink: Sink,
        node_name: Option<&str>,
    ) -> Result<(), Error> {
        if sink != Sink::File && node_name.is_none_or(str::is_empty) {
            return Err(Error::Usage(format!(
                "{} needs the node name (--node-name or NODE_NAME)",
                self.sink_source(sink)
            )));
        }
        if sink == Sink::NodeFeature && self.namespace.is_empty() {
            return Err(Error::Usage(format!(
                "{} needs the namespace (--namespace or NAMESPACE)",
                self.sink_source(sink)
            )));
        }
        if config.flags.use_node_feature_api && sink != Sink::NodeFeature {
            if config.flags.use_node_feature_api_explicit {
                info!(
                    sink = sink.name(),
                    "useNodeFeatureAPI is set, but --sink decides"
                );
            } else {
                debug!(
                    "useNodeFeatureAPI is true by GFD's default only; writing the features file \
                     (set it explicitly, or --sink node-feature, for the NodeFeature object)"
                );
            }
        }
        Ok(())
    }

    /// Connects the API sink `sink` needs, if any, with `kubeconfig` (`None`: the in-cluster
    /// service account).
    pub async fn api_sink(
        &self,
        sink: Sink,
        node_name: Option<&str>,
        kubeconfig: Option<&Path>,
    ) -> Result<Option<ApiSink>, ApiError> {
        if sink == Sink::File {
            return Ok(None);
        }
        let client = crate::kube::connect(kubeconfig).await?;
        let node = node_name.unwrap_or_default().to_owned();
        Ok(Some(if sink == Sink::NodeFeature {
            ApiSink::NodeFeature(Box::new(NodeFeatureSink::new(
                client,
                self.namespace.clone(),
                node,
                self.pod_name.clone(),
            )))
        } else {
            ApiSink::Node(Box::new(NodeSink::new(client, node)))
        }))
    }

    /// SIGHUP: the new settings for the running `sink`; a bad config file is an error (the
    /// daemon keeps the running settings and says so).
    pub fn reload(
        &self,
        config_file: Option<&Path>,
        shared: &SharedFlags,
        sink: Sink,
    ) -> Result<Settings, Error> {
        let config = self.config(config_file, shared).map_err(Error::config)?;
        for warning in &config.warnings {
            warn!("{warning}");
        }
        let now = self.sink(&config);
        if now != sink {
            warn!(
                keeping = sink.name(),
                wanted = now.name(),
                "useNodeFeatureAPI changed; the sink changes on restart"
            );
        }
        Ok(self.settings(&config, sink))
    }

    /// GFD's view of NVIDIA's config at start: warnings printed once, a bad file exit 65, a sink
    /// that lacks what it needs exit 64. Returns the config, the sink and the settings.
    pub fn resolve_at_start(
        &self,
        config_file: Option<&Path>,
        shared: &SharedFlags,
        node_name: Option<&str>,
    ) -> Result<(nvidia_config::Config, Sink, Settings), Error> {
        let config = self.config(config_file, shared).map_err(Error::config)?;
        for warning in &config.warnings {
            eprintln!("gpud: {warning}");
        }
        let sink = self.sink(&config);
        self.check(&config, sink, node_name)?;
        let settings = self.settings(&config, sink);
        Ok((config, sink, settings))
    }

    /// The labeller subsystem writing to `sink`, connecting its API sink with `kubeconfig`
    /// when it starts.
    pub fn subsystem(
        &self,
        sink: Sink,
        node_name: Option<String>,
        kubeconfig: Option<PathBuf>,
    ) -> Labeller {
        let args = self.clone();
        Labeller::new(Box::pin(async move {
            args.api_sink(sink, node_name.as_deref(), kubeconfig.as_deref())
                .await
        }))
    }
}
