#!/bin/sh
# Runs once, when the volume is new: the ledger's worker role, which the ledger's owner (privzo) then grants
# a worker's rights (service ledger-grants: privzo budget grant privzo_worker). Its password comes from the
# environment, never from the repository.
set -eu
psql -v ON_ERROR_STOP=1 -v pw="$PRIVZO_LEDGER_WORKER_PASSWORD" -U "$POSTGRES_USER" -d "$POSTGRES_DB" <<'SQL'
CREATE ROLE privzo_worker LOGIN PASSWORD :'pw';
SQL
