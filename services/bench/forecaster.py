"""`greenserve bench forecaster`: day-ahead MAPE against seasonal naive on the shipped series or a data folder.

Without ``--data-dir`` it runs on what the package ships (the evaluation's four grids, 22 days of 2022
life-cycle CI each, and the demo's Azure 2024 conversation week), so that a clone runs it alone. ``--data-dir``
points it at a folder laid out like the public datasets (:data:`DATA_DIR_HELP`); the figures in
docs/forecaster.md were measured on such a folder.

CI series (every file x signal): the last 14 whole days, 336 h of history each. Load traces (Azure 2024
code/conv, ServeGen m-large/m-mid, WorldCup98), resampled hourly by the ingestion code with gaps kept
missing: every whole day that has 72 h of history before it (GreenCache's 72 h in, 24 h out). Series run in
parallel in a process pool (one BLAS thread per worker). Progress goes to stderr; the last stdout line is one
JSON object with per-series results and a summary (max and mean MAPE ratio to naive per kind).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from greenserve.common import strict_json
from greenserve.common.cli_parser import Parser
from greenserve.common.parent_death import exit_with_parent
from greenserve.forecaster.backtest import limit_native_threads, run_backtest
from greenserve.forecaster.forecast_models.holiday_calendar import holidays_for_region
from greenserve.forecaster.csv_sources import CatalogEntry, catalog, load_entry
from greenserve.forecaster.forecast_models import DEFAULT_MODEL, MODELS

CI_DAYS = 14
CI_HISTORY_HOURS = 336
LOAD_HISTORY_HOURS = 72
LOAD_DAYS = 366  # every day that has 72 h of history
#: The GetForecast latency is timed on this series' last 14 days: the full data set's Spain 2023 when given,
#: else the shipped Spain 2022 (then the first entry selected).
RPC_SERIES = ("em/ES_2023/lifecycle", "em/ES_2022-06/lifecycle")

DATA_DIR_HELP = (
    "a folder laid out like the public datasets, one sub-folder each with the upstream file names: "
    "ci_electricitymaps_greendcc/ and ci_electricitymaps_es/ (Electricity Maps data-portal <ZONE>_<YEAR>_hourly.csv, "
    "as in HewlettPackard/green-dcc data/carbon_intensity and umassos/decarbonization-potential "
    "downloaded_carbon_data), ci_electricitymaps_fr2022/FR_2022_hourly_normalized.csv (Electricity Maps FR 2022), "
    "ci_em2022_derived_fi_se3/<ZONE>_2022_hourly_lca_derived.csv (Datetime (UTC), Zone Id, Carbon Intensity "
    "gCO2eq/kWh (LCA, derived)), ci_ensembleci/<REGION>_{direct,lifecycle}_emissions.csv (EnsembleCI / CarbonCast "
    "data/<REGION>), ci_letswaitawhile_2020/<zone>_ci.csv (Let's Wait Awhile data/), "
    "azure_llm_2024_week/azure2024_llm_requests_per_minute.csv (minute,code_requests,conv_requests: Azure LLM "
    "inference trace 2024 counted per minute), servegen_bailian_language/servegen_language_total_rate_10min.csv "
    "(alibaba/ServeGen data/language summed over clients: t_s, <model>_rate_rps, <model>_all_clients_zero), "
    "worldcup98_http/invocation_count.csv (period,count: WorldCup98 requests per minute). Missing sub-folders "
    "are skipped. Default: the series this package ships"
)


def _run_one(entry: CatalogEntry, data_dir: str, model: str, days: int | None) -> dict[str, object]:
    limit_native_threads(1)
    t0 = time.perf_counter()
    series = load_entry(entry, Path(data_dir) if data_dir else None)
    if entry.kind == "ci":
        hist, n_days = CI_HISTORY_HOURS, days or CI_DAYS
    else:
        hist, n_days = LOAD_HISTORY_HOURS, days or LOAD_DAYS
    holidays = holidays_for_region(series.region) if entry.kind == "ci" else None  # load: region unknown
    result = run_backtest(series, history_hours=hist, horizon_hours=24, days=n_days, model=model, holidays=holidays)
    return {
        "series": entry.name, "kind": entry.kind, "mape": result.mape, "naive_mape": result.naive_mape,
        "ratio_to_naive": result.ratio, "points": result.points, "days": len(result.days),
        "history_hours": hist, "fit_seconds_median": result.fit_seconds_median,
        "fit_seconds_max": max(d.fit_s for d in result.days), "model": result.model,
        "models_used": result.models_used, "wall_s": time.perf_counter() - t0,
        "interval_coverage_fraction": result.interval_coverage_fraction,
        "holidays": holidays.name if holidays else None,
    }


def _summary(rows: list[dict[str, object]], kind: str) -> dict[str, object]:
    sel = [r for r in rows if r["kind"] == kind]
    if not sel:
        return {}
    ratios = [float(r["ratio_to_naive"]) for r in sel]  # type: ignore[arg-type]
    coverage = [float(r["interval_coverage_fraction"]) for r in sel]  # type: ignore[arg-type]
    worst = max(sel, key=lambda r: float(r["ratio_to_naive"]))  # type: ignore[arg-type]
    return {
        "series": len(sel), "ratio_max": max(ratios), "ratio_mean": statistics.fmean(ratios),
        "worst_series": worst["series"], "mape_mean": statistics.fmean(float(r["mape"]) for r in sel),  # type: ignore[arg-type]
        "naive_mape_mean": statistics.fmean(float(r["naive_mape"]) for r in sel),  # type: ignore[arg-type]
        "series_at_or_below_0_95": sum(1 for x in ratios if x <= 0.95),
        "fit_seconds_median": statistics.median(float(r["fit_seconds_median"]) for r in sel),  # type: ignore[arg-type]
        "fit_seconds_max": max(float(r["fit_seconds_max"]) for r in sel),  # type: ignore[arg-type]
        # share of scored points inside the 90 % interval, mean over series and the lowest series
        "interval_coverage_mean": statistics.fmean(coverage), "interval_coverage_min": min(coverage),
    }


async def _rpc_latency(series_values: list[float], start_s: int, calls: int, model: str) -> dict[str, object]:
    """Start a forecaster in-process, ingest one series, wait for its fit, then time ``calls`` GetForecast RPCs
    (24 steps, 90 % interval) over a real gRPC channel on loopback."""
    import asyncio
    import tempfile

    import grpc
    from google.protobuf.timestamp_pb2 import Timestamp
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from greenserve.common.app import start_service
    from greenserve.common.telemetry import setup_telemetry
    from greenserve.forecaster.service import build
    from greenserve.forecaster.settings import ForecasterSettings
    from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

    with tempfile.TemporaryDirectory() as tmp:
        settings = ForecasterSettings.model_validate({"host": "127.0.0.1", "port": 0, "data_dir": tmp,
                                                      "forecast_model": model, "log_level": "WARNING"})
        telemetry = setup_telemetry("forecaster", span_exporter=InMemorySpanExporter(),
                                    metric_reader=InMemoryMetricReader(), install_global=False)
        server = await start_service(settings, build, telemetry=telemetry)
        ref = common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key="bench",
                                   carbon_signal=common_pb2.CARBON_SIGNAL_LIFECYCLE)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
                points = [common_pb2.TimeSeriesPoint(time=Timestamp(seconds=start_s + i * 3600), value=v)
                          for i, v in enumerate(series_values)]
                await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(series=ref, resolution_s=3600,
                                                                           points=points))
                t_fit = time.perf_counter()
                name = ""
                while time.perf_counter() - t_fit < 300:
                    listed = await stub.ListSeries(forecaster_pb2.ListSeriesRequest())
                    name = listed.series[0].model if listed.series else ""
                    if name:
                        break
                    await asyncio.sleep(0.1)
                fit_wait_s = time.perf_counter() - t_fit
                request = forecaster_pb2.GetForecastRequest(series=ref, horizon_steps=24)
                await stub.GetForecast(request)
                latencies = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    reply = await stub.GetForecast(request)
                    latencies.append((time.perf_counter() - t0) * 1000)
                # after an online update (new point), the first call recomputes the forecast
                last = start_s + (len(series_values) - 1) * 3600
                await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(series=ref, resolution_s=3600, points=[
                    common_pb2.TimeSeriesPoint(time=Timestamp(seconds=last + 3600), value=series_values[-24])]))
                t0 = time.perf_counter()
                await stub.GetForecast(request)
                after_update_ms = (time.perf_counter() - t0) * 1000
        finally:
            await server.stop(0)
            telemetry.shutdown()
    ordered = sorted(latencies)
    return {"calls": calls, "model": reply.forecast.model, "fit_wait_s": fit_wait_s,
            "p50_ms": ordered[len(ordered) // 2], "p99_ms": ordered[int(len(ordered) * 0.99) - 1],
            "max_ms": ordered[-1], "first_call_after_update_ms": after_update_ms}


def main(argv: list[str], prog: str = "greenserve bench forecaster") -> int:
    parser = Parser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="(the last line is always JSON; kept for symmetry)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes (default: cores)")
    parser.add_argument("--series", action="append", default=[], metavar="SUBSTRING",
                        help="only series whose name contains this (repeatable)")
    parser.add_argument("--kind", choices=["ci", "load", "all"], default="all", help="which series")
    parser.add_argument("--days", type=int, help="override the number of backtested days per series")
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS), help="model (default auto)")
    parser.add_argument("--data-dir", type=Path, default=None, help=DATA_DIR_HELP)
    parser.add_argument("--rpc-calls", type=int, default=1000,
                        help="GetForecast calls timed against an in-process service (0: skip)")
    ns = parser.parse_args(argv)
    if ns.workers < 1 or (ns.days is not None and ns.days < 1):
        parser.error("--workers and --days must be >= 1")
    data_dir: Path | None = ns.data_dir
    if data_dir is not None and not data_dir.is_dir():
        print(f"{prog}: error: --data-dir {data_dir} is not a folder", file=sys.stderr)
        return 2
    entries = [e for e in catalog(data_dir) if (ns.kind == "all" or e.kind == ns.kind)
               and (not ns.series or any(s in e.name for s in ns.series))]
    if not entries:
        where = data_dir if data_dir is not None else "the shipped series (--data-dir: a public-dataset folder)"
        print(f"{prog}: error: no series selected in {where}", file=sys.stderr)
        return 2
    limit_native_threads(1)
    t0 = time.perf_counter()
    rows: list[dict[str, object]] = []
    errors: list[dict[str, str]] = []
    with ProcessPoolExecutor(max_workers=min(ns.workers, len(entries)), initializer=exit_with_parent,
                             initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(_run_one, e, str(data_dir or ""), ns.model, ns.days): e for e in entries}
        for future in as_completed(futures):
            entry = futures[future]
            try:
                row = future.result()
            except Exception as exc:  # noqa: BLE001 - one unreadable series must not hide the others' results
                errors.append({"series": entry.name, "error": str(exc)})
                print(f"{entry.name}: ERROR {exc}", file=sys.stderr)
                continue
            rows.append(row)
            print(f"{row['series']:42s} mape {row['mape']:7.2f}  naive {row['naive_mape']:7.2f}  "
                  f"ratio {row['ratio_to_naive']:.3f}  fit {row['fit_seconds_median']:.2f}s  "
                  f"in 90% interval {row['interval_coverage_fraction']:.2f}  "
                  f"[{len(rows)}/{len(entries)}]", file=sys.stderr, flush=True)
    rows.sort(key=lambda r: str(r["series"]))
    rpc: dict[str, object] = {}
    if ns.rpc_calls > 0:
        import asyncio

        rpc_entry = next((e for e in catalog(data_dir) if e.name in RPC_SERIES), entries[0])
        grid = load_entry(rpc_entry, data_dir)
        tail = grid.values[-14 * 24:]
        start = grid.start_s + (len(grid.values) - len(tail)) * 3600
        rpc = asyncio.run(_rpc_latency([float(v) for v in tail], start, ns.rpc_calls, ns.model))
        rpc["series"] = rpc_entry.name
        print(f"GetForecast over gRPC: p50 {rpc['p50_ms']:.2f} ms, p99 {rpc['p99_ms']:.2f} ms "
              f"({rpc['calls']} calls, model {rpc['model']})", file=sys.stderr)
    out = {
        "benchmark": "forecaster", "model": ns.model, "workers": ns.workers, "wall_s": time.perf_counter() - t0,
        "ci": _summary(rows, "ci"), "load": _summary(rows, "load"), "forecast_rpc": rpc, "series": rows,
        "errors": errors,
    }
    print(strict_json.dumps(out))
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
