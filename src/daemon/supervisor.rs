//! The supervisor: starts subsystems (those that start first, the health watcher, before the
//! others, which then read its first verdicts), waits for readiness, fans SIGHUP out, stops
//! everything with one grace period and maps the outcome to an exit code.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, warn};

use super::admin::{self, Admin};
use super::context::{Context, ReadyLatch};
use super::error::Error;
use super::file_watch;
use super::notify::Notifier;
use super::readiness::{Readiness, State};
use super::signals::{Request, Signals};
use super::subsystem::Subsystem;
use super::successor::Successor;
use crate::handover::take::{Predecessor, Takeover};
use crate::handover::{self, Board, offer};
use crate::inventory::Inventory;
use crate::listeners;

/// How long subsystems get to finish after the stop signal before the process exits anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How long the others wait for the subsystems that start first ([`Subsystem::STARTS_FIRST`])
/// to be ready: a hung NVML delays the start by this much at most, never forever. A stop
/// signal ends the wait, and the others are never started.
pub const FIRST_WAIT: Duration = Duration::from_secs(5);
/// How long a gpud that took over waits for every subsystem to be ready before it tells the
/// old one to stop anyway (and before it serves its own handover socket after a cold start):
/// a subsystem that cannot get ready must not keep two daemons running side by side.
pub const TAKEOVER_READY_WAIT: Duration = Duration::from_secs(30);

type Started = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;
type Starter = Box<dyn FnOnce(CancellationToken, Inventory) -> Started + Send>;
type FanOut<C> = Box<dyn Fn(&Arc<C>) + Send>;

struct Pending {
    name: &'static str,
    slot: usize,
    /// Serves the other subsystems (rescans, health, the admin endpoint) rather than doing
    /// the applet's own work: the daemon stops once every other subsystem has finished.
    support: bool,
    /// Starts before the others, which wait for it to be ready ([`Subsystem::STARTS_FIRST`]).
    first: bool,
    start: Starter,
}

/// A daemon under construction: the applet adds its subsystems, then [`Daemon::run`]s it.
///
/// `C` is the applet's reloadable configuration: `reload` builds a fresh one on SIGHUP, and
/// each subsystem sees its own part of it through its [`Context`].
pub struct Daemon<C> {
    applet: &'static str,
    current: Arc<C>,
    reload: Box<dyn Fn() -> Result<C, Error> + Send>,
    fan_out: Vec<FanOut<C>>,
    pending: Vec<Pending>,
    readiness: Readiness,
    notifier: Notifier,
    workers: usize,
    /// Routes subsystems add to the admin endpoint (`/doctor`).
    extra_routes: axum::Router,
    /// Config files whose change of contents reloads as SIGHUP does.
    watched: Vec<PathBuf>,
    /// The handover socket ([`Daemon::hand_over`]); `None` takes over from nobody.
    handover: Option<PathBuf>,
    /// The state handed from the process taken over from and to the next one.
    board: Board,
    /// How to start this daemon again for `gpud upgrade` and SIGUSR2.
    successor: Option<Successor>,
}

impl<C> std::fmt::Debug for Daemon<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("applet", &self.applet)
            .field("subsystems", &self.readiness.states())
            .finish_non_exhaustive()
    }
}

impl Daemon<()> {
    /// A daemon without reloadable configuration: SIGHUP is logged and changes nothing.
    pub fn fixed(applet: &'static str) -> Self {
        Daemon::new(applet, (), || Ok(()))
    }
}

impl<C: Send + Sync + 'static> Daemon<C> {
    /// A daemon for `applet` whose configuration starts as `initial` and is rebuilt by
    /// `reload` on every SIGHUP (an error keeps the running configuration).
    // systemd's NOTIFY_SOCKET is the daemon's own configuration, read once here.
    #[allow(clippy::disallowed_methods)]
    pub fn new(
        applet: &'static str,
        initial: C,
        reload: impl Fn() -> Result<C, Error> + Send + 'static,
    ) -> Self {
        Daemon {
            applet,
            current: Arc::new(initial),
            reload: Box::new(reload),
            fan_out: Vec::new(),
            pending: Vec::new(),
            readiness: Readiness::default(),
            notifier: Notifier::from_env(std::env::var_os("NOTIFY_SOCKET")),
            workers: 2,
            extra_routes: axum::Router::new(),
            watched: Vec::new(),
            handover: None,
            board: Board::default(),
            successor: Successor::of_this_process(),
        }
    }

    /// Takes over from a gpud of this applet already running on the node, and hands over to
    /// the next, through a socket in `state_dir` (`""`: never; see [`crate::handover`]).
    pub fn hand_over(&mut self, state_dir: &str) {
        if !state_dir.is_empty() {
            self.handover = Some(handover::socket_of(
                std::path::Path::new(state_dir),
                self.applet,
            ));
        }
    }

    /// Reloads, as on SIGHUP, whenever the contents of one of `files` change (a ConfigMap
    /// update in a container nothing can signal; see [`super::file_watch`]).
    pub fn reload_on_change(&mut self, files: impl IntoIterator<Item = PathBuf>) {
        self.watched.extend(files);
    }

    /// The readiness board, for the routes of an admin endpoint served by a subsystem.
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// The `/healthz` and `/readyz` routes, for a subsystem that serves HTTP anyway (the
    /// exporter); see [`Daemon::serve_admin`] otherwise.
    pub fn admin_routes(&self) -> axum::Router {
        admin::routes(self.readiness.clone()).merge(self.extra_routes.clone())
    }

    /// Adds routes to the admin endpoint; call it before [`Daemon::admin_routes`] or
    /// [`Daemon::serve_admin`].
    pub fn add_admin_routes(&mut self, routes: axum::Router) {
        self.extra_routes = std::mem::take(&mut self.extra_routes).merge(routes);
    }

    /// Serves `/healthz` and `/readyz` on `address` (`""` leaves them off).
    pub fn serve_admin(&mut self, address: &str) {
        if !address.is_empty() {
            let routes = self.admin_routes();
            self.add_support(Admin::new(address.to_owned(), routes));
        }
    }

    /// Adds a subsystem that keeps its start-up settings.
    pub fn add_fixed<S: Subsystem<Settings = ()>>(&mut self, subsystem: S) {
        self.add(subsystem, |_: &Arc<C>| Arc::new(()));
    }

    /// Adds a subsystem that serves the others (the rescanner, the health watcher beside a
    /// device plugin): it runs as long as they do, and its finishing early stops nothing.
    pub fn add_support<S: Subsystem<Settings = ()>>(&mut self, subsystem: S) {
        self.push(subsystem, |_: &Arc<C>| Arc::new(()), true);
    }

    /// Adds a subsystem whose settings are `part` of the configuration, re-derived on every
    /// reload.
    pub fn add<S: Subsystem>(
        &mut self,
        subsystem: S,
        part: impl Fn(&Arc<C>) -> Arc<S::Settings> + Send + 'static,
    ) {
        self.push(subsystem, part, false);
    }

    fn push<S: Subsystem>(
        &mut self,
        subsystem: S,
        part: impl Fn(&Arc<C>) -> Arc<S::Settings> + Send + 'static,
        support: bool,
    ) {
        let (tx, rx) = watch::channel(part(&self.current));
        self.fan_out.push(Box::new(move |config| {
            tx.send_replace(part(config));
        }));
        let name = subsystem.name();
        let slot = self.readiness.register(name);
        let latch = ReadyLatch::new(self.readiness.clone(), slot);
        let span = subsystem.span();
        let board = self.board.clone();
        let start: Starter = Box::new(move |cancel, inventory| {
            let ctx = Context::new(cancel, latch, rx, board);
            Box::pin(
                async move {
                    info!("Starting");
                    let outcome = subsystem.run(ctx, inventory).await;
                    if outcome.is_ok() {
                        info!("Stopped");
                    }
                    outcome
                }
                .instrument(span),
            )
        });
        self.pending.push(Pending {
            name,
            slot,
            support,
            first: S::STARTS_FIRST,
            start,
        });
    }

    /// Runs the daemon until SIGTERM/SIGINT, a subsystem's failure, or every subsystem having
    /// finished its work. Builds the runtime; call it from `main`'s thread.
    pub fn run(self, inventory: Inventory) -> Result<ExitCode, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.workers)
            .thread_name("gpud-worker")
            .enable_all()
            .build()
            .map_err(|err| Error::Failure(format!("cannot start the runtime: {err}")))?;
        let outcome = runtime.block_on(self.supervise(inventory));
        if let Ok(Ended::Unfinished) = outcome {
            // Work still runs on a blocking thread (an NVML call stuck on a sick GPU, a MIG
            // apply): ending the process is what stops it, at once, so that the gpud that
            // took over (told so by this process's end) never works beside it.
            runtime.shutdown_background();
            return Ok(ExitCode::SUCCESS);
        }
        // A blocking NVML call stuck on a sick GPU must not hold the exit.
        runtime.shutdown_timeout(Duration::from_millis(500));
        if let Ok(Ended::HandedOver) = outcome {
            // The kubelet restarts a container whose process ends, and the pod of this one is
            // deleted only once the new pod is ready: end when told to, not before, holding
            // nothing (the runtime and every connection it still had are gone).
            listeners::forget_all();
            super::signals::wait_for_stop();
        }
        outcome.map(|_| ExitCode::SUCCESS)
    }

    async fn supervise(self, inventory: Inventory) -> Result<Ended, Error> {
        let mut signals = Signals::install()
            .map_err(|err| Error::Failure(format!("cannot install signal handlers: {err}")))?;
        raise_fd_limit();
        let Daemon {
            applet,
            reload,
            fan_out,
            pending,
            readiness,
            notifier,
            watched,
            handover,
            board,
            successor,
            ..
        } = self;
        let started = Instant::now();
        // The state directory is root's: one another user could write to is refused before
        // anything in it is trusted (the handover socket below, saved state later).
        if let Some(socket) = &handover
            && let Some(state_dir) = socket.parent().and_then(std::path::Path::parent)
        {
            handover::state_dir::check(state_dir, socket).map_err(Error::Config)?;
        }
        // Before anything binds: the sockets of a running gpud are taken rather than bound.
        let mut takeover = match &handover {
            Some(socket) => Some(take_over(socket, &board).await?),
            None => None,
        };
        let (handover_tx, mut handover_requests) = mpsc::unbounded_channel();
        let mut handover_pending = handover.is_some();
        let handover_due = tokio::time::Instant::now() + TAKEOVER_READY_WAIT;
        // Whether this process started the one that takes over (bare metal: it then exits once
        // it has handed over; a pod's process that was taken over from waits to be stopped).
        let started_successor = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let upgrade: offer::Upgrade = {
            let started_successor = std::sync::Arc::clone(&started_successor);
            std::sync::Arc::new(move || {
                let started = match &successor {
                    Some(successor) => successor.start(),
                    None => Err("the path of this process's binary is unknown".to_owned()),
                };
                if started.is_ok() {
                    started_successor.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                started
            })
        };
        // Set when a new gpud took over: the connection it waits on closes as this one ends.
        let mut handed_to = None;
        let mut file_changes = file_watch::watch(&watched);
        let root = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let mut names = HashMap::new();
        let mut primaries = HashMap::new();
        let (first, rest): (Vec<Pending>, Vec<Pending>) =
            pending.into_iter().partition(|p| p.first);
        let first_slots: Vec<usize> = first.iter().map(|p| p.slot).collect();
        let mut first_tasks = Vec::new();
        // A signal that ended the wait for the first subsystems, answered below.
        let mut early = None;
        for (index, batch) in [first, rest].into_iter().enumerate() {
            if index == 1 && !first_slots.is_empty() {
                early = wait_for_first(&readiness, &first_slots, &first_tasks, &mut signals).await;
                if early == Some(Request::Stop) {
                    // The others never start: stop what did at once.
                    break;
                }
            }
            for Pending {
                name,
                slot,
                support,
                start,
                ..
            } in batch
            {
                let run = start(root.child_token(), inventory.clone());
                let handle = tasks.spawn(async move { (slot, run.await) });
                names.insert(handle.id(), name);
                if !support {
                    primaries.insert(handle.id(), name);
                }
                if index == 0 {
                    first_tasks.push(handle);
                }
            }
        }
        info!(
            applet,
            subsystems = %names.values().copied().collect::<Vec<_>>().join(","),
            gpus = inventory.current().gpus.len(),
            "gpud started"
        );
        let mut changes = readiness.subscribe();
        let mut announced = false;
        let mut abandoned = board.abandoned();
        let mut abandoned_open = true;
        if early == Some(Request::Reload) {
            reload_now(&reload, &fan_out, &notifier, announced, "SIGHUP");
        }
        let outcome = loop {
            if early == Some(Request::Stop) {
                info!("Stopping on signal");
                break Ok(());
            }
            tokio::select! {
                request = signals.next() => match request {
                    Request::Stop => {
                        info!("Stopping on signal");
                        break Ok(());
                    }
                    Request::Reload => reload_now(&reload, &fan_out, &notifier, announced, "SIGHUP"),
                    Request::Upgrade => match upgrade() {
                        Ok((pid, program)) => info!(pid, program, "SIGUSR2: started the installed gpud to take over from this one"),
                        Err(err) => warn!(error = %err, "SIGUSR2: cannot start the installed gpud; keeping this one"),
                    },
                },
                Some(path) = file_changes.recv() => {
                    let trigger = format!("{} changed", path.display());
                    reload_now(&reload, &fan_out, &notifier, announced, &trigger);
                },
                changed = changes.changed(), if !announced => {
                    if changed.is_ok() && readiness.all_ready() {
                        announced = true;
                        if handover_pending {
                            handover_pending = false;
                            complete_handover(handover.as_deref(), takeover.take(), &board, &readiness, &root, &handover_tx, &upgrade, &notifier, started);
                        }
                        notifier.ready();
                        info!("All subsystems ready");
                    }
                }
                () = tokio::time::sleep_until(handover_due), if handover_pending => {
                    handover_pending = false;
                    warn!(wait = ?TAKEOVER_READY_WAIT, not_ready = %readiness.report().1.trim(), "Not every subsystem is ready; taking over (or serving the handover socket) anyway");
                    complete_handover(handover.as_deref(), takeover.take(), &board, &readiness, &root, &handover_tx, &upgrade, &notifier, started);
                }
                changed = abandoned.changed(), if abandoned_open => {
                    if changed.is_err() {
                        abandoned_open = false;
                        continue;
                    }
                    // The new process told systemd it was the main process before it went
                    // away: this one is again, or systemd would take the service for ended.
                    notifier.main_pid(std::process::id());
                }
                Some(request) = handover_requests.recv() => match request {
                    offer::Request::Stop { to, connection } => {
                        info!(to, "A new gpud took over; stopping");
                        handed_to = Some(connection);
                        break Ok(());
                    }
                },
                Some(joined) = tasks.join_next_with_id() => match joined {
                    Ok((id, (slot, Ok(())))) => {
                        readiness.mark(slot, State::Done);
                        info!(subsystem = names.get(&id).copied().unwrap_or("?"), "Subsystem finished");
                        if primaries.remove(&id).is_some() && primaries.is_empty() {
                            break Ok(());
                        }
                    }
                    Ok((id, (slot, Err(cause)))) => {
                        let name = names.get(&id).copied().unwrap_or("subsystem");
                        readiness.mark(slot, State::Failed(crate::logging::error_chain(cause.as_ref())));
                        break Err(Error::Subsystem { name, cause });
                    }
                    Err(join) => {
                        let name = names.get(&join.id()).copied().unwrap_or("subsystem");
                        break Err(Error::Subsystem { name, cause: anyhow::anyhow!("stopped unexpectedly: {join}") });
                    }
                },
            }
        };
        // A process that handed over is not the service stopping: the new one is its main
        // process now.
        if handed_to.is_none() {
            notifier.stopping();
        }
        root.cancel();
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while let Some(joined) = tasks.join_next_with_id().await {
                if let Ok((id, (_, Err(cause)))) = joined {
                    let name = names.get(&id).copied().unwrap_or("subsystem");
                    error!(subsystem = name, error = %crate::logging::error_chain(cause.as_ref()), "Subsystem failed while stopping");
                }
            }
        })
        .await;
        if let (Some(socket), None) = (&handover, &handed_to) {
            listeners::remove_if_owned(socket);
        }
        if drained.is_err() {
            warn!(
                grace = ?SHUTDOWN_GRACE,
                "Some subsystems did not stop in time; exiting anyway"
            );
            tasks.abort_all();
            return outcome.map(|()| Ended::Unfinished);
        }
        if handed_to.take().is_some()
            && !started_successor.load(std::sync::atomic::Ordering::SeqCst)
        {
            info!("Handed over to the new gpud; waiting to be stopped");
            // From here a SIGTERM stays pending for `wait_for_stop` instead of reaching the
            // handlers that go with the runtime.
            super::signals::block();
            return outcome.map(|()| Ended::HandedOver);
        }
        outcome.map(|()| Ended::Stopped)
    }
}

/// How the supervisor's run ended well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Stopped,
    /// A new gpud took over that this one did not start: wait to be stopped.
    HandedOver,
    /// Some subsystem did not stop within the grace period: its work may go on, so the
    /// process ends now, even if it handed over.
    Unfinished,
}

/// Looks for a running gpud on `socket` and takes over its sockets and state (on a blocking
/// thread: the exchange blocks, for a few seconds at most). Another takeover under way is an
/// error: two new processes must not both start.
async fn take_over(socket: &std::path::Path, board: &Board) -> Result<Found, Error> {
    let (socket, board) = (socket.to_path_buf(), board.clone());
    let found = tokio::task::spawn_blocking(move || handover::take::take_over(&socket, &board))
        .await
        .map_err(|err| Error::Failure(format!("the takeover stopped unexpectedly: {err}")))?;
    match found {
        Takeover::Took(predecessor) => {
            info!(
                from = predecessor.pid,
                sockets = %predecessor.sockets.join(","),
                state = %predecessor.pieces.join(","),
                "Taking over from the running gpud"
            );
            Ok(Found::Predecessor(predecessor))
        }
        Takeover::Cold { why, stopped: None } => {
            info!(reason = %why, "Starting cold");
            Ok(Found::Nobody)
        }
        Takeover::Cold {
            why,
            stopped: Some(at),
        } => {
            warn!(reason = %why, "Starting cold");
            Ok(Found::Stopped(at))
        }
        Takeover::Busy(why) => Err(Error::Unavailable(format!(
            "{why}; this one does not start (start it again once that takeover has finished)"
        ))),
    }
}

/// What the start found on the handover socket.
#[derive(Debug)]
enum Found {
    Nobody,
    /// A gpud that could not hand over, stopped at this moment: the node's gap starts there.
    Stopped(Instant),
    Predecessor(Predecessor),
}

/// Every subsystem serves (or [`TAKEOVER_READY_WAIT`] passed): the process taken over from is
/// told to stop, systemd learns the new main pid, and this process serves the handover socket
/// for the next one.
#[allow(clippy::too_many_arguments)]
fn complete_handover(
    socket: Option<&std::path::Path>,
    found: Option<Found>,
    board: &Board,
    readiness: &Readiness,
    stop: &CancellationToken,
    requests: &mpsc::UnboundedSender<offer::Request>,
    upgrade: &offer::Upgrade,
    notifier: &Notifier,
    started: Instant,
) {
    let Some(socket) = socket else { return };
    match found {
        Some(Found::Predecessor(predecessor)) => {
            let unused = listeners::close_untaken();
            if !unused.is_empty() {
                info!(sockets = %unused.join(","), "Closed the sockets taken over that this configuration does not serve");
            }
            notifier.main_pid(std::process::id());
            let pid = predecessor.pid;
            let board = board.clone();
            tokio::task::spawn_blocking(move || {
                handover::pause::here("before-stop");
                match predecessor.stop() {
                    Ok(finishing) => info!(
                        from = pid,
                        finishing_ms = finishing.as_millis() as u64,
                        takeover_ms = started.elapsed().as_millis() as u64,
                        "Took over: the gpud taken over from has finished"
                    ),
                    Err(err) => {
                        warn!(from = pid, error = %err, "The gpud taken over from did not finish cleanly")
                    }
                }
                board.mark_predecessor_gone();
            });
        }
        Some(Found::Stopped(at)) => {
            info!(
                gap_ms = at.elapsed().as_millis() as u64,
                "Serving after a cold start: the node had no gpud serving for this long"
            );
        }
        Some(Found::Nobody) | None => {}
    }
    match offer::bind(socket) {
        Ok(listener) => {
            // Serves until the process ends: an end before is a next gpud that would start
            // cold, and shows on /readyz.
            super::helpers::spawn_unowned(
                readiness,
                "handover",
                stop.clone(),
                format!("handover socket server ({})", socket.display()),
                offer::serve(
                    listener,
                    socket.to_path_buf(),
                    board.clone(),
                    requests.clone(),
                    std::sync::Arc::clone(upgrade),
                ),
            );
        }
        Err(err) => warn!(
            error = %err,
            "Cannot serve the handover socket: a new gpud will start cold (check that the state directory is writable)"
        ),
    }
}

/// Raises the soft open-file limit to the hard one, before any server sizes its connection cap
/// from it: connections, sockets and NVML's own descriptors share one table, and systemd's
/// usual soft limit of 1024 is easy to reach.
/// Builds the next configuration and hands each subsystem its part; a failure keeps the
/// running one. `announced`: systemd has been told READY=1 (before that a reload must not say
/// the daemon is ready). One log line says the outcome and what asked for it.
fn reload_now<C>(
    reload: &dyn Fn() -> Result<C, Error>,
    fan_out: &[FanOut<C>],
    notifier: &Notifier,
    announced: bool,
    trigger: &str,
) {
    if announced {
        notifier.reloading();
    }
    match reload() {
        Ok(next) => {
            let next = Arc::new(next);
            for send in fan_out {
                send(&next);
            }
            info!(trigger, "Configuration reloaded");
        }
        Err(err) => {
            warn!(trigger, error = %crate::logging::error_chain(&err), "Configuration not reloaded; keeping the running one")
        }
    }
    if announced {
        notifier.ready();
    }
}

/// Waits until every subsystem in `slots` is ready (or done, not ready, failed), its task
/// ended, or [`FIRST_WAIT`] passed, whichever comes first, or a stop signal came; returns the
/// stop, or a reload asked for meanwhile.
async fn wait_for_first(
    readiness: &Readiness,
    slots: &[usize],
    tasks: &[tokio::task::AbortHandle],
    signals: &mut Signals,
) -> Option<Request> {
    let mut changes = readiness.subscribe();
    let settled = || {
        let states = readiness.states();
        slots.iter().all(|slot| {
            states
                .get(*slot)
                .is_none_or(|(_, state)| *state != State::Starting)
        }) || tasks.iter().any(tokio::task::AbortHandle::is_finished)
    };
    let settle = tokio::time::timeout(FIRST_WAIT, async {
        while !settled() {
            // A task that ends without marking itself is seen on the next tick.
            let _ = tokio::time::timeout(Duration::from_millis(50), changes.changed()).await;
        }
    });
    tokio::pin!(settle);
    let mut reload = None;
    loop {
        tokio::select! {
            waited = &mut settle => {
                if waited.is_err() {
                    warn!(wait = ?FIRST_WAIT, "The subsystems that start first are not ready yet; starting the others anyway");
                }
                return reload;
            }
            request = signals.next() => match request {
                Request::Stop => return Some(Request::Stop),
                // Answered once every subsystem has started, so that all of them reload.
                Request::Reload => reload = Some(Request::Reload),
                // A daemon still starting has nothing to hand over yet.
                Request::Upgrade => warn!("SIGUSR2 while starting: ignored; send it again once gpud is ready"),
            },
        }
    }
}

fn raise_fd_limit() {
    match crate::http::raise_fd_limit() {
        Ok((before, now)) if before < now => {
            info!(from = before, to = now, "Raised the open-file limit")
        }
        Ok(_) => {}
        Err(err) => {
            warn!(error = %crate::logging::error_chain(&err), "Cannot raise the open-file limit")
        }
    }
}
