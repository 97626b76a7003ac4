"""`bash scripts/test.sh --help` prints the script's own usage at once, without setting anything up (issue 35: it
bootstrapped the whole clone and then printed pytest's help)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_test_sh_help_is_its_own_and_sets_nothing_up(flag: str, tmp_path: Path) -> None:
    venv = tmp_path / "venv"  # bootstrap.sh would create it first
    done = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh"), flag], capture_output=True, text=True,
                          timeout=10, env={"PATH": "/usr/bin:/bin", "GREENSERVE_VENV": str(venv)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: bash scripts/test.sh")
    assert "bash scripts/test.sh tests/optimizer -x" in done.stdout and "minutes" in done.stdout
    assert not venv.exists() and done.stderr == ""
