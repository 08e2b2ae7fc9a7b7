#!/usr/bin/env bash
# Runs check.py: NVIDIA's Python bindings (nvidia-ml-py, i.e. pynvml) against the mock
# libnvidia-ml.so.1, loaded exactly the way pynvml loads the real one (by SONAME through
# LD_LIBRARY_PATH).
#
# Usage: tests/pynvml/run.sh [path/to/libnvidia_ml_mock.so]
# Without an argument it builds the debug library with cargo and uses that.
set -euo pipefail

if ! command -v python3 >/dev/null 2>&1; then
    echo "pynvml check skipped: python3 is not installed"
    exit 0
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
lib=${1:-}
if [[ -z "$lib" ]]; then
    cargo build --quiet -p nvml-mock --manifest-path "$root/Cargo.toml"
    lib="${CARGO_TARGET_DIR:-$root/target}/debug/libnvidia_ml_mock.so"
fi
[[ -f "$lib" ]] || { echo "run.sh: no library at $lib" >&2; exit 1; }

# nvidia-ml-py 13.x provides the `pynvml` module; install it for this user if missing.
if ! python3 -c 'import importlib.metadata as m, sys; sys.exit(not m.version("nvidia-ml-py").startswith("13."))' 2>/dev/null; then
    python3 -m pip install --user --quiet 'nvidia-ml-py==13.*'
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ln -s "$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")" "$tmp/libnvidia-ml.so.1"

env -u NVML_MOCK_FIXTURE -u NVML_MOCK_STATE -u NVML_MOCK_CONTROL -u NVML_MOCK_CLOCK \
    -u NVML_MOCK_MIG_RESET_REQUIRED \
    LD_LIBRARY_PATH="$tmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    PYNVML_CHECK_TMP="$tmp" \
    PYNVML_CHECK_FIXTURES="$root/tests/fixtures/nodes" \
    python3 "$root/tests/pynvml/check.py"
