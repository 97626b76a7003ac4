"""Every command line's --help prints and exits 0 (a '%' in a help text is a format directive to argparse: a
strategy's 'accuracy loss <= 4 %' once ended `greenserve evaluate --help` in a traceback), and reads well: no
sentence cut off, every default shown, no `{int,null}` types, no abbreviations. And no parser bypasses the common
one."""

from __future__ import annotations

import argparse
import ast
import importlib
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from greenserve_client.cli import DELEGATED_COMMANDS, main
from greenserve_client.commands.bench import BENCHMARKS

from greenserve.common.cli_parser import Parser
from greenserve.common.config import load_settings

COMMANDS = ["up", "demo", "status", *DELEGATED_COMMANDS]
OWN_PARSER_BENCHMARKS = sorted(BENCHMARKS)
MODULE_MAINS = ["greenserve.evaluation.breakdown", "greenserve.bench.router_bookkeeping",
                "greenserve.bench.router_engine", "greenserve.bench.router_grpc_message",
                "greenserve.bench.router_workers", "greenserve_client.lmcache_control",
                "greenserve.simulator.emulator.__main__"]
SETTINGS = ["greenserve.forecaster.settings:ForecasterSettings", "greenserve.profiler.service:ProfilerSettings",
            "greenserve.optimizer.service:OptimizerSettings", "greenserve.cache_manager.settings:CacheManagerSettings",
            "greenserve.gpu_partitioner.service:GpuPartitionerSettings", "greenserve.router.settings:RouterSettings"]
# a help text or description ending on one of these words was cut off mid-sentence
DANGLING = {"a", "an", "and", "by", "for", "from", "its", "of", "or", "the", "their", "to", "with"}


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[Parser]:
    """Every Parser built while the test runs (sub-commands' included)."""
    parsers: list[Parser] = []
    init = Parser.__init__

    def record(self: Parser, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)
        parsers.append(self)

    monkeypatch.setattr(Parser, "__init__", record)
    return parsers


def _help(run: Callable[[], object], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        run()
    assert info.value.code in (0, None)
    return capsys.readouterr().out


def _entry(target: str) -> Callable[[list[str]], object]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name or "main")


def _check(parsers: list[Parser]) -> None:
    assert parsers, "the command built no greenserve Parser (plain argparse: abbreviations on, no defaults)"
    for parser in parsers:
        assert parser.allow_abbrev is False, parser.prog
        text = parser.format_help()
        assert not re.search(r"\{[^}]*null[^}]*\}|\(default: null\)", text), (parser.prog, text)
        words = [(parser.description or "", "description")] + [
            (a.help, "/".join(a.option_strings) or a.dest) for a in parser._actions
            if a.help and a.help != argparse.SUPPRESS]
        for words_of, where in words:
            last = re.sub(r"[^\w]+$", "", words_of.strip()).rsplit(None, 1)[-1:] if words_of.strip() else []
            ends_on_word = words_of.strip()[-1:].isalnum()
            cut = (last and ends_on_word and last[0] in DANGLING) or words_of.rstrip().endswith((",", ";"))
            assert not cut, f"{parser.prog} {where}: {words_of!r}"
        formatter = parser._get_formatter()
        for action in parser._actions:
            shown = action.help not in (None, argparse.SUPPRESS) and action.option_strings
            worth = action.default not in (None, False, argparse.SUPPRESS, "") and not isinstance(action.default, list)
            if shown and worth:
                assert "default" in formatter._expand_help(action).lower(), f"{parser.prog} {action.option_strings}"


@pytest.mark.parametrize("command", COMMANDS)
def test_help_exits_0_and_reads_well(command: str, made: list[Parser], capsys: pytest.CaptureFixture[str]) -> None:
    assert "usage: greenserve" in _help(lambda: main([command, "--help"]), capsys)
    _check(made)


@pytest.mark.parametrize("name", OWN_PARSER_BENCHMARKS)
def test_bench_help_reads_well(name: str, made: list[Parser], capsys: pytest.CaptureFixture[str]) -> None:
    assert "usage: greenserve bench" in _help(lambda: main(["bench", name, "--help"]), capsys)
    _check(made[1:])  # made[0] is `greenserve bench` itself, checked with the commands


@pytest.mark.parametrize("module", MODULE_MAINS)
def test_module_help_reads_well(module: str, made: list[Parser], capsys: pytest.CaptureFixture[str]) -> None:
    assert "usage:" in _help(lambda: _entry(module)(["--help"]), capsys)
    _check(made)


@pytest.mark.parametrize("target", SETTINGS)
def test_service_help_shows_plain_types(target: str, made: list[Parser], capsys: pytest.CaptureFixture[str]) -> None:
    settings = _entry(target)
    text = _help(lambda: load_settings(settings, ["--help"], prog="greenserve-x"), capsys)  # type: ignore[arg-type]
    assert "--port int " in text and "--tls-cert Path " in text
    _check(made)


def test_evaluate_description_is_whole(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(_help(lambda: main(["evaluate", "--help"]), capsys).split())
    assert "the planner and the simulator, hour by hour" in text
    assert "--hours HOURS hours of the day to replay (1..24) (default: 24)" in text


ROOT = Path(__file__).resolve().parents[2]
# files run by an interpreter without greenserve installed (vLLM's, or before the bootstrap installs it): they build
# a plain ArgumentParser, and must switch abbreviations off themselves
STANDALONE = {"services/vllm_cpu/tiny_model.py", "scripts/gen_protos.py"}


def test_no_parser_bypasses_the_common_one() -> None:
    """Every `ArgumentParser(...)` in the product and its scripts is greenserve.common.cli_parser's Parser (or, in a
    standalone file, passes allow_abbrev=False)."""
    offenders = []
    for path in sorted([*ROOT.glob("services/**/*.py"), *ROOT.glob("clients/**/*.py"), *ROOT.glob("scripts/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "services/common/cli_parser.py" or "/v1/" in rel:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) ==
                    "ArgumentParser"):
                continue
            no_abbrev = any(k.arg == "allow_abbrev" and getattr(k.value, "value", True) is False
                            for k in node.keywords)
            if not (rel in STANDALONE and no_abbrev):
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, f"plain argparse parsers (use greenserve.common.cli_parser.Parser): {offenders}"
