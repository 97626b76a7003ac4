"""setup.py lists every folder of the two package roots, data folders included, so that `pip install -e .` prints
no "Package would be ignored" warning for them (issue 35: about 320 lines of such warnings buried the set-up)."""

from __future__ import annotations

import runpy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[2]
ROOTS = {"services": "greenserve", "clients/python/greenserve_client": "greenserve_client"}


def test_every_folder_with_files_is_a_listed_package(monkeypatch: pytest.MonkeyPatch) -> None:
    given: dict[str, Any] = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: given.update(kwargs))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"))
    tracked = subprocess.run(["git", "ls-files", *ROOTS], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    wanted = set()
    for file in tracked:
        folder = Path(file).parent.as_posix()
        root = next(r for r in ROOTS if folder == r or folder.startswith(r + "/"))
        wanted.add(ROOTS[root] + folder[len(root):].replace("/", "."))
    assert {"greenserve.evaluation.data", "greenserve.simulator.data.traces"} <= wanted
    assert wanted <= set(given["packages"])
    assert not [p for p in given["packages"] if "__pycache__" in p]
