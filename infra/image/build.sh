#!/usr/bin/env bash
# `make image`: the amflow CPU image from Debian packages and PyPI, with no registry.
#   infra/image/build.sh            build localhost/amflow:<pyproject version>
# Steps, each cached under $IMAGE_BUILD_DIR (default build/image, gitignored):
#   1. rootfs.tar  mmdebstrap of infra/image/debian-packages.txt (redone when that file changes)
#   2. wheels/     the wheels of infra/image/requirements.lock, fetched on the host
#   3. podman build of infra/image/Containerfile (podman's layer cache: a changed source
#      tree redoes only the last layer)
# Needs podman, buildah, runc, catatonit (podman run --init), mmdebstrap (Debian packages).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${IMAGE_BUILD_DIR:-$root/build/image}
py=${PYTHON:-$root/.venv/bin/python}
[[ -x "$py" ]] || py=python3  # no venv: the host's Python 3.11+ and its pip
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}

for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "make image: $tool not found (apt-get install -y podman buildah runc catatonit mmdebstrap)" >&2; exit 1; }
done
version=$("$py" -c 'import tomllib; print(tomllib.load(open("'"$root"'/pyproject.toml", "rb"))["project"]["version"])')
tag=${IMAGE_TAG:-localhost/amflow:$version}
mkdir -p "$build"
t0=$SECONDS

# 1. the base: redone only when the package list changed
pkgsum=$(sha256sum "$here/debian-packages.txt" "$here/rootfs.sh" | sha256sum | cut -c1-16)
if [[ ! -s "$build/rootfs.tar" || "$(cat "$build/rootfs.sha" 2>/dev/null)" != "$pkgsum" ]]; then
  "$here/rootfs.sh" "$build/rootfs.tar"
  echo "$pkgsum" > "$build/rootfs.sha"
fi
echo "make image: rootfs.tar $(du -h "$build/rootfs.tar" | cut -f1) ($((SECONDS - t0)) s)"

# 2. the wheels of the lock (a stamp skips this when they are there)
"$py" "$here/wheels.py" fetch "$build/wheels"
echo "make image: wheels $(du -sh "$build/wheels" | cut -f1) ($((SECONDS - t0)) s)"

# 3. the context: hard links, so nothing big is copied; src/ is the project's files as git
#    sees them (tracked and new, not ignored), the same directories infra/docker copies
ctx=$build/context
rm -rf "$ctx"
mkdir -p "$ctx/src"
ln "$build/rootfs.tar" "$ctx/rootfs.tar"
cp -al "$build/wheels" "$ctx/wheels"
(cd "$root" && git ls-files -co --exclude-standard -- pyproject.toml README.md core amflow tasks \
   training decoding bench serving alignment configs dags infra \
 | while read -r f; do [[ -f "$f" ]] && printf '%s\0' "$f"; done \
 | xargs -0 cp --parents -t "$ctx/src")
# IMAGE_BUILD_ARGS: more podman build flags (--no-cache: time a build from nothing)
# the checkout it was built from: container mode notes when a step runs older code
rev=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)
podman build --layers ${IMAGE_BUILD_ARGS:-} --label "amflow.revision=$rev" \
  --label "org.opencontainers.image.version=$version" -f "$here/Containerfile" -t "$tag" "$ctx"
rm -rf "$ctx"
size=$(podman image inspect "$tag" --format '{{.Size}}')
echo "make image: $tag, $((size / 1000000)) MB, built in $((SECONDS - t0)) s"
podman image prune -f >/dev/null  # the previous build's layers that no tag uses any more
