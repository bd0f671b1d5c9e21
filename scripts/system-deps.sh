#!/usr/bin/env bash
# System packages amflow needs: espeak-ng (the embedded corpus's synthesiser), and for the
# test suite Debian's chromium (the Airflow UI test drives it headless via playwright);
# with `image`, podman and friends for the image (make image, make test-image).
set -euo pipefail
need=()
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
ldconfig -p 2>/dev/null | grep -q libespeak-ng.so.1 || need+=(libespeak-ng1)
test_need=()
[ -x /usr/bin/chromium ] || test_need+=(chromium)
# `scripts/system-deps.sh image`: what `make image` / `make test-image` need as well
if [ "${1:-}" = image ]; then
  for tool in podman buildah runc catatonit mmdebstrap; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/libexec/podman/$tool" ] || test_need+=("$tool")
  done
fi
[ ${#need[@]} -eq 0 ] && [ ${#test_need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then
  echo "installing ${need[*]} ${test_need[*]} with apt-get" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" "${test_need[@]}" >/dev/null
else
  if [ ${#test_need[@]} -gt 0 ]; then
    echo "the browser test needs ${test_need[*]}: run 'sudo apt-get install ${test_need[*]}'" >&2
  fi
  if [ ${#need[@]} -gt 0 ]; then
    echo "amflow needs ${need[*]}: run 'sudo apt-get install ${need[*]}' and retry" >&2
    exit 1
  fi
fi
