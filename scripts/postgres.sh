#!/usr/bin/env bash
# A local PostgreSQL server for Optuna studies (docs/beyond-one-machine.md, tests/test_sweeps.py).
#
#   scripts/postgres.sh start DIR   initialise (once) and start a server whose data and Unix socket are
#                                   in DIR (created if missing); prints the study URL on its last line:
#                                   postgresql+psycopg2://postgres@/optuna?host=DIR
#   scripts/postgres.sh stop DIR    stop it (DIR is left for you to remove)
#   scripts/postgres.sh url DIR     print the URL again
#   scripts/postgres.sh install     find the server's programs, or install Debian's postgresql package
#                                   (root with apt-get only)
#
# The server listens on its Unix socket only (no TCP port): the machines of a sweep need a server
# they can reach over the network (see the docs page). Local connections are trusted; DIR is made
# private to the server's user, so only that user and root reach the socket. PostgreSQL refuses to run
# as root: as root the server runs as the user `postgres` (created if missing). PG_BIN=/path/to/bin
# picks the programs (default: the newest /usr/lib/postgresql/*/bin, else initdb on PATH).
# Exit status 3: no server programs and none could be installed.
set -euo pipefail

DATABASE=optuna
ROLE=postgres

die() { echo "postgres.sh: $1" >&2; exit "${2:-1}"; }

find_bin() {
    local dir
    for dir in "${PG_BIN:-}" $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [[ -n "$dir" && -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then echo "$dir"; return 0; fi
    done
    if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
        dirname "$(command -v initdb)"; return 0
    fi
    return 1
}

install_server() {
    if find_bin >/dev/null; then return 0; fi
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        die "no PostgreSQL server programs (initdb, pg_ctl) in /usr/lib/postgresql/*/bin or on PATH, and \
they cannot be installed here (needs root and apt-get): install PostgreSQL or set PG_BIN=/path/to/bin." 3
    fi
    echo "postgres.sh: installing Debian's postgresql package" >&2
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2 \
        || die "apt-get install postgresql failed (see above)." 3
    find_bin >/dev/null || die "postgresql installed, but initdb and pg_ctl are still not found." 3
}

# Run a server program as the server's user: `postgres` when we are root, else ourselves.
as_server() {
    if [[ $(id -u) -ne 0 ]]; then "$@"; return; fi
    if command -v runuser >/dev/null; then runuser -u postgres -- "$@"; return; fi
    su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
}

ensure_server_user() {
    [[ $(id -u) -ne 0 ]] && return 0
    id -u postgres >/dev/null 2>&1 && return 0
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin postgres \
        || die "could not create the user postgres (the server refuses to run as root)."
}

url() { echo "postgresql+psycopg2://$ROLE@/$DATABASE?host=$1"; }

start() {
    local dir=$1 bin
    install_server
    bin=$(find_bin)
    ensure_server_user
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [[ ${#dir} -le 90 ]] || die "$dir is too long for a Unix socket path (at most 90 characters): use a shorter DIR."
    if [[ $(id -u) -eq 0 ]]; then chown postgres: "$dir"; fi
    chmod 700 "$dir"
    as_server test -w "$dir" || die "the user postgres cannot write $dir (a parent folder is private): use a \
folder under /tmp, e.g. \$(mktemp -d)."
    if ! as_server "$bin/pg_ctl" status -D "$dir/data" >/dev/null 2>&1; then
        if [[ ! -f "$dir/data/PG_VERSION" ]]; then
            as_server "$bin/initdb" -D "$dir/data" -U "$ROLE" --auth=trust --encoding=UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
                || die "initdb failed: $(tail -5 "$dir/initdb.log")"
        fi
        as_server "$bin/pg_ctl" start -w -t 60 -D "$dir/data" -l "$dir/server.log" \
            -o "-c listen_addresses='' -c unix_socket_directories='$dir'" >/dev/null \
            || die "the server did not start: $(tail -5 "$dir/server.log")"
    fi
    if ! as_server "$bin/psql" -h "$dir" -U "$ROLE" -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$DATABASE'" | grep -q 1; then
        as_server "$bin/createdb" -h "$dir" -U "$ROLE" "$DATABASE"
    fi
    echo "postgres.sh: server of $dir running (socket only, log $dir/server.log)" >&2
    url "$dir"
}

stop() {
    local dir=$1 bin
    bin=$(find_bin) || die "no PostgreSQL server programs found." 3
    if as_server "$bin/pg_ctl" status -D "$dir/data" >/dev/null 2>&1; then
        as_server "$bin/pg_ctl" stop -w -m fast -D "$dir/data" >/dev/null
    fi
}

case "${1:-}" in
    start) [[ $# -eq 2 ]] || die "usage: $0 start DIR"; start "$2" ;;
    stop) [[ $# -eq 2 ]] || die "usage: $0 stop DIR"; stop "$2" ;;
    url) [[ $# -eq 2 ]] || die "usage: $0 url DIR"; url "$(cd "$2" && pwd)" ;;
    install) install_server; echo "postgres.sh: server programs in $(find_bin)" ;;
    *) die "usage: $0 {start DIR|stop DIR|url DIR|install}" ;;
esac
