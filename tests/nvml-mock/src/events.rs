//! Event sets: which GPUs and event types a set listens to, the queue of delivered events, and
//! the blocking wait behind `nvmlEventSetWait_v2`.
//!
//! Each set has its own lock and condition variables, so a thread blocked in a wait holds no
//! lock the rest of the mock needs, and an injected event wakes it immediately.
//!
//! A set's queue holds [`QUEUE_LIMIT`] events. While its consumer keeps waiting on it, a full
//! queue makes the deliverer (the control-file watcher) wait for room: a storm injected at
//! once reaches the consumer whole, however slowly it reads. Only a consumer that stopped
//! waiting altogether (none for [`CONSUMER_GONE`]) has its oldest events dropped, so the mock
//! cannot grow without bound or stall fault injection for good; that is reported on stderr.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::driver::warn;
use std::time::{Duration, Instant};

use crate::ffi::{Res, rc};

/// `gpuInstanceId`/`computeInstanceId` of an event not attributed to a MIG instance.
pub const NO_INSTANCE: u32 = u32::MAX;

/// Events a set queues before a delivery waits for room.
pub const QUEUE_LIMIT: usize = 4096;

/// A consumer that has not waited on its set for this long is taken to have stopped: a
/// delivery to its full queue drops the oldest event instead of waiting.
pub const CONSUMER_GONE: Duration = Duration::from_secs(10);

/// How often a waiting delivery rechecks whether the consumer is still there.
const ROOM_RECHECK: Duration = Duration::from_millis(100);

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
    /// When a consumer last called `nvmlEventSetWait_v2` on the set.
    last_wait: Option<Instant>,
    /// Events dropped because the consumer stopped waiting.
    dropped: u64,
}

/// One `nvmlEventSet_t`.
#[derive(Debug, Default)]
pub struct EventSet {
    inner: Mutex<Inner>,
    /// Signalled when an event is queued.
    ready: Condvar,
    /// Signalled when an event is taken (or the set closes).
    room: Condvar,
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

    /// Queues the event if this set listens for it and wakes a waiter. Waits while the queue
    /// is full and its consumer is still waiting on the set (see the module documentation).
    /// Must not be called with the runtime lock held: the consumer needs it to reach the set.
    pub fn deliver(&self, event: &Event) {
        let mut inner = self.lock();
        let wanted = inner
            .registrations
            .iter()
            .any(|(g, m)| *g == event.gpu && m & event.event_type != 0);
        if !wanted {
            return;
        }
        while inner.queue.len() >= QUEUE_LIMIT && !inner.closed {
            let consumer_gone = inner
                .last_wait
                .is_none_or(|at| at.elapsed() >= CONSUMER_GONE);
            if consumer_gone {
                inner.queue.pop_front();
                if inner.dropped == 0 {
                    warn(&format!(
                        "an event set's consumer has not waited for {}s and its queue is full: \
                         dropping its oldest events",
                        CONSUMER_GONE.as_secs()
                    ));
                }
                inner.dropped += 1;
                break;
            }
            inner = match self.room.wait_timeout(inner, ROOM_RECHECK) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        if inner.closed {
            return;
        }
        inner.queue.push_back(*event);
        drop(inner);
        self.ready.notify_all();
    }

    /// Events dropped so far because the consumer stopped waiting.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Takes the oldest event, blocking up to `timeout_ms`; `NVML_ERROR_TIMEOUT` when none
    /// arrives, `NVML_ERROR_UNINITIALIZED` when the set is closed meanwhile.
    pub fn wait(&self, timeout_ms: u32) -> Res<Event> {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
        let mut inner = self.lock();
        inner.last_wait = Some(Instant::now());
        loop {
            if inner.closed {
                return Err(rc::UNINITIALIZED);
            }
            if let Some(event) = inner.queue.pop_front() {
                drop(inner);
                self.room.notify_all();
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

    /// Closes the set and wakes every waiter, and every delivery waiting for room.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
        self.room.notify_all();
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

    fn numbered(n: u64) -> Event {
        Event { data: n, ..xid(0) }
    }

    #[test]
    fn a_full_queue_makes_the_deliverer_wait_for_a_live_consumer() {
        let set = Arc::new(EventSet::default());
        set.register(0, 8);
        assert_eq!(set.wait(1), Err(rc::TIMEOUT)); // the consumer is there
        let total = QUEUE_LIMIT as u64 * 2 + 7;
        let deliverer = {
            let set = Arc::clone(&set);
            std::thread::spawn(move || (0..total).for_each(|n| set.deliver(&numbered(n))))
        };
        let mut received = Vec::new();
        while (received.len() as u64) < total {
            received.push(set.wait(5_000).unwrap().data);
            if received.len() == QUEUE_LIMIT {
                // A slow reader: the deliverer must wait, not drop.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        deliverer.join().unwrap();
        assert_eq!(received, (0..total).collect::<Vec<_>>());
        assert_eq!(set.dropped(), 0);
    }

    #[test]
    fn a_set_nobody_waits_on_drops_its_oldest_events_instead_of_blocking() {
        let set = EventSet::default();
        set.register(0, 8);
        for n in 0..QUEUE_LIMIT as u64 + 3 {
            set.deliver(&numbered(n));
        }
        assert_eq!(set.dropped(), 3);
        assert_eq!(set.wait(0).map(|e| e.data), Ok(3));
    }

    #[test]
    fn closing_releases_a_waiting_delivery() {
        let set = Arc::new(EventSet::default());
        set.register(0, 8);
        assert_eq!(set.wait(1), Err(rc::TIMEOUT));
        for n in 0..QUEUE_LIMIT as u64 {
            set.deliver(&numbered(n));
        }
        let deliverer = {
            let set = Arc::clone(&set);
            std::thread::spawn(move || set.deliver(&numbered(0)))
        };
        std::thread::sleep(Duration::from_millis(20));
        set.close();
        deliverer.join().unwrap();
        assert_eq!(set.dropped(), 0);
    }
}
