#!/usr/bin/env bash
# Assembles the root filesystem of gpud's image (built `FROM scratch`) in OUT:
#   /usr/bin/gpud and a gpud-<applet> link for every applet `gpud --list` prints;
#   the dynamic loader and exactly the shared libraries `ldd` resolves for gpud and for NVML
#   (NVML_LIB: a libnvidia-ml.so.1 whose needed libraries are the driver's: libc, libm, libdl,
#   libpthread, librt; the simulated one declares the same), each under the path ldd names,
#   in a merged-/usr layout (/lib and /lib64 link to usr/) as Debian and Ubuntu have it.
# Nothing is downloaded. Usage: rootfs.sh GPUD_BINARY NVML_LIB OUT
set -euo pipefail
bin=$1 nvml=$2 out=$3

rm -rf "$out"
mkdir -p "$out/usr/bin" "$out/usr/lib" "$out/usr/lib64" "$out/etc"
ln -s usr/lib "$out/lib"
ln -s usr/lib64 "$out/lib64"

install -m 0755 "$bin" "$out/usr/bin/gpud"
for applet in $("$bin" --list); do
  ln -s gpud "$out/usr/bin/gpud-$applet"
done

# `ldd` lines: "libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x...)" and the loader's
# "/lib64/ld-linux-x86-64.so.2 (0x...)". The vDSO has no file. A library ldd cannot find
# ("not found") stops the build.
if ldd "$bin" "$nvml" | grep -q 'not found'; then
  ldd "$bin" "$nvml" >&2
  echo "rootfs.sh: a needed library is missing on this machine" >&2
  exit 1
fi
ldd "$bin" "$nvml" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $2 ~ /^\(0x/ { print $1 }' |
  sort -u | while read -r lib; do
    # In the image every library lives under /usr; /lib and /lib64 are links to it.
    dest="$out/usr${lib#/usr}"
    mkdir -p "$(dirname "$dest")"
    install -m 0755 "$(readlink -f "$lib")" "$dest"
  done

# Names for the numeric user the DaemonSet runs as, for tools that look them up.
echo 'root:x:0:0:root:/:/usr/bin/gpud' >"$out/etc/passwd"
echo 'root:x:0:' >"$out/etc/group"
