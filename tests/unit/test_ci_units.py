"""CI in another unit than gCO2e/kWh (WattTime's and EIA's lb/MWh, kg/kWh, t/MWh) was read as gCO2e/kWh: no range
check catches 1,000 lb/MWh, and every gram planned and receipted was off by that factor. The unit is now a flag, and
a header that states another unit is refused until the flag says which is right."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from greenserve_client import demo
from greenserve_client.cli import main
from greenserve_client.commands import forecast

from greenserve.common.ci_units import G_PER_KWH_PER_UNIT, ci_unit_factor, unit_in_header
from greenserve.evaluation import grids


@pytest.mark.parametrize(("header", "unit"), [
    ("MOER (lbs/MWh)", "lb/MWh"),
    ("co2_moer_lbs_per_mwh", "lb/MWh"),
    ("emission rate, pounds CO2 per MWh", "lb/MWh"),
    ("Carbon Intensity gCO₂eq/kWh (LCA)", "g/kWh"),
    ("carbon_intensity_g_per_kwh", "g/kWh"),
    ("kgCO2e/kWh", "kg/kWh"),
    ("kg_co2e_per_mwh", "kg/MWh"),
    ("tCO2/MWh", "t/MWh"),
    ("carbon_intensity", None),
    ("bulbs_on", None),  # "lbs" inside a word is no unit
])
def test_the_unit_a_header_states(header: str, unit: str | None) -> None:
    assert unit_in_header(header) == unit


def test_factors_and_refusals() -> None:
    assert ci_unit_factor(None, "ci") == 1.0
    assert ci_unit_factor("lb/MWh", "MOER (lbs/MWh)") == pytest.approx(0.45359237)
    assert ci_unit_factor("kg/kWh", "x") == 1000.0
    assert ci_unit_factor(None, "kg_co2e_per_mwh") == 1.0  # kg/MWh is g/kWh: nothing to ask
    assert ci_unit_factor("g/kWh", "MOER (lbs/MWh)") == 1.0  # the user said so: the header is overruled
    with pytest.raises(ValueError, match=r"column 'MOER \(lbs/MWh\)' looks like lb/MWh, not gCO2e/kWh: pass "
                                         r"--ci-unit lb/MWh"):
        ci_unit_factor(None, "MOER (lbs/MWh)")
    with pytest.raises(ValueError, match="--ci-unit: unknown unit 'lbs'; known: g/kWh, kg/MWh, lb/MWh"):
        ci_unit_factor("lbs", "x")
    assert set(G_PER_KWH_PER_UNIT) == {"g/kWh", "kg/MWh", "lb/MWh", "kg/kWh", "t/MWh"}


def _moer_csv(path: Path, day: datetime, days_before: int) -> Path:
    start = day - timedelta(days=days_before)
    rows = [f"{(start + timedelta(hours=h)).isoformat()},{1000 + h % 24}" for h in range((days_before + 1) * 24)]
    path.write_text("point_time,moer_lbs_per_mwh\n" + "\n".join(rows) + "\n")
    return path


def test_read_csv_scales_to_g_per_kwh(tmp_path: Path) -> None:
    day = datetime(2023, 3, 20, tzinfo=UTC)
    path = _moer_csv(tmp_path / "CAISO_NORTH.csv", day, 1)
    (series,) = grids.read_csv(path, time_column="point_time", value_column="moer_lbs_per_mwh",
                               value_scale=ci_unit_factor("lb/MWh", "moer_lbs_per_mwh")).values()
    assert series.values[0] == pytest.approx(1000 * 0.45359237)


def test_the_demo_converts_or_refuses_a_lb_per_mwh_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    day = datetime(2023, 3, 20, tzinfo=UTC)
    path = _moer_csv(tmp_path / "CAISO_NORTH.csv", day, 3)
    seen: dict[str, object] = {}
    monkeypatch.setattr(demo, "run", lambda options, **kwargs: seen.update(kwargs) or 0)
    argv = ["demo", "--ci-csv", str(path), "--time-column", "point_time", "--value-column", "moer_lbs_per_mwh",
            "--day", "2023-03-20", "--hours", "2"]
    assert main(argv) == 2 and not seen  # refused before any service starts
    assert main([*argv, "--ci-unit", "lb/MWh"]) == 0
    series = seen["series"]
    assert series.window(int(day.timestamp()), 2) == pytest.approx((1000 * 0.45359237, 1001 * 0.45359237))


def test_forecast_ingest_refuses_an_unclear_unit_before_connecting(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = _moer_csv(tmp_path / "moer.csv", datetime(2023, 3, 20, tzinfo=UTC), 3)
    base = ["ingest", "--csv", str(path), "--time-column", "point_time", "--value-column", "moer_lbs_per_mwh",
            "--addr", "127.0.0.1:1", "--timeout-s", "1"]
    assert forecast.main([*base, "--region", "CAISO_NORTH"]) == 2
    assert "looks like lb/MWh, not gCO2e/kWh: pass --ci-unit lb/MWh" in capsys.readouterr().err
    assert forecast.main([*base, "--pool", "chat", "--ci-unit", "lb/MWh"]) == 2
    assert "--ci-unit is the unit of a CI series (--region)" in capsys.readouterr().err
