#!/usr/bin/env bash
# Makes (once) the virtual environment the Python checks run in: target/py-venv, with NVIDIA's
# bindings (nvidia-ml-py, for the pynvml check of the mock), grpcio (a Python device-plugin
# client, tests/grpc.rs) and nvitop-exporter (a third-party exporter run on the simulated
# node). Nothing is installed into the user's own Python.
#
# Usage: tests/python/venv.sh    prints the venv's python on stdout; exits 3 without python3
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv="$root/target/py-venv"
# Bump when the requirements change, so existing environments are brought up to date.
requirements=('nvidia-ml-py>=13,<14' 'grpcio>=1.60' 'nvitop-exporter>=1.4,<2')
stamp="$venv/.gpud-requirements"

if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 is not installed: the Python checks are skipped" >&2
    exit 3
fi
if [[ ! -x "$venv/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "${requirements[*]}" ]]; then
    echo "Python checks: installing ${requirements[*]} into ${venv#"$root"/} (not your Python)" >&2
    mkdir -p "$root/target"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${requirements[@]}" >&2
    echo "${requirements[*]}" >"$stamp"
fi
echo "$venv/bin/python"
