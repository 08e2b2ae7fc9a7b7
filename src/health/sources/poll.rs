//! The polled source: counters, temperatures, NVLinks, reachability and NVML's recovery
//! action, read on a blocking thread every poll interval, and at once after a batch of faults
//! (what the driver says a fault needs comes right after it).

use std::time::SystemTime;

use tokio::time::MissedTickBehavior;
use tracing::warn;

use super::feed::{self, Observation, Report, Row, Setup, Started};
use super::observer::{GpuMap, Observer};
use crate::nvml::{GpuSignals, Nvml};

/// The row of the table.
pub const ROW: Row = Row {
    name: "signal poll",
    start,
};

/// One poll of every GPU, and when it finished.
#[derive(Debug)]
pub struct Polled {
    signals: Vec<GpuSignals>,
    at: SystemTime,
}

/// Polls every GPU's signals on a blocking thread; `None` (after a warning) when the poll
/// did not finish.
pub async fn poll_once(nvml: &Nvml) -> Option<Polled> {
    let poller = nvml.clone();
    match tokio::task::spawn_blocking(move || poller.poll_signals()).await {
        Ok(signals) => Some(Polled {
            signals,
            at: SystemTime::now(),
        }),
        Err(err) => {
            warn!(error = %crate::logging::error_chain(&err), "Signal poll failed");
            None
        }
    }
}

fn start(setup: &Setup<'_>, feed: feed::Feed) -> Started {
    let (nvml, interval, soon, stop) = (
        setup.nvml.clone(),
        setup.poll_interval,
        setup.poll_soon.clone(),
        setup.stop.clone(),
    );
    let sender = feed.clone();
    let task = feed::spawn_task(ROW.name, feed, stop.clone(), async move {
        let mut poll = tokio::time::interval(interval);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first tick fires at once: an initial poll before anything else.
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = poll.tick() => {}
                () = soon.notified() => poll.reset(),
            }
            let Some(polled) = poll_once(&nvml).await else {
                continue;
            };
            if sender.send(Report::Seen(Box::new(polled))).await.is_err() {
                return Ok(()); // the watcher is gone
            }
        }
    });
    Started::Running(Box::new(task))
}

impl Polled {
    /// Takes the poll into the tracker directly (the watcher's first poll, before it is
    /// ready).
    pub fn into_tracker(self, tracker: &mut crate::health::tracker::Tracker) {
        for gpu in &self.signals {
            tracker.observe_signals(gpu, self.at);
        }
    }
}

impl Observation for Polled {
    fn observe(self: Box<Self>, observer: &mut Observer, _gpus: &GpuMap) {
        self.into_tracker(&mut observer.tracker);
    }

    fn polls_after(&self) -> bool {
        false
    }
}
