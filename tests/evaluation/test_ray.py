"""`greenserve evaluate --ray-address`: the same jobs on a local Ray instance give the same result as the local
process pool. Skipped when Ray (the optional extra greenserve[ray]) is not installed, which is the case in CI: the
CI command installs greenserve[dev] only (see docs/evaluation.md)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from greenserve.evaluation import executor, grids, run
from greenserve.evaluation.scenario import Scenario


def _square(x: int) -> int:
    return x * x


def test_without_ray_the_message_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(executor.RayUnavailable, match=r"greenserve\[ray\]"):
        executor.map_jobs(_square, [1, 2], ray_address="local")


def test_measured_profiles_reach_the_ray_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """`evaluate --profile` names its measured profiles in an environment variable; Ray's workers get it through
    the runtime environment (a stand-in module records what ray.init is given: Ray is not installed in CI)."""
    import sys
    import types

    calls: list[dict] = []
    fake = types.SimpleNamespace(is_initialized=lambda: False, init=lambda **kw: calls.append(kw),
                                 shutdown=lambda: None)
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setenv(executor.MEASURED_PROFILES_ENV, "a.json:b.json")
    with executor.ray_session("local"):
        pass
    assert calls[-1]["runtime_env"] == {"env_vars": {executor.MEASURED_PROFILES_ENV: "a.json:b.json"}}
    monkeypatch.delenv(executor.MEASURED_PROFILES_ENV)
    with executor.ray_session("local"):
        pass
    assert calls[-1]["runtime_env"] is None


def test_local_ray_runs_the_same_evaluation() -> None:
    pytest.importorskip("ray", reason="Ray is the optional extra greenserve[ray]; not installed here (CI installs "
                                      "greenserve[dev] only)")
    seen: list[int] = []
    with executor.ray_session("local"):  # one local instance for the whole test
        _on_ray(seen)


def _on_ray(seen: list[int]) -> None:
    assert executor.map_jobs(_square, [3, 1, 2], ray_address="local", on_done=seen.append) == [9, 1, 4]
    assert sorted(seen) == [1, 4, 9]
    day = int(datetime(2022, 7, 6, tzinfo=UTC).timestamp())
    kwargs = dict(day_start_s=day, strategies=["base_full_cache", "joint"], scenario=Scenario(),
                  forecast_model="seasonal_naive", window_s=60.0, hours=1)
    series = {"FR": grids.shipped()["FR"]}
    on_ray = run.evaluate(series, ray_address="local", **kwargs)
    local = run.evaluate(series, workers=1, **kwargs)
    def figures(result: dict) -> dict:  # CPU seconds differ from run to run
        return {s: {k: v for k, v in row.items() if k != "cpu_s"} for s, row in result["summary"]["FR"].items()}

    assert figures(on_ray) == figures(local)
    assert all(row["cpu_s"] > 0 for row in on_ray["summary"]["FR"].values())
    assert on_ray["grids"]["FR"]["joint"]["hours"] == local["grids"]["FR"]["joint"]["hours"]
