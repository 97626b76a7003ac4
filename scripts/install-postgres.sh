#!/usr/bin/env bash
# Install the PostgreSQL server binaries (initdb, pg_ctl, postgres) that the persistence tests use.
#
# The tests start their own throw-away server from these binaries (tests/persistence/conftest.py);
# this script only makes sure Debian's `postgresql` package is there. It is idempotent: when
# initdb and pg_ctl are already present it changes nothing. It does not create or start the
# distribution's default cluster (no server is left running, no port is taken).
#
# Usage: bash scripts/install-postgres.sh        (as root, or as a user with sudo)
set -euo pipefail

log() { printf 'install-postgres: %s\n' "$*" >&2; }

find_pg_bindir() {
    local dir
    # Debian/Ubuntu layout: /usr/lib/postgresql/<major>/bin, newest major first.
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -V -r); do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
            printf '%s\n' "$dir"
            return 0
        fi
    done
    # Elsewhere (other distributions, Homebrew, a source build): on PATH.
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
        return 0
    fi
    return 1
}

if bindir="$(find_pg_bindir)"; then
    log "PostgreSQL server binaries already installed: $bindir ($("$bindir/initdb" --version))"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    log "initdb/pg_ctl not found and apt-get is not available."
    log "Install the PostgreSQL server package of your system (it must provide initdb and pg_ctl)."
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"  # never wait on a password prompt (CI)
    else
        log "initdb/pg_ctl not found; installing them needs root or password-less sudo."
        log "Run as root: apt-get install postgresql   (or: sudo bash scripts/install-postgres.sh)"
        exit 1
    fi
fi

# Do not let the package create and start a 'main' cluster: the tests run their own server.
$SUDO mkdir -p /etc/postgresql-common/createcluster.d
printf 'create_main_cluster = false\n' | $SUDO tee /etc/postgresql-common/createcluster.d/greenserve-no-main.conf >/dev/null

export DEBIAN_FRONTEND=noninteractive
log "installing Debian's postgresql package"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends postgresql >/dev/null

if bindir="$(find_pg_bindir)"; then
    log "installed: $bindir ($("$bindir/initdb" --version))"
else
    log "the postgresql package was installed but initdb/pg_ctl were not found"
    exit 1
fi

# The tests run the server as this user when they are started as root (initdb refuses root).
if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
    log "warning: no 'postgres' system user; tests started as root will skip PostgreSQL"
fi
