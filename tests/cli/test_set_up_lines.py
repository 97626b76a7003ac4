"""The set-up that `bash scripts/run.sh` and `bash scripts/test.sh` source (scripts/bootstrap.sh) prints nothing when
everything is already installed: a later run.sh shows `greenserve up`'s own lines only, and a fresh clone's stays
under 40 lines before the services are up (its set-up steps one line each; `greenserve up`'s share is pinned in
tests/integration/test_up_numbers.py).

The run checks the installs this checkout already has (LMCache's and vLLM's virtualenvs, under their lock files; the
npm tools) and a stand-in for the project's virtualenv whose stamp says greenserve is installed as pyproject.toml and
setup.py now ask: it installs nothing, and the test skips, saying why, where an install is missing or was made under
another lock (it would install it)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the files whose change makes bootstrap.sh reinstall greenserve[dev]
STAMPED = ("pyproject.toml", "setup.py", "scripts/constraints.txt")


def _dependency_digest() -> str:
    """bootstrap.sh's stamp: sha256 of `sha256sum pyproject.toml setup.py scripts/constraints.txt`'s output (the paths
    as it names them)."""
    listing = "".join(f"{hashlib.sha256((ROOT / name).read_bytes()).hexdigest()}  {ROOT / name}\n"
                      for name in STAMPED)
    return hashlib.sha256(listing.encode()).hexdigest()


def _installed_under_lock(stamp: Path, lock: str) -> bool:
    """The install script's stamp exists and names the lock file as it is now (else the script reinstalls)."""
    digest = hashlib.sha256((ROOT / "scripts" / lock).read_bytes()).hexdigest()
    return stamp.is_file() and f"lock={digest}" in stamp.read_text().split()


def _missing_installs() -> list[str]:
    missing = []
    if not _installed_under_lock(ROOT / ".venv-lmcache" / ".greenserve-lmcache-installed", "constraints-lmcache.txt"):
        missing.append("LMCache's virtualenv (.venv-lmcache) under scripts/constraints-lmcache.txt")
    vllm = (ROOT / ".venv-vllm").resolve()
    if not _installed_under_lock(vllm / ".greenserve-vllm-installed", "constraints-vllm.txt"):
        missing.append("vLLM's virtualenv (.venv-vllm) under scripts/constraints-vllm.txt")
    elif not _installed_under_lock(Path(f"{vllm}-lmcache-0.5.6", ".greenserve-vllm-lmcache-installed"),
                                   "constraints-vllm-lmcache.txt"):
        missing.append("vLLM's virtualenv with LMCache (.venv-vllm-lmcache) under scripts/constraints-vllm-lmcache.txt")
    if shutil.which("npm"):
        for folder in ("protos", "clients/node"):
            modules, lock = ROOT / folder / "node_modules", ROOT / folder / "package-lock.json"
            if not modules.is_dir() or lock.stat().st_mtime > modules.stat().st_mtime:
                missing.append(f"{folder}/node_modules")
    return missing


def test_the_set_up_prints_nothing_when_everything_is_installed(tmp_path: Path) -> None:
    missing = _missing_installs()
    if missing:
        pytest.skip(f"not installed here (the set-up would install it): {', '.join(missing)}")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    (venv / ".greenserve-installed").write_text(_dependency_digest() + "\n")
    env = {**os.environ, "GREENSERVE_VENV": str(venv), "GREENSERVE_SKIP_SYSTEM": "1",
           "GREENSERVE_VLLM_VENV": str((ROOT / ".venv-vllm").resolve())}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap.sh")], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout + done.stderr == "", "the set-up printed lines with nothing to do"
    assert not list(venv.glob("lib/python*/site-packages/*")), "the set-up installed into the stand-in"


def test_the_stamp_is_what_bootstrap_computes(tmp_path: Path) -> None:
    """The stand-in's stamp above is the digest bootstrap.sh itself computes (else the test would install)."""
    script = (ROOT / "scripts" / "bootstrap.sh").read_text()
    line = next(line for line in script.splitlines() if line.startswith("want=") and "sha256sum" in line)
    done = subprocess.run(["bash", "-c", f'REPO="$1"; {line}; printf "%s" "$want"', "-", str(ROOT)],
                          capture_output=True, text=True, check=True, timeout=30)
    assert done.stdout.strip() == _dependency_digest()
