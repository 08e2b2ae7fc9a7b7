//! `gpud run` with the device plugin and `--dra` keeps its sockets: a socket file removed from
//! under the running daemon is served again at once (and the device plugin registers anew),
//! the DRA plugin's own folder removed is made again with its socket, and a removed
//! device-plugin folder shows on `/readyz`, naming the subsystem, until a kubelet brings it
//! back. Against the fake kubelet, the fake API server and the simulated
//! node; every wait polls a fact with a deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_api.rs"]
mod fake_api;
#[path = "common/fake_dra_kubelet.rs"]
mod fake_dra_kubelet;
#[path = "common/fake_kubelet.rs"]
mod fake_kubelet;
#[path = "common/raw_grpc.rs"]
mod raw_grpc;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use common::Node;
use common::http::{self, free_port};
use fake_api::FakeApi;
use fake_kubelet::FakeKubelet;
use gpud::proto::deviceplugin::Empty;
use gpud::proto::deviceplugin::device_plugin_client::DevicePluginClient;
use gpud::proto::dra_v1::NodePrepareResourcesRequest;
use serde_json::json;
use tonic::transport::Endpoint;

/// How soon a removed socket must answer again.
const BACK_WITHIN: Duration = Duration::from_secs(2);

/// `gpud run --dra` on a node with the fake kubelet's device-plugin folder, the kubelet's DRA
/// folders and the fake API server; stderr in `<node>/gpud.log`.
struct Daemon {
    node: Node,
    _api: FakeApi,
    kubelet: FakeKubelet,
    child: Child,
    port: u16,
}

impl Daemon {
    async fn start() -> Daemon {
        let node = Node::new("pcie-4gpu");
        let path = |rel: &str| node.dir.path().join(rel);
        for dir in [
            "device-plugins",
            "plugins_registry",
            "plugins",
            "cdi",
            "driver",
        ] {
            std::fs::create_dir_all(path(dir)).unwrap();
        }
        let kubelet = FakeKubelet::start(&path("device-plugins")).await;
        let api = FakeApi::start(json!({}));
        let kubeconfig = api.kubeconfig(node.dir.path());
        let port = free_port();
        let text = |p: PathBuf| p.to_str().unwrap().to_owned();
        let args: Vec<String> = [
            "run".to_owned(),
            "--dra".into(),
            "--extended-resource-owner".into(),
            "device-plugin".into(),
            "--disable".into(),
            "labeller,exporter".into(),
            "--doctor-interval".into(),
            "0".into(),
            "--kmsg".into(),
            String::new(),
            "--health-address".into(),
            format!("127.0.0.1:{port}"),
            "--kubelet-socket".into(),
            text(kubelet.socket()),
            "--kubeconfig".into(),
            text(kubeconfig),
            "--dra-registry-dir".into(),
            text(path("plugins_registry")),
            "--dra-plugins-dir".into(),
            text(path("plugins")),
            "--dra-cdi-root".into(),
            text(path("cdi")),
            "--dra-driver-root".into(),
            text(path("driver")),
            "--dra-proc-root".into(),
            text(path("driver")),
            "--dra-pod-resources-socket".into(),
            text(path("pod-resources.sock")),
        ]
        .into();
        let log = std::fs::File::create(path("gpud.log")).unwrap();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = node.gpud(&args).stderr(log).spawn().unwrap();
        Daemon {
            node,
            _api: api,
            kubelet,
            child,
            port,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.node.dir.path().join(rel)
    }

    fn dra_plugin_socket(&self) -> PathBuf {
        self.path("plugins/gpu.nvidia.com/dra.sock")
    }

    fn dra_registration_socket(&self) -> PathBuf {
        self.path("plugins_registry/gpu.nvidia.com-reg.sock")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("gpud.log")).unwrap_or_default()
    }

    /// `/readyz` once `accept` holds for its status and body, failing after 20 s.
    fn readyz_when(&self, accept: impl Fn(u16, &str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(answer) = http::get(self.port, "/readyz")
                && accept(answer.status, &answer.body)
            {
                return answer.body;
            }
            assert!(
                Instant::now() < deadline,
                "/readyz never as expected; gpud's log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- gpud's log ---\n{}", self.log());
        }
    }
}

/// Polls `check` every 10 ms until it gives a value, failing once `deadline` has passed.
async fn by<T, F: Future<Output = Option<T>>>(
    deadline: Instant,
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether a gRPC call on the device plugin's socket `path` succeeds.
async fn device_plugin_answers(path: &Path) -> Option<()> {
    let channel = Endpoint::try_from(format!("unix://{}", path.display()))
        .ok()?
        .connect()
        .await
        .ok()?;
    let mut client = DevicePluginClient::new(channel);
    client.get_device_plugin_options(Empty {}).await.ok()?;
    Some(())
}

/// Whether something accepts connections on the unix socket `path`.
fn accepts(path: &Path) -> Option<()> {
    std::os::unix::net::UnixStream::connect(path).ok().map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_sockets_are_served_again_within_two_seconds() {
    let mut gpud = Daemon::start().await;
    let first = gpud.kubelet.next_registration(20).await;
    let device_socket = gpud.kubelet.dir.join(&first.endpoint);
    let registry = gpud.dra_registration_socket();
    by(
        Instant::now() + Duration::from_secs(20),
        "DRA registration socket",
        || async { accepts(&registry) },
    )
    .await;
    fake_dra_kubelet::register(&registry).await;
    gpud.readyz_when(|status, _| status == 200);

    let removed = Instant::now();
    for socket in [
        &device_socket,
        &gpud.dra_plugin_socket(),
        &gpud.dra_registration_socket(),
    ] {
        std::fs::remove_file(socket).unwrap();
    }
    let deadline = removed + BACK_WITHIN;

    // The device plugin: served again, and registered anew with the kubelet.
    let (arrived, again) = gpud
        .kubelet
        .next_registration_at(BACK_WITHIN.as_secs())
        .await;
    assert_eq!(again.endpoint, first.endpoint);
    assert_eq!(again.resource_name, first.resource_name);
    assert!(
        arrived - removed < BACK_WITHIN,
        "registered again after {:?}",
        arrived - removed
    );
    by(
        deadline,
        "a gRPC call on the device plugin's socket",
        || device_plugin_answers(&device_socket),
    )
    .await;

    // The DRA plugin: both sockets answer again.
    let plugin = gpud.dra_plugin_socket();
    by(deadline, "the DRA plugin socket", || async {
        accepts(&plugin)
    })
    .await;
    by(deadline, "the DRA registration socket", || async {
        accepts(&registry)
    })
    .await;
    let answer =
        fake_dra_kubelet::prepare_v1(&plugin, NodePrepareResourcesRequest { claims: Vec::new() })
            .await;
    assert!(answer.claims.is_empty());
    let info = fake_dra_kubelet::register(&registry).await;
    assert_eq!(info.endpoint, plugin.to_str().unwrap());

    // The servers replaced on the way were stopped on purpose: nothing failed.
    let body = gpud.readyz_when(|status, _| status == 200);
    assert!(body.contains("device-plugin ready\n"), "{body}");
    assert!(body.contains("dra ready\n"), "{body}");
}

/// Removes `folder` and all in it. gpud serves a removed socket again at once, so it may put
/// one back between `remove_dir_all` emptying the folder and removing it: remove until gone.
fn remove_folder(folder: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(err) = std::fs::remove_dir_all(folder) {
        assert!(
            Instant::now() < deadline,
            "cannot remove {}: {err}",
            folder.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_device_plugin_folder_is_reported_until_a_kubelet_brings_it_back() {
    let mut gpud = Daemon::start().await;
    let first = gpud.kubelet.next_registration(20).await;
    gpud.readyz_when(|status, _| status == 200);

    // The DRA plugin's own folder is made again, with its socket in it.
    let plugin = gpud.dra_plugin_socket();
    remove_folder(plugin.parent().unwrap());
    let removed = Instant::now();
    by(
        removed + BACK_WITHIN,
        "the DRA plugin socket in its folder made again",
        || async { accepts(&plugin) },
    )
    .await;
    let registry = gpud.dra_registration_socket();
    by(
        removed + BACK_WITHIN,
        "the DRA registration socket",
        || async { accepts(&registry) },
    )
    .await;
    assert_eq!(
        fake_dra_kubelet::register(&registry).await.endpoint,
        plugin.to_str().unwrap()
    );

    let folder = gpud.kubelet.dir.clone();
    remove_folder(&folder);
    let body = gpud
        .readyz_when(|status, body| status == 503 && body.contains("device-plugin not ready: "));
    assert!(
        body.contains(&format!(
            "device-plugin not ready: the device-plugin folder {} was removed",
            folder.display()
        )),
        "{body}"
    );
    assert!(
        body.contains("dra ready\n"),
        "the rest keeps serving: {body}"
    );

    // A kubelet starting creates its folder and socket; the plugin is served and registered.
    std::fs::create_dir_all(&folder).unwrap();
    gpud.kubelet.restart().await;
    let again = gpud.kubelet.next_registration(20).await;
    assert_eq!(again.endpoint, first.endpoint);
    gpud.readyz_when(|status, _| status == 200);
    device_plugin_answers(&folder.join(&again.endpoint))
        .await
        .expect("the plugin answers on its socket again");
}
