#!/usr/bin/env bash
# Start (or stop) a local PostgreSQL on 127.0.0.1:5432. For tests, `start` also makes the test role privzo
# (password privzo: a test fixture's, never a stack's) owning the database privzo and any others named;
# `server` only starts the server (what infra/local-stack.sh uses: its roles and passwords are its own).
# Installs Debian's postgresql if it is missing (needs root).
#   infra/postgres/test-db.sh start [DB ...]   -> prints "started" or "running", then the SQLAlchemy URL of privzo
#   infra/postgres/test-db.sh server           -> prints "started" or "running"
#   infra/postgres/test-db.sh stop
set -euo pipefail
action=${1:-start}
version() { ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1; }

if [ "$action" = stop ]; then
  v=$(version); [ -n "$v" ] && pg_ctlcluster "$v" main stop >/dev/null 2>&1 || true
  exit 0
fi

if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ -z "$(version)" ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >/dev/null
fi
v=$(version)
[ -d "/etc/postgresql/$v/main" ] || pg_createcluster "$v" main >/dev/null
if su postgres -c "pg_isready -q -h 127.0.0.1 -p 5432"; then
  state=running
else
  pg_ctlcluster "$v" main start >/dev/null
  state=started
fi
for _ in $(seq 1 30); do
  su postgres -c "pg_isready -q -h 127.0.0.1 -p 5432" && break
  sleep 1
done
if [ "$action" = server ]; then
  echo "$state"
  exit 0
fi
su postgres -c "psql -q -tAc \"SELECT 1 FROM pg_roles WHERE rolname='privzo'\"" | grep -q 1 ||
  su postgres -c "psql -q -c \"CREATE ROLE privzo LOGIN PASSWORD 'privzo'\""
shift || true
for db in privzo "$@"; do
  case "$db" in *[!a-z0-9_]*|"") echo "test-db.sh: database names are lower-case letters, digits and _ ($db)" >&2; exit 2;; esac
  su postgres -c "psql -q -tAc \"SELECT 1 FROM pg_database WHERE datname='$db'\"" | grep -q 1 ||
    su postgres -c "psql -q -c \"CREATE DATABASE $db OWNER privzo\""
done
echo "$state"
echo "postgresql+psycopg://privzo:privzo@127.0.0.1:5432/privzo"
