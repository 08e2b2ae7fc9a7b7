//! How fast one gpud process may talk to the API server, all its parts together: every
//! request of every client [`super::connect`] builds passes one process-wide [`Pacer`].
//!
//! - A token bucket ([`Limits`]: `--api-qps`, `--api-burst`): a request past the burst waits
//!   for its token instead of being sent (client-go's client-side limit, per process rather
//!   than per client). Waiting counts against the caller's time limit, so a caller that waits
//!   too long fails and retries on its own backoff.
//! - A reachability gate: when a request cannot reach the API server at all (no connection,
//!   connection reset), the process stops sending. One request, the probe, goes out after a
//!   random pause drawn uniformly from a window that starts at [`GATE_START`] and doubles with
//!   every failed probe up to [`GATE_MAX`]; the others wait at the gate. When the probe gets an
//!   answer, the gate opens. A fleet whose API server comes back after an outage thus returns
//!   spread over the whole window (full jitter, per process), instead of every subsystem of
//!   every node arriving on its own retry schedule in the same few seconds.
//! - A ramp: when the gate opens, the requests of the next [`RAMP_SHARE`]th of the last
//!   window (4 s after a long outage) go at random points of it rather than at once. Every
//!   subsystem of a process that waited at the gate (or paused until its probe) would
//!   otherwise send in the probe's second: a few nodes arriving together made the busiest
//!   second of a fleet's return, at several requests each.
//! - [`spread`]: the random factor (up to one and a half) callers' retry pauses are lengthened
//!   by ([`super::ApiError::paced`]), so a fleet's subsystems that failed together retry apart;
//!   and [`retry_by`]: while the gate is closed no caller pauses past its process's next probe,
//!   so a process's subsystems return with it, where the gate's jitter put it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backoff;

/// The first window a probe is drawn from once the API server cannot be reached.
pub const GATE_START: Duration = Duration::from_secs(1);
/// The widest window: after a long outage, a fleet's processes come back spread over this.
pub const GATE_MAX: Duration = Duration::from_secs(64);
/// The ramp after the gate opens is this share of the window the successful probe was drawn
/// from: 4 s after a long outage (a node's calls spread over seconds, not in one), 62 ms
/// after a blip (nothing a caller notices).
pub const RAMP_SHARE: u32 = 16;

/// The client-side limits of one process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Requests per second, sustained.
    pub qps: f64,
    /// Requests that may go at once after a quiet spell.
    pub burst: u32,
}

impl Default for Limits {
    /// What `--api-qps` and `--api-burst` default to.
    fn default() -> Self {
        Limits {
            qps: DEFAULT_QPS,
            burst: DEFAULT_BURST,
        }
    }
}

/// `--api-qps`'s default: a steady gpud sends well under one request a minute, a fault
/// a handful at once; 5 per second is client-go's default too.
pub const DEFAULT_QPS: f64 = 5.0;
/// `--api-burst`'s default: what one start or one fault needs at once (discovery, the Node,
/// the slices, two watches, the conditions, the labels, an event).
pub const DEFAULT_BURST: u32 = 10;

static LIMITS: OnceLock<Limits> = OnceLock::new();
static PACER: OnceLock<Arc<Pacer>> = OnceLock::new();

/// Sets this process's limits from `--api-qps` and `--api-burst`; the first call wins, and it
/// must come before the first [`super::connect`] (applets call it once their flags are read).
pub fn set_limits(qps: f64, burst: u32) {
    let _ = LIMITS.set(Limits { qps, burst });
}

/// The process's pacer, made on first use with the limits set (or the defaults).
pub(super) fn pacer() -> Arc<Pacer> {
    Arc::clone(PACER.get_or_init(|| {
        let limits = LIMITS.get().copied().unwrap_or_default();
        Arc::new(Pacer::new(limits, backoff::process_seed()))
    }))
}

/// The token bucket and the gate of one process.
#[derive(Debug)]
pub struct Pacer {
    limits: Limits,
    state: Mutex<State>,
    opened: Notify,
}

#[derive(Debug)]
struct State {
    /// Tokens now; below zero, requests already promised the tokens to come.
    tokens: f64,
    refilled: Instant,
    gate: Gate,
    /// Until when requests are spread after the gate opened.
    ramp_until: Option<Instant>,
    seed: u64,
}

/// How long after its process's next probe a caller that failed while the gate was closed
/// tries again: time for a probe to an answering API server to come back and open the gate.
pub const AFTER_PROBE: Duration = Duration::from_millis(250);

/// While this process's gate is closed, the longest a failed caller should pause: until just
/// after the next probe ([`Pacer::retry_by`]). `None` while the gate is open.
pub fn retry_by() -> Option<Duration> {
    pacer().retry_by(Instant::now())
}

/// Whether this process found the API server unreachable at its last try (its gate is
/// closed): a periodic check that fails so waits for its next turn rather than retrying.
pub fn unreachable() -> bool {
    retry_by().is_some()
}

/// A factor drawn uniformly from `[1, 1.5)` for this process's retry pauses: never shorter
/// than the backoff's step, which callers and their tests count on.
pub fn spread() -> f64 {
    let pacer = pacer();
    let mut state = pacer.lock();
    1.0 + backoff::spread(&mut state.seed, Duration::from_millis(500)).as_secs_f64()
}

/// Whether the API server could be reached at the last try.
#[derive(Debug, Clone, Copy)]
enum Gate {
    Open,
    /// Unreachable: the next probe may go at `probe_at`; `probing` while one is out.
    Closed {
        probe_at: Instant,
        window: Duration,
        probing: bool,
    },
}

/// What a request that passed the gate was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The gate was open.
    Open,
    /// The one request sent to find out whether the API server is back.
    Probe,
}

impl Pacer {
    pub fn new(limits: Limits, seed: u64) -> Pacer {
        Pacer {
            limits,
            state: Mutex::new(State {
                tokens: f64::from(limits.burst),
                refilled: Instant::now(),
                gate: Gate::Open,
                ramp_until: None,
                seed: seed | 1,
            }),
            opened: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until the gate lets this request through, for its place in the ramp if the
    /// gate just opened, then for its token.
    pub async fn admit(&self) -> Pass {
        let pass = self.through_gate().await;
        if pass == Pass::Open {
            let ramp = self.ramp_wait(Instant::now());
            if !ramp.is_zero() {
                tokio::time::sleep(ramp).await;
            }
        }
        let wait = self.take_token(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        pass
    }

    async fn through_gate(&self) -> Pass {
        loop {
            let opened = self.opened.notified();
            let mut opened = std::pin::pin!(opened);
            opened.as_mut().enable();
            let wait = {
                let mut state = self.lock();
                match &mut state.gate {
                    Gate::Open => return Pass::Open,
                    Gate::Closed {
                        probe_at, probing, ..
                    } => {
                        if !*probing && Instant::now() >= *probe_at {
                            *probing = true;
                            return Pass::Probe;
                        }
                        (!*probing).then_some(*probe_at)
                    }
                }
            };
            match wait {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = opened => {}
                    }
                }
                None => opened.await,
            }
        }
    }

    /// How long a request that passed the open gate at `now` waits: a random part of what
    /// is left of the ramp, so the requests arriving in it go at points spread over it.
    pub fn ramp_wait(&self, now: Instant) -> Duration {
        let mut state = self.lock();
        match state.ramp_until {
            Some(until) if until > now => backoff::spread(&mut state.seed, until - now),
            _ => {
                state.ramp_until = None;
                Duration::ZERO
            }
        }
    }

    /// Takes a token at `now`; how long the request must wait for it.
    pub fn take_token(&self, now: Instant) -> Duration {
        let mut state = self.lock();
        let elapsed = now.saturating_duration_since(state.refilled).as_secs_f64();
        state.refilled = now;
        state.tokens = (state.tokens + elapsed * self.limits.qps).min(f64::from(self.limits.burst));
        state.tokens -= 1.0;
        if state.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-state.tokens / self.limits.qps)
        }
    }

    /// The request that passed as `pass` reached the API server (`true`: any answer) or not.
    pub fn reached(&self, pass: Pass, reached: bool) {
        let mut state = self.lock();
        let now = Instant::now();
        match (state.gate, reached) {
            (Gate::Open, true) => {}
            (Gate::Closed { window, .. }, true) => {
                state.gate = Gate::Open;
                state.ramp_until = Some(now + window / RAMP_SHARE);
                drop(state);
                self.opened.notify_waiters();
            }
            (Gate::Open, false) => {
                let delay = backoff::spread(&mut state.seed, GATE_START);
                state.gate = Gate::Closed {
                    probe_at: now + delay,
                    window: GATE_START,
                    probing: false,
                };
            }
            (Gate::Closed { window, .. }, false) if pass == Pass::Probe => {
                let window = (window * 2).min(GATE_MAX);
                let delay = backoff::spread(&mut state.seed, window);
                state.gate = Gate::Closed {
                    probe_at: now + delay,
                    window,
                    probing: false,
                };
                drop(state);
                // Those waiting for the probe's outcome wait for the next one.
                self.opened.notify_waiters();
            }
            // A request sent before the gate closed failed too: the gate already knows.
            (Gate::Closed { .. }, false) => {}
        }
    }

    /// While the gate is closed, the longest pause from `now` for a caller that failed: to
    /// just after the next probe. A fleet's subsystems that lost the API server together
    /// have backoff timers in step; were they to sleep them out, each would come back on its
    /// own timer, in step with the same subsystem on every other node, however the gate
    /// spread the nodes' probes. Sleeping no longer than the probe, they come back when
    /// their process does. `None` while the gate is open.
    pub fn retry_by(&self, now: Instant) -> Option<Duration> {
        match self.lock().gate {
            Gate::Open => None,
            Gate::Closed { probe_at, .. } => {
                Some(probe_at.saturating_duration_since(now) + AFTER_PROBE)
            }
        }
    }

    /// A probe given up before its answer (its caller's time limit) counts as not reached.
    fn abandoned(&self, pass: Pass) {
        if pass == Pass::Probe {
            self.reached(pass, false);
        }
    }
}

/// The layer [`super::connect`] puts in every client.
#[derive(Debug, Clone)]
pub struct PaceLayer(pub Arc<Pacer>);

impl<S> tower::Layer<S> for PaceLayer {
    type Service = Paced<S>;

    fn layer(&self, inner: S) -> Paced<S> {
        Paced {
            inner,
            pacer: Arc::clone(&self.0),
        }
    }
}

/// A service whose requests pass the pacer first.
#[derive(Debug, Clone)]
pub struct Paced<S> {
    inner: S,
    pacer: Arc<Pacer>,
}

impl<S, R> tower::Service<R> for Paced<S>
where
    S: tower::Service<R>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        // The inner future sends nothing until polled, which is after the pacer admits it.
        let sent = self.inner.call(request);
        let pacer = Arc::clone(&self.pacer);
        Box::pin(async move {
            let pass = pacer.admit().await;
            let mut outcome = Outcome {
                pacer: &pacer,
                pass,
                done: false,
            };
            let result = sent.await;
            outcome.done = true;
            pacer.reached(pass, result.is_ok());
            result
        })
    }
}

/// Reports a probe whose future was dropped before its answer.
struct Outcome<'a> {
    pacer: &'a Pacer,
    pass: Pass,
    done: bool,
}

impl Drop for Outcome<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.pacer.abandoned(self.pass);
        }
    }
}

#[cfg(test)]
mod tests {
    use tower::Layer;

    use super::*;

    fn pacer(qps: f64, burst: u32) -> Pacer {
        Pacer::new(Limits { qps, burst }, 7)
    }

    #[test]
    fn the_burst_goes_at_once_and_the_rest_at_the_rate() {
        let pacer = pacer(2.0, 3);
        let now = Instant::now();
        let waits: Vec<Duration> = (0..6).map(|_| pacer.take_token(now)).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        assert_eq!(waits[3], Duration::from_millis(500));
        assert_eq!(waits[4], Duration::from_secs(1));
        assert_eq!(waits[5], Duration::from_millis(1500));
        // After a quiet spell the bucket is full again, never fuller than the burst.
        let later = now + Duration::from_secs(60);
        let waits: Vec<Duration> = (0..4).map(|_| pacer.take_token(later)).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        assert_eq!(waits[3], Duration::from_millis(500));
    }

    #[tokio::test]
    #[allow(clippy::disallowed_methods)] // a bare task standing for another subsystem's call
    async fn an_unreachable_api_server_lets_one_probe_through_within_the_window() {
        let pacer = Arc::new(pacer(100.0, 100));
        assert_eq!(pacer.admit().await, Pass::Open);
        pacer.reached(Pass::Open, false);
        let closed = Instant::now();
        // The first probe goes within the first window; the others wait behind it.
        assert_eq!(pacer.admit().await, Pass::Probe);
        assert!(closed.elapsed() <= GATE_START, "{:?}", closed.elapsed());
        let waiting = {
            let pacer = Arc::clone(&pacer);
            tokio::spawn(async move { pacer.admit().await })
        };
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(
            !waiting.is_finished(),
            "a second request passed a closed gate"
        );
        // A failed probe widens the window; the waiting request becomes the next probe.
        pacer.reached(Pass::Probe, false);
        let failed = Instant::now();
        assert_eq!(waiting.await.unwrap(), Pass::Probe);
        assert!(failed.elapsed() <= GATE_START * 2, "{:?}", failed.elapsed());
        // The probe gets an answer: everyone goes.
        pacer.reached(Pass::Probe, true);
        assert_eq!(pacer.admit().await, Pass::Open);
    }

    #[test]
    fn after_a_long_outage_processes_return_spread_over_the_widest_window() {
        // Many processes, each failing probes until the window is at its widest: their next
        // probes spread over it rather than arriving together.
        let mut firsts = Vec::new();
        for seed in 0..200u64 {
            let pacer = Pacer::new(Limits::default(), backoff::seed_from(&format!("n{seed}")));
            pacer.reached(Pass::Open, false);
            for _ in 0..8 {
                pacer.reached(Pass::Probe, false);
            }
            let start = Instant::now();
            let Gate::Closed { probe_at, .. } = pacer.lock().gate else {
                panic!("open")
            };
            firsts.push(probe_at.duration_since(start));
        }
        let mut per_second = vec![0u32; GATE_MAX.as_secs() as usize + 1];
        for first in &firsts {
            per_second[first.as_secs() as usize] += 1;
        }
        let busiest = per_second.iter().max().copied().unwrap_or(0);
        // Uniform over 64 s: about 3 a second; never a fifth of the fleet in one second.
        assert!(busiest <= 12, "{per_second:?}");
        assert!(firsts.iter().all(|f| *f <= GATE_MAX));
    }

    #[test]
    fn a_failed_caller_pauses_no_longer_than_just_after_the_next_probe() {
        let pacer = pacer(5.0, 10);
        assert_eq!(pacer.retry_by(Instant::now()), None);
        pacer.reached(Pass::Open, false);
        for _ in 0..6 {
            pacer.reached(Pass::Probe, false);
        }
        let now = Instant::now();
        let Gate::Closed { probe_at, .. } = pacer.lock().gate else {
            panic!("open")
        };
        assert_eq!(
            pacer.retry_by(now),
            Some(probe_at.duration_since(now) + AFTER_PROBE)
        );
        // A probe that is due (or out) leaves only the time for its answer.
        assert_eq!(pacer.retry_by(probe_at + GATE_MAX), Some(AFTER_PROBE));
        pacer.reached(Pass::Probe, true);
        assert_eq!(pacer.retry_by(now), None);
    }

    #[test]
    fn requests_right_after_the_gate_opens_go_spread_over_the_ramp() {
        let pacer = pacer(5.0, 10);
        assert_eq!(pacer.ramp_wait(Instant::now()), Duration::ZERO);
        pacer.reached(Pass::Open, false);
        for _ in 0..7 {
            pacer.reached(Pass::Probe, false);
        }
        pacer.reached(Pass::Probe, true);
        let opened = Instant::now();
        let ramp = GATE_MAX / RAMP_SHARE;
        let waits: Vec<Duration> = (0..50).map(|_| pacer.ramp_wait(opened)).collect();
        assert!(waits.iter().all(|w| *w < ramp), "{waits:?}");
        let (early, late) = (ramp / 4, ramp * 3 / 4);
        assert!(
            waits.iter().any(|w| *w < early) && waits.iter().any(|w| *w > late),
            "not spread over the ramp: {waits:?}"
        );
        // Late in the ramp only what is left of it; after it, nothing.
        assert!(
            pacer.ramp_wait(opened + ramp - Duration::from_millis(10)) < Duration::from_millis(10)
        );
        assert_eq!(pacer.ramp_wait(opened + ramp), Duration::ZERO);
        // A gate that opens after a blip has a ramp nobody notices.
        pacer.reached(Pass::Open, false);
        pacer.reached(Pass::Probe, true);
        let blip = Instant::now();
        assert!(pacer.ramp_wait(blip) < GATE_START / RAMP_SHARE);
    }

    #[test]
    fn retry_pauses_are_lengthened_by_up_to_a_half() {
        let factors: Vec<f64> = (0..200).map(|_| spread()).collect();
        assert!(
            factors.iter().all(|f| (1.0..1.5).contains(f)),
            "{factors:?}"
        );
        assert!(factors.iter().any(|f| *f < 1.1) && factors.iter().any(|f| *f > 1.4));
    }

    #[tokio::test]
    async fn a_probe_given_up_counts_as_a_failure() {
        let pacer = Arc::new(pacer(100.0, 100));
        pacer.reached(Pass::Open, false);
        let mut service = PaceLayer(Arc::clone(&pacer)).layer(tower::service_fn(|_: ()| {
            std::future::pending::<Result<(), ()>>()
        }));
        let call = tower::Service::call(&mut service, ());
        assert!(
            tokio::time::timeout(GATE_START + Duration::from_millis(300), call)
                .await
                .is_err()
        );
        let Gate::Closed {
            probing, window, ..
        } = pacer.lock().gate
        else {
            panic!("open")
        };
        assert!(!probing);
        assert_eq!(window, GATE_START * 2);
    }
}
