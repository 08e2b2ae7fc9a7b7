#!/usr/bin/env bash
# The exporter benchmark: installs nginx (the static-file baseline) when it is missing and
# apt-get can, then runs benches/exporter_scrape.rs. Everything stays on loopback.
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
exec "${CARGO:-cargo}" bench --bench exporter_scrape
