#!/usr/bin/env bash
# The exporter benchmark: installs what it compares with when it is missing and can be
# installed (nginx, the static-file baseline, with apt-get; nvitop-exporter, the peer, with pip
# into target/py-venv, tests/python/venv.sh), then runs benches/exporter_scrape.rs.
# Everything stays on loopback. Arguments go to the benchmark (e.g. h100-mig, --fresh-only).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]]; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "exporter bench: installing nginx (baseline static file server)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
  else
    echo "exporter bench: nginx is missing and cannot be installed here; the baseline is skipped"
  fi
fi
if [[ -z "${NVITOP_EXPORTER:-}" ]] && ! command -v nvitop-exporter >/dev/null; then
  # The same virtual environment as make test's Python checks (target/py-venv).
  if python=$(tests/python/venv.sh); then
    export NVITOP_EXPORTER="$(dirname "$python")/nvitop-exporter"
  else
    echo "exporter bench: nvitop-exporter cannot be installed here (python3 -m venv, pip); the peer is skipped"
  fi
fi
exec "${CARGO:-cargo}" bench --bench exporter_scrape -- "$@"
