"""Issue 35: `plan show`, `plan explain` and `plan compute` name the forecasts the plan was computed on (model, time
made, history seen), so that a plan's CI can be traced to the forecast `greenserve forecast get` prints."""

from __future__ import annotations

import json

import pytest
from greenserve.v1 import common_pb2
from greenserve_client.commands import plan as plan_cli

ENSEMBLE = ("weighted[seasonal_naive:0.06+ets(A,N,A)[24]:0.17+sarima_fourier(2,0,1)K4[24]:0.23+"
            "sarima(1,0,0)(0,1,1)[24]:0.16]x1.000~p3~trim0.2")


def _plan() -> common_pb2.Plan:
    plan = common_pb2.Plan(version=3, state=common_pb2.PLAN_STATE_ACTIVE, trigger="manual")
    plan.valid_from.FromSeconds(1_796_468_400)
    plan.valid_until.FromSeconds(1_796_468_400 + 3600)
    ci = plan.forecasts.add(model=ENSEMBLE, source="forecaster", series=common_pb2.SeriesRef(
        kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key="ES"))
    ci.generated_at.FromSeconds(1_796_471_895)  # 2026-12-05 11:58:15 UTC
    ci.history_end.FromSeconds(1_796_464_800)  # 10:00
    load = plan.forecasts.add(model="seasonal_naive", source="cache", stale_s=1800.0, series=common_pb2.SeriesRef(
        kind=common_pb2.SERIES_KIND_LOAD, key="default"))
    load.generated_at.FromSeconds(1_796_470_095)
    return plan


def test_show_and_explain_name_the_forecasts(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(plan_cli, "_get", lambda ns, version: _plan())
    assert plan_cli.main(["show"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[1] == ("forecast of CI ES: weighted ensemble of 4 models, made 2026-12-05 11:58:15 UTC from history "
                        "to 2026-12-05 10:00 UTC")
    assert shown[2] == ("forecast of load default: seasonal_naive, made 2026-12-05 11:28:15 UTC (cached: the "
                        "forecaster did not answer; 30 min old)")
    assert plan_cli.main(["explain"]) == 0
    explained = capsys.readouterr().out
    assert f"forecast of CI ES: {ENSEMBLE}, made 2026-12-05 11:58:15 UTC" in explained  # the whole model name
    assert plan_cli.main(["explain", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [f["model"] for f in data["forecasts"]] == [ENSEMBLE, "seasonal_naive"]
