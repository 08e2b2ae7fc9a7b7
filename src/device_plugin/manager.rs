//! Running the plugins: one gRPC server and socket per resource, kept in step with the
//! inventory, the settings and the kubelet.
//!
//! - Each resource gets a server on `<dir>/nvidia-<resource>.sock` and a registration task that
//!   retries until the kubelet accepts it: every few milliseconds at first (a restarting
//!   kubelet's socket exists a moment before it answers), then with backoff (one warning with
//!   the whole cause, then quiet).
//! - Every inventory or settings change recomputes the resources: device lists are pushed to
//!   the running plugins (ListAndWatch resends), plugins whose resource vanished stop and
//!   remove their socket, new resources start and register.
//! - An MPS-shared resource is served once its daemon's `.started` marker exists, and its
//!   devices are unhealthy while the marker is gone (the daemon died and is being restarted).
//! - When the kubelet recreates `kubelet.sock` (it restarted and wiped the plugin sockets),
//!   every plugin is served and registered again.
//! - A plugin socket removed from under a running plugin (an operator, a cleanup script) is
//!   served again at once and registered anew; the whole folder removed makes the subsystem
//!   not ready, naming the folder, until it is back (a kubelet restart creates it), when
//!   every plugin is served and registered again.
//! - Each plugin's gRPC server runs as a helper of the subsystem (`daemon::Helpers`): one that
//!   fails marks the device plugin failed on `/readyz`, naming the resource.
//! - A new gpud that abandons its takeover of this process (killed after registering its own
//!   sockets, which the kubelet switched to) leaves the kubelet reaching nobody: every plugin
//!   registers anew at once, served again first where its socket file is not the one it bound.
//! - Devices held by DRA claims ([`crate::holdings`]) are withdrawn from every resource's
//!   list while the claim lasts, so the kubelet never hands one GPU out through both.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::allocate::CONTROL_NODES;
use super::kubelet_watch::{DirEvent, KubeletWatch};
use super::mps;
use super::registration;
use super::retry;
use super::server::{PluginService, PluginState};
use crate::daemon::{Helpers, ReadyLatch};
use crate::grpc;
use crate::holdings::{Held, HeldSource};
use crate::inventory::{Inventory, Snapshot};
use crate::logging;
use crate::proto::deviceplugin::device_plugin_server::DevicePluginServer;
use crate::resources::settings::Settings;
use crate::resources::{self, Resource};

/// Where the plugins live.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// The kubelet's registration socket; its directory holds the plugin sockets. `None`
    /// serves without registering (NVIDIA's empty `--kubelet-socket`).
    pub kubelet_socket: Option<PathBuf>,
    /// Directory for plugin sockets when there is no kubelet socket.
    pub plugin_dir: PathBuf,
    /// The procfs holding the MIG capability tree (`/proc`).
    pub proc_root: PathBuf,
    /// UUIDs held by DRA claims, to withdraw; `None` when no DRA plugin runs beside.
    pub held: Option<HeldSource>,
    /// Leave out the names gpud's DeviceClasses serve through DRA (`nvidia.com/gpu`,
    /// `nvidia.com/mig-<profile>`): the DRA plugin beside owns them on this node
    /// ([`crate::resources::extended`]).
    pub left_to_dra: bool,
}

/// Errors that stop the device plugin.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("cannot serve a plugin: {0}")]
    Bind(#[from] grpc::BindError),
    /// The folder for the plugin sockets is missing: usually no kubelet on this host.
    #[error(
        "the kubelet's device-plugin folder {} does not exist (is a kubelet running on this \
         host?); without Kubernetes leave the device plugin out (gpud run --disable \
         device-plugin), else point --kubelet-socket at the kubelet's kubelet.sock, or serve \
         without registering with --kubelet-socket \"\" --plugin-dir DIR",
        .0.display()
    )]
    NoPluginDir(PathBuf),
}

struct Plugin {
    state: watch::Sender<PluginState>,
    stop: CancellationToken,
    socket: PathBuf,
    /// The socket file as bound: (device, inode).
    bound: Option<(u64, u64)>,
    /// Stops the registration task now running (a child of `stop`).
    registration: CancellationToken,
}

/// Runs until `cancel`, then stops every plugin and removes its socket. `ready` is set once
/// every resource is served; registration goes on with backoff and does not hold readiness
/// back, since a kubelet that starts after gpud (or after a node reboot) is normal. The
/// plugins' servers run as `helpers`.
pub async fn run(
    cancel: CancellationToken,
    inventory: Inventory,
    mut settings: watch::Receiver<Arc<Settings>>,
    config: ManagerConfig,
    ready: ReadyLatch,
    helpers: Helpers,
    mut abandoned: watch::Receiver<u64>,
) -> Result<(), ManagerError> {
    let dir = config
        .kubelet_socket
        .as_deref()
        .and_then(Path::parent)
        .map_or_else(|| config.plugin_dir.clone(), Path::to_path_buf);
    let mut folder = KubeletWatch::new(&dir, config.kubelet_socket.as_deref());
    let mut dir_gone = false;
    let mut started = false;
    let mut snapshots = inventory.subscribe();
    let mut plugins: BTreeMap<String, Plugin> = BTreeMap::new();
    let mut last_error: Option<String> = None;
    // Why every plugin is to be served and registered again, when it is.
    let mut restart_all: Option<&str> = None;
    let mut held = config.held.clone().map(HeldSource::subscribe);
    let mut markers = mps::Markers::default();
    let mut mps_logged: BTreeSet<String> = BTreeSet::new();
    let mut abandoned_open = true;
    'run: loop {
        let snapshot = snapshots.borrow_and_update().clone();
        let current = settings.borrow_and_update().clone();
        let claimed = held
            .as_mut()
            .map(|h| h.borrow_and_update().clone())
            .unwrap_or_default();
        markers.follow(&current);
        let withheld = Withheld {
            claimed: &claimed,
            mps: MpsState {
                started: markers.current(),
                logged: &mut mps_logged,
            },
        };
        if let Some(why) = restart_all.take() {
            info!("{why}; serving and registering every resource again");
            for (_, plugin) in std::mem::take(&mut plugins) {
                stop(plugin);
            }
        }
        let spawn = Spawn {
            dir: &dir,
            config: &config,
            cancel: &cancel,
            helpers: &helpers,
        };
        if !dir_gone {
            let served = reconcile(
                &mut plugins,
                &snapshot,
                &current,
                withheld,
                &spawn,
                &mut last_error,
            );
            match served {
                Ok(true) => ready.set(),
                Ok(false) => {}
                // Gone between a look and a bind: the folder's watch says so in a moment.
                Err(ManagerError::NoPluginDir(_)) if started => dir_gone = true,
                Err(err) => return Err(err),
            }
            started = true;
        }
        if dir_gone {
            for (_, plugin) in std::mem::take(&mut plugins) {
                stop(plugin);
            }
            ready.unset(format!(
                "the device-plugin folder {} was removed; the resources are served and \
                 registered again once it is back (a kubelet restart creates it)",
                dir.display()
            ));
        }
        // Folder events that change nothing (a socket of another plugin removed) wait on.
        loop {
            tokio::select! {
                () = cancel.cancelled() => break 'run,
                changed = snapshots.changed() => if changed.is_err() { break 'run } else { break },
                changed = settings.changed() => if changed.is_err() { break 'run } else { break },
                () = markers.changed() => break,
                () = held_changed(&mut held) => break,
                changed = abandoned.changed(), if abandoned_open => {
                    if changed.is_err() {
                        abandoned_open = false;
                        continue;
                    }
                    if register_all_again(&mut plugins, config.kubelet_socket.as_deref()) {
                        break;
                    }
                }
                event = folder.next() => match event {
                    DirEvent::KubeletStarted => {
                        restart_all = Some("Kubelet restarted");
                        break;
                    }
                    DirEvent::SocketRemoved => {
                        if serve_removed_again(&mut plugins) {
                            break;
                        }
                    }
                    DirEvent::FolderGone => {
                        warn!(folder = %dir.display(), "The device-plugin folder was removed; not ready until it is back");
                        dir_gone = true;
                        break;
                    }
                    DirEvent::FolderBack => {
                        dir_gone = false;
                        restart_all = Some("The device-plugin folder is back");
                        break;
                    }
                },
            }
        }
    }
    for (_, plugin) in plugins {
        stop(plugin);
    }
    Ok(())
}

/// Resolves when the DRA-held set changes; never when there is none (or its sender is gone).
async fn held_changed(held: &mut Option<watch::Receiver<Held>>) {
    match held {
        Some(rx) => {
            if rx.changed().await.is_err() {
                *held = None;
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// A takeover of this process was abandoned: the kubelet may have switched to the new
/// process's sockets, which nobody serves now. Every plugin whose socket file is still the one
/// it bound registers anew (its server and its ListAndWatch streams go on); the others are
/// stopped, for the next reconcile to serve and register them again. Whether any was stopped.
fn register_all_again(plugins: &mut BTreeMap<String, Plugin>, kubelet: Option<&Path>) -> bool {
    let replaced: Vec<String> = plugins
        .iter()
        .filter(|(_, plugin)| plugin.bound.is_none() || identity(&plugin.socket) != plugin.bound)
        .map(|(name, _)| name.clone())
        .collect();
    for name in &replaced {
        if let Some(plugin) = plugins.remove(name) {
            warn!(resource = %name, socket = %plugin.socket.display(), "The plugin socket is not the one this process bound; serving it again and registering anew");
            stop(plugin);
        }
    }
    let Some(kubelet) = kubelet else {
        return !replaced.is_empty();
    };
    for (name, plugin) in plugins.iter_mut() {
        let Some(endpoint) = plugin.socket.file_name() else {
            continue;
        };
        info!(resource = %name, "Registering anew with the kubelet");
        plugin.registration.cancel();
        plugin.registration = plugin.stop.child_token();
        logging::spawn(register_until_accepted(
            kubelet.to_path_buf(),
            endpoint.to_string_lossy().into_owned(),
            name.clone(),
            plugin.registration.clone(),
        ));
    }
    !replaced.is_empty()
}

/// (device, inode) of the file at `path`, not following a link.
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|meta| (meta.dev(), meta.ino()))
}

/// Stops the plugins whose socket file is gone, for the next reconcile to serve and register
/// them again; whether there was one.
fn serve_removed_again(plugins: &mut BTreeMap<String, Plugin>) -> bool {
    let removed: Vec<String> = plugins
        .iter()
        .filter(|(_, plugin)| !plugin.socket.exists())
        .map(|(name, _)| name.clone())
        .collect();
    for name in &removed {
        if let Some(plugin) = plugins.remove(name) {
            warn!(resource = %name, socket = %plugin.socket.display(), "The plugin socket was removed; serving it again and registering anew");
            stop(plugin);
        }
    }
    !removed.is_empty()
}

/// Where and how a plugin is started.
struct Spawn<'a> {
    dir: &'a Path,
    config: &'a ManagerConfig,
    /// The subsystem's stop; each plugin's is a child of it.
    cancel: &'a CancellationToken,
    helpers: &'a Helpers,
}

/// What keeps devices from being offered as the node and the settings say: GPUs held by DRA
/// claims are withdrawn, and an MPS resource waits for its daemon.
struct Withheld<'a> {
    claimed: &'a Held,
    mps: MpsState<'a>,
}

/// Which MPS daemons are up, and which resources' waits were already logged.
struct MpsState<'a> {
    started: BTreeSet<String>,
    logged: &'a mut BTreeSet<String>,
}

impl MpsState<'_> {
    /// Whether `resource` is MPS-shared and its daemon is not up; says so once per outage.
    fn down(&mut self, settings: &Settings, resource: &Resource, served: bool) -> bool {
        let Some(root) = settings.mps_root.as_deref() else {
            return false;
        };
        if resource.replicas.is_none() || self.started.contains(&resource.name) {
            if self.logged.remove(&resource.name) {
                info!(resource = %resource.name, "MPS daemon is ready");
            }
            return false;
        }
        if self.logged.insert(resource.name.clone()) {
            let marker = crate::cuda_mps::layout::started_marker(root, &resource.name);
            if served {
                warn!(resource = %resource.name, marker = %marker.display(),
                      "MPS daemon is down; the resource's devices are unhealthy until it is back");
            } else {
                info!(resource = %resource.name, marker = %marker.display(),
                      "Waiting for MPS daemon to be ready (gpud's MPS control daemon writes the \
                       marker); the resource is served once it is");
            }
        }
        true
    }
}

/// Brings the plugins in line with the node and the settings; whether every resource is
/// served (an MPS resource waits for its daemon).
fn reconcile(
    plugins: &mut BTreeMap<String, Plugin>,
    snapshot: &Arc<Snapshot>,
    settings: &Arc<Settings>,
    mut withheld: Withheld<'_>,
    spawn: &Spawn<'_>,
    last_error: &mut Option<String>,
) -> Result<bool, ManagerError> {
    let mut wanted = match resources::resources(snapshot, settings) {
        Ok(wanted) => {
            *last_error = None;
            wanted
        }
        Err(err) => {
            // The node is in a state the settings cannot express (e.g. MIG half reconfigured
            // under the single strategy): advertise nothing rather than something wrong.
            let text = err.to_string();
            if last_error.as_deref() != Some(text.as_str()) {
                error!(error = %text, "Cannot offer the node's devices; advertising none until this changes");
                *last_error = Some(text);
            }
            Vec::new()
        }
    };
    if spawn.config.left_to_dra {
        // A node offers a name one way only: these are DRA's here.
        wanted.retain(|r| resources::extended::dra_class(&r.name).is_none());
    }
    for resource in &mut wanted {
        let before = resource.devices.len();
        resource
            .devices
            .retain(|d| !withheld.claimed.contains(&d.uuid));
        if resource.devices.len() != before {
            debug!(resource = %resource.name, withdrawn = before - resource.devices.len(), "Devices held by DRA claims withdrawn");
        }
    }
    let names: Vec<String> = wanted.iter().map(|r| r.name.clone()).collect();
    let gone: Vec<String> = plugins
        .keys()
        .filter(|n| !names.contains(n))
        .cloned()
        .collect();
    for name in gone {
        if let Some(plugin) = plugins.remove(&name) {
            info!(resource = %name, "Resource no longer offered; stopping its plugin");
            stop(plugin);
        }
    }
    let host = HostFacts::read(&settings.dev_root, &spawn.config.proc_root, snapshot);
    let mut all_served = true;
    for mut resource in wanted {
        let served = plugins.contains_key(&resource.name);
        if withheld.mps.down(settings, &resource, served) {
            if !served {
                all_served = false;
                continue;
            }
            for device in &mut resource.devices {
                device.healthy = false;
            }
        }
        let state = PluginState {
            resource: Arc::new(resource),
            snapshot: Arc::clone(snapshot),
            settings: Arc::clone(settings),
            control_nodes: Arc::clone(&host.control_nodes),
            mig_caps: Arc::clone(&host.mig_caps),
        };
        match plugins.get(&state.resource.name) {
            Some(plugin) => {
                plugin.state.send_replace(state);
            }
            None => {
                let name = state.resource.name.clone();
                let plugin = start(state, spawn)?;
                plugins.insert(name, plugin);
            }
        }
    }
    Ok(all_served)
}

/// Host facts Allocate needs, read once per reconcile rather than per request.
struct HostFacts {
    control_nodes: Arc<Vec<&'static str>>,
    mig_caps: Arc<HashMap<String, Vec<String>>>,
}

impl HostFacts {
    fn read(dev_root: &Path, proc_root: &Path, snapshot: &Snapshot) -> HostFacts {
        let control_nodes = CONTROL_NODES
            .iter()
            .copied()
            .filter(|node| dev_root.join(node.trim_start_matches('/')).exists())
            .collect();
        HostFacts {
            control_nodes: Arc::new(control_nodes),
            mig_caps: Arc::new(mig_cap_nodes(proc_root, snapshot)),
        }
    }
}

/// `/dev/nvidia-caps/nvidia-cap<N>` for the GPU- and compute-instance access capabilities of
/// every MIG device, from the driver's capability tree. A missing or unreadable tree (no MIG
/// on the node, or procfs not mounted where expected) leaves MIG devices with their parent
/// node only, and says so once per reconcile at debug level.
fn mig_cap_nodes(proc_root: &Path, snapshot: &Snapshot) -> HashMap<String, Vec<String>> {
    let mut out = HashMap::new();
    if snapshot.gpus.iter().all(|g| g.mig.devices.is_empty()) {
        return out;
    }
    let caps = match crate::cdi::discover::mig_caps(
        &proc_root.join(crate::cdi::discover::CAPABILITIES_DIR),
    ) {
        Ok(caps) => caps,
        Err(err) => {
            debug!(error = %crate::logging::error_chain(&err), "MIG capability tree unavailable");
            return out;
        }
    };
    for gpu in &snapshot.gpus {
        let Some(minor) = gpu.minor_number else {
            continue;
        };
        for mig in &gpu.mig.devices {
            let gi = caps.gpu_instance(minor, mig.gpu_instance_id);
            let ci = caps.compute_instance(minor, mig.gpu_instance_id, mig.compute_instance_id);
            let nodes: Vec<String> = [gi, ci]
                .into_iter()
                .flatten()
                .map(|cap| format!("/dev/nvidia-caps/nvidia-cap{cap}"))
                .collect();
            out.insert(mig.uuid.clone(), nodes);
        }
    }
    out
}

fn start(state: PluginState, spawn: &Spawn<'_>) -> Result<Plugin, ManagerError> {
    let Spawn {
        dir,
        config,
        cancel,
        helpers,
    } = *spawn;
    let resource: Arc<Resource> = Arc::clone(&state.resource);
    // After a takeover the name is this instance's own: the kubelet switches to the socket
    // registered last, and the old process's socket stays the old process's.
    let socket_name = crate::listeners::instance_file_name(&resource.socket_name());
    let socket = dir.join(&socket_name);
    // Replaces a socket left by an earlier run; only root (the kubelet) may connect.
    if !dir.is_dir() {
        return Err(ManagerError::NoPluginDir(dir.to_path_buf()));
    }
    let listener = grpc::bind(&socket, grpc::SOCKET_MODE)?;
    let bound = identity(&socket);
    let (tx, rx) = watch::channel(state);
    let stop = cancel.child_token();
    // Any :authority is accepted: kubelets before 1.26 send the socket path there.
    let router = tonic::transport::Server::builder()
        .add_service(DevicePluginServer::new(PluginService::new(rx)));
    helpers.until(stop.clone()).spawn(
        format!("gRPC server for {}", resource.name),
        grpc::serve::serve(router, listener, stop.clone()),
    );
    // Whether it registers is on the line: with `--kubelet-socket ""` nothing else says so.
    let registering = config.kubelet_socket.is_some();
    info!(resource = %resource.name, socket = %socket.display(), devices = resource.devices.len(), registering, "Serving resource");
    let registration = stop.child_token();
    if let Some(kubelet) = config.kubelet_socket.clone() {
        logging::spawn(register_until_accepted(
            kubelet,
            socket_name,
            resource.name.clone(),
            registration.clone(),
        ));
    }
    Ok(Plugin {
        state: tx,
        stop,
        socket,
        bound,
        registration,
    })
}

/// Retries registration on [`retry::schedule`] (fast, then backing off up to 30 s); warns
/// once, then only at debug level, so an absent kubelet neither spins nor floods the log.
async fn register_until_accepted(
    kubelet: PathBuf,
    endpoint: String,
    resource: String,
    stop: CancellationToken,
) {
    let mut backoff = retry::schedule(&resource, Instant::now());
    let mut warned = false;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        tokio::select! {
            () = stop.cancelled() => return,
            result = registration::register(&kubelet, &endpoint, &resource) => match result {
                Ok(()) => {
                    info!(resource = %resource, endpoint = %endpoint, attempts, "Registered with the kubelet");
                    return;
                }
                Err(err) => {
                    let error = crate::logging::error_chain(&err);
                    let refused = matches!(err, registration::RegistrationError::Refused { .. });
                    if refused && !warned {
                        // The kubelet answered and said no: news at once, unlike a socket
                        // that does not answer yet.
                        warn!(resource = %resource, error = %error, "The kubelet refused the registration; retrying with backoff");
                        warned = true;
                    } else if !warned && backoff.past_fast_window(Instant::now()) {
                        // Failures inside the fast window are the kubelet still starting.
                        warn!(resource = %resource, error = %error, "Kubelet not reachable; retrying with backoff");
                        warned = true;
                    } else {
                        debug!(resource = %resource, error = %error, "Registration retry failed");
                    }
                }
            },
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff.next_delay_at(Instant::now())) => {}
        }
    }
}

fn stop(plugin: Plugin) {
    plugin.stop.cancel();
    // Dropping the sender ends every ListAndWatch stream, letting the server finish.
    drop(plugin.state);
    crate::listeners::remove_if_owned(&plugin.socket);
}
