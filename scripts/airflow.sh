#!/usr/bin/env bash
# `make airflow`: Airflow 3 standalone (SQLite, LocalExecutor, simple auth) with amflow's
# DAGs and plugin. AIRFLOW_HOME lives in the project (./airflow_home, git-ignored);
# examples are off. Env: AIRFLOW_PORT (default 8080), AIRFLOW_HOME, AMFLOW_ADMIN_PASSWORD
# (default: generated once, kept in a mode-600 file, never printed), AMFLOW_AIRFLOW_HOST
# (default 127.0.0.1: this machine only; 0.0.0.0 for every interface).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PORT="${AIRFLOW_PORT:-8080}"
source scripts/airflow_env.sh

# A busy port would otherwise surface minutes later as a half-started standalone (the API
# server dies, the scheduler keeps running): check the API port and the task log server's
# ports first and stop here, with nothing started.
python scripts/port_free.py "$PORT" "${AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT:-8793}" \
  "${AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT:-8794}" || exit 1

stop() {
  echo "stopping airflow standalone ..."
  stop_standalone
  exit 0
}
trap stop INT TERM
# A failed start (set -e) must not leave Airflow components running.
trap stop_standalone EXIT
echo "airflow standalone starting (log $AIRFLOW_HOME/standalone.log) ..."
start_standalone "$AIRFLOW_HOME/standalone.log"
cat <<MSG

  Airflow UI:   http://localhost:$PORT  (listening on $AIRFLOW__API__HOST; AMFLOW_AIRFLOW_HOST)
  Login:        admin, password in $PASSWORDS (mode 600; AMFLOW_ADMIN_PASSWORD sets it)
  DAGs:         ssl_student, teacher, corpus (from $ROOT/dags); each run has an amflow tab
  AIRFLOW_HOME: $AIRFLOW_HOME    (Ctrl-C stops everything)

MSG
tail -n 0 -f "$AIRFLOW_HOME/standalone.log" &
TAIL=$!
wait "$STANDALONE_PID" || true
kill "$TAIL" 2>/dev/null || true
