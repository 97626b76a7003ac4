"""Every command line's --help prints and exits 0 (found by an adversarial audit of the CLI: `greenserve evaluate
--help` ended in a ValueError traceback, argparse reading the '%' of a strategy's description, 'accuracy loss <= 4 %)',
as a format directive), and reads well (issue 35): no sentence cut off, every default shown, no `{int,null}` types,
no abbreviations."""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Callable

import pytest
from greenserve_client.cli import DELEGATED_COMMANDS, main
from greenserve_client.commands.bench import BENCHMARKS

from greenserve.common.cli_parser import Parser
from greenserve.common.config import load_settings

COMMANDS = ["up", "demo", "status", *DELEGATED_COMMANDS]
# cache-pareto's parser lives in the optimizer's solvers (another team's code); it still answers --help
OWN_PARSER_BENCHMARKS = sorted(set(BENCHMARKS) - {"cache-pareto"})
MODULE_MAINS = ["greenserve.evaluation.breakdown", "greenserve.router.bench_bookkeeping",
                "greenserve.router.bench_engine", "greenserve.router.bench_grpc_message",
                "greenserve.router.bench_workers", "greenserve_client.lmcache_control",
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
