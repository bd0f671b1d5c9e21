#!/usr/bin/env bash
# The main job on the embedded default: synthesise the corpus and summarise it.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-configs/local.yaml}
.venv/bin/amflow corpus --config "$CONFIG"
