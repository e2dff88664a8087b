#!/bin/sh
# The part of the official postgres image's entrypoint that compose and the tests use:
# initialise PGDATA from POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB on first start,
# accept password connections from anywhere, run the server as `postgres`.
set -eu
if [ "${1:-}" != "postgres" ]; then
  exec "$@"
fi
user="${POSTGRES_USER:-postgres}"
mkdir -p "$PGDATA" /var/run/postgresql
chown -R postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
  pwfile="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  chown postgres "$pwfile"
  runuser -u postgres -- initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  if [ -n "${POSTGRES_DB:-}" ] && [ "$POSTGRES_DB" != "$user" ]; then
    runuser -u postgres -- postgres --single -D "$PGDATA" -c listen_addresses='' postgres \
      <<SQL >/dev/null
CREATE DATABASE "$POSTGRES_DB" OWNER "$user";
SQL
  fi
fi
shift
exec runuser -u postgres -- postgres -D "$PGDATA" -c listen_addresses='*' "$@"
