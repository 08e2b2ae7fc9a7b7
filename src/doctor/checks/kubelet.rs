//! The kubelet: its device-plugin registration socket and its pod-resources socket (the
//! exporter's pod attribution), and an NVIDIA device plugin registered with it.

use crate::doctor::env::Env;
use crate::doctor_report::Verdict;

const KUBELET_DIR: &str = "/var/lib/kubelet";
const PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
const SOCKETS: [&str; 2] = [
    "/var/lib/kubelet/device-plugins/kubelet.sock",
    "/var/lib/kubelet/pod-resources/kubelet.sock",
];

/// `kubelet.sockets`
pub fn sockets(env: &Env) -> Verdict {
    if !env.host.exists(KUBELET_DIR) {
        return Verdict::skip(format!(
            "no kubelet on this node ({KUBELET_DIR} does not exist)"
        ));
    }
    let missing: Vec<&str> = SOCKETS
        .iter()
        .copied()
        .filter(|s| !env.host.exists(s))
        .collect();
    if missing.is_empty() {
        Verdict::ok("device-plugin and pod-resources sockets exist")
    } else {
        Verdict::fail(
            format!("missing {}", missing.join(", ")),
            "check that the kubelet runs (systemctl status kubelet) with the DevicePlugins and KubeletPodResources APIs",
        )
    }
}

/// `kubelet.plugin`
pub fn plugin(env: &Env) -> Verdict {
    if !env.host.exists(KUBELET_DIR) {
        return Verdict::skip(format!(
            "no kubelet on this node ({KUBELET_DIR} does not exist)"
        ));
    }
    let sockets: Vec<String> = env
        .host
        .list(PLUGIN_DIR)
        .into_iter()
        .filter(|name| name.starts_with("nvidia") && name.ends_with(".sock"))
        .collect();
    if sockets.is_empty() {
        return Verdict::fail(
            format!("no NVIDIA device plugin socket in {PLUGIN_DIR}"),
            "start gpud run (or gpud device-plugin) and read its log for the registration error",
        );
    }
    // The kubelet records what registered in its checkpoint; a socket without an entry there
    // is a plugin the kubelet has not (yet) accepted.
    let checkpoint = env
        .host
        .read(&format!("{PLUGIN_DIR}/kubelet_internal_checkpoint"))
        .unwrap_or_default();
    let registered = checkpoint.contains("nvidia.com/");
    if registered || checkpoint.is_empty() {
        Verdict::ok(format!(
            "plugin socket {} in {PLUGIN_DIR}",
            sockets.join(", ")
        ))
    } else {
        Verdict::warn(
            format!(
                "plugin socket {} exists but the kubelet's checkpoint lists no nvidia.com resource",
                sockets.join(", ")
            ),
            "restart the device plugin so it registers again, and read the kubelet's log for the refusal",
        )
    }
}
