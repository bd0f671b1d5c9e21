#!/usr/bin/env bash
# `make airflow`: Airflow 3 standalone (SQLite, LocalExecutor, simple auth) with amflow's
# DAGs. AIRFLOW_HOME lives in the project (./airflow_home, git-ignored); examples are off.
# Env: AIRFLOW_PORT (default 8080), AIRFLOW_HOME, AMFLOW_ADMIN_PASSWORD (default: generated).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"  # standalone spawns `airflow` subprocesses
export AIRFLOW_HOME="${AIRFLOW_HOME:-$ROOT/airflow_home}"
PORT="${AIRFLOW_PORT:-8080}"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin"
export AIRFLOW__API__PORT="$PORT"
export AIRFLOW__API__BASE_URL="http://localhost:$PORT"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://localhost:$PORT/execution/"
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="${AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL:-30}"
mkdir -p "$AIRFLOW_HOME"
PASSWORDS="$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="$PASSWORDS"
if [ -n "${AMFLOW_ADMIN_PASSWORD:-}" ]; then
  printf '{"admin": "%s"}\n' "$AMFLOW_ADMIN_PASSWORD" > "$PASSWORDS"
fi
# One signing secret for every component (they are separate processes).
if [ ! -s "$AIRFLOW_HOME/.jwt_secret" ]; then
  python -c "import secrets; print(secrets.token_hex(32))" > "$AIRFLOW_HOME/.jwt_secret"
fi
AIRFLOW__API_AUTH__JWT_SECRET="$(cat "$AIRFLOW_HOME/.jwt_secret")"
export AIRFLOW__API_AUTH__JWT_SECRET

# Its own process group, so one signal stops every component it spawned.
setsid airflow standalone > "$AIRFLOW_HOME/standalone.log" 2>&1 &
PID=$!
stop() {
  echo "stopping airflow standalone ..."
  kill -TERM -- -"$PID" 2>/dev/null || true
  for _ in $(seq 1 20); do kill -0 "$PID" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- -"$PID" 2>/dev/null || true
  exit 0
}
trap stop INT TERM
echo "airflow standalone starting (pid $PID, log $AIRFLOW_HOME/standalone.log) ..."
for _ in $(seq 1 180); do
  if ! kill -0 $PID 2>/dev/null; then
    echo "airflow standalone exited; last log lines:" >&2
    tail -n 40 "$AIRFLOW_HOME/standalone.log" >&2
    exit 1
  fi
  if python -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" \
      "http://localhost:$PORT/api/v2/version" 2>/dev/null && [ -s "$PASSWORDS" ]; then
    break
  fi
  sleep 1
done
PASSWORD=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['admin'])" "$PASSWORDS")
cat <<MSG

  Airflow UI:   http://localhost:$PORT
  Login:        admin / $PASSWORD
  DAGs:         ssl_student, teacher, corpus (from $ROOT/dags)
  AIRFLOW_HOME: $AIRFLOW_HOME    (Ctrl-C stops everything)

MSG
tail -n 0 -f "$AIRFLOW_HOME/standalone.log" &
TAIL=$!
wait "$PID" || true
kill "$TAIL" 2>/dev/null || true
