#!/usr/bin/env bash
# `make demo`'s two ways of running the DAGs, timed one after the other on this machine:
#   scheduler  (the default) an `airflow standalone` that the demo starts; tasks defer while
#              their step runs: task logs in the UI, true durations
#   dags-test  the earlier way: `airflow dags test` in the demo's process, short
#              rescheduled tries; nothing readable in the UI afterwards
# Each on a fresh storage root and corpus, same config, same DEMO_SETS. Prints the wall time of
# the whole demo and of its DAG phase (from the teacher's trigger to simulate) per flow, and
# the ratio scheduler / dags-test.
#   bash bench/demo_flows.sh [WORKDIR]      (default /tmp/amflow-demo-flows)
#   DEMO_SETS="train.epochs=2 ..." bash bench/demo_flows.sh    a shorter recipe: the fixed
#       costs of a flow weigh more in a short run, so its ratio bounds the full demo's
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-/tmp/amflow-demo-flows}
mkdir -p "$WORK"
declare -A WALL DAGS
for flow in dags-test scheduler; do
  root="$WORK/$flow"
  rm -rf "$root"
  log="$WORK/$flow.log"
  t0=$(date +%s)
  DEMO_FLOW=$flow DEMO_PREFIX="flows-$flow" \
    DEMO_SETS="storage.root=$root data.corpus=$root/corpus ${DEMO_SETS:-}" \
    bash scripts/demo.sh > "$log" 2>&1 || { echo "$flow demo failed: $log" >&2; tail -n 30 "$log" >&2; exit 1; }
  WALL[$flow]=$(( $(date +%s) - t0 ))
  # stage lines: "=== [ 84s] 2/5 DAG teacher ..." ... "=== [2184s] 4/5 simulate ..."
  dag_start=$(sed -n 's/^=== \[ *\([0-9]*\)s\] 2\/5.*/\1/p' "$log" | head -1)
  dag_end=$(sed -n 's/^=== \[ *\([0-9]*\)s\] 4\/5.*/\1/p' "$log" | head -1)
  DAGS[$flow]=$(( dag_end - dag_start ))
  echo "$flow: demo ${WALL[$flow]} s, DAGs ${DAGS[$flow]} s  (log $log)"
done
printf '\n| flow | demo s | DAG phase s |\n|---|---:|---:|\n'
for flow in dags-test scheduler; do printf '| %s | %d | %d |\n' "$flow" "${WALL[$flow]}" "${DAGS[$flow]}"; done
python3 -c "import sys; \
a, b, c, e = map(float, sys.argv[1:5]); print(f'| scheduler / dags-test | {c/a:.3f} | {e/b:.3f} |')" \
  "${WALL[dags-test]}" "${DAGS[dags-test]}" "${WALL[scheduler]}" "${DAGS[scheduler]}"
