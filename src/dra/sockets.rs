//! The plugin's two sockets, served in the order the kubelet needs and kept there.
//!
//! The plugin socket (`<plugins>/<driver>/dra.sock`: DRAPlugin v1 and v1beta1,
//! DRAResourceHealth v1 and v1alpha1) is served first, then the registration socket
//! (`<registry>/<driver>-reg.sock`), so the kubelet never learns of a socket that does not
//! answer yet. Both replace stale sockets an earlier run left ([`crate::grpc::bind`]) and
//! accept any `:authority` (kubelets before 1.26 send the socket path).
//!
//! A socket file that vanishes (a kubelet or an operator cleaning its folders) leaves the
//! kubelet nothing to dial, and nothing else would bring it back: the two paths are looked at
//! on every change in their folders ([`crate::daemon::file_watch::follow`]) and every
//! [`CHECK`] besides (a folder removed ends its watch), and a missing one is served again (the
//! plugin socket first, then the registration socket, which makes the kubelet register the
//! plugin anew).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::args::DraConfig;
use super::health_stream::HealthService;
use super::plugin::DraService;
use super::prepare::Preparer;
use super::readiness::{Cause, DraReadiness};
use super::registration::{Outcome, RegistrationService};
use crate::daemon::Helpers;
use crate::daemon::file_watch::{self, Change};
use crate::grpc::{self, BindError};
use crate::inventory::Inventory;
use crate::proto::dra_v1::dra_plugin_server::DraPluginServer as V1Server;
use crate::proto::dra_v1beta1::dra_plugin_server::DraPluginServer as V1beta1Server;
use crate::proto::drahealth_v1::dra_resource_health_server::DraResourceHealthServer as HealthV1;
use crate::proto::drahealth_v1alpha1::dra_resource_health_server::DraResourceHealthServer as HealthV1alpha1;
use crate::proto::pluginregistration::registration_server::RegistrationServer;

/// How often the socket files are looked at.
pub const CHECK: Duration = Duration::from_secs(1);

/// The served sockets and what serving them again needs.
#[derive(Debug)]
pub struct Sockets {
    config: Arc<DraConfig>,
    preparer: Arc<Preparer>,
    inventory: Inventory,
    outcome: Outcome,
    cancel: CancellationToken,
    helpers: Helpers,
    plugin: Option<CancellationToken>,
    registration: Option<CancellationToken>,
    /// `true` once the gpud this one took over from has finished (see [`Sockets::serve`]).
    predecessor_gone: tokio::sync::watch::Receiver<bool>,
}

impl Sockets {
    /// Serves both sockets; `registered` wakes whenever the kubelet accepts the plugin, and a
    /// refusal unsets `ready` until one is accepted. Each server runs as a helper of the
    /// subsystem (`helpers`): one that fails marks it failed.
    ///
    /// After a takeover the plugin socket is the old process's, still served by it: calls are
    /// accepted here only once `predecessor_gone` (they wait in the socket's queue meanwhile,
    /// answered by the old process or by this one after), with the checkpoint read again
    /// then, so that two processes never prepare from two copies of it.
    #[allow(clippy::too_many_arguments)]
    pub fn serve(
        config: Arc<DraConfig>,
        preparer: Arc<Preparer>,
        inventory: Inventory,
        registered: Arc<Notify>,
        ready: DraReadiness,
        cancel: CancellationToken,
        helpers: Helpers,
        predecessor_gone: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Sockets, BindError> {
        let mut sockets = Sockets {
            config,
            preparer,
            inventory,
            outcome: Outcome { registered, ready },
            cancel,
            helpers,
            plugin: None,
            registration: None,
            predecessor_gone,
        };
        sockets.serve_plugin()?;
        sockets.serve_registration()?;
        Ok(sockets)
    }

    fn serve_plugin(&mut self) -> Result<(), BindError> {
        // The kubelet keeps the plugin socket's path across a takeover: the new process serves
        // the old one's socket, so a call during the takeover waits instead of failing.
        let listener = grpc::bind_or_inherit(&self.config.plugin_socket(), grpc::SOCKET_MODE)?;
        let service = DraService::new(Arc::clone(&self.preparer));
        let stop = self.cancel.child_token();
        let health =
            HealthService::new(&self.config.node, self.inventory.subscribe(), stop.clone());
        let router = tonic::transport::Server::builder()
            .add_service(V1Server::new(service.clone()))
            .add_service(V1beta1Server::new(service))
            .add_service(HealthV1::new(health.clone()))
            .add_service(HealthV1alpha1::new(health));
        let mut gone = self.predecessor_gone.clone();
        let preparer = Arc::clone(&self.preparer);
        let serving = stop.clone();
        self.helpers.until(stop.clone()).spawn(
            "gRPC server for the DRA plugin socket",
            async move {
                let waiting = !*gone.borrow_and_update();
                if waiting {
                    tokio::select! {
                        () = serving.cancelled() => return Ok(()),
                        _ = gone.wait_for(|gone| *gone) => {}
                    }
                    preparer.reload_checkpoint().await;
                }
                grpc::serve::serve(router, listener, serving).await
            },
        );
        if let Some(old) = self.plugin.replace(stop) {
            old.cancel();
        }
        Ok(())
    }

    fn serve_registration(&mut self) -> Result<(), BindError> {
        let socket = self.config.registration_socket();
        let listener = grpc::bind(&socket, grpc::SOCKET_MODE)?;
        let service = RegistrationService::new(
            &self.config.driver,
            &self.config.plugin_socket().to_string_lossy(),
            self.outcome.clone(),
        );
        let router =
            tonic::transport::Server::builder().add_service(RegistrationServer::new(service));
        let stop = self.cancel.child_token();
        self.helpers.until(stop.clone()).spawn(
            "gRPC server for the DRA registration socket",
            grpc::serve::serve(router, listener, stop.clone()),
        );
        if let Some(old) = self.registration.replace(stop) {
            old.cancel();
        }
        Ok(())
    }

    /// Serves again whichever socket vanished, until cancelled; then removes both. While one
    /// cannot be served again (its folder gone, a bind refused), the subsystem is not ready
    /// (`ready`), with the reason; it is tried again on every change and every [`CHECK`].
    pub async fn keep(mut self) {
        let ready = self.outcome.ready.clone();
        let paths: [PathBuf; 2] = [
            self.config.plugin_socket(),
            self.config.registration_socket(),
        ];
        let folders: Vec<PathBuf> = paths
            .iter()
            .filter_map(|p| p.parent().map(PathBuf::from))
            .collect();
        let mut changes = watch(&folders);
        loop {
            let mut rewatch = false;
            tokio::select! {
                () = self.cancel.cancelled() => break,
                change = changed(&mut changes) => rewatch = change == Change::FolderGone,
                () = tokio::time::sleep(CHECK) => {}
            }
            match self.serve_missing(&paths) {
                Ok(()) => {
                    // Only this cause: a registration the kubelet refused keeps the subsystem
                    // unready until one is accepted, sockets or not.
                    ready.clear(Cause::Sockets);
                    // A folder removed took its watch along; the one made again needs one.
                    if rewatch || changes.is_none() {
                        changes = watch(&folders);
                    }
                }
                Err(why) => {
                    warn!(error = %why, "Cannot serve a removed DRA socket again; retrying");
                    ready.not_ready(
                        Cause::Sockets,
                        format!("{why}; retrying on every change in its folder"),
                    );
                }
            }
        }
        for path in paths {
            crate::listeners::remove_if_owned(&path);
        }
    }

    /// Serves again whichever of `paths` (plugin, registration) is missing.
    fn serve_missing(&mut self, paths: &[PathBuf; 2]) -> Result<(), String> {
        let plugin_gone = !paths[0].exists();
        if plugin_gone {
            warn!(socket = %paths[0].display(), "The DRA plugin socket was removed; serving it again");
            // The plugin's folder is gpud's own: one removed with the socket is made again.
            if let Some(folder) = paths[0].parent() {
                let _ = std::fs::create_dir_all(folder);
            }
            self.serve_plugin().map_err(|err| {
                format!(
                    "cannot serve the DRA plugin socket again: {}",
                    crate::logging::error_chain(&err)
                )
            })?;
        }
        if plugin_gone || !paths[1].exists() {
            warn!(socket = %paths[1].display(), "Serving the DRA registration socket again, for the kubelet to register the plugin");
            self.serve_registration().map_err(|err| {
                format!(
                    "cannot serve the DRA registration socket again: {}",
                    crate::logging::error_chain(&err)
                )
            })?;
        }
        Ok(())
    }
}

/// A watch on the sockets' folders; `None` (and a look every [`CHECK`] alone) when one cannot
/// be watched.
fn watch(folders: &[PathBuf]) -> Option<mpsc::Receiver<Change>> {
    file_watch::follow(folders, "gpud-dra-socket-watch")
        .inspect_err(|err| debug!(error = %crate::logging::error_chain(err), "Cannot watch the DRA socket folders; looking every second"))
        .ok()
}

/// The next change in the watched folders; never once the watch is over.
async fn changed(changes: &mut Option<mpsc::Receiver<Change>>) -> Change {
    if let Some(rx) = changes
        && let Some(change) = rx.recv().await
    {
        return change;
    }
    *changes = None;
    std::future::pending().await
}
