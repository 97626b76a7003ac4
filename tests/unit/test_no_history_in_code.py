"""Comments and docstrings say what the code does and why, not what changed: history belongs in commits and docs.

Checks the product's sources (services/, clients/, scripts/; not the generated protobuf modules) for issue
references and for "Before, ..." narratives.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HISTORY = re.compile(r"(?i:\bissue[ -]#?\d+)|\bBefore, ")


def sources() -> list[Path]:
    files = [*ROOT.glob("services/**/*.py"), *ROOT.glob("clients/**/*.py"), *ROOT.glob("scripts/**/*.py")]
    return sorted(p for p in files if not re.search(r"_pb2(_grpc)?\.py$", p.name))


def history_lines(text: str) -> list[tuple[int, str]]:
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)]


def test_the_pattern_finds_history_and_spares_ordinary_words() -> None:
    assert history_lines("x = 1  # see issue 36, fault 5\n") == [(1, "x = 1  # see issue 36, fault 5")]
    assert history_lines('"""Before, a slice took the first profile."""\n')
    assert history_lines("# (Issue #12)\n")
    assert not history_lines("# the issue: a stale plan; before the first plan arrives, nothing is routed\n")


def test_no_issue_references_or_before_narratives_in_the_sources() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}: {line}" for p in sources() for n, line in history_lines(p.read_text())]
    assert len(sources()) > 100
    assert not found, "history in comments (say what and why; history goes in commits and docs):\n" + "\n".join(found)
