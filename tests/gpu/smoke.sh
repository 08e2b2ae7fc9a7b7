#!/usr/bin/env bash
# Read-only smoke test on a machine with a real NVIDIA GPU and driver.
#
# It never changes GPU state: no MIG changes, no clocks, power limits, persistence mode or
# resets. It only reads: the inventory, one health poll, a few seconds of the health watcher,
# a CDI spec printed to stdout, and one /metrics scrape when the exporter exists in this build.
#
# Usage: tests/gpu/smoke.sh [path/to/gpud]   (default: target/release/gpud, built if missing)
# Everything it prints also lands in ${OUT:-/tmp/gpud-smoke}/ for comparison with the mock.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
gpud=${1:-$root/target/release/gpud}
out=${OUT:-/tmp/gpud-smoke}
mkdir -p "$out"
if [[ ! -x "$gpud" ]]; then
    (cd "$root" && cargo build --release --bin gpud) || exit 1
fi

step() { echo; echo "== $*"; }
run() { # name, command…: runs with a time limit, keeps stdout and stderr
    local name=$1; shift
    timeout 60 "$@" >"$out/$name.out" 2>"$out/$name.err"
    local rc=$?
    echo "exit $rc"
    head -c 20000 "$out/$name.out"
    [[ -s "$out/$name.err" ]] && { echo "-- stderr:"; head -c 4000 "$out/$name.err"; }
    return 0
}

step "nvidia-smi (for comparison)"
command -v nvidia-smi >/dev/null && run nvidia-smi nvidia-smi -q -d MEMORY,ECC,PAGE_RETIREMENT,TEMPERATURE,POWER
command -v nvidia-smi >/dev/null && run nvidia-smi-topo nvidia-smi topo -m

step "gpud --list"
run list "$gpud" --list

step "gpud inventory --format table"
run inventory-table "$gpud" inventory --format table

step "gpud inventory (JSON)"
run inventory-json "$gpud" inventory

step "gpud health --once"
run health-once "$gpud" health --once

step "gpud health (watcher, 5 s; kernel log included when readable)"
run health-watch timeout 5 "$gpud" health --json --poll-interval 1s

step "gpud cdi generate --output - (stdout only, nothing written)"
if "$gpud" --list | grep -qx cdi; then
    run cdi "$gpud" cdi generate --output - --format yaml
fi

step "gpud exporter: one /metrics scrape"
if "$gpud" --list | grep -qx exporter; then
    "$gpud" exporter --address 127.0.0.1:19400 >"$out/exporter.out" 2>"$out/exporter.err" &
    pid=$!
    for _ in $(seq 1 50); do
        curl -fsS http://127.0.0.1:19400/readyz >/dev/null 2>&1 && break
        sleep 0.2
    done
    curl -fsS http://127.0.0.1:19400/metrics >"$out/metrics.prom" 2>&1
    echo "exit $?"; head -c 20000 "$out/metrics.prom"
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
fi

echo
echo "Outputs kept in $out"
