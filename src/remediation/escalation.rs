//! The escalation on the Node: the condition `GPURemediationRequired` (True with the reason
//! and a message naming the GPUs and their faults while any GPU is escalated, False once none
//! is), kept by a helper task under gpud's own field manager so it never touches the node
//! status's conditions. Cluster API's MachineHealthCheck (`unhealthyConditions`), managed node
//! auto-repair and other node-repair engines act on a Node condition; this is that condition.
//!
//! The helper writes only what differs from what the Node has: at start it reads the Node once
//! (a True condition from before a reboot that has since answered it becomes False), then
//! writes on each change, retrying on gpud's backoff paced by a 429's `Retry-After`.

use std::path::PathBuf;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::backoff::{self, Backoff};
use crate::daemon::Helpers;
use crate::kube::{ApiError, ConditionRecord, NodeClient};
use crate::logging;

/// The longest pause between two tries.
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// The condition's type.
pub const CONDITION: &str = "GPURemediationRequired";
/// The field manager of gpud's remediation writes.
pub const MANAGER: &str = "gpud-remediation";
/// The reason while nothing is escalated.
pub const NONE_REQUIRED: &str = "NoRemediationRequired";
/// What RBAC must allow for the condition: said when the API server forbids a write.
pub const CONDITION_RBAC: &str = "gpud's service account needs the verb patch on the resource nodes/status and get on nodes (its ClusterRole)";

/// What the condition should say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Escalation {
    /// True while a GPU needs what gpud cannot do.
    pub required: bool,
    pub reason: String,
    pub message: String,
}

impl Escalation {
    /// Nothing escalated.
    pub fn none() -> Self {
        Escalation {
            required: false,
            reason: NONE_REQUIRED.to_owned(),
            message: "gpud can bring every GPU back by itself".to_owned(),
        }
    }

    fn status(&self) -> &'static str {
        if self.required { "True" } else { "False" }
    }
}

/// Starts the helper `remediation condition`; the returned sender sets what the condition
/// should say, and the receiver says why the Node does not have it, while it cannot be
/// written (for `/readyz`).
pub fn start(
    helpers: &Helpers,
    node: String,
    kubeconfig: Option<PathBuf>,
) -> (watch::Sender<Escalation>, watch::Receiver<Option<String>>) {
    let (sender, wanted) = watch::channel(Escalation::none());
    let (failing, failure) = watch::channel(None);
    helpers.spawn(
        "remediation condition",
        keep(wanted, failing, node, kubeconfig),
    );
    (sender, failure)
}

/// What the Node is known to have: the condition's status, message and transition time.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Written {
    escalation: Option<Escalation>,
    status: Option<String>,
    transition: Option<String>,
}

async fn keep(
    mut wanted: watch::Receiver<Escalation>,
    failure: watch::Sender<Option<String>>,
    node: String,
    kubeconfig: Option<PathBuf>,
) {
    let mut backoff = Backoff::capped(backoff::seed_from(&node), RETRY_MAX);
    let mut client: Option<NodeClient> = None;
    let mut known: Option<Written> = None;
    let mut failing = false;
    loop {
        let want = wanted.borrow_and_update().clone();
        match sync(&mut client, &mut known, &want, &node, kubeconfig.as_ref()).await {
            Ok(()) => {
                if failing {
                    info!("The remediation condition is written again");
                }
                failing = false;
                failure.send_replace(None);
                backoff.reset();
                if wanted.changed().await.is_err() {
                    return;
                }
            }
            Err(err) => {
                let delay = err.paced(backoff.next_delay());
                // Retrying does not fix what RBAC forbids: say what to grant.
                let rbac = (err.status() == Some(403)).then_some(CONDITION_RBAC);
                if !failing {
                    match rbac {
                        Some(rbac) => {
                            warn!(error = %logging::error_chain(&err), rbac, retry_in = ?delay, "Cannot write the {CONDITION} condition on the Node: the API server forbids it; retrying")
                        }
                        None => {
                            warn!(error = %logging::error_chain(&err), retry_in = ?delay, "Cannot write the {CONDITION} condition on the Node; retrying")
                        }
                    }
                }
                failing = true;
                let why = match rbac {
                    Some(rbac) => format!("the API server forbids it: {rbac}"),
                    None => logging::error_chain(&err),
                };
                failure.send_replace(Some(format!(
                    "the {CONDITION} condition cannot be written on the Node: {why}"
                )));
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    changed = wanted.changed() => if changed.is_err() { return },
                }
            }
        }
    }
}

/// Makes the Node's condition say `want`.
async fn sync(
    client: &mut Option<NodeClient>,
    known: &mut Option<Written>,
    want: &Escalation,
    node: &str,
    kubeconfig: Option<&PathBuf>,
) -> Result<(), ApiError> {
    let api = NodeClient::in_slot(client, kubeconfig.map(PathBuf::as_path), node, MANAGER).await?;
    if known.is_none() {
        let view = api.read().await?;
        let (status, transition) = view
            .conditions
            .into_iter()
            .find(|(kind, _, _)| kind == CONDITION)
            .map(|(_, status, at)| (Some(status), at))
            .unwrap_or_default();
        *known = Some(Written {
            // A False one is what gpud would write for nothing escalated; a True one is
            // rewritten with this process's message.
            escalation: (status.as_deref() == Some("False")).then(Escalation::none),
            status,
            transition,
        });
    }
    let Some(written) = known.as_mut() else {
        return Ok(());
    };
    let absent_and_fine = written.status.is_none() && !want.required;
    if written.escalation.as_ref() == Some(want) || absent_and_fine {
        return Ok(());
    }
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let transition = match (&written.status, &written.transition) {
        (Some(status), Some(at)) if status == want.status() => at.clone(),
        _ => now.clone(),
    };
    api.apply_conditions(&[ConditionRecord {
        kind: CONDITION,
        status: want.status(),
        reason: &want.reason,
        message: &want.message,
        transition: &transition,
        heartbeat: &now,
    }])
    .await?;
    *written = Written {
        escalation: Some(want.clone()),
        status: Some(want.status().to_owned()),
        transition: Some(transition),
    };
    Ok(())
}
