//! The supervisor: starts subsystems (those that start first, the health watcher, before the
//! others, which then read its first verdicts), waits for readiness, fans SIGHUP out, stops
//! everything with one grace period and maps the outcome to an exit code.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
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
use crate::inventory::Inventory;

/// How long subsystems get to finish after the stop signal before the process exits anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How long the others wait for the subsystems that start first ([`Subsystem::STARTS_FIRST`])
/// to be ready: a hung NVML delays the start by this much at most, never forever. A stop
/// signal ends the wait, and the others are never started.
pub const FIRST_WAIT: Duration = Duration::from_secs(5);

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
        let start: Starter = Box::new(move |cancel, inventory| {
            let ctx = Context::new(cancel, latch, rx);
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
        // A blocking NVML call stuck on a sick GPU must not hold the exit.
        runtime.shutdown_timeout(Duration::from_millis(500));
        outcome.map(|()| ExitCode::SUCCESS)
    }

    async fn supervise(self, inventory: Inventory) -> Result<(), Error> {
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
            ..
        } = self;
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
                },
                Some(path) = file_changes.recv() => {
                    let trigger = format!("{} changed", path.display());
                    reload_now(&reload, &fan_out, &notifier, announced, &trigger);
                },
                changed = changes.changed(), if !announced => {
                    if changed.is_ok() && readiness.all_ready() {
                        announced = true;
                        notifier.ready();
                        info!("All subsystems ready");
                    }
                }
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
        notifier.stopping();
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
        if drained.is_err() {
            warn!(
                grace = ?SHUTDOWN_GRACE,
                "Some subsystems did not stop in time; exiting anyway"
            );
            tasks.abort_all();
        }
        outcome
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
