#!/usr/bin/env bash
# Fetches Debian's containerd 1.7 (trixie) and 2.x (sid) into target/containerd/<suite>/: the
# daemon, its runc shim (`containerd-shim-runc-v2`, looked up on PATH when a pod starts) and
# `ctr`, all from the same package. tests/runtime_configure.rs has `containerd config dump`
# parse the files `gpud runtime configure` writes (only 1.7 and later know the CDI keys;
# bookworm's 1.6 drops them), and tests/containerd_cri.rs runs both as daemons. Also fetched:
# a static busybox (trixie's busybox-static) into target/containerd/busybox, the one binary of
# the image that suite's containers run, so no registry is needed.
#
# The packages are only unpacked there, never installed: apt runs with its own lists and cache
# in a temporary folder, so the machine's package state is left alone. What is already there
# is kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The Debian archive this machine's apt already uses (deb822 .sources first, then the one-line
# sources.list): the newer suites come from the same archive, with only the suite swapped.
mirror=$( (sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | tr ' ' '\n'
  awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/) { print $i; break } }' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true) |
  grep -E '/debian/?$' | head -n 1 || true)
[[ -n $mirror ]] || { echo "fetch-containerd: no Debian archive in this machine's apt sources" >&2; exit 1; }

work=
cleanup() { [[ -z $work ]] || rm -rf "$work"; }
trap cleanup EXIT

# fetch <suite> <package>: downloads the package from <suite> and unpacks it into $work/unpacked.
fetch() {
  work=$(mktemp -d)
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
  echo "deb ${mirror%/} $1 main" >"$work/sources.list"
  local opts=(-qq -o "Dir::Etc::sourcelist=$work/sources.list" -o Dir::Etc::sourceparts=-
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update
  (cd "$work" && apt-get "${opts[@]}" download "$2")
  dpkg-deb -x "$work/$2"_*.deb "$work/unpacked"
}

for suite in trixie sid; do
  out=target/containerd/$suite
  [[ -x $out/containerd && -x $out/containerd-shim-runc-v2 && -x $out/ctr ]] && continue
  fetch "$suite" containerd
  mkdir -p "$out"
  for bin in containerd containerd-shim-runc-v2 ctr; do
    cp "$work/unpacked/usr/bin/$bin" "$out/$bin"
  done
  cleanup
  work=
  echo "$out/containerd: $("$out/containerd" --version)"
done

out=target/containerd/busybox
if [[ ! -x $out ]]; then
  fetch trixie busybox-static
  cp "$work/unpacked/usr/bin/busybox" "$out"
  cleanup
  work=
  echo "$out: $("$out" | head -n 1)"
fi
