//! The health watcher and the transition printer as daemon subsystems.

use std::io::Write;
use std::path::PathBuf;
use std::time::SystemTime;

use tracing::warn;

use super::kept::NodeEvents;
use super::watcher::{self, WatcherConfig};
use crate::daemon::{Context, Subsystem};
use crate::inventory::transitions;
use crate::inventory::{Inventory, Snapshot};
use crate::nvml::Nvml;
use crate::xid::ledger::XidLedger;

/// The XID ledger's piece of the handover state.
const LEDGER_KEY: &str = "xid-ledger";

/// The health watcher: NVML events, polled signals and the kernel log folded into the
/// inventory's health states.
#[derive(Debug)]
pub struct HealthWatcher {
    nvml: Nvml,
    config: WatcherConfig,
    xids: Option<XidLedger>,
    required: bool,
    /// The Node (and kubeconfig) a damaged kept-verdicts file is reported on as an event.
    node_events: Option<(String, Option<PathBuf>)>,
}

impl HealthWatcher {
    /// A watcher that stops the daemon when it cannot watch (`gpud health`).
    pub fn required(nvml: Nvml, config: WatcherConfig) -> Self {
        HealthWatcher {
            nvml,
            config,
            xids: None,
            required: true,
            node_events: None,
        }
    }

    /// A watcher beside other subsystems: if it cannot watch, they still run and devices keep
    /// discovery's state (health is a view, not a service).
    pub fn optional(nvml: Nvml, config: WatcherConfig) -> Self {
        HealthWatcher {
            required: false,
            ..HealthWatcher::required(nvml, config)
        }
    }

    /// Reports a damaged kept-verdicts file as a Warning event on the Node `node`
    /// (`Some((node, kubeconfig))`; the kubeconfig, else the in-cluster service account).
    pub fn with_node_events(mut self, node_events: Option<(String, Option<PathBuf>)>) -> Self {
        self.node_events = node_events;
        self
    }

    /// Also records every XID occurrence in `xids` (the exporter's counters).
    pub fn with_xids(mut self, xids: XidLedger) -> Self {
        self.xids = Some(xids);
        self
    }
}

impl Subsystem for HealthWatcher {
    type Settings = ();
    crate::subsystem_name!("health");
    const STARTS_FIRST: bool = true;

    async fn run(self, ctx: Context<()>, inventory: Inventory) -> anyhow::Result<()> {
        if let Some(ledger) = &self.xids {
            // The counts go on where the gpud taken over from left them: a scrape never sees a
            // counter go back.
            if let Some(handed) = ctx.inherited(LEDGER_KEY) {
                match ledger.take_on(handed) {
                    Ok(()) => tracing::info!("Took on the XID counts of the gpud taken over from"),
                    Err(err) => {
                        warn!(error = %err, "Cannot read the XID counts handed over; counting from zero")
                    }
                }
            }
            let ledger = ledger.clone();
            ctx.hand_on(LEDGER_KEY, move || ledger.handed());
        }
        // Ready once the event set is registered, not before: a fault injected (or happening)
        // before that is one the driver never reports as an event.
        let ready = ctx.ready_latch();
        let helpers = ctx.helpers();
        let events = self
            .node_events
            .map(|(node, kubeconfig)| NodeEvents::new(helpers, node, kubeconfig));
        let watched = watcher::run_with_xids(
            ctx.cancel_token(),
            self.nvml,
            inventory,
            self.config,
            self.xids,
            ready,
            events,
        )
        .await;
        match watched {
            Ok(()) => Ok(()),
            Err(err) if self.required => Err(err.into()),
            Err(err) => {
                warn!(error = %crate::logging::error_chain(&err), "Health watching is off: devices keep discovery's state");
                // Optional: the applet serves without it, so it must not hold readiness back.
                ctx.set_ready();
                Ok(())
            }
        }
    }
}

/// Prints one line per health transition on stdout (`gpud health`), as text or JSON.
#[derive(Debug)]
pub struct TransitionPrinter {
    json: bool,
}

impl TransitionPrinter {
    /// A printer of text lines, or JSON objects with `json`.
    pub fn new(json: bool) -> Self {
        TransitionPrinter { json }
    }
}

impl Subsystem for TransitionPrinter {
    type Settings = ();
    crate::subsystem_name!("printer");

    async fn run(self, ctx: Context<()>, inventory: Inventory) -> anyhow::Result<()> {
        let mut updates = inventory.subscribe();
        let mut last = updates.borrow_and_update().clone();
        ctx.set_ready();
        loop {
            tokio::select! {
                () = ctx.cancelled() => return Ok(()),
                changed = updates.changed() => if changed.is_err() { return Ok(()) },
            }
            let now = updates.borrow_and_update().clone();
            if !print_transitions(&last, &now, self.json) {
                // stdout is gone (the reader quit): nothing left to do.
                return Ok(());
            }
            last = now;
        }
    }
}

/// Prints transitions; `false` once stdout is closed.
fn print_transitions(before: &Snapshot, after: &Snapshot, json: bool) -> bool {
    let now = SystemTime::now();
    let mut out = std::io::stdout().lock();
    for change in transitions::between(before, after) {
        let line = if json {
            change.json(now)
        } else {
            format!(
                "{} {}",
                humantime::format_rfc3339_seconds(now),
                change.line()
            )
        };
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            return false;
        }
    }
    true
}
