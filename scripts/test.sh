#!/bin/bash
# make test: the whole suite but the cluster rehearsal and the exhaustive sweeps.
#
# Two pytest processes run side by side:
#  - the tests marked `waits` (Airflow runs driven over its API: ~10 min spent waiting on
#    the scheduler, ~10 % of a core) at normal priority, so that a scheduler loop or the
#    UI's page gets a core the moment it needs one;
#  - every other test at nice 10 (and all it starts: Ray, steps, servers), taking every
#    cycle left. Their timeouts are about throughput, the Airflow tests' about latency.
# Then the tests marked `isolated`, which need a process in which no in-process Ray ran.
set -u
PYTEST=.venv/bin/pytest
NOT_HERE="not cluster and not exhaustive and not benchmark and not corpus_ui"
SKIP="$NOT_HERE and not isolated"
waits_log=$(mktemp /tmp/amflow-test-waits.XXXXXX)
trap 'rm -f "$waits_log"' EXIT

"$PYTEST" -q -rs -p no:cacheprovider --durations=10 -m "waits and $SKIP" tests \
  > "$waits_log" 2>&1 &
waits=$!
nice -n 10 "$PYTEST" -q -rs --durations=25 -m "not waits and $SKIP" tests
rc=$?
wait "$waits"
waits_rc=$?
echo "== the tests marked waits (they ran beside the ones above):"
cat "$waits_log"
[ "$rc" = 0 ] && [ "$waits_rc" = 0 ] || exit 1

# Each `isolated` test in a process of its own: one that starts an in-process Ray (e.g. the
# own-corpus recipe, run through amflow.cli.main) would leave its token and config behind
# for the next (the Ray-job runner test's client is then refused by its own head).
isolated=$("$PYTEST" --collect-only -q -p no:cacheprovider -m "isolated and $NOT_HERE" tests \
           | grep '::')
rc=0
for test in $isolated; do
  "$PYTEST" -q -rs -p no:cacheprovider "$test" || rc=1
done
exit "$rc"
