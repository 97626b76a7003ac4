"""`greenserve forecast ...`: backtests on CSV files, and ingest / forecast / list against a running forecaster.

    greenserve forecast backtest --csv FILE --time-column COL --value-column COL --history-hours 72 \
        --horizon-hours 24 --days N [--model NAME] --json
    greenserve forecast ingest --csv FILE [--layout L] --region ES --signal lifecycle   (or --pool P for load)
    greenserve forecast get --region ES --signal lifecycle --horizon-steps 24 [--json]
    greenserve forecast list [--json]

`backtest` runs locally (no service needed); the last line it prints is one JSON object with `mape`,
`naive_mape`, `points`, `fit_seconds_median` and `model`. Exit status 2 for bad arguments or unreadable input.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from greenserve.common import strict_json
from greenserve.common.ci_units import add_ci_unit_flag, ci_unit_factor
from greenserve.common.cli_parser import Parser
from greenserve.common.file_errors import cannot_read

if TYPE_CHECKING:
    import grpc

    from greenserve.forecaster.csv_sources import RegularSeries
    from greenserve.v1 import common_pb2

DEFAULT_ADDR = "127.0.0.1:50051"


def _connection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--addr", default=os.environ.get("GREENSERVE_FORECASTER_ADDR", DEFAULT_ADDR),
                        help="forecaster host:port (default env GREENSERVE_FORECASTER_ADDR or 127.0.0.1:50051)")
    parser.add_argument("--auth-token", help="bearer token (default env GREENSERVE_AUTH_TOKEN)")
    parser.add_argument("--tls-ca", type=Path, help="PEM CA to trust; turns TLS on")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="deadline of each call (default 30)")


def _csv_flags(parser: argparse.ArgumentParser, *, required_columns: bool) -> None:
    parser.add_argument("--csv", type=Path, required=True, help="CSV file")
    parser.add_argument("--time-column", required=required_columns, help="column with the timestamps (UTC)")
    parser.add_argument("--value-column", required=required_columns, help="column with the values")
    parser.add_argument("--layout", choices=["electricitymaps", "ensembleci", "letswaitawhile", "generic"],
                        help="CSV layout (default: detected from the header); picks default columns")
    parser.add_argument("--time-format", help="strftime format of the time column (default: detected)")
    parser.add_argument("--dayfirst", action="store_true", help="dates are DD/MM/YYYY")
    parser.add_argument("--filter-column", help="keep only rows whose FILTER_COLUMN equals --filter-value")
    parser.add_argument("--filter-value", help="value kept by --filter-column")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="greenserve forecast", description="CI and load forecasts and backtests")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    bt = sub.add_parser("backtest", help="day-ahead backtest of a model on a CSV column (runs locally)")
    _csv_flags(bt, required_columns=True)
    bt.add_argument("--history-hours", type=int, default=72, help="hours of history per fit (24..720, default 72)")
    bt.add_argument("--horizon-hours", type=int, default=24, help="hours forecast per day (1..48, default 24)")
    bt.add_argument("--days", type=int, default=7, help="last N whole UTC days backtested (default 7)")
    bt.add_argument("--model", default="auto", help="model name (default auto)")
    bt.add_argument("--holidays", default=None,
                    help="public holidays of the series' region, off days like weekends: a country (DE) or "
                         "country-subdivision (US-CA); default: weekends only")
    bt.add_argument("--json", action="store_true", help="print only the JSON object")

    ing = sub.add_parser("ingest", help="send a CSV column to a running forecaster (hourly)")
    _csv_flags(ing, required_columns=False)
    target = ing.add_mutually_exclusive_group(required=True)
    target.add_argument("--region", help="carbon-intensity series of this region")
    target.add_argument("--pool", help="load series of this model/pool (values in requests/s)")
    ing.add_argument("--signal", choices=["direct", "lifecycle"], default="direct", help="CI signal")
    add_ci_unit_flag(ing, "the CI column (--region only)")
    ing.add_argument("--batch-points", type=int, default=5000, help="points per IngestPoints call")
    ing.add_argument("--json", action="store_true", help="print one JSON object")
    _connection(ing)

    get = sub.add_parser("get", help="fetch a forecast with prediction intervals")
    tgt = get.add_mutually_exclusive_group(required=True)
    tgt.add_argument("--region", help="carbon-intensity series of this region")
    tgt.add_argument("--pool", help="load series of this pool")
    get.add_argument("--signal", choices=["direct", "lifecycle"], default="direct", help="CI signal")
    get.add_argument("--unit", choices=["requests_per_s", "input_tokens_per_s", "output_tokens_per_s"],
                     default="requests_per_s", help="load quantity")
    get.add_argument("--horizon-steps", type=int, default=24, help="steps ahead (1..168)")
    get.add_argument("--coverage", type=float, default=0.9, help="interval coverage in (0, 1)")
    get.add_argument("--json", action="store_true", help="print one JSON object")
    _connection(get)

    ls = sub.add_parser("list", help="list stored series")
    ls.add_argument("--json", action="store_true", help="print one JSON object")
    _connection(ls)
    return parser


def _read_series(ns: argparse.Namespace, kind: str = "ci") -> RegularSeries:
    from greenserve.forecaster.csv_sources import read_csv_series, to_grid

    raw = read_csv_series(
        ns.csv, time_column=ns.time_column, value_column=ns.value_column, layout=ns.layout,
        signal=getattr(ns, "signal", None), kind=kind, time_format=ns.time_format, dayfirst=ns.dayfirst,
        filter_column=ns.filter_column, filter_value=ns.filter_value,
    )
    return to_grid(raw)


def cmd_backtest(ns: argparse.Namespace) -> int:
    from greenserve.forecaster.backtest import limit_native_threads, run_backtest
    from greenserve.forecaster.forecast_models import MODELS
    from greenserve.forecaster.forecast_models.holiday_calendar import Holidays

    limit_native_threads(1)
    if ns.model not in MODELS:
        print(f"greenserve forecast backtest: error: --model must be one of {', '.join(MODELS)}", file=sys.stderr)
        return 2
    try:
        holidays = Holidays.parse(ns.holidays) if ns.holidays else None
        series = _read_series(ns)
        result = run_backtest(series, history_hours=ns.history_hours, horizon_hours=ns.horizon_hours,
                              days=ns.days, model=ns.model, holidays=holidays)
    except OSError as exc:
        print(f"greenserve forecast backtest: error: {cannot_read(exc)}", file=sys.stderr)
        return 2
    except (ValueError, KeyError) as exc:
        print(f"greenserve forecast backtest: error: {exc}", file=sys.stderr)
        return 2
    out = {
        "series": series.name, "csv": str(ns.csv), "mape": result.mape, "naive_mape": result.naive_mape,
        "ratio_to_naive": result.ratio, "points": result.points, "days": len(result.days),
        "fit_seconds_median": result.fit_seconds_median, "model": result.model,
        "models_used": result.models_used, "history_hours": ns.history_hours, "horizon_hours": ns.horizon_hours,
        "interval_coverage_fraction": result.interval_coverage_fraction,
        "interval_nominal_fraction": result.interval_nominal_fraction,
        "holidays": holidays.name if holidays else None,
    }
    if not ns.json:
        from datetime import datetime, timezone

        for d in result.days:
            day = datetime.fromtimestamp(d.day_s, tz=timezone.utc).date().isoformat()
            print(f"{day}  mape {d.mape_percent:6.2f}%  naive {d.naive_mape_percent:6.2f}%  fit {d.fit_s:5.2f}s  "
                  f"in 90% interval {d.interval_coverage_fraction:4.0%}  {d.model}")
    print(strict_json.dumps(out))
    return 0


def _channel(ns: argparse.Namespace) -> grpc.aio.Channel:
    from greenserve.common.client import ChannelConfig, create_channel
    from greenserve_client.cli import check_connection

    token = ns.auth_token or os.environ.get("GREENSERVE_AUTH_TOKEN")
    check_connection(token, "--auth-token" if ns.auth_token else "GREENSERVE_AUTH_TOKEN", {"--tls-ca": ns.tls_ca})
    return create_channel(ChannelConfig(address=ns.addr, token=token, tls_ca=ns.tls_ca, default_timeout_s=ns.timeout_s))


def _ref(ns: argparse.Namespace) -> common_pb2.SeriesRef:
    from greenserve.v1 import common_pb2

    if ns.region:
        signal = common_pb2.CARBON_SIGNAL_LIFECYCLE if ns.signal == "lifecycle" else common_pb2.CARBON_SIGNAL_DIRECT
        return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key=ns.region,
                                    carbon_signal=signal, unit=common_pb2.UNIT_G_PER_KWH)
    unit = {"requests_per_s": common_pb2.UNIT_REQUESTS_PER_S, "input_tokens_per_s": common_pb2.UNIT_INPUT_TOKENS_PER_S,
            "output_tokens_per_s": common_pb2.UNIT_OUTPUT_TOKENS_PER_S}[getattr(ns, "unit", "requests_per_s")]
    return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key=ns.pool, unit=unit)


async def _ingest(ns: argparse.Namespace) -> dict[str, object]:
    from google.protobuf.timestamp_pb2 import Timestamp

    from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

    if ns.pool and ns.ci_unit:
        raise ValueError("--ci-unit is the unit of a CI series (--region); a load series (--pool) is in requests/s")
    scale = ci_unit_factor(ns.ci_unit, ns.value_column) if ns.region else 1.0
    series = _read_series(ns, kind="ci" if ns.region else "load")
    times = series.times_s[np.isfinite(series.values)]
    values = series.values[np.isfinite(series.values)] * scale
    inserted = duplicates = 0
    gaps: list[dict[str, object]] = []
    channel = _channel(ns)
    try:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        for lo in range(0, len(values), ns.batch_points):
            points = [common_pb2.TimeSeriesPoint(time=Timestamp(seconds=int(t)), value=float(v))
                      for t, v in zip(times[lo:lo + ns.batch_points], values[lo:lo + ns.batch_points], strict=True)]
            reply = await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(
                series=_ref(ns), resolution_s=series.step_s, points=points, source=f"csv:{ns.csv.name}"))
            inserted += reply.inserted_points
            duplicates += reply.duplicate_points
            gaps = [{"start": g.start.ToJsonString(), "missing_points": g.missing_points} for g in reply.gaps]
    finally:
        await channel.close()
    return {"inserted_points": inserted, "duplicate_points": duplicates, "gaps": gaps}


async def _get(ns: argparse.Namespace) -> dict[str, object]:
    from greenserve.v1 import forecaster_pb2, forecaster_pb2_grpc

    channel = _channel(ns)
    try:
        reply = await forecaster_pb2_grpc.ForecasterServiceStub(channel).GetForecast(forecaster_pb2.GetForecastRequest(
            series=_ref(ns), horizon_steps=ns.horizon_steps, interval_coverage_fraction=ns.coverage))
    finally:
        await channel.close()
    f = reply.forecast
    return {"model": f.model, "interval_coverage_fraction": f.interval_coverage_fraction,
            "history_end": f.history_end.ToJsonString(), "resolution_s": f.resolution_s,
            "points": [{"time": p.time.ToJsonString(), "mean": p.mean, "lower": p.lower, "upper": p.upper}
                       for p in f.points]}


async def _list(ns: argparse.Namespace) -> dict[str, object]:
    from google.protobuf.json_format import MessageToDict

    from greenserve.v1 import forecaster_pb2, forecaster_pb2_grpc

    channel = _channel(ns)
    try:
        reply = await forecaster_pb2_grpc.ForecasterServiceStub(channel).ListSeries(forecaster_pb2.ListSeriesRequest())
    finally:
        await channel.close()
    return MessageToDict(reply, preserving_proto_field_name=True)


def _remote(ns: argparse.Namespace) -> int:
    import grpc

    action = {"ingest": _ingest, "get": _get, "list": _list}[ns.action]
    try:
        out = asyncio.run(action(ns))
    except grpc.aio.AioRpcError as exc:
        from greenserve_client import rpc_errors

        return rpc_errors.report(f"greenserve forecast {ns.action}", exc, "forecaster", ns.addr, "--addr")
    except OSError as exc:
        print(f"greenserve forecast {ns.action}: error: {cannot_read(exc)}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"greenserve forecast {ns.action}: error: {exc}", file=sys.stderr)
        return 2
    if ns.json or ns.action == "list":
        print(strict_json.dumps(out))
    elif ns.action == "get":
        print(f"model {out['model']}  ({out['interval_coverage_fraction']:.0%} interval)")
        points = out["points"]
        assert isinstance(points, list)  # _get answers a list of point dicts
        for p in points:
            print(f"{p['time']}  {p['mean']:10.2f}  [{p['lower']:.2f}, {p['upper']:.2f}]")
    else:
        gaps = out["gaps"]
        assert isinstance(gaps, list)  # _ingest answers a list of gap dicts
        print(f"inserted {out['inserted_points']}, duplicates {out['duplicate_points']}, gaps {len(gaps)}")
    return 0


def main(argv: list[str]) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.action == "backtest":
        return cmd_backtest(ns)
    if not 0 < ns.timeout_s <= 86400:  # also refuses nan
        parser.error(f"--timeout-s must be in (0, 86400] seconds, got {ns.timeout_s}")
    if ns.action == "get" and not (1 <= ns.horizon_steps <= 168 and 0 < ns.coverage < 1):
        parser.error("--horizon-steps must be in 1..168 and --coverage in (0, 1)")
    if ns.action == "ingest" and ns.batch_points < 1:
        parser.error("--batch-points must be >= 1")
    return _remote(ns)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
