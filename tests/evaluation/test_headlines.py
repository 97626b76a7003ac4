"""The seeds' headline table (services/evaluation/headlines): the registry runs each landed module, reports a
missing, failing or malformed one without sinking the others, `greenserve bench headlines` prints one JSON object
on its last line, and `greenserve evaluate` puts the table (and the simulator's fidelity table) in its report.
Built against small fake modules; the real ones are run by `greenserve bench headlines`."""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest

from greenserve.evaluation import grids, headlines, report, run
from greenserve.evaluation.scenario import Scenario

GOOD = """
def run(quick=False):
    return {"seed": "FakeSeed", "setting": "one GPU, quick" if quick else "one GPU",
            "paper": {"saving_fraction": {"value": 0.15, "source": "Sec. 6.2"}},
            "ours": {"saving_fraction": 0.14, "attainment_fraction": 0.97},
            "within_tolerance": True, "notes": ["fake module for tests"]}
"""
NO_NOTES = "def run(quick=False):\n    return {'seed': 'x', 'setting': '', 'paper': {}, 'ours': {}, 'within_tolerance': True}\n"
RAISES = "def run(quick=False):\n    raise RuntimeError('solver diverged')\n"


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    package = tmp_path / "fake_headlines"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, body in (("good", GOOD), ("no_notes", NO_NOTES), ("raises", RAISES)):
        (package / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = {"good": "fake_headlines.good", "no_notes": "fake_headlines.no_notes", "raises": "fake_headlines.raises",
                "later": "fake_headlines.not_yet"}
    monkeypatch.setattr(headlines, "HEADLINES", registry)
    monkeypatch.setattr(run, "HEADLINES", registry)
    return registry


def test_registry_runs_landed_modules_and_reports_the_others(fakes: dict[str, str]) -> None:
    assert headlines.landed() == ["good", "no_notes", "raises"]
    good = headlines.run_one("good", quick=True)
    assert good["status"] == "ok" and good["result"]["setting"] == "one GPU, quick" and good["cpu_s"] >= 0
    bad = headlines.run_one("no_notes")
    assert bad["status"] == "failed" and "lacks notes" in bad["error"]
    raised = headlines.run_one("raises")
    assert raised["status"] == "failed" and "RuntimeError: solver diverged" in raised["error"]
    assert headlines.run_one("later")["status"] == "missing"
    with pytest.raises(KeyError, match="unknown"):
        headlines.run_one("nope")
    rows = headlines.table_rows([good, raised])
    assert [(r["seed"], r["figure"], r["paper"], r["ours"]) for r in rows[:2]] == [
        ("FakeSeed", "saving_fraction", "value: 0.15, source: Sec. 6.2", "0.14"), ("", "attainment_fraction", "", "0.97")]
    assert rows[2]["seed"] == "raises" and rows[2]["within_tolerance"].startswith("failed")


def test_bench_headlines_prints_one_json_line(fakes: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert headlines.main(["--quick", "--only", "good,later", "--json"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["quick"] is True
    assert [(r["name"], r["status"]) for r in last["headlines"]] == [("good", "ok"), ("later", "missing")]
    with pytest.raises(SystemExit) as exit_info:
        headlines.main(["--only", "magic"])
    assert exit_info.value.code == 2
    assert "--only: unknown ['magic']" in capsys.readouterr().err


def test_bench_command_is_wired() -> None:
    from greenserve_client.commands.bench import BENCHMARKS

    assert BENCHMARKS["headlines"][0] == "greenserve.evaluation.headlines:main"


def test_evaluation_report_carries_the_headline_and_fidelity_tables(fakes: dict[str, str], tmp_path: Path) -> None:
    day = int(datetime(2022, 7, 6, tzinfo=UTC).timestamp())
    result = run.evaluate({"FR": grids.shipped()["FR"]}, day_start_s=day, strategies=["no_cache"], scenario=Scenario(),
                          forecast_model="seasonal_naive", window_s=60.0, hours=1, workers=1, headlines="quick")
    assert [(r["name"], r["status"]) for r in result["headlines"]] == [
        ("good", "ok"), ("no_notes", "failed"), ("raises", "failed"), ("later", "missing")]
    assert result["fidelity"] and all({"source", "published", "model"} <= set(r) for r in result["fidelity"])
    index = report.write(result, tmp_path / "report")
    page = index.read_text()
    assert "reproduced in their own settings" in page and "FakeSeed" in page and "Sec. 6.2" in page
    assert "fake module for tests" in page and "solver diverged" in page
    assert "Simulator fidelity" in page and result["fidelity"][0]["quantity"] in page
    stored = json.loads((tmp_path / "report" / "result.json").read_text())
    assert stored["headlines"][0]["result"]["ours"]["saving_fraction"] == 0.14
    with pytest.raises(ValueError, match="headlines: must be"):
        run.evaluate({}, day_start_s=day, strategies=[], scenario=Scenario(), headlines="some")
