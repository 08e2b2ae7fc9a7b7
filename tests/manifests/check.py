#!/usr/bin/env python3
"""Renders every overlay and component combination under packaging/k8s and checks it.

For each combination: `kubectl kustomize` must render it; every object must validate against
the Kubernetes schemas of the oldest and the newest supported minor (kubernetes-validate,
strict: unknown fields are errors); every container's command line, with its environment
(envFrom ConfigMaps, fieldRefs) and the ConfigMap files it mounts, must be accepted by the real
binary (`--check-config`, exit 0); and every container keeps the least-privilege settings the
docs promise. The PrometheusRule must carry exactly packaging/prometheus/gpud-alerts.yaml. The
node status runs once, where the layout puts it (its own container in base, `gpud run` in
all-in-one), with taints only from node-status-taints; so does the DRA plugin, with its
DeviceClasses and RBAC only from the dra component; so does the remediation (the remediation
component: in the node status's process, privileged, with the kubelet's pod-resources folder
and its Lease and eviction RBAC). Every DaemonSet rolls with a surge
(maxSurge 1, maxUnavailable 0: the new pod takes over from the old one on the same node), no pod
claims a host port (the surge pod could not be scheduled next to the old one), and every
container mounts gpud's state directory, where the handover socket and the state live. Every
component also renders alone over both layouts, under its older name too (mig-manager-run,
mps-run), into a complete DaemonSet whose probes reach the port gpud serves them on. The DRA
and CDI goldens are validated against the Kubernetes schemas and the CDI schema
(tests/schemas/cdi.json).

Usage: check.py GPUD_BINARY   (run by `make manifests-test`, in the venv .ci/run makes)
"""

import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "packaging" / "k8s"
# The oldest and newest Kubernetes minors the manifests are checked against.
VERSIONS = ["1.29.0", "1.37.0"]
# Custom resources: no schema in kubernetes-validate; checked for shape below.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}
# gpud's state directory on the host, mounted at the same path in every container: the
# handover sockets (<state-dir>/handover/<applet>.sock) and what a restart must not forget.
STATE_DIR = "/var/lib/gpud"

SINKS = [None, "labeller-node", "labeller-node-feature"]
NODE_STATUS = ["node-status", "node-status-taints"]
TOGGLES = ["sharing-config", "servicemonitor", "prometheus-rule", "runtime-class"]
# The MIG reconciler: its own container beside the applets, or inside `gpud run`.
MIG = {"base": "mig-manager", "all-in-one": "mig-manager-run"}
# The MPS control daemons: their own container beside the applets, or inside `gpud run`.
MPS = {"base": "mps", "all-in-one": "mps-run"}
# The remediation (GPU resets): in the node status's process, the node-status container in
# base, `gpud run` in all-in-one.
REMEDIATION = {"base": "node-status", "all-in-one": "gpud"}
# The older names of the MIG and MPS components, kept for existing overlays: each is the same
# component, which puts its part where the layout runs it.
ALIASES = {"mig-manager-run": "mig-manager", "mps-run": "mps"}
# The containers that may run privileged, per layout: the one running the MIG reconciler, the
# one running the MPS control daemons (and the one resetting GPUs, REMEDIATION).
PRIVILEGED_CONTAINER = {
    "base": {"mig-manager": "mig-manager", "mps": "mps-control-daemon"},
    "all-in-one": {"mig-manager": "gpud", "mps": "gpud"},
}
# The kubelet's pod-resources folder: where the remediation finds the pods holding a GPU.
POD_RESOURCES = "/var/lib/kubelet/pod-resources"
# What the NVIDIA container runtime puts on the PATH of a container that asks for the driver's
# "utility" capability (NVIDIA_DRIVER_CAPABILITIES): the reset command's default program.
RUNTIME_TOOLS = ["nvidia-smi"]


def combinations():
    """(overlay, [components]) for every valid combination."""
    for overlay in ["base", "all-in-one"]:
        exporter_choices = [False, True] if overlay == "base" else [False]
        for no_exporter in exporter_choices:
            for sink in SINKS:
                for picks in itertools.product([False, True], repeat=len(TOGGLES)):
                    chosen = [name for name, on in zip(TOGGLES, picks) if on]
                    # A ServiceMonitor without the exporter's Service scrapes nothing.
                    if no_exporter and "servicemonitor" in chosen:
                        continue
                    components = (["no-exporter"] if no_exporter else []) + (
                        [sink] if sink else []
                    ) + chosen
                    yield overlay, components
                # The node status, with and without taints, over each overlay and sink.
                for status in NODE_STATUS:
                    yield overlay, (["no-exporter"] if no_exporter else []) + (
                        [sink] if sink else []
                    ) + [status]
                # The DRA plugin, alone and next to the node status (distinct ports).
                for extra in [[], ["node-status"]]:
                    yield overlay, (["no-exporter"] if no_exporter else []) + (
                        [sink] if sink else []
                    ) + ["dra"] + extra
                # The MIG reconciler, alone and next to the node status (distinct ports).
                for extra in [[], ["node-status"]]:
                    yield overlay, (["no-exporter"] if no_exporter else []) + (
                        [sink] if sink else []
                    ) + [MIG[overlay]] + extra
                # Per-pod usage (the exporter's), alone and next to the node status.
                if not no_exporter:
                    for extra in [[], ["node-status"]]:
                        yield overlay, ([sink] if sink else []) + ["pod-usage"] + extra
                # The container toolkit step: its own DaemonSet, beside either layout.
                if sink is None:
                    for extra in [[], ["dra"]]:
                        yield overlay, (["no-exporter"] if no_exporter else []) + ["toolkit"] + extra
                # The remediation over the node status it runs in (with and without taints),
                # alone, next to the DRA plugin and next to the MIG reconciler (two privileged
                # parts).
                for status in NODE_STATUS:
                    for extra in [[], ["dra"], [MIG[overlay]]]:
                        yield overlay, (["no-exporter"] if no_exporter else []) + (
                            [sink] if sink else []
                        ) + [status, "remediation"] + extra
                # MPS sharing, alone, next to the node status and next to the MIG reconciler
                # (one DaemonSet, distinct ports, one config).
                for extra in [[], ["node-status"], [MIG[overlay]]]:
                    yield overlay, (["no-exporter"] if no_exporter else []) + (
                        [sink] if sink else []
                    ) + [MPS[overlay]] + extra
    # Every component alone on both layouts, under every name: a component meant for the other
    # layout must still render a complete DaemonSet there (not a container without an image).
    for overlay in ["base", "all-in-one"]:
        for component in sorted(p.name for p in (K8S / "components").iterdir() if p.is_dir()):
            if component in ALONE_REFUSED:
                continue
            yield overlay, [component]


# Components that refuse to render alone, each tested for its refusal.
ALONE_REFUSED = {"remediation"}


def render(overlay, components):
    with tempfile.TemporaryDirectory() as tmp:
        rel = os.path.relpath(K8S, os.path.realpath(tmp))
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [f"{rel}/{overlay}"],
            "components": [f"{rel}/components/{c}" for c in components],
        }
        Path(tmp, "kustomization.yaml").write_text(json.dumps(kustomization))
        out = subprocess.run(
            ["kubectl", "kustomize", tmp], capture_output=True, text=True
        )
        if out.returncode != 0:
            raise SystemExit(f"{overlay} + {components}: kustomize failed:\n{out.stderr}")
        return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def container_env(container, objects, files_dir):
    """The container's environment as the kubelet would set it, with ConfigMap-mounted
    folders materialised under files_dir and their paths rewritten to it."""
    config_maps = {
        o["metadata"]["name"]: o.get("data", {})
        for o in objects
        if o["kind"] == "ConfigMap"
    }
    env = {}
    for source in container.get("envFrom", []):
        ref = source["configMapRef"]
        name = ref["name"]
        if name not in config_maps:
            # An optional source is one a component may add (all-in-one's gpud-node-status).
            if ref.get("optional"):
                continue
            raise SystemExit(f"container {container['name']}: envFrom names missing ConfigMap {name}")
        env.update(config_maps[name])
    fields = {
        "spec.nodeName": "gpu-node-1",
        "metadata.namespace": "gpud",
        "metadata.name": "gpud-x7k2p",
    }
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "configMapKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["configMapKeyRef"]
            if ref["key"] not in config_maps.get(ref["name"], {}):
                raise SystemExit(
                    f"container {container['name']}: {var['name']} names missing key "
                    f"{ref['key']} of ConfigMap {ref['name']}"
                )
            env[var["name"]] = config_maps[ref["name"]][ref["key"]]
        else:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def mounted_config_maps(pod, container, objects, files_dir):
    """Writes each ConfigMap volume the container mounts under files_dir; returns
    (mountPath, local folder) pairs."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    data = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
    pairs = []
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"])
        if volume is None:
            raise SystemExit(f"container {container['name']}: volumeMount {mount['name']} has no volume")
        ref = volume.get("configMap")
        if not ref:
            continue
        local = Path(files_dir, mount["name"])
        local.mkdir(parents=True, exist_ok=True)
        for key, text in data.get(ref["name"], {}).items():
            (local / key).write_text(text)
        pairs.append((mount["mountPath"], str(local)))
    return pairs


def runtime_path(env, files_dir):
    """The container's PATH: the image's, plus the driver's tools (stand-ins that do nothing)
    where the NVIDIA container runtime would mount them: for a container that sees GPUs and
    asks for the "utility" capability."""
    path = "/usr/bin:/bin"
    capabilities = env.get("NVIDIA_DRIVER_CAPABILITIES", "").split(",")
    if env.get("NVIDIA_VISIBLE_DEVICES") and ("utility" in capabilities or "all" in capabilities):
        tools = Path(files_dir, "nvidia-container-runtime")
        tools.mkdir(exist_ok=True)
        for tool in RUNTIME_TOOLS:
            (tools / tool).write_text("#!/bin/sh\nexit 0\n")
            (tools / tool).chmod(0o755)
        path = f"{tools}:{path}"
    return path


def check_command(gpud, pod, container, objects, cache):
    command = container.get("command", []) + container.get("args", [])
    with tempfile.TemporaryDirectory() as files_dir:
        env = container_env(container, objects, files_dir)
        check_probe_port(container, command, env)
        mounts = mounted_config_maps(pod, container, objects, files_dir)
        # Keyed before the mounted paths are rewritten to this run's temporary folder.
        files = {
            path: sorted((p.name, p.read_text()) for p in Path(local).iterdir())
            for path, local in mounts
        }
        key = json.dumps([command, sorted(env.items()), files], sort_keys=True)
        if key in cache:
            return
        for mount_path, local in mounts:
            env = {k: v.replace(mount_path, local) if v.startswith(mount_path) else v for k, v in env.items()}
        env_run = dict(env, PATH=runtime_path(env, files_dir))
        out = subprocess.run(
            [Path(command[0]).name] + command[1:] + ["--check-config"],
            executable=gpud,
            env=env_run,
            capture_output=True,
            text=True,
        )
        cache[key] = out.returncode
        if out.returncode != 0:
            raise SystemExit(
                f"container {container['name']}: `{' '.join(command)}` with {env} "
                f"is not accepted (exit {out.returncode}):\n{out.stderr}"
            )


def check_probe_port(container, command, env):
    """The probes reach the port gpud serves /healthz and /readyz on: GPUD_HEALTH_ADDRESS's,
    else the metrics port where the exporter runs in this container."""
    if "GPUD_HEALTH_ADDRESS" in env:
        serving = int(env["GPUD_HEALTH_ADDRESS"].rsplit(":", 1)[1])
    else:
        program = Path(command[0]).name
        runs_exporter = program == "gpud-exporter" or (
            program == "gpud" and command[1:2] == ["run"]
            and "exporter" not in env.get("GPUD_DISABLE", "").split(",")
        )
        if not runs_exporter:
            return
        serving = int(env.get("DCGM_EXPORTER_LISTEN", ":9400").rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    for probe in ["livenessProbe", "readinessProbe"]:
        port = ports.get(container[probe]["httpGet"]["port"])
        assert port == serving, (
            f"{container['name']}: {probe} on port {port}, but gpud serves it on {serving}"
        )


def check_security(container, privileged_ok):
    ctx = container.get("securityContext", {})
    name = container["name"]
    assert ctx.get("readOnlyRootFilesystem") is True, f"{name}: readOnlyRootFilesystem"
    if privileged_ok:
        # MIG changes need the driver's capability devices and a GPU reset (docs/mig.md);
        # MPS needs compute mode, the shm tmpfs and a Bidirectional mount (docs/mps.md); the
        # remediation resets GPUs (docs/remediation.md).
        assert ctx.get("privileged") is True, (
            f"{name}: the MIG reconciler / MPS daemons / remediation run privileged"
        )
    else:
        assert ctx.get("allowPrivilegeEscalation") is False, f"{name}: allowPrivilegeEscalation"
        assert not ctx.get("privileged"), f"{name}: privileged"
        assert ctx.get("capabilities", {}).get("drop") == ["ALL"], f"{name}: capabilities.drop"
        assert set(ctx["capabilities"].get("add", [])) <= {"SYSLOG"}, f"{name}: capabilities.add"
    ports = {p["name"] for p in container.get("ports", [])}
    for probe in ["livenessProbe", "readinessProbe"]:
        get = container[probe]["httpGet"]
        assert get["port"] in ports, f"{name}: {probe} port {get['port']} not declared"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", name
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", name
    resources = container["resources"]
    assert resources["requests"]["memory"] and resources["limits"]["memory"], f"{name}: memory"


def check_objects(overlay, objects, gpud, cache, version, components):
    kinds = [o["kind"] for o in objects]
    toolkits = [o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == TOOLKIT]
    assert len(toolkits) == ("toolkit" in components), f"DaemonSets {TOOLKIT}: {len(toolkits)}"
    for toolkit in toolkits:
        check_toolkit(toolkit, objects, gpud, cache, version)
    daemonsets = [o for o in objects if o["kind"] == "DaemonSet" and o not in toolkits]
    assert len(daemonsets) == 1, kinds
    pod = daemonsets[0]["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    for daemonset in daemonsets:
        check_upgrade(daemonset, objects)
    assert any(t.get("key") == "nvidia.com/gpu" for t in pod["tolerations"])
    assert pod["nodeSelector"], "a node selector on GPU nodes"
    named = [ALIASES.get(c, c) for c in components]
    privileged = {PRIVILEGED_CONTAINER[overlay][c] for c in named if c in PRIVILEGED_CONTAINER[overlay]}
    if "remediation" in components:
        privileged.add(REMEDIATION[overlay])
    check_mps(overlay, components, daemonsets[0], pod, objects)
    ports = [p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])]
    assert len(ports) == len(set(ports)), f"containers share a port: {sorted(ports)}"
    for container in pod["containers"]:
        assert container["image"] == f"gpud:{version}", container["image"]
        check_security(container, container["name"] in privileged)
        check_command(gpud, pod, container, objects, cache)
    for obj in objects:
        # Cluster-scoped kinds carry no namespace.
        if obj["kind"] not in ("Namespace", "DeviceClass") and not obj["kind"].startswith("Cluster"):
            assert obj["metadata"].get("namespace") == "gpud", (obj["kind"], obj["metadata"])
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "gpud-mig-config":
            default = (ROOT / "packaging/mig/config-default.yaml").read_text()
            assert obj["data"] == {"config.yaml": default}, (
                "components/mig-manager/config-default.yaml differs from "
                "packaging/mig/config-default.yaml: copy it over"
            )
        if obj["kind"] == "PrometheusRule":
            alerts = yaml.safe_load((ROOT / "packaging/prometheus/gpud-alerts.yaml").read_text())
            assert obj["spec"] == alerts, (
                "components/prometheus-rule/prometheusrule.yaml differs from "
                "packaging/prometheus/gpud-alerts.yaml: copy the groups over"
            )


# The toolkit step's DaemonSet (components/toolkit) and the containers in it that may run
# privileged: the one that asks the host's systemd to restart the runtime (chroot) and the one
# that reads the GPUs through NVML.
TOOLKIT = "gpud-toolkit"
TOOLKIT_PRIVILEGED = {"configure", "cdi"}


def check_toolkit(daemonset, objects, gpud, cache, version):
    """The toolkit DaemonSet: on GPU nodes, critical, rolling with a surge like gpud's own (its
    steps are idempotent, so the surge pod changes nothing), no host port, no API access, each
    container with the least it needs and a command line gpud accepts."""
    spec = daemonset["spec"]
    assert spec.get("updateStrategy", {}).get("rollingUpdate") == {"maxSurge": 1, "maxUnavailable": 0}
    pod = spec["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] and any(t.get("key") == "nvidia.com/gpu" for t in pod["tolerations"])
    assert pod.get("automountServiceAccountToken") is False, "the toolkit talks to no API server"
    assert not pod.get("hostNetwork") and not pod.get("hostPID"), "no host network or PIDs"
    containers = pod.get("initContainers", []) + pod["containers"]
    assert [c["name"] for c in containers] == ["install", "configure", "cdi"], containers
    for container in containers:
        name = container["name"]
        ctx = container.get("securityContext", {})
        assert container["image"] == f"gpud:{version}", container["image"]
        assert ctx.get("readOnlyRootFilesystem") is True, f"{name}: readOnlyRootFilesystem"
        if name in TOOLKIT_PRIVILEGED:
            assert ctx.get("privileged") is True, f"{name}: privileged"
        else:
            assert not ctx.get("privileged") and ctx.get("allowPrivilegeEscalation") is False, name
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], f"{name}: capabilities.drop"
            assert not ctx["capabilities"].get("add"), f"{name}: capabilities.add"
        resources = container["resources"]
        assert resources["requests"]["memory"] and resources["limits"]["memory"], f"{name}: memory"
        assert not any("hostPort" in p for p in container.get("ports", [])), f"{name}: hostPort"
        check_command(gpud, pod, container, objects, cache)
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/host"].get("readOnly") is True, "the host's root is mounted read-only"


def check_upgrade(daemonset, objects):
    """A rollout without a gap: the new pod starts beside the old one on the same node (maxSurge
    1, maxUnavailable 0) and takes over from it through the state directory, so every container
    mounts that directory, writable, at the path gpud uses; no pod claims a host port (with a
    surge the new pod could not be scheduled while the old one holds it)."""
    name = daemonset["metadata"]["name"]
    strategy = daemonset["spec"].get("updateStrategy", {})
    assert strategy.get("type") == "RollingUpdate", f"DaemonSet {name}: updateStrategy {strategy}"
    assert strategy.get("rollingUpdate") == {"maxSurge": 1, "maxUnavailable": 0}, (
        f"DaemonSet {name}: rollingUpdate {strategy.get('rollingUpdate')}, "
        "expected maxSurge 1, maxUnavailable 0"
    )
    pod = daemonset["spec"]["template"]["spec"]
    state = [
        v for v in pod.get("volumes", []) if v.get("hostPath", {}).get("path") == STATE_DIR
    ]
    assert len(state) == 1, f"DaemonSet {name}: hostPath volumes for {STATE_DIR}: {state}"
    assert state[0]["hostPath"].get("type") == "DirectoryOrCreate", (
        f"DaemonSet {name}: {STATE_DIR} hostPath type {state[0]['hostPath'].get('type')}"
    )
    for container in pod.get("initContainers", []) + pod["containers"]:
        cname = container["name"]
        mounts = [m for m in container.get("volumeMounts", []) if m["name"] == state[0]["name"]]
        assert len(mounts) == 1, f"container {cname}: mounts of the state directory: {mounts}"
        mount = mounts[0]
        assert mount["mountPath"] == STATE_DIR and not mount.get("subPath"), (
            f"container {cname}: state directory mounted as {mount}"
        )
        assert not mount.get("readOnly"), f"container {cname}: the state directory is read-only"
        # gpud's default is the mounted path; a setting elsewhere would miss the handover.
        state_dir = container_env(container, objects, None).get("GPUD_STATE_DIR", STATE_DIR)
        assert state_dir == STATE_DIR, f"container {cname}: GPUD_STATE_DIR={state_dir!r}"
        for port in container.get("ports", []):
            assert "hostPort" not in port, (
                f"container {cname}: hostPort {port['hostPort']} blocks the surge pod"
            )
    if pod.get("hostNetwork"):
        ports = [p for c in pod["containers"] for p in c.get("ports", [])]
        assert not ports, f"DaemonSet {name}: hostNetwork with ports {ports} blocks the surge pod"


def check_dra(overlay, components, objects):
    """The DRA plugin runs exactly once, where the layout puts it: a dra container (and the
    device plugin following its checkpoint) in base, `gpud run` with GPUD_DRA=true in
    all-in-one; its DeviceClasses and ClusterRole only with the dra component."""
    dra = "dra" in components
    pod = next(o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "gpud")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    envs = {name: container_env(c, objects, None) for name, c in containers.items()}
    if overlay == "all-in-one":
        assert envs["gpud"].get("GPUD_DRA") == ("true" if dra else None), "gpud run: GPUD_DRA"
        # Beside its device plugin, gpud run must be told which path offers nvidia.com/gpu.
        owner = envs["gpud"].get("GPUD_EXTENDED_RESOURCE_OWNER")
        assert owner == ("device-plugin" if dra else None), f"GPUD_EXTENDED_RESOURCE_OWNER={owner!r}"
    else:
        assert ("dra" in containers) == dra, f"containers: {list(containers)}"
        checkpoint = envs["device-plugin"].get("GPUD_DRA_CHECKPOINT")
        assert (checkpoint is not None) == dra, f"GPUD_DRA_CHECKPOINT={checkpoint!r}"
    classes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "DeviceClass"}
    plain = sorted(name for name in classes if not name.startswith("mig-"))
    assert plain == (["gpu.nvidia.com", "mig.nvidia.com"] if dra else []), sorted(classes)
    assert classes.get("gpu.nvidia.com", {"spec": {"extendedResourceName": "nvidia.com/gpu"}})[
        "spec"]["extendedResourceName"] == "nvidia.com/gpu"
    # One class per MIG profile, named and selecting as the device plugin's mixed strategy names
    # the resource: mig-1g-10gb-me.gpu.nvidia.com selects profile 1g.10gb+me and serves
    # nvidia.com/mig-1g.10gb.me.
    profiles = [name for name in classes if name.startswith("mig-")]
    assert bool(profiles) == dra, sorted(classes)
    for name in profiles:
        spec = classes[name]["spec"]
        profile = spec["selectors"][0]["cel"]["expression"].rsplit("profile == '", 1)[1].rstrip("'")
        assert name == "mig-" + profile.replace(".", "-").replace("+", "-") + ".gpu.nvidia.com", name
        assert spec["extendedResourceName"] == "nvidia.com/mig-" + profile.replace("+", "."), spec
    roles = {o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRole"}
    assert ("gpud-dra" in roles) == dra, f"ClusterRoles: {sorted(roles)}"


def check_mps(overlay, components, daemonset, pod, objects):
    """With MPS: host PID, the mps root shared Bidirectional by exactly the container running
    the daemons, a config that shares with MPS under that root, and no second DaemonSet or
    selector. Without: none of it."""
    mps = any(c in ("mps", "mps-run") for c in components)
    assert bool(pod.get("hostPID")) == mps, f"hostPID={pod.get('hostPID')} with MPS={mps}"
    assert daemonset["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "gpud"}
    runners = [
        c["name"]
        for c in pod["containers"]
        for m in c.get("volumeMounts", [])
        if m["name"] == "mps-root" and m.get("mountPropagation") == "Bidirectional"
    ]
    if not mps:
        assert runners == [], runners
        return
    expected = "gpud" if overlay == "all-in-one" else "mps-control-daemon"
    assert runners == [expected], f"Bidirectional mps-root in {runners}, expected {expected}"
    volume = next(v for v in pod["volumes"] if v["name"] == "mps-root")
    config = next(
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpud-nvidia-config"
    )
    nvidia = yaml.safe_load(config["data"]["config.yaml"])
    assert nvidia["flags"]["mpsRoot"] == volume["hostPath"]["path"], "mpsRoot is the mounted root"
    assert nvidia["sharing"]["mps"]["resources"], "the config shares with MPS"
    if expected == "mps-control-daemon":
        dp = next(c for c in pod["containers"] if c["name"] == "device-plugin")
        assert any(m["name"] == "mps-root" for m in dp["volumeMounts"]), "device plugin sees markers"


def check_node_status(overlay, components, objects):
    """The node status runs exactly once, where the layout puts it: a gpud-node-status
    container in the per-applet base, `gpud run` with GPUD_NODE_STATUS=true in all-in-one;
    taints (and the permission they need) only with node-status-taints."""
    status = any(c in NODE_STATUS for c in components)
    taints = "node-status-taints" in components
    pod = next(o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "gpud")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    envs = {name: container_env(c, objects, None) for name, c in containers.items()}
    if overlay == "all-in-one":
        assert list(containers) == ["gpud"], f"all-in-one containers: {list(containers)}"
        run = envs["gpud"]
        assert run.get("GPUD_NODE_STATUS") == ("true" if status else None), (
            f"gpud run: GPUD_NODE_STATUS={run.get('GPUD_NODE_STATUS')!r}"
        )
        status_env = run
    else:
        assert ("node-status" in containers) == status, f"containers: {list(containers)}"
        if status:
            command = containers["node-status"]["command"]
            assert command == ["/usr/bin/gpud-node-status"], command
        status_env = envs.get("node-status", {})
    if status:
        assert pod["automountServiceAccountToken"] is True, "node status without its token"
    assert ("GPUD_TAINT_UNHEALTHY" in status_env) == taints, (
        f"GPUD_TAINT_UNHEALTHY={status_env.get('GPUD_TAINT_UNHEALTHY')!r}"
    )
    roles = {o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRole"}
    assert ("gpud-node-status" in roles) == status, f"ClusterRoles: {sorted(roles)}"
    assert ("gpud-node-status-taints" in roles) == taints, f"ClusterRoles: {sorted(roles)}"


def env_sources(container, objects, var):
    """Where the container's environment sets `var`: each ConfigMap of its envFrom that has the
    key, and each env entry naming it."""
    config_maps = {
        o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"
    }
    sources = [
        f"ConfigMap {s['configMapRef']['name']}"
        for s in container.get("envFrom", [])
        if var in config_maps.get(s["configMapRef"]["name"], {})
    ]
    sources += [f"env {v['name']}" for v in container.get("env", []) if v["name"] == var]
    return sources


# The remediation's settings, as the remediation component sets them.
REMEDIATION_ENV = {
    "GPUD_REMEDIATION": "reset",
    "GPUD_REMEDIATION_EVICT": "true",
    "GPUD_REMEDIATION_NAMESPACE": "gpud",
}
# Its RBAC: exactly what it asks for (src/kube/lease.rs, src/kube/eviction.rs; tests/rbac.rs
# runs it against these rules): the budget's Leases in gpud's namespace, evictions anywhere.
REMEDIATION_ROLE = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
]
REMEDIATION_CLUSTER_ROLE = [
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}
]


def check_remediation(overlay, components, objects):
    """The remediation runs exactly once, where the layout puts it (the node-status container in
    base, `gpud run` in all-in-one), in reset mode with eviction, each setting from one source;
    that container is privileged and mounts the kubelet's pod-resources folder (read-only,
    once); the Lease Role (in the namespace the Leases are written to) and the eviction
    ClusterRole, bound to gpud's service account, come with the remediation component and
    only with it."""
    remediation = "remediation" in components
    pod = next(o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "gpud")["spec"]["template"]["spec"]
    runners = [
        c["name"] for c in pod["containers"] if env_sources(c, objects, "GPUD_REMEDIATION")
    ]
    assert runners == ([REMEDIATION[overlay]] if remediation else []), (
        f"containers with GPUD_REMEDIATION: {runners}"
    )
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objects if o["kind"].endswith("Role")}
    bindings = {
        (o["kind"], o["metadata"]["name"]): o for o in objects if o["kind"].endswith("RoleBinding")
    }
    for kind in ["Role", "ClusterRole"]:
        assert ((kind, "gpud-remediation") in roles) == remediation, f"{kind}s: {sorted(roles)}"
        assert ((f"{kind}Binding", "gpud-remediation") in bindings) == remediation, (
            f"{kind}Bindings: {sorted(bindings)}"
        )
    if not remediation:
        return
    container = next(c for c in pod["containers"] if c["name"] == runners[0])
    env = container_env(container, objects, None)
    for var, value in REMEDIATION_ENV.items():
        sources = env_sources(container, objects, var)
        assert len(sources) == 1, f"{var} set by {sources}, expected once"
        assert env[var] == value, f"{var}={env[var]!r}, expected {value!r}"
    assert container.get("securityContext", {}).get("privileged") is True, (
        f"{runners[0]}: resets GPUs, not privileged"
    )
    assert pod["automountServiceAccountToken"] is True, "the remediation without its token"
    # The kubelet's pod-resources socket, where the pods to evict are found.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = [m for m in container["volumeMounts"] if m["mountPath"] == POD_RESOURCES]
    assert len(mounts) == 1, f"{runners[0]}: mounts at {POD_RESOURCES}: {mounts}"
    assert mounts[0].get("readOnly") is True, f"{runners[0]}: {POD_RESOURCES} is writable"
    host = volumes[mounts[0]["name"]].get("hostPath", {}).get("path")
    assert host == POD_RESOURCES, f"{runners[0]}: {POD_RESOURCES} mounted from {host}"
    paths = [m["mountPath"] for m in container["volumeMounts"]]
    assert len(paths) == len(set(paths)), f"{runners[0]}: a path mounted twice: {paths}"
    socket = env.get("GPUD_REMEDIATION_POD_RESOURCES_SOCKET", f"{POD_RESOURCES}/kubelet.sock")
    assert socket.startswith(POD_RESOURCES + "/"), f"the pod-resources socket {socket} is not mounted"
    # The rules, each bound to gpud's service account, the Role where the Leases are written.
    role = roles[("Role", "gpud-remediation")]
    assert role["metadata"]["namespace"] == env["GPUD_REMEDIATION_NAMESPACE"], (
        f"Role in {role['metadata']['namespace']}, Leases in {env['GPUD_REMEDIATION_NAMESPACE']}"
    )
    assert role["rules"] == REMEDIATION_ROLE, f"Role rules: {role['rules']}"
    cluster_role = roles[("ClusterRole", "gpud-remediation")]
    assert cluster_role["rules"] == REMEDIATION_CLUSTER_ROLE, f"ClusterRole rules: {cluster_role['rules']}"
    for kind in ["RoleBinding", "ClusterRoleBinding"]:
        binding = bindings[(kind, "gpud-remediation")]
        assert binding["roleRef"]["name"] == "gpud-remediation", binding["roleRef"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "gpud", "namespace": "gpud"}
        ], binding["subjects"]
        if kind == "RoleBinding":
            assert binding["metadata"]["namespace"] == role["metadata"]["namespace"], binding["metadata"]


def validate(unique):
    skipped = set()
    for text in unique:
        obj = json.loads(text)
        if obj["kind"] in CUSTOM_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1", obj["apiVersion"]
            skipped.add(obj["kind"])
            continue
        for version in VERSIONS:
            # resource.k8s.io/v1 (DeviceClass) is served from Kubernetes 1.34 on.
            if obj["apiVersion"] == "resource.k8s.io/v1" and version < "1.34":
                continue
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                raise SystemExit(
                    f"{obj['kind']}/{obj['metadata']['name']} is invalid for Kubernetes "
                    f"{version}: {err.message} at {'.'.join(map(str, err.path))}"
                )
    return skipped


# The DRA goldens (tests/dra.rs) hold what gpud publishes as ResourceSlices: each file in the
# resource.k8s.io version it was served through, validated against the Kubernetes releases
# that serve that version, so a golden cannot be blessed from output an API server refuses.
GOLDEN_SLICES = {
    "dgx-h100.json": ("resource.k8s.io/v1", ["1.34.0", "1.37.0"]),
    "a100-mig.json": ("resource.k8s.io/v1", ["1.34.0", "1.37.0"]),
    "mixed.json": ("resource.k8s.io/v1", ["1.34.0", "1.37.0"]),
    "mixed-v1beta1.json": ("resource.k8s.io/v1beta1", ["1.32.0", "1.33.0"]),
    # Dynamic MIG: counter sets beside their devices (1.34), in slices of their own (1.35+).
    "dgx-a100-dynamic-mig-1.34.json": ("resource.k8s.io/v1", ["1.34.0"]),
    "dgx-h100-dynamic-mig-1.34.json": ("resource.k8s.io/v1", ["1.34.0"]),
    "dgx-a100-dynamic-mig-1.36.json": ("resource.k8s.io/v1", ["1.36.0", "1.37.0"]),
    "dgx-h100-dynamic-mig-1.36.json": ("resource.k8s.io/v1", ["1.36.0", "1.37.0"]),
    # resource.kubernetes.io/numaNode as a list (ints): from 1.36 (DRAListTypeAttributes).
    "dgx-h100-1.37.json": ("resource.k8s.io/v1", ["1.36.0", "1.37.0"]),
}


def validate_golden_slices():
    root = os.path.join(os.path.dirname(__file__), "..", "fixtures", "golden", "dra")
    files = sorted(f for f in os.listdir(root) if f.endswith(".json"))
    assert files == sorted(GOLDEN_SLICES), f"DRA goldens without a version here: {files}"
    checked = 0
    for name, (api_version, versions) in GOLDEN_SLICES.items():
        with open(os.path.join(root, name)) as f:
            slices = json.load(f)
        for shown in slices:
            obj = {
                "apiVersion": api_version,
                "kind": "ResourceSlice",
                "metadata": {"name": shown["name"]},
                "spec": shown["spec"],
            }
            for version in versions:
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                except kubernetes_validate.ValidationError as err:
                    raise SystemExit(
                        f"golden {name}: ResourceSlice {shown['name']} is invalid for "
                        f"Kubernetes {version}: {err.message} at "
                        f"{'.'.join(map(str, err.path))}"
                    )
                checked += 1
    return checked


def validate_cdi_goldens():
    """Every CDI golden (tests/cdi.rs blesses them from gpud's output) against the CDI schema of
    tests/schemas/cdi.json, so a golden cannot be blessed from a spec a runtime refuses."""
    import jsonschema

    here = os.path.dirname(__file__)
    with open(os.path.join(here, "..", "schemas", "cdi.json")) as f:
        schema = json.load(f)
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    root = os.path.join(here, "..", "fixtures", "golden", "cdi")
    files = sorted(f for f in os.listdir(root) if f.endswith((".json", ".yaml")))
    assert files, "no CDI goldens"
    for name in files:
        with open(os.path.join(root, name)) as f:
            spec = json.load(f) if name.endswith(".json") else yaml.safe_load(f)
        errors = sorted(validator.iter_errors(spec), key=lambda e: list(e.path))
        if errors:
            raise SystemExit(
                f"CDI golden {name} is not a valid CDI spec: "
                + "; ".join(f"{e.message} at {'.'.join(map(str, e.path)) or '(top)'}" for e in errors)
            )
    # The schema can fail: what a runtime refuses, it refuses.
    bad = {
        "a kind without a class": {"cdiVersion": "0.5.0", "kind": "nvidia.com", "devices": []},
        "an unknown version": {"cdiVersion": "0.9.9", "kind": "nvidia.com/gpu", "devices": []},
        "a device name with a slash": {
            "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "devices": [{"name": "a/b", "containerEdits": {}}],
        },
        "an unknown hook point": {
            "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [],
            "containerEdits": {"hooks": [{"hookName": "onStart", "path": "/bin/true"}]},
        },
        "an unknown field": {
            "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [],
            "containerEdits": {"deviceNodes": [{"path": "/dev/x", "mode": 1}]},
        },
    }
    for what, spec in bad.items():
        assert not validator.is_valid(spec), f"the CDI schema accepts {what}"
    return files


def check_remediation_needs_node_status():
    """The remediation runs in the node status's process and does not include it (so that it
    goes with node-status-taints as well as node-status): alone, kustomize refuses it, naming
    the node status's ConfigMap, instead of rendering a container without a node status."""
    for overlay in ["base", "all-in-one"]:
        try:
            render(overlay, ["remediation"])
        except SystemExit as refused:
            assert "gpud-node-status" in str(refused), f"{overlay} + remediation: {refused}"
            continue
        raise SystemExit(f"{overlay} + ['remediation'] rendered without the node status")


def main():
    gpud = os.path.abspath(sys.argv[1])
    version = subprocess.run(
        [gpud, "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    cache = {}
    unique = set()
    combos = list(combinations())
    for overlay, components in combos:
        objects = render(overlay, components)
        try:
            check_objects(overlay, objects, gpud, cache, version, components)
            check_node_status(overlay, components, objects)
            check_dra(overlay, components, objects)
            check_remediation(overlay, components, objects)
        except AssertionError as err:
            raise SystemExit(f"{overlay} + {components}: {err}")
        unique.update(json.dumps(o, sort_keys=True) for o in objects)
    check_remediation_needs_node_status()
    skipped = validate(unique)
    golden = validate_golden_slices()
    cdi = validate_cdi_goldens()
    print(f"CDI goldens: {len(cdi)} specs valid against tests/schemas/cdi.json")
    print(
        f"DRA goldens: {golden} ResourceSlice validations against the Kubernetes releases "
        f"serving their resource.k8s.io version passed"
    )
    print(
        f"manifests: {len(combos)} combinations rendered, {len(unique)} distinct objects "
        f"valid for Kubernetes {' and '.join(VERSIONS)} (schemas not checked: "
        f"{', '.join(sorted(skipped))}), {len(cache)} distinct container command lines "
        f"accepted by {gpud} --check-config"
    )


if __name__ == "__main__":
    main()
