#!/usr/bin/env bash
# System packages amflow needs: espeak-ng (the embedded corpus's synthesiser), and for the
# test suite Debian's chromium (the Airflow UI test drives it headless via playwright);
# with `image`, podman and friends for the image (make image, make test-image).
# Says what it installs and why; as root it apt-installs, otherwise it prints the command.
# Ubuntu's `chromium` package is only a shim that installs the snap (which fails where snapd
# does not run, e.g. in a container): there, it is not installed; the message says how to
# give the tests a chromium instead (docs/how-to/installation.md).
set -euo pipefail
need=()
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
ldconfig -p 2>/dev/null | grep -q libespeak-ng.so.1 || need+=(libespeak-ng1)
test_need=()
ubuntu_chromium=
if [ ! -x /usr/bin/chromium ]; then
  if grep -qs '^ID=ubuntu' /etc/os-release; then ubuntu_chromium=1; else test_need+=(chromium); fi
fi
# `scripts/system-deps.sh image`: what `make image` / `make test-image` need as well
if [ "${1:-}" = image ]; then
  for tool in podman buildah runc catatonit mmdebstrap; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/libexec/podman/$tool" ] || test_need+=("$tool")
  done
fi
if [ -n "$ubuntu_chromium" ]; then
  echo "setup: the browser tests need /usr/bin/chromium; Ubuntu's chromium package is a snap" \
       "shim, so it is not installed here. Use playwright's build instead:" \
       "'.venv/bin/playwright install --with-deps chromium', then link its chrome binary to" \
       "/usr/bin/chromium (docs/how-to/installation.md). Only the browser tests need it." >&2
fi
[ ${#need[@]} -eq 0 ] && [ ${#test_need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then
  [ ${#need[@]} -gt 0 ] && echo "setup: apt-get installing ${need[*]}: the embedded corpus's speech synthesiser (amflow corpus)" >&2
  [ ${#test_need[@]} -gt 0 ] && echo "setup: apt-get installing ${test_need[*]}: for the test suite (chromium: the browser tests; podman and friends: the image)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" "${test_need[@]}" >/dev/null
  echo "setup: installed ${need[*]} ${test_need[*]}" >&2
else
  if [ ${#test_need[@]} -gt 0 ]; then
    echo "the test suite needs ${test_need[*]}: run 'sudo apt-get install ${test_need[*]}'" >&2
  fi
  if [ ${#need[@]} -gt 0 ]; then
    echo "amflow needs ${need[*]}: run 'sudo apt-get install ${need[*]}' and retry" >&2
    exit 1
  fi
fi
