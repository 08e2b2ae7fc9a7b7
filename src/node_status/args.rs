//! The node status's command line, shared by `gpud node-status` and `gpud run`.

use std::time::Duration;

use super::taints::{Effect, MinHealthy, Policy};

/// How the node status holds, retries and taints.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeStatusArgs {
    /// A condition or taint changes at most once per this long, and a GPU that failed must be
    /// healthy this long before it counts as recovered.
    #[arg(long, value_name = "DURATION", env = "GPUD_NODE_STATUS_HOLD", default_value = "5m",
          value_parser = crate::values::positive_duration)]
    pub node_status_hold: Duration,

    /// The Node is read this often even when nothing changed, and gpud's conditions and
    /// taints written again only if someone removed or changed them.
    #[arg(long, value_name = "DURATION", env = "GPUD_NODE_STATUS_RESYNC", default_value = "5m",
          value_parser = crate::values::positive_duration)]
    pub node_status_resync: Duration,

    /// The longest wait between retries while the API server fails.
    #[arg(long, value_name = "DURATION", env = "GPUD_NODE_STATUS_RETRY_MAX", default_value = "30s",
          value_parser = crate::values::positive_duration)]
    pub node_status_retry_max: Duration,

    /// Taint the node with gpud.io/gpu-unhealthy=true:EFFECT while any GPU is unhealthy
    /// (NoSchedule, PreferNoSchedule or NoExecute) [default: no taint].
    #[arg(long, value_name = "EFFECT", env = "GPUD_TAINT_UNHEALTHY")]
    pub taint_unhealthy: Option<Effect>,

    /// Taint the node with gpud.io/gpu-degraded=true:EFFECT while any GPU is degraded
    /// [default: no taint].
    #[arg(long, value_name = "EFFECT", env = "GPUD_TAINT_DEGRADED")]
    pub taint_degraded: Option<Effect>,

    /// Taint the node with gpud.io/gpu-too-few-healthy=true:EFFECT while fewer than N GPUs are
    /// healthy; N or N:EFFECT (NoSchedule when not given) [default: no taint].
    #[arg(long, value_name = "N[:EFFECT]", env = "GPUD_TAINT_MIN_HEALTHY")]
    pub taint_min_healthy: Option<MinHealthy>,
}

/// The node status's settings, resolved from [`NodeStatusArgs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub hold: Duration,
    pub resync: Duration,
    pub retry_max: Duration,
    pub taints: Policy,
}

impl NodeStatusArgs {
    pub fn settings(&self) -> Settings {
        Settings {
            hold: self.node_status_hold,
            resync: self.node_status_resync,
            retry_max: self.node_status_retry_max,
            taints: Policy {
                unhealthy: self.taint_unhealthy,
                degraded: self.taint_degraded,
                min_healthy: self.taint_min_healthy,
            },
        }
    }
}
