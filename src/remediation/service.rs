//! The remediation subsystem: one per node, after the health watcher. It follows the
//! inventory (the health verdicts), steps the [`Engine`] on every change and, while a GPU is
//! on its way back, once a second; publishes each GPU's phase into the inventory (for the
//! health watcher, the exporter and `/readyz`) and keeps the Node's escalation condition.

use std::time::Duration;

use tokio::sync::watch;

use super::args::Settings;
use super::engine::{Engine, Observed};
use super::escalation;
use crate::daemon::{Context, Subsystem};
use crate::inventory::Inventory;
use crate::kube::EventSender;
use crate::nvml::{Nvml, Rescanner};
use crate::remediation_state::metrics::Metrics;

/// How often a GPU on its way back is looked at (its processes, NVML's signals).
pub const TICK: Duration = Duration::from_secs(1);

/// Self-healing GPUs.
#[derive(Debug)]
pub struct Remediation {
    settings: Settings,
    nvml: Nvml,
    metrics: Metrics,
    /// Reads the node again after a MIG layout is made again (its MIG devices are new).
    rescanner: Option<Rescanner>,
}

impl Remediation {
    pub fn new(settings: Settings, nvml: Nvml) -> Self {
        Remediation {
            settings,
            nvml,
            metrics: Metrics::default(),
            rescanner: None,
        }
    }

    /// Rescans with `rescanner` once a GPU's MIG layout is made again after its reset.
    pub fn with_rescanner(mut self, rescanner: Rescanner) -> Self {
        self.rescanner = Some(rescanner);
        self
    }

    /// Its counters, for the exporter of the same process.
    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }
}

impl Subsystem for Remediation {
    type Settings = ();
    crate::subsystem_name!("remediation");

    async fn run(self, ctx: Context<()>, inventory: Inventory) -> anyhow::Result<()> {
        let kube = self
            .settings
            .node
            .clone()
            .map(|node| (node, self.settings.kubeconfig.clone()));
        let helpers = ctx.helpers();
        let events = kube
            .clone()
            .map(|(node, config)| EventSender::start(&helpers, node, config));
        let (condition, mut condition_failure) =
            match kube.map(|(node, config)| escalation::start(&helpers, node, config)) {
                Some((sender, failure)) => (Some(sender), Some(failure)),
                None => (None, None),
            };
        let nvml = self.nvml.clone();
        let rescanner = self.rescanner;
        let mut engine = Engine::new(self.settings, self.nvml, self.metrics, events, condition);
        engine.publish_to(inventory.clone());
        let mut changes = inventory.subscribe();
        ctx.set_ready();
        loop {
            let snapshot = changes.borrow_and_update().clone();
            let signals = if engine.wants_signals(&snapshot) {
                let nvml = nvml.clone();
                tokio::task::spawn_blocking(move || nvml.poll_signals())
                    .await
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            let observed = Observed {
                signals: signals.into_iter().map(|s| (s.gpu, s)).collect(),
            };
            engine.step(&snapshot, &observed).await;
            if engine.take_rescan()
                && let Some(rescanner) = &rescanner
                && let Err(err) = rescanner.rescan(&inventory).await
            {
                tracing::warn!(error = %crate::logging::error_chain(&err), "Cannot read the node again after making a MIG layout again");
            }
            engine.publish();
            let failure = condition_failure
                .as_mut()
                .and_then(|f| f.borrow_and_update().clone());
            let busy = [engine.busy_with(&inventory.current()), failure];
            let busy: Vec<String> = busy.into_iter().flatten().collect();
            ctx.ready_latch()
                .busy((!busy.is_empty()).then(|| busy.join("; ")));
            let tick = engine.busy().then_some(TICK);
            tokio::select! {
                () = ctx.cancelled() => break,
                changed = changes.changed() => if changed.is_err() { break },
                () = sleep(tick) => {}
                () = failure_changed(&mut condition_failure) => {}
            }
        }
        engine.stop().await;
        Ok(())
    }
}

/// Waits until the condition's writer says something new of its failure; never wakes
/// without a writer (or once it is gone).
async fn failure_changed(failure: &mut Option<watch::Receiver<Option<String>>>) {
    if let Some(receiver) = failure
        && receiver.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Sleeps for `pause`; never wakes without one.
async fn sleep(pause: Option<Duration>) {
    match pause {
        Some(pause) => tokio::time::sleep(pause).await,
        None => std::future::pending().await,
    }
}
