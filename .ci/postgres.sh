#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the store's tests, on 127.0.0.1 only, and print the
# one line the caller evals:
#     eval "$(bash .ci/postgres.sh)"   ->   export COEVO_TEST_PG_URL=postgresql+psycopg://...
# Everything else goes to stderr. Idempotent: a second call finds the cluster initialised and
# the server running, and prints the same line. Works as root (the server itself runs as the
# `postgres` system user, since PostgreSQL refuses to run as root) and as an ordinary user.
#
# The cluster is private to coevo (its own data folder and port), so it never touches a
# system cluster. Durability is switched off (fsync, synchronous_commit, full_page_writes):
# test databases are created and dropped by the hundred and nothing in them must survive.
# Autovacuum is off too: it has nothing to do in them, and its workers race the drops.
#
# Settings (environment): COEVO_PG_DATA (data folder, default /var/tmp/coevo-pg),
# COEVO_PG_PORT (default 54329).
set -euo pipefail

DATA="${COEVO_PG_DATA:-/var/tmp/coevo-pg}"
PORT="${COEVO_PG_PORT:-54329}"
ROLE=coevo
PASSWORD=coevo
DB=coevo

log() { echo "postgres.sh: $*" >&2; }

find_bin() {
    # Debian puts the server binaries under /usr/lib/postgresql/<major>/bin; take the newest.
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]]; then echo "$d"; return; fi
    if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
        dirname "$(command -v initdb)"
    fi
}

BIN=$(find_bin)
if [[ -z "$BIN" ]]; then
    if [[ $(id -u) -ne 0 ]]; then
        log "PostgreSQL server binaries not found and not root: install the Debian package postgresql"
        exit 1
    fi
    log "installing PostgreSQL (apt-get) ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    BIN=$(find_bin)
    [[ -n "$BIN" ]] || { log "PostgreSQL installed but initdb/pg_ctl not found"; exit 1; }
fi

# Run server commands as `postgres` when we are root; as ourselves otherwise.
if [[ $(id -u) -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
    as_pg() { runuser -u postgres -- "$@"; }
else
    as_pg() { "$@"; }
fi

mkdir -p "$DATA"
[[ $(id -u) -eq 0 ]] && chown postgres:postgres "$DATA"
chmod 700 "$DATA"

if [[ ! -f "$DATA/PG_VERSION" ]]; then
    log "initialising a cluster in $DATA"
    # Local (socket) connections are trusted for the superuser that sets things up; TCP needs
    # the password.
    # C.UTF-8 is built into Debian 12's glibc, so no locale package is needed.
    as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
        -E UTF8 --locale=C.UTF-8 >&2
fi

if ! as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    log "starting the server on 127.0.0.1:$PORT"
    as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DATA -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c autovacuum=off -c max_connections=200" \
        start >&2 || { log "server failed to start; its log:"; tail -n 30 "$DATA/server.log" >&2; exit 1; }
fi

psql_su() { as_pg psql -X -q -h "$DATA" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -tA "$@"; }

if [[ "$(psql_su -c "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'")" != "1" ]]; then
    log "creating role $ROLE"
    psql_su -c "CREATE ROLE $ROLE LOGIN CREATEDB PASSWORD '$PASSWORD'" >&2
fi
# The tests drop each database WITH (FORCE), which terminates whatever is still connected to
# it: an autovacuum worker of a server started without autovacuum=off (one already running)
# is not the role's own process, and without pg_signal_backend the drop fails.
psql_su -c "GRANT pg_signal_backend TO $ROLE" >&2
if [[ "$(psql_su -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != "1" ]]; then
    log "creating database $DB"
    psql_su -c "CREATE DATABASE $DB OWNER $ROLE" >&2
fi

echo "export COEVO_TEST_PG_URL=postgresql+psycopg://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DB"
