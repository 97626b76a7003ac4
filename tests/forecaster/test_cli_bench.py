"""`greenserve forecast backtest ... --json` and `greenserve bench forecaster` smoke runs on real files (a slice of
an Electricity Maps CSV; the bench's shipped series)."""

from __future__ import annotations

import json

from greenserve.bench import forecaster as bench
from greenserve_client.commands import forecast


def test_cli_backtest_prints_one_json_object(data_dir, capsys) -> None:
    path = data_dir / "GB_2023_hourly.csv"
    code = forecast.main(["backtest", "--csv", str(path), "--time-column", "Datetime (UTC)",
                          "--value-column", "Carbon Intensity gCO₂eq/kWh (LCA)", "--history-hours", "72",
                          "--horizon-hours", "24", "--days", "2", "--model", "sarima_fourier", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"mape", "naive_mape", "points", "fit_seconds_median", "model"} <= set(out)
    assert 0.0 <= out["interval_coverage_fraction"] <= 1.0 and out["interval_nominal_fraction"] == 0.9
    assert out["points"] == 48 and out["model"].startswith("sarima_fourier") and out["mape"] > 0


def test_cli_backtest_bad_column_exits_2(data_dir, capsys) -> None:
    path = data_dir / "GB_2023_hourly.csv"
    code = forecast.main(["backtest", "--csv", str(path), "--time-column", "Datetime (UTC)", "--value-column",
                          "nope", "--days", "1", "--json"])
    assert code == 2 and "nope" in capsys.readouterr().err


def test_bench_smoke(capsys) -> None:
    code = bench.main(["--series", "load/azure2024-conv", "--days", "1", "--workers", "1", "--rpc-calls", "0", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["load"]["series"] == 1 and out["ci"] == {} and out["forecast_rpc"] == {}
    row = out["series"][0]
    assert {"mape", "naive_mape", "ratio_to_naive", "fit_seconds_median", "model", "points"} <= set(row)
    assert row["points"] == 24 and row["history_hours"] == 72
    assert out["load"]["interval_coverage_mean"] == out["load"]["interval_coverage_min"] == \
        row["interval_coverage_fraction"]


def test_bench_data_dir_that_is_no_folder_exits_2(tmp_path, capsys) -> None:
    code = bench.main(["--data-dir", str(tmp_path / "absent"), "--rpc-calls", "0", "--json"])
    assert code == 2 and "is not a folder" in capsys.readouterr().err
    code = bench.main(["--data-dir", str(tmp_path), "--rpc-calls", "0", "--json"])  # no dataset sub-folder
    assert code == 2 and f"no series selected in {tmp_path}" in capsys.readouterr().err


def test_cli_backtest_unknown_holiday_country_exits_2(data_dir, capsys) -> None:
    path = data_dir / "GB_2023_hourly.csv"
    code = forecast.main(["backtest", "--csv", str(path), "--time-column", "Datetime (UTC)", "--value-column",
                          "Carbon Intensity gCO₂eq/kWh (LCA)", "--days", "1", "--holidays", "XX", "--json"])
    assert code == 2 and "unknown country 'XX'" in capsys.readouterr().err


def _flat_csv(folder):
    """Five days of hourly points, all 5."""
    path = folder / "flat.csv"
    path.write_text("time,value\n" + "".join(f"2024-01-{1 + h // 24:02d} {h % 24:02d}:00:00,5\n" for h in range(24 * 5)))
    return path


def test_cli_backtest_of_a_constant_series_prints_standard_json(tmp_path, capsys) -> None:
    # naive MAPE 0: the ratio is undefined and must come out as null, not as a NaN token jq or Go would refuse
    path = _flat_csv(tmp_path)
    code = forecast.main(["backtest", "--csv", str(path), "--time-column", "time", "--value-column", "value",
                          "--history-hours", "72", "--days", "2", "--json"])
    assert code == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    out = json.loads(line, parse_constant=lambda token: (_ for _ in ()).throw(ValueError(token)))
    assert out["naive_mape"] == 0 and out["ratio_to_naive"] is None and out["points"] == 48


def test_cli_backtest_sarima_on_a_constant_series_exits_2_naming_the_model(tmp_path, capsys) -> None:
    path = _flat_csv(tmp_path)
    code = forecast.main(["backtest", "--csv", str(path), "--time-column", "time", "--value-column", "value",
                          "--history-hours", "72", "--days", "1", "--model", "sarima", "--json"])
    assert code == 2 and "sarima(1,0,0)(0,1,1)[24]: cannot be estimated" in capsys.readouterr().err
