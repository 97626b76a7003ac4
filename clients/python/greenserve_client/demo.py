"""`greenserve demo`: the whole system through one day of a real grid on a virtual clock, then a report.

Every service, the emulated engines, the real LMCache server and the simulated MIG GPU run as `greenserve up` runs
them, but on one virtual clock (``--clock-start/--clock-speed/--clock-anchor-s`` given to every process): by default
6 July 2022 (GreenCache's evaluation day) lived in 20 minutes. As the clock passes each hour, the grid's actual CI
for it is fed to the forecaster; the Azure 2024 conversation load shape is replayed through the router's
OpenAI-compatible front; the optimizer re-plans ahead of each virtual hour and on events, and the router, the
cache-manager and the gpu-partitioner enforce each plan. Every virtual hour the demo records what was planned (the
plan in force, its expected carbon), what was applied (each component's enforcement state) and what was measured
(requests, errors and latency from the client side). At the end it writes ``result.json``, PNG plots and
``index.html`` into the report folder.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np

from greenserve.common.ci_units import ci_unit_factor
from greenserve.common.client import ChannelConfig, create_channel
from greenserve.common.clock import VirtualClock, hour_floor_s, set_clock
from greenserve.common.names import is_name
from greenserve.evaluation import grids
from greenserve.evaluation.run import load_shape
from greenserve.v1 import cache_manager_pb2, cache_manager_pb2_grpc, optimizer_pb2, optimizer_pb2_grpc
from greenserve_client.demo_report import write_report
from greenserve_client.local_loop import LocalLoopOptions, ci_ref, ingest

HOUR_S = 3600
MAX_IN_FLIGHT = 64
CI_HISTORY_DAYS = 21  # the CI the forecaster is seeded with: the shipped slice's three weeks before its day


@dataclass(frozen=True)
class DemoOptions:
    grid: str = "ES"
    day: str = "2022-07-06"
    minutes: float = 20.0
    hours: int = 24
    peak_requests_per_s: float = 2.0
    max_tokens: int = 16
    model: str = "meta-llama/Meta-Llama-3-8B-Instruct"
    pool: str = "default"
    startup_s: float = 150.0  # real seconds the services get to start before the virtual day begins

    @property
    def day_start_s(self) -> int:
        return int(datetime.fromisoformat(self.day).replace(tzinfo=UTC).timestamp())

    @property
    def speed(self) -> float:
        return self.hours * HOUR_S / (self.minutes * 60.0)


def clock_args(options: DemoOptions, anchor_s: float) -> list[str]:
    return [f"--clock-start={options.day_start_s}", f"--clock-speed={options.speed:g}",
            f"--clock-anchor-s={anchor_s:.3f}"]


def histories(options: DemoOptions, series: grids.GridSeries, until_s: float) -> tuple[
        list[tuple[int, float]], list[tuple[int, float]], np.ndarray]:
    """CI and load points before ``until_s`` (load: the shape's days before the demo day, scaled), and the demo
    day's scaled hourly load."""
    # the CI history the forecaster fits on: the known hours of the CI_HISTORY_DAYS before (a user's CSV may hold
    # years, and hours it misses before the day)
    since_s = options.day_start_s - CI_HISTORY_DAYS * 86400
    ci = [(series.start_s + HOUR_S * i, v) for i, v in enumerate(series.values)
          if since_s <= series.start_s + HOUR_S * i < until_s and math.isfinite(v)]
    shape = load_shape()
    scale = options.peak_requests_per_s / float(shape.max())
    days = len(shape) // 24
    first = options.day_start_s - (days - 1) * 86400
    load = [(first + HOUR_S * i, float(v) * scale) for i, v in enumerate(shape[:(days - 1) * 24])
            if first + HOUR_S * i < until_s]
    return ci, load, shape[(days - 1) * 24:days * 24] * scale


@dataclass
class HourStats:
    """One virtual hour's requests: the latency of each answered one, and how many failed."""

    latency_s: list[float] = field(default_factory=list)
    errors: int = 0


class LoadGenerator:
    """Open-loop Poisson arrivals through the router's OpenAI-compatible front at the virtual hour's rate."""

    def __init__(self, url: str, options: DemoOptions, day_rates: np.ndarray, clock: VirtualClock) -> None:
        self.url = url.rstrip("/") + "/v1/completions"
        self.options = options
        self.rates = day_rates
        self.clock = clock
        self.stats: dict[int, HourStats] = defaultdict(HourStats)
        self.rng = random.Random(7)

    async def run(self, end_s: float) -> None:
        limits = httpx.Limits(max_connections=MAX_IN_FLIGHT)
        gate = asyncio.Semaphore(MAX_IN_FLIGHT)
        async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
            tasks: set[asyncio.Task[None]] = set()
            while self.clock.now_s() < end_s:
                hour = int((self.clock.now_s() - self.options.day_start_s) // HOUR_S)
                rate = float(self.rates[min(max(hour, 0), len(self.rates) - 1)])
                await asyncio.sleep(self.rng.expovariate(max(rate, 0.01)))
                if hour < 0:
                    continue
                await gate.acquire()
                task = asyncio.create_task(self._one(client, hour, gate))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, client: httpx.AsyncClient, hour: int, gate: asyncio.Semaphore) -> None:
        started = time.perf_counter()
        try:
            reply = await client.post(self.url, json={"model": self.options.model, "prompt": "Tell me about carbon.",
                                                      "max_tokens": self.options.max_tokens})
            if reply.status_code == 200:
                self.stats[hour].latency_s.append(time.perf_counter() - started)
            else:
                self.stats[hour].errors += 1
        except httpx.HTTPError:
            self.stats[hour].errors += 1
        finally:
            gate.release()


SNAPSHOT_AT_S = 1800.0  # into each virtual hour


async def _snapshot(optimizer: optimizer_pb2_grpc.OptimizerServiceStub,
                    cache: cache_manager_pb2_grpc.CacheManagerServiceStub) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        status = await optimizer.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(), timeout=10)
        plan = (await optimizer.GetPlan(optimizer_pb2.GetPlanRequest(), timeout=10)).plan
        out.update(plan_version=plan.version, trigger=plan.trigger, fleet_matches_plan=status.fleet_matches_plan,
                   expected_total_g=plan.intervals[0].expected_carbon.total_g if plan.intervals else 0.0,
                   enforcement={f"{r.component}/{r.instance}": optimizer_pb2.EnforcementState.Name(r.state)
                                for r in status.reports},
                   pending_components=list(status.pending_components))
    except grpc.aio.AioRpcError as exc:
        out["plan_error"] = exc.details()
    try:
        servers = (await cache.ListCacheServers(cache_manager_pb2.ListCacheServersRequest(), timeout=10)).servers
        out["cache_dram_bytes"] = sum(s.dram_bytes for s in servers)
    except grpc.aio.AioRpcError as exc:
        out["cache_error"] = exc.details()
    return out


async def drive(addresses: dict[str, str], http_url: str, options: DemoOptions, series: grids.GridSeries,
                day_rates: np.ndarray, clock: VirtualClock) -> dict[str, Any]:
    """Feeds CI hour by hour, replays the load, snapshots the loop every virtual hour; returns the result."""
    channels = {n: create_channel(ChannelConfig(address=a, default_timeout_s=30.0)) for n, a in addresses.items()}
    optimizer = optimizer_pb2_grpc.OptimizerServiceStub(channels["optimizer"])
    cache = cache_manager_pb2_grpc.CacheManagerServiceStub(channels["cache_manager"])
    end_s = options.day_start_s + options.hours * HOUR_S
    generator = LoadGenerator(http_url, options, day_rates, clock)
    load_task = asyncio.create_task(generator.run(end_s))
    fed_until = hour_floor_s(clock.now_s())
    hours: list[dict[str, Any]] = []
    wait_s = max(0.0, (options.day_start_s - clock.now_s()) / options.speed)
    print(f"demo: {options.grid} on {options.day}, {options.hours} virtual hours in {options.minutes:g} min, starting "
          f"in {wait_s:.0f} s; one line per virtual hour, then the report", flush=True)
    try:
        next_hour = options.day_start_s
        while next_hour < end_s:
            await clock.sleep_until(next_hour + 60.0)  # a virtual minute into the hour: the plan for it is in force
            now = clock.now_s()
            # The actual CI of the hours that began, as a grid feed would deliver it.
            new = [(t, v) for t, v in ((series.start_s + HOUR_S * i, v) for i, v in enumerate(series.values))
                   if fed_until <= t <= now]
            await ingest(channels["forecaster"], ci_ref(options.grid), new, "demo:feed")
            fed_until = hour_floor_s(now) + HOUR_S
            record: dict[str, Any] = {"hour": int((next_hour - options.day_start_s) // HOUR_S),
                      "ci_actual_g_per_kwh": float(series.window(int(next_hour), 1)[0])}
            # Half an hour in, the enforcers have had time to apply the plan for the hour (and the re-plans the
            # new CI may have caused): an LMCache DRAM resize is a restart of several real seconds.
            await clock.sleep_until(next_hour + SNAPSHOT_AT_S)
            record.update(await _snapshot(optimizer, cache))
            hours.append(record)
            print(f"demo: {datetime.fromtimestamp(next_hour, UTC):%H:%M} CI {record['ci_actual_g_per_kwh']:.0f} "
                  f"g/kWh, plan v{record.get('plan_version', '?')} ({record.get('trigger', '')}), fleet matches: "
                  f"{record.get('fleet_matches_plan', '?')} (hour {record['hour'] + 1} of {options.hours})", flush=True)
            next_hour += HOUR_S
        await load_task
    finally:
        load_task.cancel()
        for channel in channels.values():
            await channel.close()
    for record in hours:
        stats = generator.stats.get(record["hour"], HourStats())
        latencies = stats.latency_s
        record["requests_ok"] = len(latencies)
        record["requests_failed"] = stats.errors
        record["latency_p50_s"] = float(np.percentile(latencies, 50)) if latencies else None
        record["latency_p99_s"] = float(np.percentile(latencies, 99)) if latencies else None
        record["load_target_requests_per_s"] = float(day_rates[min(record["hour"], len(day_rates) - 1)])
    return {"grid": options.grid, "day": options.day, "minutes": options.minutes, "speed": options.speed,
            "hours": hours}


def grid_series(options: DemoOptions, ci_csv: Path | None = None, time_column: str | None = None,
                value_column: str | None = None, ci_unit: str | None = None) -> grids.GridSeries:
    """The CI the day replays: the shipped grid ``options.grid``, or a user's CSV (read as ``evaluate --ci-csv``
    reads it: hourly or finer rows averaged per UTC hour, in ``ci_unit``), whose region is ``options.grid``.
    ValueError naming the flag when the grid is unknown, the CSV unreadable, its unit unclear or the day's hours not
    all there."""
    if ci_csv is None:
        series = grids.shipped().get(options.grid)
        if series is None:
            raise ValueError(f"--grid: unknown {options.grid!r}; shipped: {', '.join(grids.SHIPPED_REGIONS)}")
    else:
        if not time_column or not value_column:
            raise ValueError("--ci-csv needs --time-column and --value-column")
        if not is_name(options.grid):  # the pools' region and the CI series' key on the wire
            raise ValueError(f"--region: {options.grid!r} (the file's name by default) is not a region name: 1-128 "
                             "of A-Z a-z 0-9 . _ : - starting with a letter or digit; give --region")
        (series,) = grids.read_csv(ci_csv, time_column=time_column, value_column=value_column,
                                   region=options.grid,
                                   value_scale=ci_unit_factor(ci_unit, value_column)).values()
    series.window(options.day_start_s, options.hours)  # the day is covered (raises naming the span)
    return series


def run(options: DemoOptions, *, up_kwargs: dict[str, Any], out: Path, series: grids.GridSeries | None = None) -> int:
    """Starts the fleet on the virtual clock, drives the day, writes the report, stops everything. ``series``: the
    CI to replay (``grid_series``; default the shipped grid ``options.grid``)."""
    from greenserve_client import supervisor

    if series is None:
        series = grid_series(options)
    anchor = time.time() + options.startup_s
    clock = VirtualClock(options.day_start_s, options.speed, anchor)
    set_clock(clock)
    ci, load, day_rates = histories(options, series, options.day_start_s - HOUR_S * 2)
    loop_options = LocalLoopOptions(pool=options.pool, model=options.model, region=options.grid,
                                    ci_history=tuple(ci), load_history=tuple(load))

    def after_start(addresses: dict[str, str], http_url: str) -> int:
        result = asyncio.run(drive(addresses, http_url, options, series, day_rates, clock))
        index = write_report(result, out)
        print(f"demo report: {index}", flush=True)
        return 0

    extra = list(up_kwargs.pop("extra_args", [])) + clock_args(options, anchor)
    return supervisor.up(**up_kwargs, extra_args=extra, loop_options=loop_options, after_start=after_start)
