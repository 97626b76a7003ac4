#!/usr/bin/env bash
# The test command: bootstrap a fresh clone, then run the whole suite. Extra arguments go to pytest.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO/scripts/bootstrap.sh"
cd "$REPO"
exec "$VENV/bin/python" -m pytest -ra "$@"
