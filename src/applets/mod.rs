//! The applet table: every `gpud <applet>` that exists, with its one-line description.

mod cdi;
mod cdi_hook;
mod device_plugin;
mod doctor;
mod dra;
mod exporter;
mod health;
mod inventory;
mod labeller;
mod mig;
mod mps_control_daemon;
mod node_status;
mod run;
mod runtime;
mod upgrade;

use std::ffi::OsString;
use std::process::ExitCode;

use crate::daemon::Error;

/// The admin endpoint's port (`/healthz`, `/readyz`) of each long-running applet when
/// `--health-address` is not given: one port each, so every applet can run on one host (or in
/// one pod, whose containers share a network namespace) with its defaults. The exporter serves
/// them on its metrics port. docs/cli.md lists the same table.
pub const ADMIN_PORTS: &[(&str, u16)] = &[
    ("run", 9410),
    ("device-plugin", 9411),
    ("labeller", 9412),
    ("health", 9413),
    ("node-status", 9414),
    ("mig reconcile", 9415),
    ("mps-control-daemon", 9416),
    ("dra", 9417),
];

/// The default admin port of `applet` (a name from [`ADMIN_PORTS`]).
fn admin_port(applet: &str) -> u16 {
    ADMIN_PORTS
        .iter()
        .find(|(name, _)| *name == applet)
        .map_or(crate::daemon::DEFAULT_HEALTH_PORT, |(_, port)| *port)
}

/// Sets this process's pace towards the API server from `--api-qps` and `--api-burst`: every
/// applet that takes them calls this once its flags are read, before its first API client is
/// made (the exporter too, for per-pod usage).
fn set_pace(client: &crate::cli::KubeClientArgs) {
    crate::kube::pace::set_limits(client.api_qps, client.api_burst);
}

/// One applet: a name for `gpud <name>` / `gpud-<name>` and its entry point.
#[derive(Debug)]
pub struct Applet {
    /// Name on the command line and in link names.
    pub name: &'static str,
    /// One line for `gpud --help`.
    pub about: &'static str,
    /// Runs under the daemon supervisor, which takes over SIGHUP, SIGTERM and SIGINT; other
    /// applets get the signals' default actions back before they start.
    pub daemon: bool,
    /// Entry point; argv[0] is `gpud <name>`.
    pub run: fn(Vec<OsString>) -> Result<ExitCode, Error>,
}

/// All applets, in the order `gpud --list` prints them.
pub static APPLETS: &[Applet] = &[
    Applet {
        name: "cdi",
        daemon: false,
        about: "generate a CDI spec for the node's GPUs and MIG devices (as nvidia-ctk cdi generate)",
        run: cdi::main,
    },
    Applet {
        name: "cdi-hook",
        daemon: false,
        about: "the OCI hook a CDI spec runs at createContainer (as nvidia-cdi-hook; a link of that name runs it)",
        run: cdi_hook::main,
    },
    Applet {
        name: "device-plugin",
        daemon: true,
        about: "advertise GPUs to the kubelet (NVIDIA k8s-device-plugin compatible), withdraw and return sick ones",
        run: device_plugin::main,
    },
    Applet {
        name: "doctor",
        daemon: false,
        about: "check the node (driver, GPUs, MIG, fabric, runtime, CDI, kubelet) and say what to fix",
        run: doctor::main,
    },
    Applet {
        name: "dra",
        daemon: true,
        about: "the kubelet's DRA plugin for GPUs and MIG devices (driver gpu.nvidia.com), beside or instead of the device plugin",
        run: dra::main,
    },
    Applet {
        name: "exporter",
        daemon: true,
        about: "serve dcgm-exporter-compatible GPU metrics for Prometheus, with pod attribution",
        run: exporter::main,
    },
    Applet {
        name: "health",
        daemon: true,
        about: "watch GPU health (XID, ECC, row remapping, lost GPUs) and print transitions",
        run: health::main,
    },
    Applet {
        name: "inventory",
        daemon: false,
        about: "print the node's GPUs, MIG devices, topology and health (JSON or table)",
        run: inventory::main,
    },
    Applet {
        name: "labeller",
        daemon: true,
        about: "GFD-compatible node labels, as an NFD features file or on the Node object",
        run: labeller::main,
    },
    Applet {
        name: "mig",
        daemon: false,
        about: "apply, assert, export and plan MIG layouts from mig-parted config files",
        run: mig::main,
    },
    Applet {
        name: "mps-control-daemon",
        daemon: true,
        about: "run one MPS control daemon per MPS-shared resource (sharing.mps), restart them, give the GPUs back on stop",
        run: mps_control_daemon::main,
    },
    Applet {
        name: "node-status",
        daemon: true,
        about: "put GPU health on the Node: conditions, events and opt-in taints that clear on recovery",
        run: node_status::main,
    },
    Applet {
        name: "run",
        daemon: true,
        about: "everything in one process over one inventory: device plugin, labeller, exporter, health",
        run: run::main,
    },
    Applet {
        name: "runtime",
        daemon: false,
        about: "turn on CDI and add the NVIDIA runtime in containerd, CRI-O or Docker (as nvidia-ctk runtime configure)",
        run: runtime::main,
    },
    Applet {
        name: "upgrade",
        daemon: false,
        about: "replace the running gpud with the installed binary, handing over sockets, state and MPS daemons without a gap",
        run: upgrade::main,
    },
];
