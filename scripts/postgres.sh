# Starts a throwaway PostgreSQL server for the tests; sourced by scripts/test.sh (bash).
#
# - Does nothing when DDBPIPE_TEST_POSTGRES_URL is already set (bring your own server).
# - Finds pg_ctl/initdb on PATH or in /usr/lib/postgresql/*/bin (newest version first); when
#   missing, installs Debian's `postgresql` package with apt-get (needs root).
# - initdb's a data directory under a fresh `mktemp -d` as the unprivileged `postgres` OS user
#   when running as root (PostgreSQL refuses to run as root; the user is created if missing),
#   starts the server on a free loopback port (unix socket in the same directory, fsync off,
#   TLS on with a throwaway self-signed certificate when `openssl` is available), creates the
#   login role `ddbpipe` (random password; CREATEDB and CREATEROLE, which one test needs to
#   make a role without the TEMPORARY privilege in a database of its own) and the database
#   `ddbpipe_test` owned by it, and exports DDBPIPE_TEST_POSTGRES_URL. A server of your own
#   needs a role with the same rights.
# - An EXIT trap stops the server and removes the directory (it replaces any earlier EXIT trap
#   of the sourcing shell).
# Quiet on success; on failure prints what failed with the server's log and returns non-zero.

ddbpipe_pg_fail() {
  echo "scripts/postgres.sh: $*" >&2
  local log
  for log in setup.log server.log; do
    if [ -n "${DDBPIPE_PG_DIR:-}" ] && [ -s "$DDBPIPE_PG_DIR/$log" ]; then
      echo "--- $log ---" >&2
      tail -n 30 "$DDBPIPE_PG_DIR/$log" >&2
    fi
  done
  return 1
}

# Runs a command as the server's OS user (`postgres` when we are root, else ourselves).
ddbpipe_pg_as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

ddbpipe_pg_find_bin() {
  if command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
    # PATH may hold symlinks (e.g. /usr/local/bin/pg_ctl); the server binaries and psql sit next
    # to the real pg_ctl.
    DDBPIPE_PG_BIN="$(dirname "$(readlink -f "$(command -v pg_ctl)")")"
    [ -x "$DDBPIPE_PG_BIN/initdb" ] || DDBPIPE_PG_BIN=""
  fi
  if [ -z "${DDBPIPE_PG_BIN:-}" ]; then
    local dir
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
      if [ -x "$dir/pg_ctl" ] && [ -x "$dir/initdb" ]; then
        DDBPIPE_PG_BIN="$dir"
        break
      fi
    done
  fi
  [ -n "${DDBPIPE_PG_BIN:-}" ]
}

ddbpipe_pg_free_port() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
    return
  fi
  local port
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  return 1
}

ddbpipe_pg_stop() {
  if [ -n "${DDBPIPE_PG_DIR:-}" ] && [ -d "$DDBPIPE_PG_DIR" ]; then
    if [ -f "$DDBPIPE_PG_DIR/data/postmaster.pid" ]; then
      ddbpipe_pg_as_owner "$DDBPIPE_PG_BIN/pg_ctl" -D "$DDBPIPE_PG_DIR/data" -m immediate -w stop \
        >/dev/null 2>&1 || true
    fi
    rm -rf "$DDBPIPE_PG_DIR"
  fi
}

ddbpipe_pg_start() {
  if [ -n "${DDBPIPE_TEST_POSTGRES_URL:-}" ]; then
    return 0
  fi

  if ! ddbpipe_pg_find_bin; then
    if [ "$(id -u)" -ne 0 ]; then
      ddbpipe_pg_fail "pg_ctl/initdb not found (PATH, /usr/lib/postgresql/*/bin) and not root to install them; install PostgreSQL or set DDBPIPE_TEST_POSTGRES_URL"
      return 1
    fi
    echo "scripts/postgres.sh: installing postgresql with apt-get" >&2
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql; } \
      >/tmp/ddbpipe-apt-postgresql.log 2>&1 || {
      tail -n 40 /tmp/ddbpipe-apt-postgresql.log >&2
      ddbpipe_pg_fail "installing the postgresql package failed (log above)"
      return 1
    }
    ddbpipe_pg_find_bin || {
      ddbpipe_pg_fail "pg_ctl/initdb still not found after installing postgresql"
      return 1
    }
  fi

  if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --user-group --home-dir /nonexistent --shell /usr/sbin/nologin postgres || {
      ddbpipe_pg_fail "cannot create the postgres OS user"
      return 1
    }
  fi

  DDBPIPE_PG_DIR="$(mktemp -d "${TMPDIR:-/tmp}/ddbpipe-pg.XXXXXX")" || {
    ddbpipe_pg_fail "mktemp -d failed"
    return 1
  }
  trap ddbpipe_pg_stop EXIT
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$DDBPIPE_PG_DIR"
  fi
  chmod 700 "$DDBPIPE_PG_DIR"

  # setup.log: our commands' output (written by this shell); server.log: the server's own log
  # (written by the server's OS user).
  local data="$DDBPIPE_PG_DIR/data" log="$DDBPIPE_PG_DIR/setup.log" sock="$DDBPIPE_PG_DIR"
  ddbpipe_pg_as_owner "$DDBPIPE_PG_BIN/initdb" -D "$data" -U postgres -E UTF8 --no-locale --no-sync \
    --auth-local=trust --auth-host=scram-sha-256 >"$log" 2>&1 || {
    ddbpipe_pg_fail "initdb failed"
    return 1
  }

  local ssl_opts=""
  if command -v openssl >/dev/null 2>&1 &&
    ddbpipe_pg_as_owner openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=localhost \
      -keyout "$data/server.key" -out "$data/server.crt" >>"$log" 2>&1 &&
    chmod 600 "$data/server.key"; then
    ssl_opts="-c ssl=on"
  fi

  local port="" started=""
  for _ in 1 2 3; do
    port="$(ddbpipe_pg_free_port)" || break
    if ddbpipe_pg_as_owner "$DDBPIPE_PG_BIN/pg_ctl" -D "$data" -l "$DDBPIPE_PG_DIR/server.log" -w -t 60 \
      -o "-h 127.0.0.1 -p $port -k $sock -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 $ssl_opts" \
      start >>"$log" 2>&1; then
      started=1
      break
    fi
  done
  [ -n "$started" ] || {
    ddbpipe_pg_fail "the PostgreSQL server did not start"
    return 1
  }

  local password psql="$DDBPIPE_PG_BIN/psql"
  [ -x "$psql" ] || psql="$(command -v psql)" || {
    ddbpipe_pg_fail "psql not found"
    return 1
  }
  password="$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
  "$psql" -h "$sock" -p "$port" -U postgres -d postgres -qAtX -v ON_ERROR_STOP=1 \
    -c "CREATE ROLE ddbpipe LOGIN CREATEDB CREATEROLE PASSWORD '$password'" \
    -c "CREATE DATABASE ddbpipe_test OWNER ddbpipe" >>"$log" 2>&1 || {
    ddbpipe_pg_fail "creating the ddbpipe role and ddbpipe_test database failed"
    return 1
  }

  export DDBPIPE_TEST_POSTGRES_URL="postgres://ddbpipe:$password@127.0.0.1:$port/ddbpipe_test?sslmode=disable"
}

ddbpipe_pg_start || return 1
