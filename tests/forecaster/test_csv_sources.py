"""Each CSV layout the ingestion code reads, on slices of the public datasets (data/SOURCE.md: upstream, rows kept,
licence) or on synthetic files of the same layout where a dataset carries no licence that allows redistribution."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest

from greenserve.forecaster import csv_sources as cs


def _utc_s(text: str) -> int:
    return int(pd.Timestamp(text, tz="UTC").timestamp())


def test_electricitymaps_layout_both_signals(data_dir) -> None:
    path = data_dir / "GB_2023_hourly.csv"  # 2023-05-28 00:00 to 06-02 23:00 UTC
    assert cs.detect_layout(cs.read_header(path)) == "electricitymaps"
    direct = cs.read_csv_series(path, signal="direct")
    lca = cs.read_csv_series(path, signal="lifecycle")
    assert direct.region == "GB" and direct.signal == "direct" and lca.signal == "lifecycle"
    assert len(direct.values) == 6 * 24
    assert direct.values[0] == 99.26 and lca.values[0] == 146.39  # first row of the slice (2023-05-28 00:00)
    assert direct.times_s[0] == _utc_s("2023-05-28T00:00")
    noon = int(np.flatnonzero(direct.times_s == _utc_s("2023-06-01T12:00"))[0])
    assert direct.values[noon] == 66.73 and lca.values[noon] == 111.52
    grid = cs.to_grid(direct)
    assert grid.step_s == 3600 and not grid.missing_runs() and len(grid.values) == 6 * 24


def test_electricitymaps_utc_hours_run_through_the_clock_change(data_dir) -> None:
    # France went to summer time on 2022-03-27 at 01:00 UTC; the file is in UTC, so that day has 24 distinct hours
    fr = cs.read_csv_series(data_dir / "FR_2022_hourly_normalized.csv", signal="lifecycle")
    assert fr.region == "FR" and fr.signal == "lifecycle" and len(fr.values) == 72
    assert np.all(np.diff(fr.times_s) == 3600)
    day = (fr.times_s >= _utc_s("2022-03-27T00:00")) & (fr.times_s < _utc_s("2022-03-28T00:00"))
    assert day.sum() == 24
    assert list(fr.values[day][:4]) == [110.27, 112.95, 105.41, 99.12]  # 00:00-03:00 UTC, the LCA column
    direct = cs.read_csv_series(data_dir / "FR_2022_hourly_normalized.csv", signal="direct")
    assert direct.values[0] == 74.27 and not cs.to_grid(direct).missing_runs()


def test_derived_lifecycle_column_and_its_absent_last_hour(data_dir) -> None:
    fi = cs.read_csv_series(data_dir / "FI_2022_hourly_lca_derived.csv")
    assert fi.signal == "lifecycle" and fi.region == "FI" and len(fi.values) == 47
    assert fi.values[0] == 121.47
    assert fi.times_s[-1] == _utc_s("2022-12-31T22:00")  # the last hour of 2022 is absent upstream
    assert cs.to_grid(fi).times_s[-1] == _utc_s("2022-12-31T22:00")  # not invented at the end


def test_raw_spreadsheet_file_needs_dayfirst(data_dir) -> None:
    raw = data_dir / "FR_2022_hourly.csv"  # DD/MM/YYYY HH:MM, "2" for "₂", an extra CO2 column
    lca = "Carbon Intensity gCO2eq/kWh (LCA)"
    with pytest.raises(ValueError, match=r"row 2: '26/03/2022 00:00' is a DD/MM date: give --dayfirst"):
        cs.read_csv_series(raw, time_column="Datetime (UTC)", value_column=lca)
    series = cs.read_csv_series(raw, time_column="Datetime (UTC)", value_column=lca, dayfirst=True)
    normalized = cs.read_csv_series(data_dir / "FR_2022_hourly_normalized.csv", signal="lifecycle")
    assert np.array_equal(series.times_s, normalized.times_s)
    assert np.allclose(series.values, normalized.values)


def test_ensembleci_layout_with_and_without_utc_suffix(data_dir) -> None:
    se = data_dir / "synthetic" / "SE_direct_emissions.csv"  # "+00:00" suffix, extra index columns
    erco = data_dir / "synthetic" / "ERCO_direct_emissions.csv"  # no suffix, the index column first
    assert cs.detect_layout(cs.read_header(se)) == cs.detect_layout(cs.read_header(erco)) == "ensembleci"
    a, b = cs.read_csv_series(se), cs.read_csv_series(erco)
    assert a.values[0] == 40.5 and a.times_s[0] == _utc_s("2019-01-01T00:00")  # carbon_intensity, not an index
    assert b.values[0] == 300.25 and b.times_s[0] == a.times_s[0]
    assert a.region == "SE" and a.source == "ensembleci-csv"
    assert len(cs.to_grid(b).values) == 48


def test_letswaitawhile_half_and_quarter_hours_resampled_to_hourly_means(data_dir) -> None:
    # as upstream GB: 30-min steps until 2020-10-31, 15-min steps after
    path = data_dir / "synthetic" / "gb_ci.csv"
    assert cs.detect_layout(cs.read_header(path)) == "letswaitawhile"
    raw = cs.read_csv_series(path)
    grid = cs.to_grid(raw)
    assert grid.step_s == 3600 and len(grid.values) == 48 and not grid.missing_runs()
    assert np.isclose(grid.values[0], raw.values[:2].mean())  # 00:00 and 00:30 averaged
    switch = int(np.flatnonzero(raw.times_s == _utc_s("2020-10-31T00:00"))[0])
    assert np.isclose(grid.values[24], raw.values[switch:switch + 4].mean())  # four quarter hours averaged


def test_azure_2024_minutes_sum_to_the_published_hourly_counts(data_dir) -> None:
    path = data_dir / "azure2024_llm_requests_per_minute.csv"  # the first 720 minutes
    grid = cs.to_grid(cs.read_azure_2024_minutes(path, "code"))
    assert grid.start_s == _utc_s("2024-05-10T00:00") and len(grid.values) == 12
    # the first 10 hourly code counts published from the raw 1-week file (data/SOURCE.md)
    assert np.allclose(grid.values[:10] * 3600, [77540, 76895, 66953, 57781, 46575, 38670, 32595, 29267, 25758,
                                                 28504])
    conv = cs.read_azure_2024_minutes(path, "conv")
    assert conv.times_s[0] == _utc_s("2024-05-12T00:00") and conv.values[0] == 1553 / 60
    with pytest.raises(ValueError, match="service must be one of"):
        cs.read_azure_2024_minutes(path, "chat")


def test_servegen_all_zero_windows_are_missing(data_dir) -> None:
    path = data_dir / "servegen_language_total_rate_10min.csv"  # day 3 (local) of the 14
    raw = cs.read_servegen_rates(path, "m_mid")
    # the 11 all-zero windows from 15:00 local on day 3, and the partly collected window after them (14.1 req/s)
    local_hour = (raw.times_s + cs.SERVEGEN_UTC_OFFSET_S) % 86_400 / 3600
    assert int(np.isnan(raw.values).sum()) == 12
    assert np.all(np.isnan(raw.values[(local_hour >= 15) & (local_hour < 17)]))
    assert np.nanmin(raw.values) > 0
    grid = cs.to_grid(raw)
    assert [count for _, count in grid.missing_runs()] == [2], "collection gaps must stay gaps"
    assert np.nanmin(grid.values) > 100  # no hour read as (near) zero load
    assert not np.isnan(cs.read_servegen_rates(path, "m_large").values).any()  # m-large has no gap


def test_servegen_local_midnight_sits_on_utc(data_dir) -> None:
    # t=0 is 00:00 local (UTC+8): the trace's local days start at 16:00 UTC, 8 h before a UTC midnight, as the
    # Chinese service's day did
    raw = cs.read_servegen_rates(data_dir / "servegen_language_total_rate_10min.csv", "m_large")
    assert (int(raw.times_s[0]) + cs.SERVEGEN_UTC_OFFSET_S) % 86_400 == 0
    assert int(raw.times_s[0]) % 86_400 == 16 * 3600
    assert raw.values[0] == 230.773333 and raw.resolution_s == 600


def test_worldcup_absent_minutes_are_not_zero(data_dir) -> None:
    path = data_dir / "synthetic" / "invocation_count.csv"  # minutes of 1998-05-08 00:00-05:59, 03:22 absent
    raw = cs.read_count_per_minute(path)
    grid = cs.to_grid(raw)
    assert grid.start_s == _utc_s("1998-05-08T00:00") and len(grid.values) == 6 and not grid.missing_runs()
    counts = pd.read_csv(path)["count"].to_numpy(dtype=float)
    assert np.isclose(grid.values[0] * 3600, counts[:60].sum())  # a whole hour: the sum of its minutes
    present = counts[180:239]  # 59 minutes of hour 03:00
    assert np.isclose(grid.values[3], present.mean() / 60)  # the mean of the present minutes, not zero-filled
    assert grid.values[3] * 3600 > present.sum()


def test_azure_2023_request_trace_to_counts(data_dir) -> None:
    # the trace's first requests, 18:15:46 to 18:18:59: whole minutes 18:16 and 18:17 only
    grid = cs.read_azure_request_trace(data_dir / "AzureLLMInferenceTrace_conv.csv", step_s=60)
    assert grid.step_s == 60 and grid.start_s == _utc_s("2023-11-16T18:16")
    stamps = pd.read_csv(data_dir / "AzureLLMInferenceTrace_conv.csv")["TIMESTAMP"].str[:16]
    expected = [int((stamps == f"2023-11-16 18:{m}").sum()) for m in (16, 17)]
    assert list(grid.values * 60) == expected and sum(expected) < len(stamps)


def test_requests_to_counts_keeps_empty_intervals_as_zero() -> None:
    first, rates = cs.requests_to_counts(np.array([0.5, 1.0, 130.0]), 60, 0, 180)
    assert first == 0 and np.allclose(rates * 60, [2, 0, 1])


#: Where each fixture sits in a folder laid out like the public datasets (``bench forecaster --data-dir``).
PUBLIC_LAYOUT = {
    "GB_2023_hourly.csv": "ci_electricitymaps_greendcc",
    "US-CAL-CISO_2022_hourly.csv": "ci_electricitymaps_greendcc",
    "FR_2022_hourly_normalized.csv": "ci_electricitymaps_fr2022",
    "FI_2022_hourly_lca_derived.csv": "ci_em2022_derived_fi_se3",
    "synthetic/SE_direct_emissions.csv": "ci_ensembleci",
    "synthetic/ERCO_direct_emissions.csv": "ci_ensembleci",
    "synthetic/gb_ci.csv": "ci_letswaitawhile_2020",
    "azure2024_llm_requests_per_minute.csv": "azure_llm_2024_week",
    "servegen_language_total_rate_10min.csv": "servegen_bailian_language",
    "synthetic/invocation_count.csv": "worldcup98_http",
}


def test_catalog_of_a_public_dataset_folder_covers_every_layout(data_dir, tmp_path) -> None:
    for name, folder in PUBLIC_LAYOUT.items():
        (tmp_path / folder).mkdir(exist_ok=True)
        shutil.copy(data_dir / name, tmp_path / folder / name.split("/")[-1])
    shutil.copy(data_dir / "synthetic" / "SE_direct_emissions.csv",
                tmp_path / "ci_ensembleci" / "DE_lifecycle_emissions.csv")  # the upstream copy of DE direct
    entries = cs.catalog(tmp_path)
    names = [e.name for e in entries]
    for fragment in ("em/GB_2023/direct", "em/US-CAL-CISO_2022/lifecycle", "em/FR_2022/lifecycle",
                     "em-derived/FI_2022/lifecycle", "ensembleci/SE/direct", "ensembleci/ERCO/direct",
                     "letswaitawhile/GB_2020/lifecycle", "load/azure2024-code", "load/azure2024-conv",
                     "load/servegen-m-large", "load/servegen-m-mid", "load/worldcup98"):
        assert fragment in names, fragment
    assert "ensembleci/DE/lifecycle" not in names  # upstream duplicate of DE direct
    by_name = {e.name: e for e in entries}
    assert cs.load_entry(by_name["em/GB_2023/lifecycle"], tmp_path).values[0] == 146.39
    assert len(cs.load_entry(by_name["load/worldcup98"], tmp_path).values) == 6


def test_shipped_catalog_loads_without_a_data_folder() -> None:
    entries = cs.catalog()
    assert [e.name for e in entries] == ["em/FR_2022-06/lifecycle", "em/ES_2022-06/lifecycle",
                                         "em/US-CAL-CISO_2022-06/lifecycle", "em-derived/FI_2022-06/lifecycle",
                                         "load/azure2024-conv"]
    grids = {e.name: cs.load_entry(e) for e in entries}
    for name, grid in grids.items():
        assert grid.step_s == 3600 and not grid.missing_runs(), name
    ciso = grids["em/US-CAL-CISO_2022-06/lifecycle"]
    assert len(ciso.values) == 22 * 24 and ciso.start_s == _utc_s("2022-06-15T00:00") and ciso.region == "CISO"
    assert ciso.signal == "lifecycle" and grids["em/FR_2022-06/lifecycle"].values[0] == 86.58
    load = grids["load/azure2024-conv"]
    assert load.kind == "load" and len(load.values) == 168 and load.start_s == _utc_s("2024-05-12T00:00")
    assert np.isclose(load.values[0], 91156 / 3600)  # requests in the first hour, as requests per second


def test_missing_column_is_named(data_dir) -> None:
    with pytest.raises(ValueError, match="nope"):
        cs.read_csv_series(data_dir / "synthetic" / "gb_ci.csv", time_column="Time", value_column="nope")


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
