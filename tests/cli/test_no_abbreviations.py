"""No command line of the product takes an abbreviated flag (`--grid ES` is not `--grids ES`). The entry points are
found, not listed: every `greenserve` command (from the CLI's own parser), every `greenserve bench` benchmark, every
console script of pyproject.toml and every file with a ``__main__`` block in services/, clients/python/ and
scripts/. Each is run with ``--help`` in this process; every argparse parser it builds (sub-commands' included) is
then given each of its long flags less the last letter, a prefix argparse would take for that flag with
abbreviations on, and must leave it unknown.

The walk runs in a child interpreter, once for the module: running forty entry points' top-level code in the test
process left state behind (a later test's forked worker processes hung)."""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import io
import json
import runpy
import subprocess
import sys
import tomllib
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from greenserve_client.cli import build_parser, main
from greenserve_client.commands.bench import BENCHMARKS

ROOT = Path(__file__).resolve().parents[2]
# files with a __main__ block and no flags to abbreviate
NO_FLAGS = {
    "services/common/parent_death.py": "a trampoline: PARENT_PID SIGNAL PROGRAM ARGV, exec'd by the supervisor",
    "services/vllm_cpu/engines.py": "takes no arguments: says whether vLLM engines can start here",
}


def _commands() -> list[str]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def _main_files() -> list[str]:
    files = [*ROOT.glob("services/**/*.py"), *ROOT.glob("clients/python/**/*.py"), *ROOT.glob("scripts/*.py")]
    found = []
    for path in sorted(files):
        rel = path.relative_to(ROOT).as_posix()
        if "/v1/" in rel or "node_modules" in rel:
            continue
        for node in ast.parse(path.read_text(encoding="utf-8"), rel).body:
            test = getattr(node, "test", None)
            if isinstance(node, ast.If) and ast.unparse(test) in ("__name__ == '__main__'", "'__main__' == __name__"):
                found.append(rel)
                break
    return found


def _console_scripts() -> list[str]:
    return sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"].values())


def _module_of(rel: str) -> str | None:
    """The importable name of a product file (greenserve.x.y for services/x/y.py), None for a script."""
    parts = Path(rel).with_suffix("").parts
    if parts[0] == "services":
        return ".".join(("greenserve", *parts[1:]))
    if parts[:2] == ("clients", "python"):
        return ".".join(parts[2:])
    return None


def _run_help(rel: str) -> None:
    """The file's __main__ block with argv ``--help``, as `python -m` (or `python FILE`) runs it."""
    module = _module_of(rel)
    saved = sys.argv
    sys.argv = [rel, "--help"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: "found in sys.modules" for imported modules
            if module is None:
                runpy.run_path(str(ROOT / rel), run_name="__main__")
            else:
                runpy.run_module(module.removesuffix(".__main__"), run_name="__main__", alter_sys=True)
    finally:
        sys.argv = saved


def _run_script(target: str) -> None:
    module, _, name = target.partition(":")
    entry = getattr(importlib.import_module(module), name)
    saved = sys.argv
    sys.argv = [module, "--help"]
    try:
        entry()
    finally:
        sys.argv = saved


class _Recorder:
    """Every argparse parser built while it is on: greenserve's Parser, a plain one, a sub-command's."""

    def __enter__(self) -> list[argparse.ArgumentParser]:
        self.parsers: list[argparse.ArgumentParser] = []
        self.init = argparse.ArgumentParser.__init__
        init, parsers = self.init, self.parsers

        def record(parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
            init(parser, *args, **kwargs)  # type: ignore[arg-type]
            parsers.append(parser)

        argparse.ArgumentParser.__init__ = record  # type: ignore[method-assign]
        return self.parsers

    def __exit__(self, *_: object) -> None:
        argparse.ArgumentParser.__init__ = self.init  # type: ignore[method-assign]


def _help(run: Callable[[], object]) -> None:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            pytest.raises(SystemExit) as info:
        run()
    assert info.value.code in (0, None)


def abbreviations_taken(parser: argparse.ArgumentParser) -> tuple[list[str], int]:
    """The abbreviated flags ``parser`` takes (each long flag less its last letter, where that prefix names no other
    flag), and how many were tried."""
    flags = [s for s in parser._option_string_actions if s.startswith("--") and s != "--help"]
    taken, tried = [], 0
    for flag in flags:
        short = flag[:-1]
        if len(short) < 4 or any(other != flag and other.startswith(short) for other in flags):
            continue
        action = parser._option_string_actions[flag]
        token = short if action.nargs == 0 else f"{short}=1"
        # a missing required flag, group or sub-command is not what this asks about
        required = [(a, a.required) for a in [*parser._actions, *parser._mutually_exclusive_groups]]
        for a, _ in required:
            a.required = False
        tried += 1
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                _, extras = parser.parse_known_args([token])
            if token not in extras:
                taken.append(flag)
        except SystemExit:  # the prefix was read as the flag and its value refused
            taken.append(flag)
        finally:
            for a, was in required:
                a.required = was
    return taken, tried


def _problems(parsers: list[argparse.ArgumentParser]) -> tuple[list[str], int]:
    if not parsers:
        return ["built no argparse parser"], 0
    problems, tried = [], 0
    for parser in parsers:
        taken, n = abbreviations_taken(parser)
        if taken:
            problems.append(f"{parser.prog} takes abbreviations of {taken}")
        tried += n
    return problems, tried


def entry_points() -> dict[str, Callable[[], object]]:
    """Each entry point by name, and how to run it with --help."""
    entries: dict[str, Callable[[], object]] = {}
    for command in _commands():
        entries[f"greenserve {command}"] = lambda command=command: main([command, "--help"])
    for name in sorted(BENCHMARKS):
        entries[f"greenserve bench {name}"] = lambda name=name: main(["bench", name, "--help"])
    for target in _console_scripts():
        entries[target] = lambda target=target: _run_script(target)
    for rel in _main_files():
        if rel not in NO_FLAGS:
            entries[rel] = lambda rel=rel: _run_help(rel)
    return entries


def walk() -> dict[str, tuple[list[str], int]]:
    """Each entry point's problems and how many abbreviations were tried (run in the child)."""
    out = {}
    for name, run in entry_points().items():
        with _Recorder() as parsers:
            try:
                _help(run)
            except BaseException as exc:  # noqa: BLE001 - reported, the walk goes on
                out[name] = ([f"--help failed: {exc!r}"], 0)
                continue
        if name.startswith("greenserve bench "):
            parsers = parsers[1:]  # `greenserve bench` itself, walked as a command
        out[name] = _problems(parsers)
    return out


@pytest.fixture(scope="module")
def walked() -> dict[str, tuple[list[str], int]]:
    code = "import json; from tests.cli.test_no_abbreviations import walk; print(json.dumps(walk()))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return {name: (problems, tried) for name, (problems, tried) in json.loads(done.stdout.splitlines()[-1]).items()}


def test_the_check_catches_a_parser_with_abbreviations() -> None:
    plain = argparse.ArgumentParser()
    plain.add_argument("--grids")
    plain.add_argument("--json", action="store_true")
    plain.add_argument("--hours", type=int, required=True)
    assert abbreviations_taken(plain) == (["--grids", "--json", "--hours"], 3)
    plain.allow_abbrev = False
    assert abbreviations_taken(plain) == ([], 3)


@pytest.mark.parametrize("name", sorted(entry_points()))
def test_no_entry_point_takes_abbreviations(name: str, walked: dict[str, tuple[list[str], int]]) -> None:
    problems, tried = walked[name]
    assert not problems, f"{name}: {problems}"
    # a command, a benchmark and a console script each have flags to try; a module's main may have --help only
    assert tried > 0 or name.endswith(".py"), f"{name}: no flag was tried"


def test_the_walk_finds_the_entry_points() -> None:
    """The discovery finds what it must (a walk that found nothing would pass everything)."""
    assert {"up", "demo", "status", "evaluate", "plan", "bench"} <= set(_commands())
    assert "cache-pareto" in BENCHMARKS
    mains = set(_main_files())
    assert {"services/router/__main__.py", "services/evaluation/breakdown.py", "scripts/real_engine_profile.py",
            "clients/python/greenserve_client/cli.py"} <= mains
    assert set(NO_FLAGS) <= mains, "an exempt file no longer has a __main__ block: drop it from NO_FLAGS"
    assert len(_console_scripts()) == 8
