"""Each CSV layout of ../shared/data read by the ingestion code, checked against numbers from SOURCE.md."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from greenserve.forecaster import csv_sources as cs


def test_electricitymaps_layout_both_signals(data_dir) -> None:
    path = data_dir / "ci_electricitymaps_greendcc" / "GB_2024_hourly.csv"
    assert cs.detect_layout(cs.read_header(path)) == "electricitymaps"
    direct = cs.read_csv_series(path, signal="direct")
    lca = cs.read_csv_series(path, signal="lifecycle")
    assert direct.region == "GB" and direct.signal == "direct" and lca.signal == "lifecycle"
    assert len(direct.values) == 8784  # leap year, SOURCE.md
    assert direct.values[0] == 61.34 and lca.values[0] == 96.44  # first row of the file
    assert direct.times_s[0] == pd.Timestamp("2024-01-01T00:00Z").timestamp()
    grid = cs.to_grid(direct)
    assert grid.step_s == 3600 and not grid.missing_runs()


def test_electricitymaps_respelled_and_derived_columns(data_dir) -> None:
    fr = cs.read_csv_series(data_dir / "ci_electricitymaps_fr2022" / "FR_2022_hourly_normalized.csv",
                            signal="lifecycle")
    assert fr.region == "FR" and abs(np.mean(fr.values) - 89) < 1  # SOURCE.md: LCA mean 89
    fi = cs.read_csv_series(data_dir / "ci_em2022_derived_fi_se3" / "FI_2022_hourly_lca_derived.csv")
    assert fi.signal == "lifecycle" and fi.region == "FI" and len(fi.values) == 8759
    assert abs(np.mean(fi.values) - 147) < 1


def test_raw_spreadsheet_file_needs_dayfirst(data_dir) -> None:
    raw = data_dir / "ci_electricitymaps_fr2022" / "raw" / "FR_2022_hourly.csv"
    series = cs.read_csv_series(raw, time_column="Datetime (UTC)", value_column="Carbon Intensity gCO2eq/kWh (LCA)",
                                dayfirst=True)
    normalized = cs.read_csv_series(data_dir / "ci_electricitymaps_fr2022" / "FR_2022_hourly_normalized.csv",
                                    signal="lifecycle")
    assert np.array_equal(series.times_s, normalized.times_s)
    assert np.allclose(series.values, normalized.values)


def test_ensembleci_layout_with_and_without_utc_suffix(data_dir) -> None:
    se = data_dir / "ci_ensembleci" / "SE_direct_emissions.csv"  # "+00:00" suffix, extra index columns
    erco = data_dir / "ci_ensembleci" / "ERCO_direct_emissions.csv"  # no suffix
    assert cs.detect_layout(cs.read_header(se)) == "ensembleci"
    a, b = cs.read_csv_series(se), cs.read_csv_series(erco)
    assert a.values[0] == 65.6 and a.times_s[0] == pd.Timestamp("2019-01-01T00:00Z").timestamp()
    assert b.times_s[0] == a.times_s[0]
    assert len(cs.to_grid(b).values) == 35136


def test_letswaitawhile_half_hours_resampled_to_hourly_means(data_dir) -> None:
    raw = cs.read_csv_series(data_dir / "ci_letswaitawhile_2020" / "fr_ci.csv")
    assert cs.detect_layout(cs.read_header(data_dir / "ci_letswaitawhile_2020" / "fr_ci.csv")) == "letswaitawhile"
    grid = cs.to_grid(raw)
    assert grid.step_s == 3600
    assert np.isclose(grid.values[0], raw.values[:2].mean())  # 00:00 and 00:30 averaged


def test_azure_2024_minutes_sum_to_the_hourly_file(data_dir) -> None:
    folder = data_dir / "azure_llm_2024_week"
    grid = cs.to_grid(cs.read_azure_2024_minutes(folder / "azure2024_llm_requests_per_minute.csv", "code"))
    hourly = pd.read_csv(folder / "azure2024_llm_requests_hourly_utc.csv")
    code = hourly[hourly["service"] == "code"]["requests"].to_numpy(dtype=float)
    assert len(grid.values) == 168
    assert np.allclose(grid.values * 3600, code)
    assert grid.start_s == pd.Timestamp("2024-05-10T00:00Z").timestamp()


def test_servegen_all_zero_windows_are_missing(data_dir) -> None:
    raw = cs.read_servegen_rates(data_dir / "servegen_bailian_language" / "servegen_language_total_rate_10min.csv",
                                 "m_mid")
    assert int(np.isnan(raw.values).sum()) >= 84  # the 84 all-zero windows of SOURCE.md, never zero load
    assert np.nanmin(raw.values) > 0
    grid = cs.to_grid(raw)
    assert grid.missing_runs(), "collection gaps must stay gaps"
    assert np.nanmin(grid.values) > 100  # no hour read as (near) zero load


def test_servegen_local_midnight_sits_on_utc(data_dir) -> None:
    # t=0 is 00:00 local (UTC+8, SOURCE.md): the series starts at 16:00 UTC, and the trace's local day 1 starts
    # 8 h before a UTC midnight, as the Chinese service's day did
    raw = cs.read_servegen_rates(data_dir / "servegen_bailian_language" / "servegen_language_total_rate_10min.csv",
                                 "m_large")
    assert (int(raw.times_s[0]) + cs.SERVEGEN_UTC_OFFSET_S) % 86_400 == 0
    assert int(raw.times_s[0]) % 86_400 == 16 * 3600


def test_worldcup_absent_minutes_are_not_zero(data_dir) -> None:
    raw = cs.read_count_per_minute(data_dir / "worldcup98_http" / "invocation_count.csv")
    grid = cs.to_grid(raw)
    hourly = pd.read_csv(data_dir / "worldcup98_http" / "worldcup98_requests_hourly_utc.csv")
    start = int(pd.Timestamp(hourly["hour_start_utc"].iloc[0], tz="UTC").timestamp())
    i0 = (start - grid.start_s) // 3600
    ours = grid.values[i0:i0 + len(hourly)] * 3600
    theirs = hourly["requests"].to_numpy(dtype=float)
    same = np.isclose(ours, theirs)
    assert same.mean() > 0.99  # equal wherever all 60 minutes exist
    assert np.all(ours[~same] > theirs[~same])  # hours with absent minutes: mean of present ones, not zero-filled


def test_azure_2023_request_trace_to_counts(data_dir) -> None:
    grid = cs.read_azure_request_trace(data_dir / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv", step_s=60)
    assert grid.step_s == 60 and 55 <= len(grid.values) <= 58
    total = grid.values.sum() * 60
    assert 18_000 < total <= 19_366  # whole minutes only (SOURCE.md: 19,366 requests in ~58 min)


def test_requests_to_counts_keeps_empty_intervals_as_zero() -> None:
    first, rates = cs.requests_to_counts(np.array([0.5, 1.0, 130.0]), 60, 0, 180)
    assert first == 0 and np.allclose(rates * 60, [2, 0, 1])


def test_catalog_covers_every_ci_folder_and_the_load_traces(data_dir) -> None:
    names = [e.name for e in cs.catalog(data_dir)]
    for fragment in ("em/US-CAL-CISO_2024/lifecycle", "em/ES_2023/direct", "em/FR_2022/lifecycle",
                     "em-derived/FI_2022", "ensembleci/CISO/direct", "letswaitawhile/GB_2020",
                     "load/azure2024-code", "load/servegen-m-mid", "load/worldcup98"):
        assert any(fragment in n for n in names), fragment
    assert "ensembleci/DE/lifecycle" not in names  # upstream duplicate of DE direct


def test_missing_column_is_named(data_dir, tmp_path) -> None:
    import pytest

    with pytest.raises(ValueError, match="nope"):
        cs.read_csv_series(data_dir / "ci_letswaitawhile_2020" / "fr_ci.csv", time_column="Time", value_column="nope")


def test_a_cell_that_is_not_a_time_is_named_by_column_and_row(tmp_path) -> None:
    """`greenserve forecast backtest` on a file with one bad time printed pandas' "Unknown datetime string format,
    unable to parse: garbage", naming neither the column nor the row (found running the CLI on users' CSV shapes)."""
    import pytest

    path = tmp_path / "grid.csv"
    path.write_text("ts,ci\n2023-06-17T00:00Z,10\n2023-06-17T01:00+01:00,11\ngarbage,12\n2023-06-17T03:00Z,13\n")
    with pytest.raises(ValueError, match=r"^column 'ts': row 4: unparseable time 'garbage'$"):
        cs.read_csv_series(path, time_column="ts", value_column="ci")
    path.write_text("when,ci\n17/06/2023 00:00,10\n2023-06-17 01:00,11\n")
    with pytest.raises(ValueError, match=r"column 'when': row 3: unparseable time '2023-06-17 01:00' \(--time-format"):
        cs.read_csv_series(path, time_column="when", value_column="ci", time_format="%d/%m/%Y %H:%M")
    path.write_text("ts,ci\n2023-06-17T00:00Z,10\n2023-06-17T02:00+01:00,11\n")  # offsets: the instants they name
    assert list(cs.read_csv_series(path, time_column="ts", value_column="ci").times_s) == [1686960000, 1686963600]


def test_a_day_month_order_the_rows_contradict_is_refused(tmp_path) -> None:
    """A spreadsheet's DD/MM column read without --dayfirst was silently scrambled: pandas' mixed parsing read
    '01/02/2022' month first (2 January) and '13/01/2022' day first, so every date up to the 12th swapped day and month
    with no gap and no error (the backtest of the last days of a year looked fine)."""
    import pytest

    days = [f"{d:02d}/{m:02d}/2022 00:00" for m in (1, 2) for d in range(1, 29)]
    path = tmp_path / "raw.csv"
    path.write_text("Datetime (UTC),ci\n" + "".join(f"{t},{i}\n" for i, t in enumerate(days)))
    with pytest.raises(ValueError, match=r"column 'Datetime \(UTC\)': row 14: '13/01/2022 00:00' is a DD/MM date: "
                                         r"give --dayfirst"):
        cs.read_csv_series(path, time_column="Datetime (UTC)", value_column="ci")
    series = cs.read_csv_series(path, time_column="Datetime (UTC)", value_column="ci", dayfirst=True)
    assert list(series.times_s) == sorted(series.times_s) and series.times_s[28] == 1643673600  # 1 February
    us = tmp_path / "us.csv"
    us.write_text("t,ci\n" + "".join(f"{m:02d}/{d:02d}/2022,{d}\n" for m in (1, 2) for d in range(1, 29)))
    assert list(cs.read_csv_series(us, time_column="t", value_column="ci").times_s) == list(series.times_s)
    with pytest.raises(ValueError, match=r"row 14: '01/13/2022' is a MM/DD date: give without --dayfirst"):
        cs.read_csv_series(us, time_column="t", value_column="ci", dayfirst=True)


def test_a_column_typed_with_a_plain_2_finds_the_subscript_header(tmp_path) -> None:
    """`forecast backtest --value-column "Carbon Intensity gCO2eq/kWh (LCA)"` on an Electricity Maps file (whose
    header has "gCO₂eq") was refused listing columns that look the same; a column equal once folded is taken when
    it is the only one, and a --filter-column that is not in the file is named (pandas' usecols error before)."""
    import pytest

    path = tmp_path / "em.csv"
    path.write_text("Datetime (UTC),Zone Id,Carbon Intensity gCO₂eq/kWh (direct),Carbon Intensity gCO₂eq/kWh (LCA)\n"
                    "2023-06-17 00:00:00,DE,100,150\n2023-06-17 01:00:00,DE,110,160\n")
    series = cs.read_csv_series(path, time_column="datetime (utc)", value_column="Carbon Intensity gCO2eq/kWh (LCA)",
                                filter_column="zone id", filter_value="DE")
    assert list(series.values) == [150.0, 160.0] and series.signal == "lifecycle"
    with pytest.raises(ValueError, match=r"^filter column 'zone' not in em.csv \(columns: Datetime"):
        cs.read_csv_series(path, time_column="Datetime (UTC)", value_column="Zone Id", filter_column="zone",
                           filter_value="DE")


def test_unix_times_in_seconds_or_milliseconds_are_read_as_such(tmp_path) -> None:
    """A time column of Unix seconds (a Prometheus or database export) was read by pandas as nanoseconds: a week of
    hours fell into the first second of 1970, and the backtest said 'no whole day ... (1 hourly points)'."""
    hours = [1687219200 + 3600 * h for h in range(3)]  # 2023-06-20 00:00 UTC on
    for scale in (1, 1000):
        path = tmp_path / f"unix_{scale}.csv"
        path.write_text("t,ci\n" + "".join(f"{t * scale},{i}\n" for i, t in enumerate(hours)))
        assert list(cs.read_csv_series(path, time_column="t", value_column="ci").times_s) == hours


def test_an_empty_file_or_a_header_alone_is_refused_naming_the_file(tmp_path) -> None:
    """`forecast backtest` on a header-only CSV printed numpy's 'zero-size array to reduction operation minimum
    which has no identity', and on an empty file pandas' 'No columns to parse from file'."""
    import pytest

    path = tmp_path / "grid.csv"
    path.write_text("ts,ci,zone\n")
    with pytest.raises(ValueError, match=r"^grid.csv: no data rows$"):
        cs.to_grid(cs.read_csv_series(path, time_column="ts", value_column="ci"))
    path.write_text("ts,ci,zone\n2023-06-20T00:00Z,1,DE\n")
    with pytest.raises(ValueError, match=r"^grid.csv: no data rows with zone = 'FR'$"):
        cs.read_csv_series(path, time_column="ts", value_column="ci", filter_column="zone", filter_value="FR")
    path.write_text("")
    with pytest.raises(ValueError, match=r"^grid.csv: empty file \(no header\)$"):
        cs.read_csv_series(path, time_column="ts", value_column="ci")


def test_one_instant_given_two_values_is_refused_naming_both_rows(tmp_path) -> None:
    """Local time without its offset repeats the hour the clocks go back; the resampler kept the last value
    silently. A row given twice with the same value still passes."""
    path = tmp_path / "local.csv"
    path.write_text("time,ci\n2023-10-29 00:00,100\n2023-10-29 01:00,110\n2023-10-29 02:00,120\n"
                    "2023-10-29 02:00,130\n2023-10-29 03:00,140\n")
    with pytest.raises(ValueError, match=r"row 4 and row 5 .*two different values \(120, 130\).*offset"):
        cs.read_csv_series(path, time_column="time", value_column="ci")
    same = tmp_path / "twice.csv"
    same.write_text("time,ci\n2023-10-29T00:00Z,100\n2023-10-29T01:00Z,110\n2023-10-29T01:00Z,110\n"
                    "2023-10-29T02:00Z,\n2023-10-29T02:00Z,120\n")
    raw = cs.read_csv_series(same, time_column="time", value_column="ci")
    grid = cs.to_grid(raw)
    assert list(grid.values) == [100.0, 110.0, 120.0]
