#!/usr/bin/env bash
# Local privzo stack on 127.0.0.1: Prefect server, a process work pool with one worker, the deployments
# of infra/prefect.yaml, and an MLflow tracking server (UI).
#   infra/local-stack.sh up     (make up)    -> prints the exports to use the stack
#   infra/local-stack.sh down   (make down)
# Ports: PRIVZO_PREFECT_PORT (4200), PRIVZO_MLFLOW_PORT (5000). State and logs under .privzo-stack/.
#
# PRIVZO_STACK_DB picks where the state lives:
#   sqlite (default)  Prefect's own SQLite, MLflow over sqlite:///mlflow.db (PRIVZO_STACK_MLFLOW_STORE: another
#                     store), the artifacts it serves in ./mlartifacts (PRIVZO_STACK_MLFLOW_ARTIFACTS: another
#                     folder); specs name their own stores.
#   postgres          the topology of infra/compose on one machine: a local PostgreSQL (installed and
#                     started by infra/postgres/test-db.sh, needs root) holds Prefect's database
#                     (privzo_prefect), MLflow's tracking store and registry (privzo_mlflow), the privacy
#                     ledger (privzo_ledger) and the team's rows (privzo_data: written by privzo_etl, read by
#                     privzo_reader, SELECT only; their passwords in .privzo-stack/pgpass, the worker's
#                     PGPASSFILE), each owned by its own role, which only that server connects
#                     as (privzo_prefect and privzo_mlflow: passwords made for this stack and kept under
#                     .privzo-stack/, mode 600); the ledger's owner is privzo_owner. MLflow serves the
#                     artifacts (.privzo-stack/mlartifacts). The worker's flow runs get MLFLOW_TRACKING_URI
#                     (the MLflow server), and the worker's configuration (flows/worker_config.py:
#                     /etc/privzo/worker.json on the team stack, else .privzo-stack/worker.json, mode 600)
#                     names the shared ledger, so a spec that names no tracking.uri or budget.ledger is
#                     logged to the server and charged to the shared ledger (a run naming another is refused).
#                     The ETL's worker (pool etl) runs the deployments that write the team's rows.
#
# PRIVZO_STACK_AUTH=1 puts every service behind its own authentication (the team stack's switches, on one
# machine), with secrets from the environment or from files (NAME_FILE: a file holding NAME), never from
# the repository; the stack refuses to start without one, naming it:
#   PRIVZO_PREFECT_AUTH_STRING      Prefect's API and UI: "user:password" (the server's auth string)
#   PRIVZO_MLFLOW_ADMIN_PASSWORD    MLflow basic-auth: user admin (manages users and permissions)
#   PRIVZO_MLFLOW_WORKER_PASSWORD   user worker: what the Prefect worker's flow runs log and register as
#   PRIVZO_MLFLOW_VIEWER_PASSWORD   user viewer: reads runs and models, writes nothing
#   PRIVZO_RAY_TOKEN                with PRIVZO_STACK_RAY=1: the Ray head's token (RAY_AUTH_MODE=token)
#   PRIVZO_LEDGER_OWNER_PASSWORD    with PRIVZO_STACK_DB=postgres: the ledger's owner privzo_owner, who registers
#                                   each dataset's lifetime (privzo budget init DATASET --spec SPEC) and
#                                   grants the worker (without auth the stack makes one and keeps it)
#   PRIVZO_LEDGER_WORKER_PASSWORD   with PRIVZO_STACK_DB=postgres: the ledger's role privzo_worker, what the
#                                   Prefect worker charges as; it may charge registered datasets only
# No secret is ever on a command line (ps shows those to every user): servers and psql get them in their
# environment or on their standard input.
# The team stack (PRIVZO_STACK_AUTH=1 with PRIVZO_STACK_DB=postgres) runs each role as an OS user of its own,
# never root, as trusted servers do (PostgreSQL itself runs as postgres): privzo-prefect (the Prefect server),
# privzo-mlflow (the MLflow server), privzo-train (the training worker, so every flow run it starts, and the
# Ray head its steps run on) and privzo-etl (the ETL's worker, pool etl, whose flow runs write the team's
# rows). `up` makes them (system users, no login) and drops to them before any flow runs; each has a home of
# its own under .privzo-stack/home/ (mode 700), and the files of a role (its pgpass, the worker's configuration
# /etc/privzo/worker.json, MLflow's users and artifacts) are readable by that role alone, so no flow run can
# read another role's files or /proc/PID/environ, or become PostgreSQL's superuser. It must start as root to
# drop to them; started as anyone else it refuses, and says so.
# PRIVZO_STACK_RAY=1 also starts a Ray head on 127.0.0.1 (PRIVZO_RAY_PORT, its dashboard and job API on
# PRIVZO_RAY_DASHBOARD_PORT, 127.0.0.1 only), which the worker's configuration names: every deployment run's
# steps then run on its actors (the team's SQL nightly included), and on no other cluster.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/.venv/bin"
state="$root/.privzo-stack"
prefect_port=${PRIVZO_PREFECT_PORT:-4200}
mlflow_port=${PRIVZO_MLFLOW_PORT:-5000}
export PREFECT_API_URL="http://127.0.0.1:$prefect_port/api"
# offline: no usage telemetry from the servers, the worker or its flow runs (flows/cli/, COMMAND_ENVIRONMENT)
export PREFECT_SERVER_ANALYTICS_ENABLED=false MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=1
export PREFECT_HOME="${PREFECT_HOME:-$state/prefect-home}"
ray_port=${PRIVZO_RAY_PORT:-6379}
ray_dashboard_port=${PRIVZO_RAY_DASHBOARD_PORT:-8265}
auth=${PRIVZO_STACK_AUTH:-0}
with_ray=${PRIVZO_STACK_RAY:-0}
db=${PRIVZO_STACK_DB:-sqlite}
pg_host=127.0.0.1:5432
case "$db" in sqlite|postgres) ;; *) echo "local-stack: PRIVZO_STACK_DB is sqlite or postgres, not $db" >&2; exit 2;; esac
case "$auth" in 0|1) ;; *) echo "local-stack: PRIVZO_STACK_AUTH is 0 or 1, not $auth" >&2; exit 2;; esac
team=0  # the team stack: every role its own OS user (the header)
if [ "$auth" = 1 ] && [ "$db" = postgres ]; then team=1; fi
# the configuration of the team's training worker, at a path no checkout holds and no flow run can write
# (flows/worker_config.py reads it before any beside the code)
system_config=/etc/privzo/worker.json

secret() {  # NAME: $NAME, else the first line of the file $NAME_FILE; refuses to go on without either
  local name=$1 file_var="${1}_FILE" value
  value=${!name:-}
  if [ -z "$value" ] && [ -n "${!file_var:-}" ]; then
    [ -r "${!file_var}" ] || { echo "local-stack: $file_var names ${!file_var}, which cannot be read" >&2; return 2; }
    value=$(head -n 1 "${!file_var}")
  fi
  [ -n "$value" ] || { echo "local-stack: PRIVZO_STACK_AUTH=1 needs $name (or $file_var, a file holding it)" >&2; return 2; }
  printf '%s' "$value"
}

clean_environment() {  # in a subshell about to start a long-running process: every exported variable but the
  # few every process needs and the caller's settings that hold no secret; that process's own are exported
  # after. So no server, worker or flow run holds a secret it was not given (the ledger owner's, MLflow's
  # admin's), whatever the operator's shell had exported (`env -i NAME=value` would show them to ps).
  local var
  for var in $(compgen -e); do
    case "$var" in
      PATH|HOME|LANG|LC_*|TZ|TMPDIR|USER|LOGNAME|TERM|PREFECT_HOME|PREFECT_API_URL|PRIVZO_DEVICE_MEMORY_BYTES|PRIVZO_LEASE_SECONDS) continue ;;
      # the caller's runtime settings (threads, numerics, devices, offline hubs, certificates), less any secret
      PREFECT_*|MLFLOW_*|RAY_*|DO_NOT_TRACK|OMP_*|MKL_*|OPENBLAS_*|TORCH_*|CUDA_*|NVIDIA_*|HF_*|TRANSFORMERS_*|\
      TOKENIZERS_*|PYTHONHASHSEED|PYTHONUNBUFFERED|LD_LIBRARY_PATH|SSL_CERT_*|REQUESTS_CA_BUNDLE|XDG_*)
        case "$var" in *PASSWORD*|*TOKEN*|*SECRET*|*AUTH*|*KEY*|*CREDENTIAL*|*_URL|*_URI) ;; *) continue ;; esac ;;
    esac
    unset "$var" 2>/dev/null || true
  done
}

start() {  # name, [--as USER], [NAME=value ...] --, command...: in its own process group in the background,
  # from a clean environment with those variables (exported in a subshell: an `env NAME=value` argument list is
  # visible to ps); with --as, as that OS user (its own home, its own groups), never root
  local name=$1 user=""; shift
  if [ "$1" = --as ]; then user=$2; shift 2; fi
  (
    clean_environment
    umask 077  # its log and what it writes: its own
    # a role's home and temporary files its own (Prefect's runner keeps its storage under the temporary folder)
    if [ -n "$user" ]; then export HOME="$state/home/$user" TMPDIR="$state/home/$user/tmp" USER="$user" LOGNAME="$user"; fi
    while [ "$1" != -- ]; do export "${1?}"; shift; done; shift
    cd "$root"
    if [ -n "$user" ]; then
      exec setsid bash "$root/infra/stack/as-role.sh" "$user" "$@" >"$state/$name.log" 2>&1 < /dev/null
    fi
    exec setsid "$@" >"$state/$name.log" 2>&1 < /dev/null
  ) &
  echo $! >"$state/$name.pid"
}

role() {  # ROLE: the team stack's OS user for it (made if missing: a system user without login or home of its
  # own), with its home under the stack's state; prints its name
  local user="privzo-$1"
  if ! id -u "$user" >/dev/null 2>&1; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$user" ||
      { echo "local-stack: the OS user $user could not be made" >&2; return 1; }
  fi
  install -d -m 711 "$state/home"
  install -d -m 700 -o "$user" -g "$user" "$state/home/$user" "$state/home/$user/tmp"
  echo "$user"
}

owned() {  # USER PATH...: the role's alone (mode 600 files, 700 folders)
  local user=$1; shift
  chown -R "$user:$user" "$@" && chmod -R go-rwx "$@"
}

wait_http() {  # url [curl config line]: until it answers 2xx; a credential goes in curl's config, on its stdin
  local url=$1 config=${2:-}
  for _ in $(seq 1 120); do curl -sf -K - "$url" <<<"$config" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "local-stack: $url did not answer; see $state/*.log" >&2; return 1
}

kept() {  # NAME: a password this stack made for itself, kept in .privzo-stack/NAME (mode 600) between ups
  [ -s "$state/$1" ] || (umask 077 && openssl rand -hex 24 >"$state/$1")
  cat "$state/$1"
}

url_quoted() {  # a password as it goes into a URL, read from the environment (never from argv)
  PRIVZO_QUOTE="$1" "$bin/python" -c 'import os, urllib.parse; print(urllib.parse.quote(os.environ["PRIVZO_QUOTE"], safe=""))'
}

pg_roles_sql() {  # ROLE:PASSWORD_HEX ... -- DATABASE:OWNER ...: the SQL that makes them (passwords set anew each
  # up, as hex, so that no quoting matters); psql reads it on stdin
  while [ "$1" != -- ]; do
    local role=${1%%:*} hex=${1#*:}; shift
    echo "SELECT format('CREATE ROLE %I LOGIN', '$role') WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$role') \\gexec"
    echo "SELECT format('ALTER ROLE %I PASSWORD %L', '$role', convert_from(decode('$hex', 'hex'), 'UTF8')) \\gexec"
  done
  shift
  for pair in "$@"; do
    local database=${pair%%:*} owner=${pair#*:}
    echo "SELECT format('CREATE DATABASE %I OWNER %I', '$database', '$owner') WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$database') \\gexec"
    # only the roles given CONNECT reach a database: its owner, and the worker on the ledger's
    echo "REVOKE CONNECT, TEMPORARY ON DATABASE $database FROM PUBLIC;"
  done
}

hex() { printf '%s' "$1" | od -An -tx1 | tr -d ' \n'; }

stop_all() {  # every group is signalled at once and waited for together: stopping one by one summed their waits
  groups=()
  for name in prefect-worker prefect-etl-worker ray-head mlflow prefect-server; do
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
  if [ -f "$state/ray-temp-dir" ]; then
    rm -rf "$(cat "$state/ray-temp-dir")" "$state/ray-temp-dir"
  fi
  rm -f "$state/worker.json"  # no worker: a hand-started one is pinned by nothing stale
  if [ -f "$state/system-config" ]; then rm -f "$system_config" "$state/system-config"; fi
}

case "${1:-up}" in
  up)
    prefect_server_env=()
    mlflow_env=()
    mlflow_app=()
    prefect_curl=""
    if [ "$auth" = 1 ]; then  # every secret first: nothing starts without all of them
      prefect_auth=$(secret PRIVZO_PREFECT_AUTH_STRING)
      case "$prefect_auth" in *:?*) ;; *) echo "local-stack: PRIVZO_PREFECT_AUTH_STRING is user:password" >&2; exit 2;; esac
      mlflow_admin=$(secret PRIVZO_MLFLOW_ADMIN_PASSWORD)
      mlflow_worker=$(secret PRIVZO_MLFLOW_WORKER_PASSWORD)
      mlflow_viewer=$(secret PRIVZO_MLFLOW_VIEWER_PASSWORD)
      if [ "$with_ray" = 1 ]; then ray_token=$(secret PRIVZO_RAY_TOKEN); fi
      if [ "$db" = postgres ]; then
        ledger_owner=$(secret PRIVZO_LEDGER_OWNER_PASSWORD)
        ledger_worker=$(secret PRIVZO_LEDGER_WORKER_PASSWORD)
      fi
    fi
    if [ "$team" = 1 ]; then
      if [ "$(id -u)" != 0 ]; then
        echo "local-stack: a team stack (PRIVZO_STACK_AUTH=1 with PRIVZO_STACK_DB=postgres) runs each server, each worker and so every flow run as an OS user of its own, never the operator's: start it as root, which drops to those users before any flow runs" >&2
        exit 2
      fi
      for tool in setpriv useradd; do
        command -v "$tool" >/dev/null ||
          { echo "local-stack: a team stack needs $tool to run each role as an OS user of its own" >&2; exit 2; }
      done
    fi
    umask 077  # what the stack writes is its own (each role's files are then given to that role alone)
    mkdir -p "$state" "$PREFECT_HOME"
    chmod 700 "$state"
    as_prefect=() as_mlflow=() as_train=() as_etl=()
    if [ "$team" = 1 ]; then
      chmod 711 "$state"  # each role reaches its own files in it, by name, and lists nothing
      u_prefect=$(role prefect) && u_mlflow=$(role mlflow) && u_train=$(role train) && u_etl=$(role etl) || exit 1
      bash "$root/infra/stack/as-role.sh" check "$u_train" || exit 2  # it runs the checkout's code and interpreter
      as_prefect=(--as "$u_prefect") as_mlflow=(--as "$u_mlflow") as_train=(--as "$u_train") as_etl=(--as "$u_etl")
      prefect_server_env+=("PREFECT_HOME=$state/home/$u_prefect/prefect")
    fi
    etl_env=()
    trap 'stop_all' EXIT  # a stack that did not come up whole is stopped, not left half running
    # flow runs name the UI their MLflow runs are browsed in (links in Prefect's logs and artifacts)
    worker_env=("PRIVZO_MLFLOW_UI_URL=http://127.0.0.1:$mlflow_port")
    worker_ledger="" worker_ray=""
    # the team's key of row fingerprints, where the operator keeps it in the environment: the worker's runs
    # key rows as the team's other machines do (else the worker's ~/.privzo/fingerprint.key)
    if [ -n "${PRIVZO_FINGERPRINT_KEY:-}" ]; then worker_env+=("PRIVZO_FINGERPRINT_KEY=$PRIVZO_FINGERPRINT_KEY"); fi
    if [ "$db" = postgres ]; then
      bash "$root/infra/postgres/test-db.sh" server >"$state/postgres.log" 2>&1 ||
        { echo "local-stack: PostgreSQL did not start; see $state/postgres.log" >&2; exit 1; }
      # each server its own role and database; the ledger's owner is nobody's server
      [ "$auth" = 1 ] || ledger_owner=$(kept ledger-owner-password)
      prefect_db=$(kept prefect-db-password)
      mlflow_db=$(kept mlflow-db-password)
      # the team's rows: privzo_data, written by its ETL's role privzo_etl (the grow deployments), read by
      # privzo_reader (the nightly runs), which may SELECT the tables privzo_etl makes and do nothing else
      data_etl=$(kept etl-db-password)
      data_reader=$(kept reader-db-password)
      roles=("privzo_owner:$(hex "$ledger_owner")" "privzo_prefect:$(hex "$prefect_db")" "privzo_mlflow:$(hex "$mlflow_db")"
             "privzo_etl:$(hex "$data_etl")" "privzo_reader:$(hex "$data_reader")")
      if [ "$auth" = 1 ]; then roles+=("privzo_worker:$(hex "$ledger_worker")"); fi
      { pg_roles_sql "${roles[@]}" -- privzo_ledger:privzo_owner privzo_prefect:privzo_prefect privzo_mlflow:privzo_mlflow \
          privzo_data:privzo_etl
        if [ "$auth" = 1 ]; then echo "GRANT CONNECT ON DATABASE privzo_ledger TO privzo_worker;"; fi
        echo "GRANT CONNECT ON DATABASE privzo_data TO privzo_reader;"
        echo "\\connect privzo_data"
        echo "ALTER DEFAULT PRIVILEGES FOR ROLE privzo_etl IN SCHEMA public GRANT SELECT ON TABLES TO privzo_reader;"
      } | su postgres -c "psql -q -v ON_ERROR_STOP=1 -d postgres" >"$state/postgres-roles.log" 2>&1 ||
        { echo "local-stack: the stack's database roles could not be made; see $state/postgres-roles.log" >&2; exit 1; }
      # the data roles' passwords where libpq looks for them (PGPASSFILE; the specs' URLs name the roles only),
      # each worker its own: the training worker reads (privzo_reader), the ETL's worker writes (privzo_etl)
      printf '%s\n' "${pg_host%%:*}:${pg_host##*:}:privzo_data:privzo_reader:$data_reader" >"$state/pgpass"
      printf '%s\n' "${pg_host%%:*}:${pg_host##*:}:privzo_data:privzo_etl:$data_etl" >"$state/pgpass-etl"
      worker_env+=("PGPASSFILE=$state/pgpass")
      etl_env+=("PGPASSFILE=$state/pgpass-etl")
      if [ "$team" = 1 ]; then owned "$u_train" "$state/pgpass"; owned "$u_etl" "$state/pgpass-etl"; fi
      prefect_server_env+=("PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://privzo_prefect:$prefect_db@$pg_host/privzo_prefect")
      mlflow_env+=("MLFLOW_BACKEND_STORE_URI=postgresql+psycopg://privzo_mlflow:$mlflow_db@$pg_host/privzo_mlflow")
      store=""
      mkdir -p "$state/mlartifacts"
      artifacts=(--artifacts-destination "$state/mlartifacts")
      owner_url="postgresql+psycopg://privzo_owner:$(url_quoted "$ledger_owner")@$pg_host/privzo_ledger"
      ledger_url=$owner_url  # without auth the stack is one person's: its worker charges as the owner
      if [ "$auth" = 1 ]; then
        # the worker charges as privzo_worker, which the ledger's owner grants a worker's rights: it may
        # charge registered datasets, never register one or change a lifetime (flows/ledger/roles.py)
        (export PRIVZO_LEDGER_URL="$owner_url"; "$bin/privzo" budget grant privzo_worker) >"$state/ledger-roles.log" 2>&1 ||
          { echo "local-stack: the ledger's worker role could not be granted; see $state/ledger-roles.log" >&2; exit 1; }
        ledger_url="postgresql+psycopg://privzo_worker:$(url_quoted "$ledger_worker")@$pg_host/privzo_ledger"
      fi
      worker_env+=("MLFLOW_TRACKING_URI=http://127.0.0.1:$mlflow_port")
      worker_ledger=$ledger_url
    else
      store=${PRIVZO_STACK_MLFLOW_STORE:-sqlite:///mlflow.db}
      mlflow_env+=("MLFLOW_BACKEND_STORE_URI=$store")
      artifacts=(--artifacts-destination "${PRIVZO_STACK_MLFLOW_ARTIFACTS:-./mlartifacts}")
      worker_env+=("PRIVZO_MLFLOW_UI_STORE=$store")
      # one person's stack: the store and ledger they exported are where the worker's retrains go
      if [ -n "${MLFLOW_TRACKING_URI:-}" ]; then worker_env+=("MLFLOW_TRACKING_URI=$MLFLOW_TRACKING_URI"); fi
      worker_ledger=${PRIVZO_LEDGER_URL:-}
    fi
    if [ "$auth" = 1 ]; then
      # Prefect: the server checks the auth string on every API call; its CLI and the worker send it
      prefect_server_env+=("PREFECT_SERVER_API_AUTH_STRING=$prefect_auth" "PREFECT_API_AUTH_STRING=$prefect_auth")
      export PREFECT_API_AUTH_STRING="$prefect_auth"
      prefect_curl="user = \"$prefect_auth\""
      # MLflow: basic-auth, users in their own store; anyone signed in may read, only owners write
      # its users in a folder of the server's own (SQLite writes its journal beside the database)
      mkdir -p "$state/mlflow-auth"
      printf '[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///%s\nadmin_username = admin\n' \
        "$state/mlflow-auth/users.db" >"$state/mlflow-auth.ini"
      printf 'authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n' >>"$state/mlflow-auth.ini"
      # a password checked once a minute, not on every request: MLflow checks it with scrypt (about 0.1 s of
      # CPU), and a run's logging and registration send a hundred requests; a removed user or changed
      # password takes effect within the minute
      printf 'auth_cache_ttl_seconds = 60\n' >>"$state/mlflow-auth.ini"
      # the key of the UI's CSRF tokens: this stack's own, kept with its state
      [ -s "$state/mlflow-secret-key" ] || (umask 077 && openssl rand -hex 32 >"$state/mlflow-secret-key")
      mlflow_env+=("MLFLOW_AUTH_CONFIG_PATH=$state/mlflow-auth.ini"
                   "MLFLOW_FLASK_SERVER_SECRET_KEY=$(cat "$state/mlflow-secret-key")" PRIVZO_MLFLOW_READ_ONLY_USERS=viewer
                   PRIVZO_MLFLOW_PROMOTERS=admin)
      # the admin is made here, by a command that ends: the server, which runs for weeks, never holds its password
      MLFLOW_AUTH_CONFIG_PATH="$state/mlflow-auth.ini" MLFLOW_AUTH_ADMIN_PASSWORD="$mlflow_admin" "$bin/python" -c \
        'from mlflow.server.auth import bootstrap_admin_user; bootstrap_admin_user()' >"$state/mlflow-admin.log" 2>&1 ||
        { echo "local-stack: MLflow's admin could not be made; see $state/mlflow-admin.log" >&2; exit 1; }
      mlflow_app=(--app-name privzo-auth)  # basic-auth, and a viewer creates nothing (flows/record/mlflow_app.py)
      if [ "$team" = 1 ]; then owned "$u_mlflow" "$state/mlflow-auth" "$state/mlflow-auth.ini" "$state/mlartifacts"; fi
      # the worker's flow runs log to the server as user worker, whatever store the stack keeps
      worker_env+=("MLFLOW_TRACKING_URI=http://127.0.0.1:$mlflow_port" "MLFLOW_TRACKING_USERNAME=worker"
                   "MLFLOW_TRACKING_PASSWORD=$mlflow_worker" "PREFECT_API_AUTH_STRING=$prefect_auth")
      etl_env+=("PREFECT_API_AUTH_STRING=$prefect_auth")  # the ETL's worker: Prefect, and its own rows; no more
    fi
    if [ "$team" = 1 ]; then
      # a flow run's checkpoints (a relative checkpoint.dir) in the training user's own folder, as infra/compose
      # mounts its checkpoints volume: the working directory is the code's, which no role may write
      worker_env+=("PREFECT_HOME=$state/home/$u_train/prefect" "PRIVZO_CHECKPOINT_ROOT=$state/home/$u_train")
      etl_env+=("PREFECT_HOME=$state/home/$u_etl/prefect")
    fi
    start prefect-server "${as_prefect[@]}" "${prefect_server_env[@]}" -- "$bin/prefect" server start --host 127.0.0.1 \
      --port "$prefect_port"
    # the store (with its password, on PostgreSQL) from MLflow's environment: MLFLOW_BACKEND_STORE_URI
    start mlflow "${as_mlflow[@]}" "${mlflow_env[@]}" -- "$bin/mlflow" server --host 127.0.0.1 --port "$mlflow_port" \
      "${artifacts[@]}" "${mlflow_app[@]}"
    if [ "$with_ray" = 1 ]; then
      ray_env=(RAY_USAGE_STATS_ENABLED=0)
      if [ "$auth" = 1 ]; then
        printf '%s' "$ray_token" >"$state/ray-token"
        if [ "$team" = 1 ]; then owned "$u_train" "$state/ray-token"; fi
        ray_env+=(RAY_AUTH_MODE=token "RAY_AUTH_TOKEN_PATH=$state/ray-token")
        worker_env+=(RAY_AUTH_MODE=token "RAY_AUTH_TOKEN_PATH=$state/ray-token")
      fi
      # a temp folder of its own (short: Ray's socket paths have a length limit), so that the head's address
      # file is not /tmp/ray's, which every later ray.init() on this machine would try to join after `down`
      ray_temp=$(mktemp -d /tmp/privzo-ray-XXXXXX)
      echo "$ray_temp" >"$state/ray-temp-dir"
      # the training user's: its flow runs drive the steps the head's workers run
      if [ "$team" = 1 ]; then owned "$u_train" "$ray_temp"; fi
      # its workers read a run's rows themselves: from the team's database as the training worker does
      # (privzo_reader, its PGPASSFILE), never the ETL's
      if [ "$db" = postgres ]; then ray_env+=("PGPASSFILE=$state/pgpass"); fi
      # logical CPUs for a run's default 2 workers of 1 CPU each, however few cores the machine has
      ray_cpus=$(nproc); [ "$ray_cpus" -ge 2 ] || ray_cpus=2
      start ray-head "${as_train[@]}" "${ray_env[@]}" -- "$bin/ray" start --head --block --node-ip-address 127.0.0.1 --port "$ray_port" \
        --dashboard-host 127.0.0.1 --dashboard-port "$ray_dashboard_port" --num-cpus "$ray_cpus" --disable-usage-stats \
        --temp-dir "$ray_temp"
      worker_env+=("RAY_ADDRESS=127.0.0.1:$ray_port")
      worker_ray="127.0.0.1:$ray_port"
    fi
    wait_http "http://127.0.0.1:$prefect_port/api/health" "$prefect_curl"
    # pool local: the training worker's; pool etl: the ETL's worker's (the deployments that write the team's rows)
    for pool in local etl; do
      "$bin/prefect" work-pool inspect "$pool" >/dev/null 2>&1 || "$bin/prefect" work-pool create "$pool" --type process >/dev/null
    done
    (cd "$root" && PRIVZO_ROOT="$root" "$bin/prefect" --no-prompt deploy --all --prefect-file infra/prefect.yaml >"$state/deploy.log" 2>&1)
    # the ledger the worker's deployment runs are charged to, in its configuration (flows/worker_config.py),
    # not in its environment: a run's job variables set that environment, never this file
    # (none naming a ledger: a personal worker, whose runs are charged where their specs say). The team's is at
    # the system's path, which no checkout holds and the training user reads but cannot write: a deployment
    # from any checkout on this worker is pinned by it
    rm -f "$state/worker.json"
    config="$state/worker.json"
    if [ "$team" = 1 ]; then
      install -d -m 755 "$(dirname "$system_config")"
      config=$system_config
      touch "$state/system-config"  # `down` removes it
    fi
    # and, with PRIVZO_STACK_RAY=1, the stack's Ray head, where every deployment run's steps run (and no other)
    PRIVZO_WORKER_LEDGER="$worker_ledger" PRIVZO_WORKER_RAY="$worker_ray" "$bin/python" -c 'import json, os, sys
json.dump({"ledger": os.environ["PRIVZO_WORKER_LEDGER"] or None, "ray": os.environ["PRIVZO_WORKER_RAY"] or None},
          sys.stdout)' >"$config.tmp"
    if [ "$team" = 1 ]; then chown "root:$u_train" "$config.tmp" && chmod 640 "$config.tmp"; fi
    mv "$config.tmp" "$config"
    start prefect-worker "${as_train[@]}" "${worker_env[@]}" -- "$bin/prefect" worker start --pool local
    if [ "$db" = postgres ]; then
      start prefect-etl-worker "${as_etl[@]}" "${etl_env[@]}" -- "$bin/prefect" worker start --pool etl
    fi
    wait_http "http://127.0.0.1:$mlflow_port/health"
    if [ "$auth" = 1 ]; then  # users worker and viewer, made (or their passwords set) by the admin
      MLFLOW_TRACKING_URI="http://127.0.0.1:$mlflow_port" PRIVZO_MLFLOW_ADMIN_PASSWORD="$mlflow_admin" \
        PRIVZO_MLFLOW_WORKER_PASSWORD="$mlflow_worker" PRIVZO_MLFLOW_VIEWER_PASSWORD="$mlflow_viewer" \
        "$bin/python" "$root/infra/mlflow_users.py" >"$state/mlflow-users.log" 2>&1 ||
        { echo "local-stack: MLflow users could not be made; see $state/mlflow-users.log" >&2; exit 1; }
    fi
    if [ "$with_ray" = 1 ]; then
      if [ "$auth" = 1 ]; then
        wait_http "http://127.0.0.1:$ray_dashboard_port/api/version" "header = \"Authorization: Bearer $ray_token\""
      else
        wait_http "http://127.0.0.1:$ray_dashboard_port/api/version"
      fi
    fi
    echo "export PREFECT_API_URL=$PREFECT_API_URL PREFECT_HOME=$PREFECT_HOME"
    if [ "$auth" = 1 ]; then  # the secrets by name, never by value
      echo 'export PREFECT_API_AUTH_STRING="$PRIVZO_PREFECT_AUTH_STRING"'
      echo "export MLFLOW_TRACKING_URI=http://127.0.0.1:$mlflow_port MLFLOW_TRACKING_USERNAME=viewer"' MLFLOW_TRACKING_PASSWORD="$PRIVZO_MLFLOW_VIEWER_PASSWORD"'
    fi
    trap - EXIT
    if [ "$with_ray" = 1 ]; then
      echo "# Ray head 127.0.0.1:$ray_port, dashboard and job API http://127.0.0.1:$ray_dashboard_port/"
    fi
    if [ "$db" = postgres ]; then
      # the owner's URL without its password, which libpq reads from PGPASSWORD
      echo "export MLFLOW_TRACKING_URI=http://127.0.0.1:$mlflow_port PRIVZO_LEDGER_URL=postgresql+psycopg://privzo_owner@$pg_host/privzo_ledger"
      if [ "$auth" = 1 ]; then
        echo 'export PGPASSWORD="$PRIVZO_LEDGER_OWNER_PASSWORD"   # the ledger owner'"'"'s'
        echo "# the worker charges the ledger as privzo_worker, registered datasets only; as its owner, first:"
        echo "#   $bin/privzo budget init DATASET --spec SPEC"
      else
        echo "export PGPASSWORD=\"\$(cat $state/ledger-owner-password)\"   # the ledger owner's, made for this stack"
      fi
      echo "# PostgreSQL keeps running after 'down': infra/postgres/test-db.sh stop"
    fi
    echo "# Prefect UI http://127.0.0.1:$prefect_port/   MLflow UI http://127.0.0.1:$mlflow_port/"
    echo "# then, with those exports: $bin/prefect deployment run private-train/digits-retrain-nightly --watch"
    echo "#   $bin/privzo budget show sklearn-digits"
    ;;
  down)
    stop_all
    ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
