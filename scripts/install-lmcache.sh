#!/usr/bin/env bash
# Install LMCache 0.5.6 into its OWN virtualenv (its pins clash with greenserve's), so that the
# cache-manager tests and `greenserve up` can start real `lmcache server` processes on CPU.
#
# The virtualenv is .venv-lmcache in the repo root (GREENSERVE_LMCACHE_VENV overrides). torch is
# the CPU build (torch==2.13.0 from the CPU wheel index): an unpinned torch would pull several GB
# of CUDA wheels that the CPU-only server never uses. Idempotent: a stamp file records what was
# installed, and a later run with the same pins only checks that `lmcache` still imports.
#
# Every other package is locked too: pip installs under scripts/constraints-lmcache.txt (-c), the versions the
# tests passed on, so that a release of one of LMCache's dependencies cannot change CI's install overnight. The
# stamp holds the lock's sha256, so a changed lock reinstalls; re-lock with `python scripts/lock_python.py
# --engines` (DEVELOPERS.md, "Dependencies and the lock").
#
# Usage: bash scripts/install-lmcache.sh
#   GREENSERVE_LMCACHE_VENV   where the virtualenv lives (default <repo>/.venv-lmcache)
#   PYTHON                    interpreter to create it with (default python3, 3.10-3.12)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GREENSERVE_LMCACHE_VENV:-$REPO/.venv-lmcache}"
PYTHON_BIN="${PYTHON:-python3}"

LMCACHE_VERSION="0.5.6"
TORCH_VERSION="2.13.0"
# Upper bounds that lmcache 0.5.6's own requirements leave open but its code does not support.
EXTRA_PINS=("numpy<=2.2.6" "protobuf<7" "opentelemetry-api<=1.40")
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"
LOCK="$REPO/scripts/constraints-lmcache.txt"

log() { printf 'install-lmcache: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ -f "$LOCK" ] || die "the lock file $LOCK is missing"
want="lmcache==$LMCACHE_VERSION torch==$TORCH_VERSION ${EXTRA_PINS[*]} lock=$(sha256sum "$LOCK" | cut -d' ' -f1)"
stamp="$VENV/.greenserve-lmcache-installed"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/lmcache" ] \
    && "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('lmcache') != '$LMCACHE_VERSION')" 2>/dev/null; then
    exit 0
fi

command -v "$PYTHON_BIN" >/dev/null 2>&1 || die "$PYTHON_BIN not found (set PYTHON to a Python 3.10-3.12 interpreter)"
if [ ! -x "$VENV/bin/python" ]; then
    log "creating virtualenv $VENV"
    "$PYTHON_BIN" -m venv "$VENV" || die "could not create the virtualenv at $VENV"
fi
# -qq: errors only (a local wheel mirror makes pip warn once per package otherwise).
PIP=("$VENV/bin/python" -m pip install -qq --disable-pip-version-check -c "$LOCK")

log "installing torch==$TORCH_VERSION (CPU build)"
# The CPU wheel carries the local version "+cpu". A configured wheel mirror (pip's find-links /
# extra index) may hold it; otherwise PyTorch's CPU index does, added as an extra index so that torch's
# dependencies still come at their locked versions from the configured one. The exact "+cpu" pin never lets
# pip take a CUDA build.
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__ == '$TORCH_VERSION+cpu' else 1)" 2>/dev/null; then
    "${PIP[@]}" "torch==$TORCH_VERSION+cpu" 2>/dev/null \
        || "${PIP[@]}" "torch==$TORCH_VERSION+cpu" --extra-index-url "$TORCH_CPU_INDEX" \
        || die "pip could not install torch==$TORCH_VERSION+cpu (neither from the configured indexes nor $TORCH_CPU_INDEX)"
fi

log "installing lmcache==$LMCACHE_VERSION"
"${PIP[@]}" "lmcache==$LMCACHE_VERSION" "torch==$TORCH_VERSION+cpu" "${EXTRA_PINS[@]}" \
    || die "pip could not install lmcache==$LMCACHE_VERSION"

if ! err="$(LMCACHE_TRACK_USAGE=false "$VENV/bin/python" -c 'import lmcache' 2>&1)"; then
    die "lmcache was installed but does not import: $err"
fi
[ -x "$VENV/bin/lmcache" ] || die "lmcache was installed but its console script $VENV/bin/lmcache is missing"
echo "$want" > "$stamp"
log "ready: $VENV/bin/lmcache"
