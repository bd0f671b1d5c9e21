# Sourced by scripts/airflow.sh and scripts/demo.sh: one Airflow setup for both, so the
# demo's runs (DB, task logs) are the ones `make airflow` shows. Needs ROOT and PORT.
export PATH="$ROOT/.venv/bin:$PATH"  # standalone spawns `airflow` subprocesses
export AIRFLOW_HOME="${AIRFLOW_HOME:-$ROOT/airflow_home}"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$ROOT/plugins"  # the amflow tab on each DAG run
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__UNIT_TEST_MODE=False
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin"
export AIRFLOW__API__PORT="$PORT"
# The API server (UI + REST) listens on this machine only: on a laptop on a shared network
# 0.0.0.0 would open the admin UI to the network. AMFLOW_AIRFLOW_HOST=0.0.0.0 binds every
# interface (then put TLS in front; logins are the simple auth manager's admin + password).
# The task log servers (8793/8794) bind every interface in Airflow 3 whatever is set; they
# only answer requests signed with the JWT secret below (per machine, mode 600).
export AIRFLOW__API__HOST="${AMFLOW_AIRFLOW_HOST:-127.0.0.1}"
export AIRFLOW__API__BASE_URL="http://localhost:$PORT"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://localhost:$PORT/execution/"
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="${AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL:-30}"
mkdir -p "$AIRFLOW_HOME"
PASSWORDS="$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="$PASSWORDS"
# The admin password: AMFLOW_ADMIN_PASSWORD, else one generated here once. Written before
# Airflow starts, so that `airflow standalone` never echoes it into its log; mode 600.
umask_was=$(umask); umask 077
if [ -n "${AMFLOW_ADMIN_PASSWORD:-}" ]; then
  printf '{"admin": "%s"}\n' "$AMFLOW_ADMIN_PASSWORD" > "$PASSWORDS"
elif [ ! -s "$PASSWORDS" ]; then
  python -c "import json, secrets; print(json.dumps({'admin': secrets.token_urlsafe(12)}))" \
    > "$PASSWORDS"
fi
chmod 600 "$PASSWORDS"
# One signing secret for every component (they are separate processes).
if [ ! -s "$AIRFLOW_HOME/.jwt_secret" ]; then
  python -c "import secrets; print(secrets.token_hex(32))" > "$AIRFLOW_HOME/.jwt_secret"
fi
chmod 600 "$AIRFLOW_HOME/.jwt_secret"
umask "$umask_was"
AIRFLOW__API_AUTH__JWT_SECRET="$(cat "$AIRFLOW_HOME/.jwt_secret")"
export AIRFLOW__API_AUTH__JWT_SECRET

# launch_standalone LOG: `airflow standalone` in its own process group (one signal stops
# every component), in the background; sets STANDALONE_PID and STANDALONE_LOG.
launch_standalone() {
  STANDALONE_LOG=$1
  setsid airflow standalone > "$STANDALONE_LOG" 2>&1 &
  STANDALONE_PID=$!
}

# wait_standalone: returns once the API answers and the password file exists.
wait_standalone() {
  for _ in $(seq 1 300); do
    if ! kill -0 "$STANDALONE_PID" 2>/dev/null; then
      echo "airflow standalone exited; last log lines:" >&2
      tail -n 40 "$STANDALONE_LOG" >&2
      return 1
    fi
    if python -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" \
        "http://localhost:$PORT/api/v2/version" 2>/dev/null && [ -s "$PASSWORDS" ]; then
      return 0
    fi
    sleep 1
  done
  echo "airflow standalone did not answer on port $PORT; see $STANDALONE_LOG" >&2
  return 1
}

# size_pool: default_pool counts this machine's cores (scripts/airflow_pool.py), so that
# steps do not share cores beyond their threads. AMFLOW_POOL_CORES (default: nproc; 0 =
# leave the pool alone, e.g. when the steps run on a Ray cluster).
size_pool() {
  python "$ROOT/scripts/airflow_pool.py" --base "http://localhost:$PORT" --passwords "$PASSWORDS" \
    --cores "${AMFLOW_POOL_CORES:-$(nproc)}" \
    || echo "warning: default_pool not sized; steps may share cores beyond their threads" >&2
}

start_standalone() {
  launch_standalone "$1" && wait_standalone && size_pool
}

stop_standalone() {
  [ -n "${STANDALONE_PID:-}" ] || return 0
  kill -TERM -- -"$STANDALONE_PID" 2>/dev/null || true
  for _ in $(seq 1 20); do kill -0 "$STANDALONE_PID" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- -"$STANDALONE_PID" 2>/dev/null || true
  STANDALONE_PID=
}
