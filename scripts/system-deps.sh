#!/usr/bin/env bash
# System packages amflow needs: espeak-ng (the embedded corpus's synthesiser).
set -euo pipefail
need=()
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
ldconfig -p 2>/dev/null | grep -q libespeak-ng.so.1 || need+=(libespeak-ng1)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then
  echo "installing ${need[*]} with apt-get" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
else
  echo "amflow needs ${need[*]}: run 'sudo apt-get install ${need[*]}' and retry" >&2
  exit 1
fi
