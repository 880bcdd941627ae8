#!/bin/sh
# Runs once, when the volume is new: one role and one database per service, so that no service reads
# another's (MLflow's registry, Prefect's flow runs, the ledger): privzo_prefect and privzo_mlflow own their
# servers' databases; privzo_owner owns the ledger (it registers lifetimes and grants, service
# ledger-grants); privzo_worker charges it, once the owner has granted it a worker's rights. Passwords come
# from the environment, never from the repository, and reach psql on its stdin as hex (no quoting, and
# nothing on a command line).
set -eu
hex() { printf '%s' "$1" | od -An -tx1 | tr -d ' \n'; }
role() {  # NAME PASSWORD
  printf 'CREATE ROLE %s LOGIN;\n' "$1"
  printf "SELECT format('ALTER ROLE %%I PASSWORD %%L', '%s', convert_from(decode('%s', 'hex'), 'UTF8')) \\gexec\n" \
    "$1" "$(hex "$2")"
}
database() {  # NAME OWNER: only its owner (and roles granted CONNECT) reach it
  printf 'CREATE DATABASE %s OWNER %s;\nREVOKE CONNECT, TEMPORARY ON DATABASE %s FROM PUBLIC;\n' "$1" "$2" "$1"
}
{
  role privzo_owner "$PRIVZO_LEDGER_OWNER_PASSWORD"
  role privzo_worker "$PRIVZO_LEDGER_WORKER_PASSWORD"
  role privzo_prefect "$PRIVZO_PREFECT_DB_PASSWORD"
  role privzo_mlflow "$PRIVZO_MLFLOW_DB_PASSWORD"
  database privzo_ledger privzo_owner
  database privzo_prefect privzo_prefect
  database privzo_mlflow privzo_mlflow
  echo "GRANT CONNECT ON DATABASE privzo_ledger TO privzo_worker;"
} | psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres
