#!/usr/bin/env bash
# The test command: bootstrap a fresh clone, then run the whole suite. Extra arguments go to pytest.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
    cat <<'EOF'
usage: bash scripts/test.sh [PYTEST ARGS...]

Sets up a fresh clone (the .venv with greenserve and its dev tools, the npm tools, LMCache in .venv-lmcache,
Debian's postgresql package; each step is skipped once done), then runs the test suite with pytest.
Arguments go to pytest; without any, the whole suite runs: about 47 minutes on 2 CPU cores (CI), plus the
first set-up (a few minutes).

A quick subset:
  bash scripts/test.sh tests/optimizer -x         one folder, stop at the first failure
  bash scripts/test.sh tests/cli -k help          the tests whose names match
  bash scripts/test.sh -m "not slow and not postgres"   skip the slow and the PostgreSQL tests
Once set up, .venv/bin/python -m pytest ... runs the same without the set-up checks.

  GREENSERVE_SKIP_SYSTEM=1   do not install system packages (PostgreSQL); its tests then skip, saying why
  -h, --help                 this text (pytest's own: .venv/bin/python -m pytest --help)
EOF
}

if [ "$#" -eq 1 ] && { [ "$1" = "-h" ] || [ "$1" = "--help" ]; }; then
    usage
    exit 0
fi
source "$REPO/scripts/bootstrap.sh"
cd "$REPO"
exec "$VENV/bin/python" -m pytest -ra "$@"
