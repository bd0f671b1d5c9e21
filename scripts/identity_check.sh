#!/usr/bin/env bash
# A tiny end-to-end chain (corpus -> select -> align -> features -> repartition -> teacher train ->
# evaluate -> lm -> decode -> targets -> student train -> sequence -> decode) on fresh storage,
# then a digest of every data file it wrote (scripts/identity_digest.py: timings, hosts and
# wall-clock fields left out). Run both with the same OUT_DIR (paths are part of manifests).
# For refactors that promise "the same outputs to the byte": run it on the old and the new
# code and diff the two lists (keep a copy of the first tree: scripts/identity_compare.py
# names what differs in the files whose digests do).   usage: scripts/identity_check.sh OUT_DIR > sums.txt
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "$1")
AMFLOW=${AMFLOW:-.venv/bin/amflow}
export OMP_NUM_THREADS=1
rm -rf "$OUT"; mkdir -p "$OUT"
COMMON=(--set storage.root="$OUT/store" --set data.corpus="$OUT/corpus" --set ray.num_cpus=2)
TINY=(--set train.epochs=2 --set train.finetune_epochs=1 --set train.sub_epochs=1
      --set train.teacher_preset={} --set model.teacher.hidden=32 --set model.teacher.layers=1
      --set model.student.hidden=32 --set model.student.layers=1 --set lm.sentences=2000)
T=(--set select.splits=labeled,dev,test --set train.model=teacher --set train.regime=labeled
   --set train.tag=teacher --set evaluate.tag=teacher --set decode.tag=teacher)
S=(--set train.model=student --set train.regime=ssl --set targets.teacher="$OUT/store/runs/t/train-teacher/model.pt")
run() { echo "== amflow $*" >&2; "$AMFLOW" "$@" "${COMMON[@]}" "${TINY[@]}" > "$OUT/last.log" 2>&1 || { tail -40 "$OUT/last.log" >&2; exit 1; }; }
run corpus --set corpus.hours=0.08
for s in select align features repartition train evaluate lm; do run $s --run-id t "${T[@]}"; done
run decode --run-id t --split test "${T[@]}"
for s in select align features targets repartition train; do run $s --run-id s "${S[@]}"; done
run sequence --run-id s "${S[@]}" --set select.splits=labeled,dev --set train.epochs=1
run lm --run-id s "${S[@]}"
run decode --run-id s --split test "${S[@]}" --set decode.tag=sequence
"${AMFLOW%/amflow}/python" scripts/identity_digest.py "$OUT"
