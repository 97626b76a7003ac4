"""scripts/constraints.txt, the exact versions bootstrap installs, agrees with pyproject.toml and with this environment.

A release published overnight must not change what CI tests (a new grpcio-tools once made the checked-in stubs
stale), so bootstrap installs greenserve[dev] under these pins; these checks make an edit of pyproject.toml
without a re-lock (python scripts/lock_python.py --keep) fail here, by name, instead of in pip's resolver.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.lock_files import read_lock

ROOT = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, Version]:
    return read_lock("constraints.txt")


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": "dev"})]


def test_every_requirement_is_pinned_inside_its_range() -> None:
    pins = _pins()
    missing = [str(r) for r in _requirements() if canonicalize_name(r.name) not in pins]
    assert not missing, f"not in scripts/constraints.txt: {missing}; run python scripts/lock_python.py --keep"
    outside = [f"{r} but {pins[canonicalize_name(r.name)]} is pinned" for r in _requirements()
               if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]
    assert not outside, f"pins outside pyproject.toml's ranges: {outside}; run python scripts/lock_python.py --keep"


def test_this_environment_has_the_pinned_versions() -> None:
    """What the tests run on is what was locked (bootstrap installed it with -c scripts/constraints.txt)."""
    differ = []
    for name, version in _pins().items():
        try:
            installed = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            continue  # a dependency of another platform's marker, or pulled by an extra not installed here
        if installed != version:
            differ.append(f"{name} {installed} installed, {version} pinned")
    assert not differ, f"{differ}: run bash scripts/bootstrap.sh (or re-lock with python scripts/lock_python.py)"
