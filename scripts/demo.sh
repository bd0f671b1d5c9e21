#!/usr/bin/env bash
# `make demo`: the whole SSL recipe on the embedded default, through the Airflow DAGs.
#   1. amflow corpus        synthesise the espeak-ng corpus (labeled, unlabeled, dev, test; DP1..DP5)
#   2. DAG teacher          BLSTM teacher + supervised baseline student on the labeled split
#   3. DAG ssl_student      teacher top-k targets over the unlabeled split, scheduled learning
#   4. amflow simulate      trainer scaling projection from the measured step times
#   5. amflow report        Table II per condition, curves, timings -> runs/demo-ssl/report/
# Env: CONFIG (default configs/local.yaml), DEMO_PREFIX (run ids, default demo),
#      DEMO_SETS (extra space-separated key=value overrides for every step).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"
CONFIG=${CONFIG:-configs/local.yaml}
PREFIX=${DEMO_PREFIX:-demo}
read -r -a SETS <<< "${DEMO_SETS:-}"
# `airflow dags test` runs one task try at a time; short tries (a step keeps running
# between its tries) let the teacher and the baseline, two 1-thread trainings, share the
# 2 cores side by side.
SETS=(runner.max_wait_per_try_s=10 runner.reschedule_s=2 "${SETS[@]}")
TEACHER_RUN="$PREFIX-teacher"
SSL_RUN="$PREFIX-ssl"
START=$(date +%s)

export AIRFLOW_HOME="${AIRFLOW_HOME:-$ROOT/airflow_home}"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__UNIT_TEST_MODE=False
export AMFLOW_RETRY_DELAY_S=${AMFLOW_RETRY_DELAY_S:-5}
mkdir -p "$AIRFLOW_HOME"

# storage.root as an absolute URI (the DAG tasks may run elsewhere than this directory).
root=$(python - "$CONFIG" "${SETS[@]}" <<'PY'
import os, sys
from amflow.config import load_config
root = load_config(sys.argv[1], sys.argv[2:]).storage.root
print(root if "://" in root else os.path.abspath(root))
PY
)
set_args=()
for s in "${SETS[@]}"; do set_args+=(--set "$s"); done
overrides_json=$(python -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "${SETS[@]}")

stage() { printf '\n=== [%4ds] %s\n' "$(( $(date +%s) - START ))" "$*"; }

stage "1/5 corpus"
amflow corpus --config "$CONFIG" "${set_args[@]}"

stage "airflow db migrate ($AIRFLOW_HOME)"
airflow db migrate > "$AIRFLOW_HOME/migrate.log" 2>&1 || { tail -n 30 "$AIRFLOW_HOME/migrate.log"; exit 1; }

dags_test() {
  local dag=$1 conf=$2 log="$AIRFLOW_HOME/demo-$1.log"
  echo "airflow dags test $dag -c '$conf'   (log: $log)"
  if ! airflow dags test "$dag" -c "$conf" > "$log" 2>&1 || ! grep -q "state=success" "$log"; then
    echo "DAG $dag failed; last lines of $log:" >&2
    tail -n 60 "$log" >&2
    exit 1
  fi
  grep -E "\[amflow\] .*metrics|AMFLOW_SUMMARY|final metrics" "$log" | cut -c1-240 | tail -n 12 || true
}

# hours=1e6: every labeled (and unlabeled) utterance of the corpus; rerun=resume: a second
# `make demo` reuses finished work.
stage "2/5 DAG teacher (run $TEACHER_RUN)"
dags_test teacher "{\"config\": \"$CONFIG\", \"run_id\": \"$TEACHER_RUN\", \"hours\": 1000000, \"rerun\": \"resume\", \"overrides\": $overrides_json}"

TEACHER_URI="$root/runs/$TEACHER_RUN/train-teacher/model.pt"
stage "3/5 DAG ssl_student (run $SSL_RUN, teacher $TEACHER_URI)"
dags_test ssl_student "{\"config\": \"$CONFIG\", \"run_id\": \"$SSL_RUN\", \"hours\": 1000000, \"rerun\": \"resume\", \"teacher\": \"$TEACHER_URI\", \"overrides\": $overrides_json}"

stage "4/5 simulate (GTC sparsity measured by bench gtc on the paper-size student)"
if AMFLOW_BENCH_GTC_STEPS=${AMFLOW_BENCH_GTC_STEPS:-12} AMFLOW_BENCH_OVERHEAD_STEPS=${AMFLOW_BENCH_OVERHEAD_STEPS:-12} \
     amflow bench gtc --config "$CONFIG" --run-id "$SSL_RUN" "${set_args[@]}" > "$AIRFLOW_HOME/demo-bench-gtc.log" 2>&1 \
   && amflow simulate --config "$CONFIG" --run-id "$SSL_RUN" "${set_args[@]}" > "$AIRFLOW_HOME/demo-simulate.log" 2>&1; then
  # the projection beside Table 1 and the verdict on rows no input can reach (all in the report)
  sed -n '/^| Method | GPUs | simulated/,/^Ordering/p' "$AIRFLOW_HOME/demo-simulate.log"
  grep '^Unreachable' "$AIRFLOW_HOME/demo-simulate.log" || true
else
  echo "simulate skipped (see $AIRFLOW_HOME/demo-bench-gtc.log, demo-simulate.log); the report goes on without it" >&2
fi

stage "5/5 report"
amflow report --config "$CONFIG" --run-id "$SSL_RUN" --set "report.teacher_run=$TEACHER_RUN" \
  "${set_args[@]}" > "$AIRFLOW_HOME/demo-report.log"
sed -n '1,34p' "$root/runs/$SSL_RUN/report/report.md" 2>/dev/null || true
stage "done in $(( $(date +%s) - START )) s"
echo "report: $root/runs/$SSL_RUN/report/report.md"
echo "browse the runs in Airflow: make airflow"
