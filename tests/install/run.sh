#!/usr/bin/env bash
# `make install` and `make uninstall` into a temporary DESTDIR with PREFIX=/usr: the binary,
# a link for every applet, the unit starting $(PREFIX)/bin/gpud, the environment file; an
# edited environment file survives uninstall, everything else is gone.
# Usage: run.sh GPUD_BINARY (from the repository root)
set -euo pipefail
gpud=$1
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
fail() {
  echo "FAILED: $*" >&2
  exit 1
}
make --no-print-directory -s install DESTDIR="$dest" PREFIX=/usr GPUD="$gpud"

[[ -x $dest/usr/bin/gpud ]] || fail "no $dest/usr/bin/gpud"
cmp -s "$gpud" "$dest/usr/bin/gpud" || fail "installed binary differs"
for applet in $("$gpud" --list); do
  [[ $(readlink "$dest/usr/bin/gpud-$applet") == gpud ]] || fail "no link gpud-$applet -> gpud"
done
[[ $("$dest/usr/bin/gpud-inventory" --version) == "gpud inventory $("$gpud" --version | cut -d" " -f2)" ]] || fail "link does not run gpud"
unit=$dest/etc/systemd/system/gpud.service
grep -qx 'ExecStart=/usr/bin/gpud run $GPUD_ARGS' "$unit" || fail "unit: $(grep ExecStart "$unit")"
grep -q /usr/local/bin "$unit" && fail "unit still names /usr/local/bin"
diff <(sed 's|/usr/local/bin/gpud|/usr/bin/gpud|g' systemd/gpud.service) "$unit" >/dev/null ||
  fail "unit differs from systemd/gpud.service beyond the binary's path"
cmp -s systemd/gpud.env "$dest/etc/default/gpud" || fail "environment file differs"
[[ $(stat -c %a "$unit") == 644 && $(stat -c %a "$dest/etc/default/gpud") == 644 ]] ||
  fail "modes: unit $(stat -c %a "$unit"), env $(stat -c %a "$dest/etc/default/gpud")"

# A second install keeps the administrator's settings.
echo 'NODE_NAME=gpu-node-1' >>"$dest/etc/default/gpud"
make --no-print-directory -s install DESTDIR="$dest" PREFIX=/usr GPUD="$gpud"
grep -qx 'NODE_NAME=gpu-node-1' "$dest/etc/default/gpud" || fail "reinstall overwrote /etc/default/gpud"

make --no-print-directory -s uninstall DESTDIR="$dest" PREFIX=/usr GPUD="$gpud" >/dev/null
left=$(cd "$dest" && find . -type f -o -type l | sort)
[[ $left == ./etc/default/gpud ]] || fail "left after uninstall: $left"
rm "$dest/etc/default/gpud"
make --no-print-directory -s install DESTDIR="$dest" PREFIX=/usr GPUD="$gpud"
make --no-print-directory -s uninstall DESTDIR="$dest" PREFIX=/usr GPUD="$gpud"
left=$(cd "$dest" && find . -type f -o -type l | sort)
[[ -z $left ]] || fail "left after uninstall of an unedited install: $left"
echo "install test: 1 passed, 0 failed"
