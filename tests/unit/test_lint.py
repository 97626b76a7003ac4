"""The repository's lint and type check, as configured in pyproject.toml, and the package data they rely on.

ruff checks services/, clients/, tests/ and scripts/ (RUF100 among its rules: a ``# noqa`` naming a rule that is
not configured, or that finds nothing there, is itself a finding). mypy checks both packages; it cannot follow
setuptools' editable import hook (``greenserve`` is the folder services/), so the test links both package names
into a folder on MYPYPATH.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGES = {"greenserve": ROOT / "services", "greenserve_client": ROOT / "clients" / "python" / "greenserve_client"}


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]'")
    return path


def test_ruff_finds_nothing() -> None:
    out = subprocess.run([_tool("ruff"), "check", "--output-format", "concise", "services", "clients", "tests",
                          "scripts"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_noqa_names_a_configured_rule() -> None:
    # RUF100 reports a noqa code that is not enabled; this pins that RUF100 stays in the rule set.
    lint = PYPROJECT["tool"]["ruff"]["lint"]
    assert "RUF100" in lint["select"] and "RUF100" not in lint.get("ignore", [])
    selected = tuple(lint["select"])
    codes = set()
    for path in [*ROOT.glob("services/**/*.py"), *ROOT.glob("clients/**/*.py"), *ROOT.glob("tests/**/*.py"),
                 *ROOT.glob("scripts/*.py")]:
        for match in re.finditer(r"#\s*noqa:\s*([A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)", path.read_text()):
            codes.update(c.strip() for c in match.group(1).split(","))
    assert codes, "no noqa found: the pattern is wrong"
    assert all(code.startswith(selected) for code in codes), sorted(c for c in codes if not c.startswith(selected))


def _mypy_ini(without_baseline: bool) -> str:
    """[tool.mypy] of pyproject.toml as a mypy.ini, less the list of modules whose errors are not reported."""
    conf = PYPROJECT["tool"]["mypy"]

    def value(v: object) -> str:
        return ", ".join(v) if isinstance(v, list) else str(v).lower() if isinstance(v, bool) else str(v)

    lines = ["[mypy]"] + [f"{k} = {value(v)}" for k, v in conf.items() if k != "overrides"]
    for override in conf.get("overrides", []):
        if without_baseline and override.get("ignore_errors"):
            continue
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        lines.append(f"[mypy-{','.join(modules)}]")
        lines += [f"{k} = {value(v)}" for k, v in override.items() if k != "module"]
    return "\n".join(lines) + "\n"


def _baseline() -> set[str]:
    return {m for o in PYPROJECT["tool"]["mypy"].get("overrides", []) if o.get("ignore_errors") for m in o["module"]}


@pytest.mark.slow
def test_mypy_reports_errors_only_in_the_listed_modules_and_in_each_of_them(tmp_path: Path) -> None:
    """One mypy run (13 s on 2 cores from an empty cache at load average 2.4, 82 s at load 8; seconds with its
    cache) without the baseline: every error is in a listed module, and every listed module still has one (else it leaves the
    list). With the list, as configured, mypy therefore passes."""
    # A fixed place for the links: mypy's cache records each module's path, and a new path each run defeats it.
    farm = ROOT / ".mypy_cache" / "test-packages"
    farm.mkdir(parents=True, exist_ok=True)
    for name, folder in PACKAGES.items():
        link = farm / name
        if not (link.is_symlink() and link.resolve() == folder.resolve()):
            link.unlink(missing_ok=True)
            link.symlink_to(folder, target_is_directory=True)
    ini = tmp_path / "mypy.ini"
    ini.write_text(_mypy_ini(without_baseline=True))
    env = {**os.environ, "MYPYPATH": str(farm)}
    out = subprocess.run([_tool("mypy"), "--config-file", str(ini), "--cache-dir", str(ROOT / ".mypy_cache" / "test"),
                          "--no-error-summary", "-p", "greenserve", "-p", "greenserve_client"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode in (0, 1), out.stdout + out.stderr  # 2: mypy itself failed (config, a crash)
    failing: dict[str, list[str]] = {}
    for line in out.stdout.splitlines():
        # the path as mypy first saw the module (its cache keeps it): named from the package folder on
        match = re.match(r"(?:.*/)?(greenserve(?:_client)?/.+?)\.py:\d+: error: ", line)
        if match:
            parts = match.group(1).split("/")
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            failing.setdefault(module, []).append(line)
    baseline = _baseline()
    new = {m: lines for m, lines in failing.items() if m not in baseline}
    assert not new, "type errors:\n" + "\n".join(line for lines in new.values() for line in lines)
    clean = sorted(baseline - set(failing))
    assert not clean, f"no type errors left: remove from [[tool.mypy.overrides]] in pyproject.toml: {clean}"


def test_py_typed_ships_with_both_packages(tmp_path: Path) -> None:
    """setuptools' build copies the PEP 561 markers (package data) next to the modules."""
    out = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in PACKAGES:
        assert (tmp_path / name / "py.typed").is_file(), f"{name}/py.typed is not in the build"
        assert (tmp_path / name / "__init__.py").is_file()
