//! The NVML event source: one event set for all GPUs, waited on by a dedicated thread.
//!
//! `nvmlEventSetWait_v2` is a blocking C call that can sleep for its whole timeout, so it never
//! runs on an async worker. The thread waits in short slices so that a stop request is honoured
//! within half a second, and forwards each event to the health tracker through a bounded
//! channel: a storm fills the channel and then the driver's own queue, it never grows gpud's
//! memory.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::NvmlError as E;
use tokio::sync::mpsc;
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
                    debug!(gpu = index, error = %err, "Event types unavailable");
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
                    warn!(gpu = index, error = %err.error, "Cannot register for events");
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
        let thread = std::thread::Builder::new()
            .name("gpud-nvml-events".into())
            .spawn(move || event_loop(lib, set, handles, tx, thread_stop))
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
                debug!(error = %err, "Event wait failed");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let Some(event) = translate(&data, &handles) else {
            continue;
        };
        if tx.blocking_send(event).is_err() {
            return; // the tracker is gone: nothing left to do
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
