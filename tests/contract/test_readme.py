"""What a new user reads first stays true (issue 35): exactly two set-up commands, one spelling of the commands, the
deployment guide linked, the test suite's duration and a quick subset stated, grpcurl listed as optional, and the
docs pointing at the repository's data folders."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_exactly_two_set_up_commands() -> None:
    commands = re.findall(r"(?m)^bash scripts/(\w+)\.sh\b", README)
    assert commands == ["run", "test"]


def test_one_spelling_of_the_commands() -> None:
    assert ".venv/bin/greenserve" not in README and "source .venv/bin/activate" in README


def test_links_and_facts_a_new_user_needs() -> None:
    assert "(deploy/README.md)" in README and (ROOT / "deploy" / "README.md").exists()
    assert "bash scripts/test.sh tests/optimizer -x" in README
    # the suite's measured time, the same in the README and in the test command's help
    minutes = re.search(r"whole test suite, the real-engine tier included, took about (\d+) minutes", README)
    assert minutes, "the README states the suite's time"
    assert f"about {minutes.group(1)} minutes" in (ROOT / "scripts" / "test.sh").read_text()
    assert "grpcurl" in README.split("## Using it")[0]  # introduced before it is used
    assert "(SARIMA)" not in README and "ensemble" in README


def test_docs_cite_the_repositorys_data_folders() -> None:
    stale = [f"{doc.relative_to(ROOT)}: {m}" for doc in sorted((ROOT / "docs").glob("*.md"))
             for m in re.findall(r"`greenserve/\w+/data[^`]*`", doc.read_text(encoding="utf-8"))]
    assert not stale


def test_every_markdown_file_the_readme_and_setup_py_name_exists() -> None:
    named = {m for text in (README, (ROOT / "setup.py").read_text(encoding="utf-8"))
             for m in re.findall(r"[\w./-]+\.md\b", text)}
    assert {"docs/evaluation.md", "deploy/README.md"} <= named
    assert not sorted(n for n in named if not (ROOT / n).is_file())


def test_the_demos_duration_is_its_defaults() -> None:
    """The README's "2.5 min for its fleet to start, the day in 20 min" are `greenserve demo`'s defaults."""
    from greenserve_client.demo import DemoOptions

    text = " ".join(README.replace("#", " ").split())
    assert f"{DemoOptions.startup_s / 60:g} min for its fleet to start (--startup-s)" in text
    assert f"the day in {DemoOptions.minutes:g} min (--minutes)" in text
