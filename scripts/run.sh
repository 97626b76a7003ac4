#!/usr/bin/env bash
# The main job: bootstrap a fresh clone, then start all six services locally (SQLite files in
# .greenserve/, one process each) until Ctrl-C. Extra arguments go to `greenserve up`.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GREENSERVE_SKIP_SYSTEM="${GREENSERVE_SKIP_SYSTEM:-1}"
source "$REPO/scripts/bootstrap.sh"
cd "$REPO"
exec "$VENV/bin/greenserve" up "$@"
