//! The cluster-wide budget: at most `--remediation-max-concurrent` nodes reset GPUs at the
//! same time. Kubernetes is the coordinator: each slot is a `coordination.k8s.io` Lease in
//! gpud's namespace ([`crate::kube::SlotBudget`]), held while renewed and free once it
//! expires, so a node that dies holding one frees it after the lease duration. No gpud talks
//! to another. A node without a slot keeps its GPU quarantined and asks again; an API server
//! that does not answer means no slot, so nothing is reset without one.
//!
//! One slot covers the whole node: every GPU this node resets while it holds it. The
//! [`SlotBudget`] lives as long as the process: it judges a silent holder's Lease expired by
//! how long it has watched it unchanged.

use std::path::PathBuf;
use std::time::Duration;

use tracing::{info, warn};

use super::args::Settings;
use crate::kube::{self, ApiError, HeldSlot, SlotBudget};
use crate::logging;

/// Where slots come from.
#[derive(Debug)]
pub enum Budget {
    /// No cluster budget (`--remediation-max-concurrent 0`, a node without Kubernetes).
    Unlimited,
    /// Leases, through a client made on first use.
    Leases {
        lease: LeaseSettings,
        budget: Option<Box<SlotBudget>>,
    },
}

/// What the Leases are.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    kubeconfig: Option<PathBuf>,
    namespace: String,
    holder: String,
    slots: u32,
    duration: Duration,
}

/// A slot this node holds.
#[derive(Debug)]
pub enum Slot {
    Unlimited,
    Lease(HeldSlot),
}

impl Budget {
    /// The budget the settings ask for.
    pub fn new(settings: &Settings) -> Self {
        match (&settings.node, settings.max_concurrent) {
            (Some(node), slots) if slots > 0 => Budget::Leases {
                lease: LeaseSettings {
                    kubeconfig: settings.kubeconfig.clone(),
                    namespace: settings.namespace.clone(),
                    holder: node.clone(),
                    slots,
                    duration: settings.lease_duration,
                },
                budget: None,
            },
            _ => Budget::Unlimited,
        }
    }

    /// A slot, when one is free; `Ok(None)` when every slot is held by a live node.
    pub async fn try_take(&mut self) -> Result<Option<Slot>, ApiError> {
        match self {
            Budget::Unlimited => Ok(Some(Slot::Unlimited)),
            Budget::Leases { lease, budget } => {
                let budget = match budget {
                    Some(budget) => budget,
                    None => {
                        let client = kube::connect(lease.kubeconfig.as_deref()).await?;
                        budget.insert(Box::new(SlotBudget::new(
                            client,
                            lease.namespace.clone(),
                            lease.holder.clone(),
                            lease.slots,
                            lease.duration,
                        )))
                    }
                };
                let held = budget.try_acquire().await?;
                if let Some(slot) = &held {
                    info!(lease = slot.name(), "Took a remediation slot");
                }
                Ok(held.map(Slot::Lease))
            }
        }
    }

    /// Takes a slot, saying once per failing streak why none came.
    pub async fn take(&mut self, failing: &mut bool) -> Option<Slot> {
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
            Slot::Lease(held) => held.is_held(),
        }
    }

    /// Gives the slot back; a Lease that cannot be released expires by itself.
    pub async fn release(self) {
        if let Slot::Lease(held) = self {
            let name = held.name().to_owned();
            match held.release().await {
                Ok(()) => info!(lease = %name, "Gave the remediation slot back"),
                Err(err) => {
                    warn!(lease = %name, error = %logging::error_chain(&err), "Cannot give the remediation slot back; it frees itself when its Lease expires")
                }
            }
        }
    }
}
