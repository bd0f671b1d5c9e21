#!/usr/bin/env bash
# `make quickstart`: the whole teacher/student recipe on a toy corpus through the CLI alone
# (no Airflow), top to bottom, each stage one `amflow <step>`: the same calls, in the same
# order, that the DAGs make (dags/teacher.py, dags/ssl_student.py). ~3 minutes on 2 cores.
#
#   stage 0  corpus       synthesise a 36-minute espeak-ng corpus (labeled, unlabeled, dev, test)
#   teacher run (<run_id>-teacher), the labeled data:
#   stage 1  select       every labeled and dev utterance, in shards by speaker
#   stage 2  align        transcripts -> frame labels (GMM-HMM flat start, tree, triphones)
#   stage 3  features     log-mel fbank, CMVN, low frame rate, the frame labels joined
#   stage 4  repartition  equal training partitions
#   stage 5  train        the teacher (BLSTM, train.teacher_preset) and, beside it, the
#                         baseline (the student's LSTM) on the labeled data alone
#   stage 6  lm           a word 3-gram LM for decoding
#   stage 7  decode       teacher and baseline (side by side) to words on the test split: WER
#   SSL run (<run_id>-ssl), the unlabeled data:
#   stage 8  select, align (takes the teacher run's alignments), features
#   stage 9  lm; targets  the teacher's top-k soft targets over the unlabeled audio, and beside
#                         it pseudolabel: the teacher's confident words for the same audio
#   stage 10 repartition, train: the SSL student (scheduled learning on the soft targets) and
#                         beside it the CTC student (labeled + kept pseudo-labels)
#   stage 11 decode       the SSL and CTC students' WER on the same test split (side by side)
#   stage 12 compare      the WER table: each model's WER with its 95 % confidence interval
#
# Env: CONFIG (default configs/tiny.yaml), RUN_ID (default quickstart-<UTC time>; the same
# id again resumes: finished steps are kept), QUICKSTART_SETS (extra space-separated
# key=value overrides for every step, e.g. "storage.root=/tmp/qs data.corpus=/tmp/qs/corpus"),
# STAGE / STOP_STAGE (run only stages STAGE..STOP_STAGE, as a Kaldi run.sh's --stage),
# DRY_RUN=1 (print the commands, run none), QUICKSTART_LOGS (the folder for the steps' logs;
# default a new temporary one).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
CONFIG=${CONFIG:-configs/tiny.yaml}
RUN_ID=${RUN_ID:-quickstart-$(date -u +%Y%m%d-%H%M%S)}
read -r -a SETS <<< "${QUICKSTART_SETS:-}"
TEACHER_RUN="$RUN_ID-teacher"
SSL_RUN="$RUN_ID-ssl"
STAGE=${STAGE:-0}
STOP_STAGE=${STOP_STAGE:-12}
START=$(date +%s)

set_args=()
for s in "${SETS[@]}"; do set_args+=(--set "$s"); done
# `if stage N "what"; then ...; fi`: true (and says so) when N is within STAGE..STOP_STAGE.
stage() {
  [ "$1" -ge "$STAGE" ] && [ "$1" -le "$STOP_STAGE" ] || return 1
  printf '\n=== [%4ds] stage %s\n' "$(( $(date +%s) - START ))" "$*"
}
# `step LOG STEP ARGS...`: `amflow STEP --config $CONFIG ARGS...`, printed, its output in
# $LOGS/LOG.log; then what it prints for people (LM perplexity, WER per condition) and how
# long it took (a step that had finished in this run before is kept: seconds). A failure
# shows the log's end and stops the script.
LOGS=""
if [ -z "${DRY_RUN:-}" ]; then
  LOGS=${QUICKSTART_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/amflow-quickstart.XXXXXX")}
  mkdir -p "$LOGS"
fi
step() {
  local log="$LOGS/$1.log" name=$2; shift 2
  local cmd=(amflow "$name" --config "$CONFIG" "$@" "${set_args[@]}")
  echo "\$ ${cmd[*]}"
  [ -z "${DRY_RUN:-}" ] || return 0
  local t0=$SECONDS
  if ! "${cmd[@]}" > "$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "quickstart: amflow $name failed (its log: $log)" >&2
    exit 1
  fi
  grep -E '^(lm:|condition |DP[1-5] |all |kept |acwt )' "$log" || true
  echo "  (amflow $name took $((SECONDS - t0)) s)"
}

# `side_by_side STEP-ARGS -- STEP-ARGS`: two `step`s at once, as the DAGs run them on a
# 2-core machine (each is one core's work); their output shows in order once both finish.
side_by_side() {
  local i=1
  while [ "${!i}" != "--" ]; do i=$((i + 1)); done
  if [ -n "${DRY_RUN:-}" ]; then
    step "${@:1:i-1}"; step "${@:i+1}"; return 0
  fi
  step "${@:1:i-1}" > "$LOGS/first.out" & local first=$!
  step "${@:i+1}" > "$LOGS/second.out" & local second=$!
  local ok=0
  wait "$first" || ok=1
  wait "$second" || ok=1
  cat "$LOGS/first.out" "$LOGS/second.out"
  return "$ok"
}

# The teacher DAG's overrides (dags/teacher.py TEACHER_SETS, BASELINE_SETS).
# (Their evaluate.tag is left out: the quickstart runs no `amflow evaluate`.)
teacher=(--run-id "$TEACHER_RUN" --set select.splits=labeled,dev --set train.model=teacher
         --set train.regime=labeled --set train.tag=teacher --set decode.tag=teacher)
baseline=(--run-id "$TEACHER_RUN" --set select.splits=labeled,dev --set train.model=student
          --set train.regime=labeled --set train.tag=baseline --set decode.tag=baseline)

echo "quickstart: run id $RUN_ID, config $CONFIG (RUN_ID=$RUN_ID make quickstart goes on with this run)"

if stage 0 "corpus"; then
  step corpus corpus
fi

if stage 1 "select (run $TEACHER_RUN)"; then
  step select-teacher select "${teacher[@]}"
fi
if stage 2 "align"; then
  step align-teacher align "${teacher[@]}"
fi
if stage 3 "features"; then
  step features-teacher features "${teacher[@]}"
fi
if stage 4 "repartition"; then
  step repartition-teacher repartition "${teacher[@]}"
fi
if stage 5 "train the teacher and the baseline"; then
  side_by_side train-teacher train "${teacher[@]}" -- train-baseline train "${baseline[@]}"
fi
if stage 6 "lm"; then
  step lm lm "${teacher[@]}"
fi
if stage 7 "decode the teacher and the baseline"; then
  side_by_side decode-teacher decode "${teacher[@]}" --split test \
            -- decode-baseline decode "${baseline[@]}" --split test
fi

# The SSL DAG's overrides (dags/ssl_student.py) and the teacher it distils.
root=$(python - "$CONFIG" "${SETS[@]}" <<'PY'
import os, sys
from core.config import load_config
root = load_config(sys.argv[1], sys.argv[2:]).storage.root
print(root if "://" in root else os.path.abspath(root))
PY
)
TEACHER_URI="$root/runs/$TEACHER_RUN/train-teacher/model.pt"
ssl=(--run-id "$SSL_RUN" --set train.model=student --set train.regime=ssl
     --set "targets.teacher=$TEACHER_URI")
# The ssl_student DAG's CTC SSL student (dags/ssl_student.py CTC_SETS): its size and recipe
# are the config's (model.ctc, train.ctc_preset); the pseudo-labels are this run's.
ctc=(--run-id "$SSL_RUN" --set train.model=ctc --set train.regime=labeled --set train.tag=ctc
     --set decode.tag=ctc --set "train.pseudolabels=$SSL_RUN")

if stage 8 "select, align, features (run $SSL_RUN)"; then
  step select-ssl select "${ssl[@]}"
  step align-ssl align "${ssl[@]}"
  step features-ssl features "${ssl[@]}"
fi
if stage 9 "lm; targets and pseudo-labels from the teacher"; then
  step lm-ssl lm "${ssl[@]}"
  side_by_side targets targets "${ssl[@]}" -- pseudolabel pseudolabel "${ssl[@]}"
fi
if stage 10 "repartition; train the SSL student and the CTC student"; then
  step repartition-ssl repartition "${ssl[@]}"
  side_by_side train-ssl train "${ssl[@]}" -- train-ctc train "${ctc[@]}"
fi
if stage 11 "decode the SSL student and the CTC student"; then
  side_by_side decode-ssl decode "${ssl[@]}" --split test -- decode-ctc decode "${ctc[@]}" --split test
fi
if stage 12 "compare: WER on the test split"; then
  cmd=(amflow compare "$TEACHER_RUN" "$SSL_RUN" --config "$CONFIG" "${set_args[@]}")
  echo "\$ ${cmd[*]}"
  [ -n "${DRY_RUN:-}" ] || "${cmd[@]}" 2> "$LOGS/compare.log" | grep -v '^AMFLOW_SUMMARY ' \
    || { cat "$LOGS/compare.log" >&2; exit 1; }
fi
printf '\n=== done in %d s\n' "$(( $(date +%s) - START ))"
echo "outputs: $root/runs/$TEACHER_RUN/<step>/ and $root/runs/$SSL_RUN/<step>/"
[ -n "${DRY_RUN:-}" ] || echo "step logs: $LOGS"
