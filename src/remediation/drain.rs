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

/// Evicts the pods that hold a GPU.
pub struct Drainer {
    socket: PathBuf,
    dra_driver: String,
    kubeconfig: Option<PathBuf>,
    client: Option<::kube::Client>,
    /// When each pod may be asked again (refused, or asked already and on its way out).
    next_try: BTreeMap<PodName, Instant>,
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
            failing: false,
        }
    }

    /// Asks the API server to evict every pod that holds `gpu` and is due.
    pub async fn evict_holders(&mut self, snapshot: &Snapshot, gpu: &Gpu, metrics: &Metrics) {
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
                return;
            }
        };
        let now = Instant::now();
        self.next_try.retain(|pod, _| holders.contains(pod));
        for pod in holders {
            if self.next_try.get(&pod).is_some_and(|at| *at > now) {
                continue;
            }
            let pause = self.evict(&pod, gpu, metrics).await;
            self.next_try.insert(pod, Instant::now() + pause);
        }
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
        match kube::evict(&client, &pod.namespace, &pod.name).await {
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
