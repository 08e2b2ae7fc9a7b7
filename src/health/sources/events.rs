//! The NVML event source: XIDs and ECC errors as the driver reports them, on NVML's event
//! thread. The watcher cannot do without it (ECC events count whatever the XID policy says),
//! so a failure to register is the watcher's failure.

use std::time::SystemTime;

use tokio::sync::mpsc;

use super::feed::{self, Feed, Observation, Report, Row, Setup, Started};
use super::observer::{GpuMap, Observer};
use crate::health::dedup::{Occurrence, XidSource};
use crate::nvml::events::{EventKind, GpuEvent};

/// The row of the table.
pub const ROW: Row = Row {
    name: "NVML events",
    start,
};

/// Queue depth between NVML's event thread and the hand-over to the watcher's queue.
const QUEUE: usize = 1024;

fn start(setup: &Setup<'_>, feed: Feed) -> Started {
    let (tx, mut rx) = mpsc::channel::<GpuEvent>(QUEUE);
    let thread = match setup.nvml.watch_events(tx) {
        Ok(thread) => thread,
        Err(err) => return Started::Fatal(err),
    };
    let stop = setup.stop.clone();
    let sender = feed.clone();
    // NVML's event thread writes typed events; this hands each on, waiting while the watcher's
    // queue is full (the event thread then waits too). The event thread ending closes `rx`.
    let forward = feed::spawn_task(ROW.name, feed, stop.clone(), async move {
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                event = rx.recv() => event,
            };
            let Some(event) = event else {
                return Err("NVML's event thread ended".to_owned());
            };
            if sender.send(Report::Seen(Box::new(event))).await.is_err() {
                return Ok(()); // the watcher is gone
            }
        }
    });
    Started::Running(Box::new((thread, forward)))
}

impl Observation for GpuEvent {
    fn observe(self: Box<Self>, observer: &mut Observer, gpus: &GpuMap) {
        match self.kind {
            EventKind::Xid(code) => {
                let at_us = observer.now_us();
                if let Some(bus_id) = gpus.bus_id(self.gpu)
                    && observer.dedup.observe(XidSource::Nvml, bus_id, code, at_us)
                        == Occurrence::Duplicate
                {
                    return;
                }
                observer.on_xid(gpus, self.gpu, code, self.mig);
            }
            EventKind::DoubleBitEcc => observer
                .tracker
                .observe_dbe_event(self.gpu, SystemTime::now()),
            EventKind::SingleBitEcc => observer
                .tracker
                .observe_sbe_event(self.gpu, SystemTime::now()),
        }
    }
}
