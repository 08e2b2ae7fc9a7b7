//! The XID policy in force on this node: gpud's config file (`health.xid`) with NVIDIA's
//! `DP_DISABLE_HEALTHCHECKS` / `DP_ENABLE_HEALTHCHECKS` from the environment.
//!
//! Read here, once for every reader, so that the health watcher and the doctor judge an XID
//! from the same inputs: a node told to ignore an XID must not see it ignored by one and
//! failed by the other.

use super::catalog::{
    ENV_DISABLE_HEALTHCHECKS, ENV_ENABLE_HEALTHCHECKS, XidPolicy, XidPolicyConfig,
};

/// The policy of `config` (the config file's `health.xid` section, default when there is no
/// file) combined with the two `DP_*` variables of this process. Returns the warnings about
/// malformed XID lists, for the caller to say once.
// The one place NVIDIA's DP_* variables are read.
#[allow(clippy::disallowed_methods)]
pub fn policy(config: &XidPolicyConfig) -> (XidPolicy, Vec<String>) {
    let disable = std::env::var(ENV_DISABLE_HEALTHCHECKS).ok();
    let enable = std::env::var(ENV_ENABLE_HEALTHCHECKS).ok();
    XidPolicy::from_config_and_env(config, disable.as_deref(), enable.as_deref())
}
