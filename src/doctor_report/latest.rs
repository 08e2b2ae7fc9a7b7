//! The latest report of the periodic doctor, shared with whoever reads it (the node status
//! puts its verdict on the Node; the admin endpoint serves it at `/doctor`): clone it, then
//! `subscribe()` for a `watch` receiver that changes after every run, or `get()` for the report
//! now. It is `None` until the first run finishes.

use std::sync::Arc;

use tokio::sync::watch;

use super::Report;

/// The latest report of the periodic doctor, shared with whoever reads it.
#[derive(Debug, Clone)]
pub struct LatestReport {
    tx: Arc<watch::Sender<Option<Arc<Report>>>>,
}

impl Default for LatestReport {
    fn default() -> Self {
        LatestReport {
            tx: Arc::new(watch::channel(None).0),
        }
    }
}

impl LatestReport {
    /// The report now (`None` before the first run finished).
    pub fn get(&self) -> Option<Arc<Report>> {
        self.tx.borrow().clone()
    }

    /// A receiver that sees every new report.
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Report>>> {
        self.tx.subscribe()
    }

    /// Replaces the report.
    pub fn publish(&self, report: Report) {
        self.tx.send_replace(Some(Arc::new(report)));
    }
}
