#!/usr/bin/env bash
# `make demo`: the whole SSL recipe on the embedded default, through the Airflow DAGs.
#   1. amflow corpus        synthesise the espeak-ng corpus (labeled, unlabeled, dev, test; DP1..DP5)
#   2. DAG teacher          the transcripts aligned (align: frame labels; the corpus CTM only
#                           measures), BLSTM teacher on augmented renderings + supervised
#                           baseline student on the labeled split (the baseline then
#                           sMBR-trained: sequence_baseline), WER of each
#   3. DAG ssl_student      teacher top-k targets over the unlabeled split, scheduled learning,
#                           then sMBR on the labeled split (sequence), WER of each; and
#                           the teacher's pseudo-labels of the unlabeled split, the
#                           end-to-end CTC baseline (labeled only) and CTC SSL student
#                           (labeled + pseudo-labels), WER of each (params ctc,
#                           pseudolabels; DEMO_CTC=0 leaves them out: ~10 min less)
#      (both triggered on an `airflow standalone` this script starts and stops: scheduled
#      runs with task logs and true durations, browsable with `make airflow` afterwards)
#   4. amflow simulate      trainer scaling projection from the measured step times
#   5. amflow report        Table II per condition, curves, timings -> runs/demo-ssl/report/
# Env: CONFIG (default configs/local.yaml), DEMO_PREFIX (run ids, default demo),
#      DEMO_SETS (extra space-separated key=value overrides for every step),
#      DEMO_CTC (0: without the end-to-end CTC students; default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"
CONFIG=${CONFIG:-configs/local.yaml}
PREFIX=${DEMO_PREFIX:-demo}
read -r -a SETS <<< "${DEMO_SETS:-}"
TEACHER_RUN="$PREFIX-teacher"
SSL_RUN="$PREFIX-ssl"
START=$(date +%s)

# The DAGs run on an Airflow that this script starts (the one `make airflow` starts, same
# AIRFLOW_HOME and DB, on a free port): ordinary scheduled runs, so every task's log is in
# $AIRFLOW_HOME/logs and each task's duration is its step's (tasks defer while the step
# runs). DAG files are re-parsed rarely: the parser's CPU is the 2 cores' training time.
PORT=${AMFLOW_DEMO_PORT:-$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=${AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL:-300}
export AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=${AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL:-300}
source scripts/airflow_env.sh
export AMFLOW_RETRY_DELAY_S=${AMFLOW_RETRY_DELAY_S:-5}
trap stop_standalone EXIT

# storage.root as an absolute URI (the DAG tasks may run elsewhere than this directory).
root=$(python - "$CONFIG" "${SETS[@]}" <<'PY'
import os, sys
from core.config import load_config
root = load_config(sys.argv[1], sys.argv[2:]).storage.root
print(root if "://" in root else os.path.abspath(root))
PY
)
set_args=()
for s in "${SETS[@]}"; do set_args+=(--set "$s"); done
overrides_json=$(python -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "${SETS[@]}")

stage() { printf '\n=== [%4ds] %s\n' "$(( $(date +%s) - START ))" "$*"; }

# Airflow starts (DB migration, four components) while the corpus is synthesised.
launch_standalone "$AIRFLOW_HOME/demo-standalone.log"
stage "1/5 corpus"
amflow corpus --config "$CONFIG" "${set_args[@]}"

stage "airflow standalone on port $PORT ($AIRFLOW_HOME)"
wait_standalone
size_pool

# Both DAGs on the standalone. ssl_student is triggered as soon as the teacher's `train`
# has succeeded (the teacher model is all it needs), so the teacher's evaluation and
# decoding run beside the student's first steps. The teacher's new model would also start
# an ssl_student run by itself (its asset schedule): ssl_student stays paused until the
# demo triggers its own run.
run_dags() {
  local log="$AIRFLOW_HOME/demo-dags.log"
  echo "trigger teacher -c '$1', then ssl_student -c '$2'   (log: $log)"
  if ! python scripts/demo_dags.py --base "http://localhost:$PORT" --passwords "$PASSWORDS" \
       --pause ssl_student --unpause teacher --unpause corpus \
       --then ssl_student "$SSL_RUN" "$2" --after train \
       teacher "$TEACHER_RUN" "$1" 2>&1 | tee "$log"; then
    echo "a DAG run failed; see $log and the runs in \`make airflow\`" >&2
    exit 1
  fi
}

# hours=1e6: every labeled (and unlabeled) utterance of the corpus; rerun=resume: a second
# `make demo` reuses finished work.
TEACHER_URI="$root/runs/$TEACHER_RUN/train-teacher/model.pt"
TEACHER_CONF="{\"config\": \"$CONFIG\", \"run_id\": \"$TEACHER_RUN\", \"hours\": 1000000, \"rerun\": \"resume\", \"overrides\": $overrides_json}"
E2E=true
[ "${DEMO_CTC:-1}" = 0 ] && E2E=false
SSL_CONF="{\"config\": \"$CONFIG\", \"run_id\": \"$SSL_RUN\", \"hours\": 1000000, \"rerun\": \"resume\", \"teacher\": \"$TEACHER_URI\", \"ctc\": $E2E, \"pseudolabels\": $E2E, \"overrides\": $overrides_json}"
stage "2/5 DAG teacher (run $TEACHER_RUN), 3/5 DAG ssl_student (run $SSL_RUN) once the teacher is trained"
run_dags "$TEACHER_CONF" "$SSL_CONF"

stop_standalone
stage "4/5 simulate (GTC sparsity measured by bench gtc on the paper-size student)"
if amflow bench gtc --config "$CONFIG" --run-id "$SSL_RUN" --set bench.gtc_steps=12 \
     --set bench.overhead_steps=12 "${set_args[@]}" > "$AIRFLOW_HOME/demo-bench-gtc.log" 2>&1 \
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
sed -n '1,/^## Frame accuracy/p' "$root/runs/$SSL_RUN/report/report.md" 2>/dev/null || true
stage "done in $(( $(date +%s) - START )) s"
echo "report: $root/runs/$SSL_RUN/report/report.md"
echo "browse the runs in Airflow: make airflow"
