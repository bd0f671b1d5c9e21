#!/usr/bin/env bash
# The CPU image's base root filesystem, from Debian packages only (no container registry):
#   infra/image/rootfs.sh OUT.tar
# mmdebstrap --variant=minbase (Debian's essential set + apt) plus the pinned packages of
# infra/image/debian-packages.txt, written as a tar that `ADD rootfs.tar /` unpacks.
# Docs, man pages and locales are left out (dpkg path-exclude): ~40 MB nobody reads.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: rootfs.sh OUT.tar}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
pkgs=$(grep -v '^#' "$here/debian-packages.txt" | grep . | paste -sd, -)
# a fixed mtime for every file: the same packages give the same tar
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1735689600}
mmdebstrap --variant=minbase --format=tar --include="$pkgs" \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  "$suite" "$out.part" \
  "deb $mirror $suite main" "deb $mirror $suite-updates main" \
  "deb $security $suite-security main"
mv "$out.part" "$out"
