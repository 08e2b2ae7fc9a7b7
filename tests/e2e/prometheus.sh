#!/usr/bin/env bash
# End to end with a real Prometheus server: `gpud exporter` on the simulated dgx-h100 is
# scraped by Prometheus (Debian's `prometheus` package), and a PromQL query through the HTTP
# API must return DCGM_FI_DEV_GPU_UTIL for all 8 GPUs. Loopback only.
#
# Usage: tests/e2e/prometheus.sh GPUD MOCK_LIB
set -euo pipefail

GPUD=${1:?usage: prometheus.sh GPUD MOCK_LIB}
MOCK_LIB=${2:?usage: prometheus.sh GPUD MOCK_LIB}
PROMETHEUS=${PROMETHEUS:-$(command -v prometheus || true)}
if [[ -z "$PROMETHEUS" ]]; then
  echo "e2e: prometheus is not installed (apt-get install -y prometheus)" >&2
  exit 1
fi

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# free_port: a random free loopback port.
# shellcheck source=../lib/free_port.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/free_port.sh"

exporter_port=$(free_port)
prometheus_port=$(free_port)
: > "$work/control"

NVML_MOCK_FIXTURE=dgx-h100 NVML_MOCK_CONTROL="$work/control" NODE_NAME=e2e-node \
  GPUD_NVML_LIB="$MOCK_LIB" GPUD_STATE_DIR="$work/state" GPUD_LOG=warn \
  "$GPUD" exporter -a "127.0.0.1:$exporter_port" -c 1000 --kmsg "" >"$work/gpud.log" 2>&1 &
pids+=($!)

cat >"$work/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gpud-exporter
    static_configs:
      - targets: ["127.0.0.1:$exporter_port"]
YAML

"$PROMETHEUS" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$prometheus_port" --log.level=warn >"$work/prometheus.log" 2>&1 &
pids+=($!)

query() {
  curl -fsS --get "http://127.0.0.1:$prometheus_port/api/v1/query" --data-urlencode "query=$1"
}

# The value of a scalar-like instant query (`[ts, "v"]`), or nothing yet.
value_of() {
  query "$1" 2>/dev/null | grep -o '"value":\[[^]]*\]' | head -1 | sed 's/.*,"\(.*\)"\]/\1/' || true
}

echo "e2e: gpud exporter on :$exporter_port, prometheus on :$prometheus_port"
deadline=$((SECONDS + 90))
gpus=""
while ((SECONDS < deadline)); do
  gpus=$(value_of 'count(count by (gpu, UUID) (DCGM_FI_DEV_GPU_UTIL{job="gpud-exporter"}))')
  [[ "$gpus" == "8" ]] && break
  sleep 1
done
if [[ "$gpus" != "8" ]]; then
  echo "e2e: FAIL: Prometheus sees ${gpus:-no} GPUs with DCGM_FI_DEV_GPU_UTIL, expected 8" >&2
  echo "--- gpud log" >&2; cat "$work/gpud.log" >&2
  echo "--- prometheus log" >&2; tail -20 "$work/prometheus.log" >&2
  exit 1
fi

up=$(value_of 'up{job="gpud-exporter"}')
[[ "$up" == "1" ]] || { echo "e2e: FAIL: up{job=\"gpud-exporter\"} is ${up:-missing}" >&2; exit 1; }
host=$(value_of 'count(DCGM_FI_DEV_GPU_UTIL{Hostname="e2e-node",modelName="NVIDIA H100 80GB HBM3"})')
[[ "$host" == "8" ]] || { echo "e2e: FAIL: labels: $host series with Hostname and modelName" >&2; exit 1; }

echo "e2e: DCGM_FI_DEV_GPU_UTIL through Prometheus:"
query 'DCGM_FI_DEV_GPU_UTIL' | grep -o '"gpu":"[0-9]*"' | sort -u | tr '\n' ' '
echo
echo "e2e: PASS: Prometheus scraped gpud exporter and returns DCGM_FI_DEV_GPU_UTIL for all 8 GPUs"
