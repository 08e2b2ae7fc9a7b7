//! Draining a GPU: with `--remediation-evict`, the pods that hold it (through the device
//! plugin or a DRA claim, from the kubelet's pod-resources API) are evicted through the
//! Eviction API, so their PodDisruptionBudgets decide; a refusal (429) is asked again after
//! the API server's `Retry-After` or 5 s. Waiting for the GPU's processes to end is the
//! engine's: NVML says when the GPU is idle, whoever ended them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::args::Settings;
use crate::holdings::pod_resources::{self, PodName};
use crate::inventory::Snapshot;
use crate::inventory::model::Gpu;
use crate::kube::{self, Eviction};
use crate::logging;
use crate::remediation_state::metrics::Metrics;

/// How soon a refused eviction is asked again when the API server names no time.
pub const EVICT_RETRY: Duration = Duration::from_secs(5);

/// What RBAC must allow for an eviction: said when the API server forbids one.
pub const EVICT_RBAC: &str =
    "gpud's service account needs the verb create on the resource pods/eviction (its ClusterRole)";

/// Evicts the pods that hold a GPU.
pub struct Drainer {
    socket: PathBuf,
    dra_driver: String,
    kubeconfig: Option<PathBuf>,
    client: Option<::kube::Client>,
    /// When each pod may be asked again (refused, or asked already and on its way out).
    next_try: BTreeMap<PodName, Instant>,
    /// Why the last eviction of each pod failed in a way waiting does not fix (RBAC forbids
    /// it), until one succeeds: the drain's reason says it.
    forbidden: BTreeMap<PodName, String>,
    /// Whether the last pod-resources read failed (said once per streak).
    failing: bool,
}

impl std::fmt::Debug for Drainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drainer")
            .field("socket", &self.socket)
            .field("waiting", &self.next_try)
            .finish_non_exhaustive()
    }
}

impl Drainer {
    pub fn new(settings: &Settings) -> Self {
        Drainer {
            socket: settings.pod_resources_socket.clone(),
            dra_driver: settings.dra_driver.clone(),
            kubeconfig: settings.kubeconfig.clone(),
            client: None,
            next_try: BTreeMap::new(),
            forbidden: BTreeMap::new(),
            failing: false,
        }
    }

    /// Asks the API server to evict every pod that holds `gpu` and is due; says why an
    /// eviction of one of them is forbidden, when one is (the drain waits on regardless).
    pub async fn evict_holders(
        &mut self,
        snapshot: &Snapshot,
        gpu: &Gpu,
        metrics: &Metrics,
    ) -> Option<String> {
        let holders = match pod_resources::gpu_holders(
            &self.socket,
            snapshot,
            &self.dra_driver,
            &gpu.uuid,
        )
        .await
        {
            Ok(holders) => {
                self.failing = false;
                holders
            }
            Err(why) => {
                if !self.failing {
                    warn!(gpu = gpu.index, error = %why, "Cannot find the pods holding the GPU to evict them; waiting for its processes to end");
                }
                self.failing = true;
                return None;
            }
        };
        let now = Instant::now();
        self.next_try.retain(|pod, _| holders.contains(pod));
        self.forbidden.retain(|pod, _| holders.contains(pod));
        for pod in &holders {
            if self.next_try.get(pod).is_some_and(|at| *at > now) {
                continue;
            }
            let pause = self.evict(pod, gpu, metrics).await;
            self.next_try.insert(pod.clone(), Instant::now() + pause);
        }
        let forbidden: Vec<String> = holders
            .iter()
            .filter_map(|pod| self.forbidden.get(pod))
            .cloned()
            .collect();
        (!forbidden.is_empty()).then(|| forbidden.join("; "))
    }

    /// Evicts `pod`; how long to leave it before asking again.
    async fn evict(&mut self, pod: &PodName, gpu: &Gpu, metrics: &Metrics) -> Duration {
        let client = match &self.client {
            Some(client) => client.clone(),
            None => match kube::connect(self.kubeconfig.as_deref()).await {
                Ok(client) => self.client.insert(client).clone(),
                Err(err) => {
                    warn!(error = %logging::error_chain(&err), "Cannot evict the pods holding the GPU");
                    return EVICT_RETRY;
                }
            },
        };
        let answer = kube::evict(&client, &pod.namespace, &pod.name).await;
        let forbidden = matches!(&answer, Err(err) if err.status() == Some(403));
        let said = match forbidden {
            true => self
                .forbidden
                .insert(
                    pod.clone(),
                    format!("the eviction of pod {pod} is forbidden: {EVICT_RBAC}"),
                )
                .is_some(),
            false => self.forbidden.remove(pod).is_some(),
        };
        match answer {
            Err(err) if forbidden => {
                metrics.count("evict", "failed");
                // Said once while it lasts; the drain's reason (on /readyz) keeps saying it.
                if !said {
                    warn!(gpu = gpu.index, pod = %pod, error = %logging::error_chain(&err), rbac = EVICT_RBAC, "Cannot evict a pod holding the GPU: the API server forbids it; the GPU stays out of service, draining, and is not reset while the pod's processes run");
                }
                EVICT_RETRY
            }
            Ok(Eviction::Evicted) => {
                metrics.count("evict", "success");
                info!(gpu = gpu.index, pod = %pod, "Evicted a pod holding the GPU");
                // Its containers stop within their grace period; the GPU's processes say when.
                Duration::from_secs(60)
            }
            Ok(Eviction::Gone) => Duration::from_secs(60),
            Ok(Eviction::Refused(err)) => {
                metrics.count("evict", "refused");
                let pause = err.paced(EVICT_RETRY);
                info!(gpu = gpu.index, pod = %pod, error = %logging::error_chain(&err), retry_in = ?pause, "The eviction was refused (a PodDisruptionBudget); asking again");
                pause
            }
            Err(err) => {
                metrics.count("evict", "failed");
                warn!(gpu = gpu.index, pod = %pod, error = %logging::error_chain(&err), "Cannot evict a pod holding the GPU; asking again");
                EVICT_RETRY
            }
        }
    }
}
