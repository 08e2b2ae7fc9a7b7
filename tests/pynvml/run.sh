#!/usr/bin/env bash
# Runs check.py: NVIDIA's Python bindings (nvidia-ml-py, i.e. pynvml) against the mock
# libnvidia-ml.so.1, loaded exactly the way pynvml loads the real one (by SONAME through
# LD_LIBRARY_PATH); then nvitop-exporter, a third-party exporter, on the simulated dgx-h100:
# it must serve GPU series and log no error (every NVML call it makes is exported); then
# nvitop --once on the simulated a100-mig.
# Both run in the virtual environment tests/python/venv.sh keeps in target/py-venv.
#
# Usage: tests/pynvml/run.sh [path/to/libnvidia_ml_mock.so]
# Without an argument it builds the debug library with cargo and uses that.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=$("$root/tests/python/venv.sh") || {
    if [[ $? -eq 3 ]]; then
        # Required in CI: a check that silently skips there would pass what it never ran.
        [[ -n "${CI:-}" ]] && { echo "run.sh: python3 is required in CI" >&2; exit 1; }
        echo "pynvml check skipped: python3 is not installed"; exit 0
    fi
    echo "run.sh: cannot make the Python environment (tests/python/venv.sh)" >&2
    exit 1
}
lib=${1:-}
if [[ -z "$lib" ]]; then
    cargo build --quiet -p nvml-mock --manifest-path "$root/Cargo.toml"
    lib="${CARGO_TARGET_DIR:-$root/target}/debug/libnvidia_ml_mock.so"
fi
[[ -f "$lib" ]] || { echo "run.sh: no library at $lib" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ln -s "$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")" "$tmp/libnvidia-ml.so.1"

env -u NVML_MOCK_FIXTURE -u NVML_MOCK_STATE -u NVML_MOCK_CONTROL -u NVML_MOCK_CLOCK \
    -u NVML_MOCK_MIG_RESET_REQUIRED \
    LD_LIBRARY_PATH="$tmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    PYNVML_CHECK_TMP="$tmp" \
    PYNVML_CHECK_FIXTURES="$root/tests/fixtures/nodes" \
    "$python" "$root/tests/pynvml/check.py"

# nvitop-exporter on the simulated node, on a free port; its log must hold no error.
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
env -u NVML_MOCK_STATE -u NVML_MOCK_CONTROL NVML_MOCK_FIXTURE=dgx-h100 \
    LD_LIBRARY_PATH="$tmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$(dirname "$python")/nvitop-exporter" --bind-address 127.0.0.1 --port "$port" --interval 0.25 \
    >"$tmp/nvitop.log" 2>&1 &
exporter=$!
trap 'kill $exporter 2>/dev/null; wait $exporter 2>/dev/null || true; rm -rf "$tmp"' EXIT
series=0
for _ in $(seq 100); do
    series=$("$python" - "$port" <<'PY'
import sys, urllib.request
try:
    body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=2).read().decode()
except OSError:
    body = ""
print(sum(1 for line in body.splitlines() if line.startswith("gpu_utilization_Percentage{")))
PY
)
    [[ "$series" -ge 8 ]] && break
    sleep 0.1
done
if [[ "$series" -lt 8 ]] || grep -qiE 'error|traceback|notfound' "$tmp/nvitop.log"; then
    echo "nvitop-exporter on the simulated dgx-h100: $series GPU utilisation series (want 8); its log:" >&2
    cat "$tmp/nvitop.log" >&2
    exit 1
fi
echo "nvitop-exporter: serves all 8 simulated GPUs, no error logged"

# nvitop itself, once, on the MIG node: every device and MIG row, no error.
env -u NVML_MOCK_STATE -u NVML_MOCK_CONTROL NVML_MOCK_FIXTURE=a100-mig \
    LD_LIBRARY_PATH="$tmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$(dirname "$python")/nvitop" --once >"$tmp/nvitop-once.log" 2>&1 || true
if ! grep -q '3g.40gb @ GI/CI: 1/0' "$tmp/nvitop-once.log" ||
    grep -qiE 'error|traceback|notfound' "$tmp/nvitop-once.log"; then
    echo "nvitop --once on the simulated a100-mig failed; its output:" >&2
    cat "$tmp/nvitop-once.log" >&2
    exit 1
fi
echo "nvitop --once: shows the simulated a100-mig and its MIG devices, no error"
