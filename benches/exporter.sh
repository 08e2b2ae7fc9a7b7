#!/usr/bin/env bash
# The exporter benchmark: installs what it compares with when it is missing and can be
# installed (nginx, the static-file baseline, with apt-get; nvitop-exporter, the peer, with pip
# into a virtual environment under the target directory), then runs benches/exporter_scrape.rs.
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
  venv="${CARGO_TARGET_DIR:-target}/nvitop-venv"
  if [[ ! -x "$venv/bin/nvitop-exporter" ]]; then
    echo "exporter bench: installing nvitop-exporter (the peer) into $venv"
    if ! { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet nvitop-exporter; } >/dev/null 2>&1; then
      echo "exporter bench: nvitop-exporter cannot be installed here (python3 -m venv, pip); the peer is skipped"
    fi
  fi
  if [[ -x "$venv/bin/nvitop-exporter" ]]; then
    export NVITOP_EXPORTER="$PWD/$venv/bin/nvitop-exporter"
    [[ "$venv" = /* ]] && export NVITOP_EXPORTER="$venv/bin/nvitop-exporter"
  fi
fi
exec "${CARGO:-cargo}" bench --bench exporter_scrape -- "$@"
