//! The NVML event source: one event set for all GPUs, waited on by a dedicated thread.
//!
//! `nvmlEventSetWait_v2` is a blocking C call that can sleep for its whole timeout, so it never
//! runs on an async worker. The thread waits in short slices so that a stop request is honoured
//! within half a second, and forwards each event to the health tracker through a bounded
//! channel. A storm fills the channel and then the driver's own queue: the thread waits for
//! room instead of dropping an event, so every XID the driver delivers is counted, and gpud's
//! memory does not grow. A stop request ends that wait too, so dropping the [`EventWatcher`]
//! never hangs on a consumer that stopped reading.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::NvmlError as E;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tracing::{debug, warn};

use super::raw;
use super::{Nvml, NvmlError};

/// What happened, in gpud's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A critical XID with its code.
    Xid(u32),
    /// A corrected (single-bit) ECC error.
    SingleBitEcc,
    /// An uncorrected (double-bit) ECC error.
    DoubleBitEcc,
}

/// One event from the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuEvent {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// What happened.
    pub kind: EventKind,
    /// `(gpu instance, compute instance)` when the driver attributes the event to a MIG device.
    pub mig: Option<(u32, u32)>,
}

/// The event types gpud registers for, when the GPU supports them.
fn wanted() -> EventTypes {
    EventTypes::CRITICAL_XID_ERROR
        | EventTypes::DOUBLE_BIT_ECC_ERROR
        | EventTypes::SINGLE_BIT_ECC_ERROR
}

/// How long one wait may block before the thread checks for a stop request.
const WAIT_SLICE_MS: u32 = 500;

/// How long the thread sleeps before it retries handing an event to a full channel. The
/// consumer empties the channel in far less than this, so it bounds the delay, not the rate.
const FULL_RETRY: Duration = Duration::from_millis(1);

/// A running event thread; dropping it stops the thread.
#[derive(Debug)]
pub struct EventWatcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// GPUs and the event types registered for each.
    pub registered: Vec<(u32, String)>,
}

impl Drop for EventWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Nvml {
    /// Registers every reachable GPU for XID and ECC events and starts the event thread.
    /// A GPU or an event type the driver does not support is skipped with a debug line.
    pub fn watch_events(&self, tx: mpsc::Sender<GpuEvent>) -> Result<EventWatcher, NvmlError> {
        let lib = self.lib;
        let mut set = lib.create_event_set().map_err(|source| NvmlError::Call {
            call: "nvmlEventSetCreate",
            source,
        })?;
        let count = lib.device_count().map_err(|source| NvmlError::Call {
            call: "nvmlDeviceGetCount_v2",
            source,
        })?;
        let mut handles = HashMap::new();
        let mut registered = Vec::new();
        for index in 0..count {
            let Ok(device) = lib.device_by_index(index) else {
                continue;
            };
            let types = match device.supported_event_types() {
                Ok(supported) => supported & wanted(),
                Err(err) => {
                    debug!(gpu = index, error = %crate::logging::error_chain(&err), "Event types unavailable");
                    continue;
                }
            };
            if types.is_empty() {
                continue;
            }
            set = match device.register_events(types, set) {
                Ok(set) => set,
                // Registration failed and NVML may have left the set undefined: start a new
                // one and carry on without this GPU.
                Err(err) => {
                    warn!(gpu = index, error = %crate::logging::error_chain(&err.error), "Cannot register for events");
                    lib.create_event_set().map_err(|source| NvmlError::Call {
                        call: "nvmlEventSetCreate",
                        source,
                    })?
                }
            };
            handles.insert(raw::handle_key(&device), index);
            registered.push((index, format!("{types:?}")));
        }

        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = crate::logging::spawn_thread("gpud-nvml-events", move || {
            event_loop(lib, set, handles, tx, thread_stop)
        })
        .map_err(|source| NvmlError::Thread {
            what: "NVML event",
            source,
        })?;
        Ok(EventWatcher {
            stop,
            thread: Some(thread),
            registered,
        })
    }
}

fn event_loop(
    lib: &'static nvml_wrapper::Nvml,
    set: nvml_wrapper::EventSet<'static>,
    handles: HashMap<usize, u32>,
    tx: mpsc::Sender<GpuEvent>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        let data = match raw::event_wait(lib, &set, WAIT_SLICE_MS) {
            Ok(data) => data,
            Err(E::Timeout) => continue,
            Err(err) => {
                // A lost GPU can make every wait fail at once; back off instead of spinning.
                debug!(error = %crate::logging::error_chain(&err), "Event wait failed");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let Some(event) = translate(&data, &handles) else {
            continue;
        };
        if !hand_over(&tx, event, &stop) {
            return; // the tracker is gone, or a stop was requested: nothing left to do
        }
    }
}

/// Sends `event`, waiting while the channel is full. `false` when the receiver is gone or a
/// stop was requested meanwhile.
fn hand_over(tx: &mpsc::Sender<GpuEvent>, mut event: GpuEvent, stop: &AtomicBool) -> bool {
    loop {
        match tx.try_send(event) {
            Ok(()) => return true,
            Err(TrySendError::Closed(_)) => return false,
            Err(TrySendError::Full(back)) => {
                if stop.load(Ordering::Relaxed) {
                    return false;
                }
                event = back;
                std::thread::sleep(FULL_RETRY);
            }
        }
    }
}

fn translate(data: &raw::RawEventData, handles: &HashMap<usize, u32>) -> Option<GpuEvent> {
    let gpu = *handles.get(&data.device)?;
    let types = EventTypes::from_bits_truncate(data.event_type);
    let kind = if types.contains(EventTypes::CRITICAL_XID_ERROR) {
        EventKind::Xid(u32::try_from(data.event_data).unwrap_or(u32::MAX))
    } else if types.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
        EventKind::DoubleBitEcc
    } else if types.contains(EventTypes::SINGLE_BIT_ECC_ERROR) {
        EventKind::SingleBitEcc
    } else {
        return None;
    };
    let mig = (data.gpu_instance_id != u32::MAX && data.compute_instance_id != u32::MAX)
        .then_some((data.gpu_instance_id, data.compute_instance_id));
    Some(GpuEvent { gpu, kind, mig })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xid(code: u32) -> GpuEvent {
        GpuEvent {
            gpu: 0,
            kind: EventKind::Xid(code),
            mig: None,
        }
    }

    #[test]
    fn a_full_channel_makes_the_sender_wait_and_loses_nothing() {
        let (tx, mut rx) = mpsc::channel(4);
        let stop = Arc::new(AtomicBool::new(false));
        let sender = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || (0..1_000).all(|code| hand_over(&tx, xid(code), &stop)))
        };
        let mut received = Vec::new();
        while let Some(event) = rx.blocking_recv() {
            received.push(event);
        }
        assert!(sender.join().unwrap());
        assert_eq!(received, (0..1_000).map(xid).collect::<Vec<_>>());
    }

    #[test]
    fn a_stop_request_ends_the_wait_on_a_full_channel() {
        let (tx, rx) = mpsc::channel(1);
        let stop = Arc::new(AtomicBool::new(false));
        assert!(hand_over(&tx, xid(1), &stop));
        let sender = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || hand_over(&tx, xid(2), &stop))
        };
        stop.store(true, Ordering::Relaxed);
        assert!(!sender.join().unwrap(), "gave up instead of hanging");
        drop(rx);
    }

    #[test]
    fn a_closed_channel_ends_the_thread() {
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        assert!(!hand_over(&tx, xid(1), &AtomicBool::new(false)));
    }
}
