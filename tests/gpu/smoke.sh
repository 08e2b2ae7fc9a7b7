#!/usr/bin/env bash
# Read-only smoke test on a machine with a real NVIDIA GPU and driver.
#
# It never changes GPU state: no MIG changes, no clocks, power limits, persistence mode or
# resets. It only reads: the driver's own view (nvidia-smi, pynvml when present) to compare
# with, the inventory, one health poll, a few seconds of the health watcher, the labels, a CDI
# spec printed to stdout, the device plugin against a simulated kubelet (register, list,
# allocate: nothing on the GPU changes), and /metrics scrapes.
#
# Usage: tests/gpu/smoke.sh [path/to/gpud] [path/to/kubelet_sim]
#        (defaults: target/release/gpud and target/release/examples/kubelet_sim, built if
#        missing)
# Everything it prints also lands in ${OUT:-/tmp/gpud-smoke}/ for comparison with the mock.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
gpud=${1:-$root/target/release/gpud}
kubelet_sim=${2:-$root/target/release/examples/kubelet_sim}
out=${OUT:-/tmp/gpud-smoke}
mkdir -p "$out"
if [[ ! -x "$gpud" ]]; then
    (cd "$root" && cargo build --release --bin gpud) || exit 1
fi
has() { "$gpud" --list | grep -qx "$1"; }
# No daemon here binds its fixed default admin port (9410-9417): the machine may run gpud
# itself. The exporter and `gpud run` serve /readyz on the free port each is given.
export GPUD_HEALTH_ADDRESS=""

# free_port: a random free loopback port.
# shellcheck source=../lib/free_port.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/free_port.sh"
step() { echo; echo "== $*"; }
run() { # name, command…: runs with a time limit, keeps stdout and stderr, prints the wall time
    local name=$1; shift
    local start end
    start=$(date +%s%N)
    timeout 60 "$@" >"$out/$name.out" 2>"$out/$name.err"
    local rc=$?
    end=$(date +%s%N)
    echo "exit $rc in $(( (end - start) / 1000000 )) ms"
    head -c 12000 "$out/$name.out"
    [[ -s "$out/$name.err" ]] && { echo "-- stderr:"; head -c 4000 "$out/$name.err"; }
    return 0
}

step "the driver's view (for comparison)"
uname -r; cat /proc/driver/nvidia/version 2>/dev/null
ls -l /dev/nvidia* 2>/dev/null; ls -R /proc/driver/nvidia/capabilities 2>/dev/null | head -40
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; ldconfig -p 2>/dev/null | grep -E 'libnvidia-ml|libcuda\.' | head
ls /usr/local/nvidia/lib64 2>/dev/null | head -30
if command -v nvidia-smi >/dev/null; then
    run nvidia-smi nvidia-smi -q
    run nvidia-smi-topo nvidia-smi topo -m
    run nvidia-smi-query nvidia-smi --format=csv --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,temperature.gpu,power.draw,utilization.gpu,clocks.sm,clocks.mem,mig.mode.current,ecc.mode.current,pstate
fi
if python3 -c 'import pynvml' 2>/dev/null; then
    run pynvml python3 "$root/tests/gpu/nvml_facts.py"
    step "NVML call costs (pynvml, the calls of one exporter sample cycle)"
    run nvml-timing python3 "$root/tests/gpu/nvml_timing.py"
fi

step "gpud --list"
run list "$gpud" --list

step "gpud inventory --format table"
run inventory-table "$gpud" inventory --format table

step "gpud inventory (JSON)"
run inventory-json "$gpud" inventory

if has doctor; then
    step "gpud doctor --json (reads only: no bundle, no status files)"
    run doctor-json "$gpud" doctor --json
fi

step "gpud health --once"
run health-once "$gpud" health --once

step "gpud health (watcher, 5 s; kernel log included when readable)"
run health-watch timeout 5 "$gpud" health --json --poll-interval 1s

if has labeller; then
    step "gpud labeller --oneshot --output-file - (stdout only, the Node is not touched)"
    run labels "$gpud" labeller --oneshot --no-timestamp --output-file -
fi

if has cdi; then
    step "gpud cdi generate --output - (stdout only, nothing written)"
    run cdi "$gpud" cdi generate --output - --format yaml
fi

if has device-plugin && [[ -x "$kubelet_sim" ]]; then
    step "gpud device-plugin against a simulated kubelet (register, list, preferred, allocate)"
    dir=$(mktemp -d)
    "$gpud" device-plugin --kubelet-socket "$dir/kubelet.sock" --kmsg "" \
        >"$out/device-plugin.out" 2>"$out/device-plugin.err" &
    pid=$!
    run kubelet-sim "$kubelet_sim" "$dir"
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "-- device-plugin stderr:"; head -c 4000 "$out/device-plugin.err"
    rm -rf "$dir"
fi

if has exporter; then
    step "gpud exporter: /metrics scrapes (1 s sampling)"
    port=$(free_port)
    "$gpud" exporter --address "127.0.0.1:$port" --collect-interval 1000 \
        >"$out/exporter.out" 2>"$out/exporter.err" &
    pid=$!
    for _ in $(seq 1 50); do
        curl -fsS http://127.0.0.1:$port/readyz >/dev/null 2>&1 && break
        sleep 0.2
    done
    curl -fsS http://127.0.0.1:$port/metrics >"$out/metrics.prom" 2>&1
    echo "exit $?"; head -c 16000 "$out/metrics.prom"
    sleep 3
    curl -fsS http://127.0.0.1:$port/metrics >"$out/metrics-later.prom" 2>&1
    echo "-- gpud's own series after 3 s more:"
    grep -E '^gpud_(sample_duration|nvml_up|gpu_health)' "$out/metrics-later.prom"
    echo "-- scrape timings (20 scrapes):"
    for _ in $(seq 1 20); do
        curl -o /dev/null -sS -w '%{time_total}\n' http://127.0.0.1:$port/metrics
    done | sort -n | awk '{t[NR]=$1} END {print "min " t[1] " s, median " t[int((NR+1)/2)] " s, max " t[NR] " s"}'
    echo "-- exporter RSS: $(awk '/VmRSS/ {print $2, $3}' /proc/$pid/status 2>/dev/null)"
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "-- exporter stderr:"; head -c 6000 "$out/exporter.err"
fi

rss() { awk '/VmRSS/ {print $2, $3}' "/proc/$1/status" 2>/dev/null; }

step "gpud health: resident memory of the watcher alone (NVML loaded, nothing else)"
"$gpud" health --kmsg "" >/dev/null 2>&1 &
pid=$!; sleep 3; echo "gpud health RSS: $(rss $pid)"; kill "$pid"; wait "$pid" 2>/dev/null

if has run && [[ -x "$kubelet_sim" ]]; then
    step "gpud run: every subsystem in one process (simulated kubelet, labels to a temp file)"
    dir=$(mktemp -d)
    port=$(free_port)
    start=$(date +%s%N)
    "$gpud" run --kubelet-socket "$dir/kubelet.sock" --kmsg "" -o "$dir/gfd" --no-timestamp \
        -a "127.0.0.1:$port" -c 1000 >"$out/run.out" 2>"$out/run.err" &
    pid=$!
    run kubelet-sim-run "$kubelet_sim" "$dir"
    for _ in $(seq 1 50); do
        curl -fsS http://127.0.0.1:$port/readyz >/dev/null 2>&1 && break
        sleep 0.1
    done
    echo "start to metrics ready: $(( ($(date +%s%N) - start) / 1000000 )) ms"
    echo "-- labels written by gpud run:"; cat "$dir/gfd"
    sleep 3
    curl -fsS http://127.0.0.1:$port/metrics >"$out/run-metrics.prom"
    echo "-- gpud run's own series:"; grep -E '^gpud_(sample_duration|nvml_up|gpu_health)' "$out/run-metrics.prom"
    echo "-- gpud run RSS after 3 s: $(rss $pid)"
    kill "$pid"; wait "$pid"; echo "exit $? on SIGTERM; features file left: $(ls "$dir" | grep -c '^gfd$')"
    echo "-- gpud run stderr:"; head -c 6000 "$out/run.err"
    rm -rf "$dir"
fi

echo
echo "Outputs kept in $out"
