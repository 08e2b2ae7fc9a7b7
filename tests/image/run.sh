#!/usr/bin/env bash
# The image tested as it runs in the DaemonSet: root user, every capability dropped but
# SYSLOG, read-only root filesystem, no new privileges, the DaemonSet's hostPaths as bind
# mounts, and the simulated NVML mounted where each real layout puts the driver's library
# (nothing tells gpud where: it must find it by itself).
#
#   1. `gpud --list` prints the applets, as the host binary does;
#   2. `gpud inventory` finds NVML at each layout and sees the fixture's 8 GPUs;
#   3. `gpud-device-plugin` registers with a simulated kubelet (on the host, its socket folder
#      shared as the device-plugins hostPath), which allocates, injects an XID and sees the GPU
#      withdrawn and back;
#   4. `gpud-labeller` writes the NFD features file into the shared features folder;
#   5. `gpud-exporter` is scraped from another container over a container network.
#
# Where no Docker engine answers, the same checks run on the root filesystem through chroot
# (as root), the mock copied to each layout inside a scratch copy of it.
#
# Usage: run.sh IMAGE ROOTFS GPUD MOCK_LIB KUBELET_SIM SCRAPE
set -euo pipefail
image=$1
rootfs=$(realpath "$2") gpud=$(realpath "$3") mock=$(realpath "$4")
kubelet_sim=$(realpath "$5") scrape=$(realpath "$6")
fixture=dgx-h100
layouts=(
  /run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 # GPU Operator's driver container
  /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1                   # container toolkit's injection
  /home/kubernetes/bin/nvidia/lib64/libnvidia-ml.so.1           # GKE
)
work=$(mktemp -d)
containers=()
network=""
cleanup() {
  for c in "${containers[@]}"; do docker rm -f "$c" >/dev/null 2>&1 || true; done
  [[ -n $network ]] && docker network rm "$network" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
passed=0
pass() {
  echo "ok: $*"
  passed=$((passed + 1))
}
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

if [[ ${IMAGE_TEST_MODE:-} != chroot ]] && docker info >/dev/null 2>&1; then
  mode=docker
else
  mode=chroot
  [[ $(id -u) == 0 ]] || fail "no Docker engine, and chroot needs root"
fi
echo "image test ($mode): $image"

# The DaemonSet's security settings.
secure=(--user 0:0 --cap-drop ALL --cap-add SYSLOG --read-only --security-opt no-new-privileges)

# in_image MOUNT_SPEC... -- ARGV...: runs ARGV in the image. MOUNT_SPEC is HOST:CONTAINER[:ro]
# or ENV=VALUE.
in_image() {
  local opts=() spec
  while [[ $1 != -- ]]; do
    spec=$1
    shift
    if [[ $spec == *=* ]]; then opts+=(-e "$spec"); else opts+=(-v "$spec"); fi
  done
  shift
  if [[ $mode == docker ]]; then
    docker run --rm "${secure[@]}" "${opts[@]}" --entrypoint "$1" "$image" "${@:2}"
  else
    in_chroot "${opts[@]}" -- "$@"
  fi
}

# free_port: a random free loopback port.
# shellcheck source=../lib/free_port.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/free_port.sh"

# The chroot equivalent: a scratch copy of the root filesystem with each mount bind-mounted
# into it, the environment given explicitly. A TERM (the test stopping a daemon) is passed on.
in_chroot() {
  local root env=() binds=() i host inside
  root=$(mktemp -d "$work/root.XXXX")
  cp -a "$rootfs/." "$root/"
  while [[ $1 != -- ]]; do
    case $1 in
      -e) env+=("$2") ;;
      -v)
        IFS=: read -r host inside _ <<<"$2"
        mkdir -p "$root$(dirname "$inside")"
        if [[ -d $host ]]; then mkdir -p "$root$inside"; else touch "$root$inside"; fi
        mount --bind "$host" "$root$inside"
        binds+=("$root$inside")
        ;;
    esac
    shift 2
  done
  shift
  local status=0 child
  env -i "${env[@]}" "$(command -v chroot)" "$root" "$@" &
  child=$!
  trap 'kill "$child" 2>/dev/null' TERM
  wait "$child" || status=$?
  wait "$child" 2>/dev/null || true
  for i in "${binds[@]}"; do umount "$i"; done
  return $status
}

# 1. The applet list.
diff <(in_image -- /usr/bin/gpud --list) <("$gpud" --list) || fail "gpud --list differs from the host binary's"
pass "gpud --list"

# 2. NVML found at each driver layout, without --nvml-lib.
for layout in "${layouts[@]}"; do
  out=$(in_image "$mock:$layout:ro" NVML_MOCK_FIXTURE=$fixture NODE_NAME=gpu-node-1 -- \
    /usr/bin/gpud-inventory --format json) || fail "inventory with NVML at $layout"
  count=$(grep -o '"uuid": *"GPU-[^"]*"' <<<"$out" | sort -u | wc -l)
  [[ $count == 8 ]] || fail "inventory with NVML at $layout: $count GPUs, expected 8"
  pass "inventory finds NVML at $layout (8 GPUs)"
done
driver=${layouts[0]}

# 3. The device plugin against a simulated kubelet on the host.
mkdir -p "$work/device-plugins" "$work/state"
touch "$work/control"
plugin_env=("$mock:$driver:ro" "$work/device-plugins:/var/lib/kubelet/device-plugins"
  "$work/state:/var/lib/gpud"
  "$work/control:/control" NVML_MOCK_FIXTURE=$fixture NVML_MOCK_CONTROL=/control
  NODE_NAME=gpu-node-1 GPUD_KMSG_PATH= GPUD_HEALTH_POLL_INTERVAL=200ms)
if [[ $mode == docker ]]; then
  name=gpud-image-test-dp-$$
  containers+=("$name")
  opts=()
  for spec in "${plugin_env[@]}"; do
    if [[ $spec == *=* ]]; then opts+=(-e "$spec"); else opts+=(-v "$spec"); fi
  done
  docker run -d --name "$name" "${secure[@]}" "${opts[@]}" \
    --entrypoint /usr/bin/gpud-device-plugin "$image" >/dev/null
  "$kubelet_sim" "$work/device-plugins" "$work/control" >"$work/kubelet.log" 2>&1 ||
    { cat "$work/kubelet.log"; docker logs "$name"; fail "device plugin against the simulated kubelet"; }
else
  in_image "${plugin_env[@]}" -- /usr/bin/gpud-device-plugin &
  plugin=$!
  status=0
  "$kubelet_sim" "$work/device-plugins" "$work/control" >"$work/kubelet.log" 2>&1 || status=$?
  kill "$plugin"
  wait "$plugin" || true
  [[ $status == 0 ]] || { cat "$work/kubelet.log"; fail "device plugin against the simulated kubelet"; }
fi
pass "device-plugin: registered, allocated, XID withdrew the GPU and the reset returned it"
# With the DaemonSet's security settings the container keeps its verdicts in the state hostPath.
grep -q '"boot_id"' "$work/state/health/device-plugin.json" 2>/dev/null ||
  fail "device plugin kept no health verdicts in the /var/lib/gpud hostPath: $(ls -lR "$work/state")"
pass "device-plugin: health verdicts kept in the /var/lib/gpud hostPath"

# 4. The labeller writes NFD's features file into the shared features folder.
mkdir -p "$work/features.d"
in_image "$mock:$driver:ro" "$work/features.d:/etc/kubernetes/node-feature-discovery/features.d" \
  NVML_MOCK_FIXTURE=$fixture NODE_NAME=gpu-node-1 GPUD_KMSG_PATH= -- \
  /usr/bin/gpud-labeller --oneshot --no-timestamp >/dev/null 2>"$work/labeller.log" ||
  { cat "$work/labeller.log"; fail "labeller --oneshot"; }
grep -qx 'nvidia.com/gpu.count=8' "$work/features.d/gfd" || fail "features file: $(cat "$work/features.d/gfd")"
grep -qx 'nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3' "$work/features.d/gfd" ||
  fail "features file: $(grep product "$work/features.d/gfd")"
pass "labeller wrote features.d/gfd (gpu.count=8, gpu.product=NVIDIA-H100-80GB-HBM3)"

# 5. The exporter, scraped from another container. Like every container of the DaemonSet it
# keeps its health verdicts in the state hostPath: without a place to keep them it is not ready.
mkdir -p "$work/state-exporter"
if [[ $mode == docker ]]; then
  network=gpud-image-test-$$
  docker network create "$network" >/dev/null
  name=gpud-image-test-exporter-$$
  containers+=("$name")
  docker run -d --name "$name" --network "$network" "${secure[@]}" \
    -v "$mock:$driver:ro" -v "$work/state-exporter:/var/lib/gpud" \
    -e NVML_MOCK_FIXTURE=$fixture -e NODE_NAME=gpu-node-1 -e GPUD_KMSG_PATH= \
    --entrypoint /usr/bin/gpud-exporter "$image" --collect-interval 500 >/dev/null
  scrape_from_peer() {
    docker run --rm --network "$network" "${secure[@]}" -v "$scrape:/scrape:ro" \
      --entrypoint /scrape "$image" "$name:9400" "$1"
  }
else
  # The chroot shares the host's network: no fixed port (another test, or a second run of
  # this one, may hold it).
  port=$(free_port)
  in_image "$mock:$driver:ro" "$work/state-exporter:/var/lib/gpud" \
    NVML_MOCK_FIXTURE=$fixture NODE_NAME=gpu-node-1 GPUD_KMSG_PATH= -- \
    /usr/bin/gpud-exporter --collect-interval 500 -a "127.0.0.1:$port" &
  exporter=$!
  scrape_from_peer() { in_image "$scrape:/scrape" -- /scrape "127.0.0.1:$port" "$1"; }
fi
deadline=$((SECONDS + 30))
until scrape_from_peer /readyz >/dev/null 2>&1; do
  ((SECONDS < deadline)) || fail "exporter not ready within 30 s: $(scrape_from_peer /readyz 2>&1 | tail -n 3)"
  sleep 0.2
done
metrics=$(scrape_from_peer /metrics)
[[ $mode == chroot ]] && { kill "$exporter"; wait "$exporter" || true; }
utils=$(grep -c '^DCGM_FI_DEV_GPU_UTIL{' <<<"$metrics" || true)
[[ $utils == 8 ]] || fail "/metrics has $utils DCGM_FI_DEV_GPU_UTIL series, expected 8"
grep -q '^gpud_gpu_health{' <<<"$metrics" || fail "/metrics has no gpud_gpu_health"
pass "exporter scraped from another container: 8 DCGM_FI_DEV_GPU_UTIL series, gpud_gpu_health"

echo "image test: $passed passed, 0 failed"
