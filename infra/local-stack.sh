#!/usr/bin/env bash
# Local privzo stack on 127.0.0.1: Prefect server, a process work pool with one worker, the deployments
# of infra/prefect.yaml, and an MLflow tracking server (UI).
#   infra/local-stack.sh up     (make up)    -> prints the exports to use the stack
#   infra/local-stack.sh down   (make down)
# Ports: PRIVZO_PREFECT_PORT (4200), PRIVZO_MLFLOW_PORT (5000). State and logs under .privzo-stack/.
#
# PRIVZO_STACK_DB picks where the state lives:
#   sqlite (default)  Prefect's own SQLite, MLflow over sqlite:///mlflow.db (PRIVZO_STACK_MLFLOW_STORE: another
#                     store); specs name their own stores.
#   postgres          the topology of infra/compose on one machine: a local PostgreSQL (installed and
#                     started by infra/postgres/test-db.sh, needs root) holds Prefect's database, MLflow's
#                     tracking store and registry, and the privacy ledger; MLflow serves the artifacts
#                     (.privzo-stack/mlartifacts). The worker's flow runs get MLFLOW_TRACKING_URI (the
#                     MLflow server) and PRIVZO_LEDGER_URL, so a spec that names no tracking.uri or
#                     budget.ledger is logged to the server and charged to the shared ledger.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/.venv/bin"
state="$root/.privzo-stack"
prefect_port=${PRIVZO_PREFECT_PORT:-4200}
mlflow_port=${PRIVZO_MLFLOW_PORT:-5000}
export PREFECT_API_URL="http://127.0.0.1:$prefect_port/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_HOME="${PREFECT_HOME:-$state/prefect-home}"
db=${PRIVZO_STACK_DB:-sqlite}
pg=postgresql+psycopg://privzo:privzo@127.0.0.1:5432
case "$db" in sqlite|postgres) ;; *) echo "local-stack: PRIVZO_STACK_DB is sqlite or postgres, not $db" >&2; exit 2;; esac

start() {  # name, command...: run in its own process group in the background, remember the group
  local name=$1; shift
  cd "$root"
  setsid "$@" >"$state/$name.log" 2>&1 < /dev/null &
  echo $! >"$state/$name.pid"
}

wait_http() {
  for _ in $(seq 1 120); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "local-stack: $1 did not answer; see $state/*.log" >&2; return 1
}

case "${1:-up}" in
  up)
    mkdir -p "$state" "$PREFECT_HOME"
    # flow runs name the UI their MLflow runs are browsed in (links in Prefect's logs and artifacts)
    worker_env=(env "PRIVZO_MLFLOW_UI_URL=http://127.0.0.1:$mlflow_port")
    if [ "$db" = postgres ]; then
      bash "$root/infra/postgres/test-db.sh" start prefect mlflow >"$state/postgres.log" 2>&1 ||
        { echo "local-stack: PostgreSQL did not start; see $state/postgres.log" >&2; exit 1; }
      export PREFECT_API_DATABASE_CONNECTION_URL="${pg/+psycopg/+asyncpg}/prefect"
      store="$pg/mlflow"
      artifacts=(--artifacts-destination "$state/mlartifacts")
      worker_env+=("MLFLOW_TRACKING_URI=http://127.0.0.1:$mlflow_port" "PRIVZO_LEDGER_URL=$pg/privzo")
    else
      store=${PRIVZO_STACK_MLFLOW_STORE:-sqlite:///mlflow.db}
      artifacts=()
      worker_env+=("PRIVZO_MLFLOW_UI_STORE=$store")
    fi
    start prefect-server "$bin/prefect" server start --host 127.0.0.1 --port "$prefect_port"
    start mlflow "$bin/mlflow" server --host 127.0.0.1 --port "$mlflow_port" --backend-store-uri "$store" "${artifacts[@]}"
    wait_http "http://127.0.0.1:$prefect_port/api/health"
    "$bin/prefect" work-pool inspect local >/dev/null 2>&1 || "$bin/prefect" work-pool create local --type process >/dev/null
    (cd "$root" && PRIVZO_ROOT="$root" "$bin/prefect" --no-prompt deploy --all --prefect-file infra/prefect.yaml >"$state/deploy.log" 2>&1)
    start prefect-worker "${worker_env[@]}" "$bin/prefect" worker start --pool local
    wait_http "http://127.0.0.1:$mlflow_port/health"
    echo "export PREFECT_API_URL=$PREFECT_API_URL PREFECT_HOME=$PREFECT_HOME"
    if [ "$db" = postgres ]; then
      echo "export MLFLOW_TRACKING_URI=http://127.0.0.1:$mlflow_port PRIVZO_LEDGER_URL=$pg/privzo"
      echo "# PostgreSQL keeps running after 'down': infra/postgres/test-db.sh stop"
    fi
    echo "# Prefect UI http://127.0.0.1:$prefect_port/   MLflow UI http://127.0.0.1:$mlflow_port/"
    echo "# then, with those exports: $bin/prefect deployment run private-train/digits-retrain-nightly --watch"
    echo "#   $bin/privzo budget show sklearn-digits"
    ;;
  down)
    # every group is signalled at once and waited for together: stopping one by one summed their waits
    groups=()
    for name in prefect-worker mlflow prefect-server; do
      if [ -f "$state/$name.pid" ]; then
        pid=$(cat "$state/$name.pid")
        kill -TERM -- "-$pid" 2>/dev/null && groups+=("$pid")   # the whole group: servers fork workers
        rm -f "$state/$name.pid"
      fi
    done
    for _ in $(seq 1 50); do
      alive=()
      for pid in "${groups[@]}"; do kill -0 -- "-$pid" 2>/dev/null && alive+=("$pid"); done
      [ ${#alive[@]} -eq 0 ] && break
      groups=("${alive[@]}")
      sleep 0.2
    done
    for pid in "${groups[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
