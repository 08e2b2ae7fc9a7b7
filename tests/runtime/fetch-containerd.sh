#!/usr/bin/env bash
# Fetches Debian's containerd 1.7 (trixie) and 2.x (sid) into target/containerd/<suite>/, for
# tests/runtime_configure.rs: `containerd config dump` is the real parser of the files
# `gpud runtime configure` writes, and only 1.7 and later know the CDI keys (bookworm's 1.6
# drops them). The packages are only unpacked there, never installed: apt runs with its own
# lists and cache in a temporary folder, so the machine's package state is left alone. A
# binary already there is kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The Debian archive this machine's apt already uses (deb822 .sources first, then the one-line
# sources.list): the newer suites come from the same mirror, under its own name.
mirror=$( (sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | tr ' ' '\n'
  awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/) { print $i; break } }' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true) |
  grep -E '/debian/?$' | head -n 1 || true)
[[ -n $mirror ]] || { echo "fetch-containerd: no Debian archive in this machine's apt sources" >&2; exit 1; }
for suite in trixie sid; do
  out=target/containerd/$suite
  [[ -x $out/containerd ]] && continue
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
  echo "deb ${mirror%/} $suite main" >"$work/sources.list"
  opts=(-qq -o "Dir::Etc::sourcelist=$work/sources.list" -o Dir::Etc::sourceparts=-
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update
  (cd "$work" && apt-get "${opts[@]}" download containerd)
  dpkg-deb -x "$work"/containerd_*.deb "$work/unpacked"
  mkdir -p "$out"
  cp "$work/unpacked/usr/bin/containerd" "$out/containerd"
  rm -rf "$work"
  trap - EXIT
  echo "$out/containerd: $("$out/containerd" --version)"
done
