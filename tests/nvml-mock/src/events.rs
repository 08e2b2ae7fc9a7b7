//! Event sets: which GPUs and event types a set listens to, the queue of delivered events, and
//! the blocking wait behind `nvmlEventSetWait_v2`.
//!
//! Each set has its own lock and condition variable, so a thread blocked in a wait holds no
//! lock the rest of the mock needs, and an injected event wakes it immediately.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::ffi::{Res, rc};

/// `gpuInstanceId`/`computeInstanceId` of an event not attributed to a MIG instance.
pub const NO_INSTANCE: u32 = u32::MAX;

/// Events a set keeps before dropping the oldest; a consumer that stops waiting must not make
/// the mock grow without bound.
const QUEUE_LIMIT: usize = 4096;

/// One delivered event, before it is turned into an `nvmlEventData_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Index of the physical GPU.
    pub gpu: usize,
    /// One `nvmlEventType*` bit.
    pub event_type: u64,
    /// The XID for critical XID events, 0 otherwise.
    pub data: u64,
    pub gpu_instance: u32,
    pub compute_instance: u32,
}

#[derive(Debug, Default)]
struct Inner {
    /// `(gpu index, event mask)`, one entry per registered GPU.
    registrations: Vec<(usize, u64)>,
    queue: VecDeque<Event>,
    /// Set by `nvmlEventSetFree` and by the last `nvmlShutdown`; wakes and fails waiters.
    closed: bool,
}

/// One `nvmlEventSet_t`.
#[derive(Debug, Default)]
pub struct EventSet {
    inner: Mutex<Inner>,
    ready: Condvar,
}

impl EventSet {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds event types for a GPU (registrations accumulate, as in NVML).
    pub fn register(&self, gpu: usize, mask: u64) {
        let mut inner = self.lock();
        match inner.registrations.iter_mut().find(|(g, _)| *g == gpu) {
            Some((_, m)) => *m |= mask,
            None => inner.registrations.push((gpu, mask)),
        }
    }

    /// Queues the event if this set listens for it; wakes a waiter.
    pub fn deliver(&self, event: &Event) {
        let mut inner = self.lock();
        let wanted = inner
            .registrations
            .iter()
            .any(|(g, m)| *g == event.gpu && m & event.event_type != 0);
        if !wanted || inner.closed {
            return;
        }
        if inner.queue.len() >= QUEUE_LIMIT {
            inner.queue.pop_front();
        }
        inner.queue.push_back(*event);
        drop(inner);
        self.ready.notify_all();
    }

    /// Takes the oldest event, blocking up to `timeout_ms`; `NVML_ERROR_TIMEOUT` when none
    /// arrives, `NVML_ERROR_UNINITIALIZED` when the set is closed meanwhile.
    pub fn wait(&self, timeout_ms: u32) -> Res<Event> {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
        let mut inner = self.lock();
        loop {
            if inner.closed {
                return Err(rc::UNINITIALIZED);
            }
            if let Some(event) = inner.queue.pop_front() {
                return Ok(event);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(rc::TIMEOUT);
            }
            inner = match self.ready.wait_timeout(inner, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Closes the set and wakes every waiter.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn xid(gpu: usize) -> Event {
        Event {
            gpu,
            event_type: 8,
            data: 79,
            gpu_instance: NO_INSTANCE,
            compute_instance: NO_INSTANCE,
        }
    }

    #[test]
    fn waits_time_out_and_deliveries_wake_waiters() {
        let set = Arc::new(EventSet::default());
        set.register(0, 8);
        let start = Instant::now();
        assert_eq!(set.wait(30), Err(rc::TIMEOUT));
        assert!(start.elapsed() >= Duration::from_millis(30));
        let waiter = {
            let set = Arc::clone(&set);
            std::thread::spawn(move || set.wait(5_000))
        };
        std::thread::sleep(Duration::from_millis(20));
        set.deliver(&xid(1)); // not registered for GPU 1
        set.deliver(&xid(0));
        assert_eq!(waiter.join().unwrap(), Ok(xid(0)));
        set.close();
        assert_eq!(set.wait(1_000), Err(rc::UNINITIALIZED));
    }
}
