"""`greenserve bench plan`: how long ComputePlan takes on a fleet of 16 pools and 64 GPUs over 24 hourly intervals,
and how soon a new plan reaches the processes watching plans.

A forecaster (seasonal-naive model), a profiler (with the seeds' published profiles), a cache-manager and an
optimizer run in-process on a thread of their own with their own event loop; the bench is their client over loopback gRPC,
as the CLI and the enforcers are. The forecaster holds 3 days of synthetic hourly history: a daily sine per grid
region (4 regions, 50..650 g/kWh) and per pool (0.5..3 req/s). The fleet: pools in turn on A100-80GB, H100-80GB
and A100-40GB GPUs; in each pool half the GPUs serve one engine on the whole GPU and half are MIG-partitioned
into two 3g slices with one engine each (16 pools x 4 GPUs: 96 engines).

* Solvers: ``--solvers issue17`` (the default) runs the planner framework's own solvers, min-carbon routing weights
  and keep-current for the cache, MIG and serving-mode knobs; ``--solvers default`` whatever the optimizer runs
  by default (the knob solvers of later issues included).
* ``compute_first_s``: the first ComputePlan after start, with the simulator's capacity predictions (cached per
  performance profile, SLO and request shape: later computations reuse them) and the optimizer's first
  forecasts. ``compute_s``: the median wall time of the next ``--repetitions`` ComputePlan RPCs as the client
  sees them (inputs gathered over gRPC, every solver, the plan stored and activated); ``compute_server_s``
  is the optimizer's own ``solve_s`` (the same minus the RPC).
* ``watch_delivery_ms_p99``: ``--watchers`` WatchPlans streams (each on its own channel) are open while the bench
  alternates ActivatePlan between the last two plans ``--activations`` times; for each activation and watcher the
  time from the activation (the optimizer's PlanStore publishing the plan, right after its transaction commits)
  to the watcher's receipt of the whole plan. ``watch_delivery_from_call_ms_p99`` measures from the ActivatePlan
  call (an upper bound that includes the RPC and the database write), ``watch_delivery_after_reply_ms_p99`` from
  its reply (0 when the plan arrived first, which is the rule: the optimizer publishes before it replies).

Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from greenserve.common import strict_json
from greenserve.common.cli_parser import Parser
from greenserve.v1 import common_pb2

REGIONS = (("FR", 50.0, 25.0), ("DE", 350.0, 120.0), ("ES", 150.0, 70.0), ("PL", 650.0, 80.0))
# (hardware, GPU model, served model, simulator model, MIG profile, its size in memory slices)
KINDS = (
    ("A100-80GB", common_pb2.GPU_MODEL_A100_80GB, "meta-llama/Meta-Llama-3-8B-Instruct", "llama3-8b", "3g.40gb", 4),
    ("H100-80GB", common_pb2.GPU_MODEL_H100_80GB, "meta-llama/Meta-Llama-3-8B-Instruct", "llama3-8b", "3g.40gb", 4),
    ("A100-40GB", common_pb2.GPU_MODEL_A100_40GB, "meta-llama/Llama-3.2-1B-Instruct", "llama3.2-1b", "3g.20gb", 4),
)
HISTORY_DAYS = 3
GIB = 1024**3


def build_fleet(pools: int, gpus: int) -> common_pb2.FleetInventory:
    """``pools`` pools sharing ``gpus`` GPUs (as evenly as they divide); see the module docstring."""
    fleet = common_pb2.FleetInventory(max_cache_storage_bytes=16 * 10**12)
    for p in range(pools):
        hardware, model_enum, model, sim_model, mig_profile, mig_size = KINDS[p % len(KINDS)]
        region = REGIONS[p % len(REGIONS)][0]
        pool = fleet.pools.add(
            name=f"pool-{p:02d}", model=model, region=region,
            slo=common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9),
            max_cache_dram_bytes=64 * GIB, max_cache_disk_bytes=2 * 10**12, cache_step_bytes=10**12,
            mean_prompt_tokens=1024, mean_output_tokens=256)
        pool.variants.add(name="default", model=model, quality_fraction=1.0, quality_source="the pool's only variant",
                          simulator_model=sim_model)
        count = gpus // pools + (1 if p < gpus % pools else 0)
        for g in range(count):
            uuid = f"GPU-bench-{p:02d}-{g:02d}"
            gpu = fleet.gpus.add(uuid=uuid, model=model_enum, node=f"node-{(p * 4 + g) // 8:02d}", pool=pool.name,
                                 hardware=hardware)
            if g % 2 == 1:  # MIG: two 3g slices, one engine each
                gpu.mig_enabled = True
                for k in range(2):
                    mig_uuid = f"MIG-bench-{p:02d}-{g:02d}-{k}"
                    engine_id = f"{pool.name}-g{g}-mig{k}"
                    gpu.instances.add(uuid=mig_uuid, profile=mig_profile, placement_start=k * mig_size,
                                      placement_size=mig_size, engine_id=engine_id)
                    pool.engines.add(id=engine_id, url=f"http://127.0.0.1:9/{engine_id}", gpu_uuid=uuid,
                                     mig_uuid=mig_uuid, hardware=f"{hardware}-MIG-{mig_profile}",
                                     kind=common_pb2.ENGINE_KIND_SIMULATED, model_variant="default")
            else:
                engine_id = f"{pool.name}-g{g}"
                pool.engines.add(id=engine_id, url=f"http://127.0.0.1:9/{engine_id}", gpu_uuid=uuid, hardware=hardware,
                                 kind=common_pb2.ENGINE_KIND_SIMULATED, model_variant="default")
    return fleet


def _daily(base: float, amplitude: float, end_s: int, days: int) -> list[common_pb2.TimeSeriesPoint]:
    points = []
    for h in range(days * 24):
        t = end_s - (days * 24 - 1 - h) * 3600
        value = base + amplitude * math.sin(2 * math.pi * ((t / 3600) % 24) / 24)
        point = common_pb2.TimeSeriesPoint(value=max(value, 0.0))
        point.time.FromSeconds(int(t))
        points.append(point)
    return points


class Services:
    """Forecaster, profiler and optimizer serving from one background thread and its event loop."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.addresses: dict[str, str] = {}
        self.optimizer: Any = None  # the optimizer's ServiceServer (its PlanStore is read for publish times)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="bench-services", daemon=True)

    def __enter__(self) -> Services:
        self._thread.start()
        self._ready.wait(300)
        if self._error is not None:
            raise self._error
        if not self._ready.is_set():
            raise TimeoutError("services did not start within 300 s")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from greenserve.cache_manager.service import build as build_cache_manager
        from greenserve.cache_manager.settings import CacheManagerSettings
        from greenserve.common.app import start_service
        from greenserve.common.telemetry import setup_telemetry
        from greenserve.forecaster.service import build as build_forecaster
        from greenserve.forecaster.settings import ForecasterSettings
        from greenserve.optimizer.service import OptimizerSettings
        from greenserve.optimizer.service import build as build_optimizer
        from greenserve.profiler.service import ProfilerSettings
        from greenserve.profiler.service import build as build_profiler

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        started = []

        async def start(settings_cls: Any, build: Callable[..., Any], **values: Any) -> str:
            settings = settings_cls.model_validate({"host": "127.0.0.1", "port": 0, "log_level": "WARNING",
                                                    "data_dir": self.data_dir / settings_cls.service_name, **values})
            telemetry = setup_telemetry(settings.service_name, span_exporter=InMemorySpanExporter(),
                                        metric_reader=InMemoryMetricReader(), install_global=False)
            server = await start_service(settings, build, telemetry=telemetry)
            started.append((server, telemetry))
            return f"127.0.0.1:{server.port}"

        try:
            self.addresses["forecaster"] = await start(ForecasterSettings, build_forecaster,
                                                       forecast_model="seasonal_naive")
            self.addresses["profiler"] = await start(ProfilerSettings, build_profiler, engine_backend=False,
                                                     nvml_power="off")
            # The optimizer reads the cache sizes in force from the cache-manager (no LMCache server registered
            # here); it does not follow plans, so the watchers are the bench's own.
            self.addresses["cache_manager"] = await start(CacheManagerSettings, build_cache_manager,
                                                          follow_plans=False)
            self.addresses["optimizer"] = await start(
                OptimizerSettings, build_optimizer, forecaster_addr=self.addresses["forecaster"],
                profiler_addr=self.addresses["profiler"], cache_manager_addr=self.addresses["cache_manager"],
                schedule_plans=False, ci_monitor_interval_s=0)
            self.optimizer = started[-1][0]
            self._ready.set()
            await self._stop.wait()
        finally:
            for server, telemetry in reversed(started):
                await server.stop(0)
                telemetry.shutdown()


def optimizer_loop(optimizer: Any) -> Any:
    """The OptimizerLoop behind a running optimizer's servicer."""
    return next(r.servicer for r in optimizer.registrations if hasattr(r.servicer, "loop")).loop


def use_solvers(optimizer: Any, which: str) -> list[str]:
    """Sets the planner's solvers: ``issue17`` (min-carbon routing, keep-current for the other knobs) or
    ``default`` (what the optimizer runs by default); returns their names."""
    planner = optimizer_loop(optimizer).planner
    if which == "issue17":
        from greenserve.optimizer.solvers.keep_current import KeepCurrent
        from greenserve.optimizer.solvers.routing_weights import MinCarbonRouting

        planner.solvers = [MinCarbonRouting(), KeepCurrent("cache_targets"), KeepCurrent("mig_layouts"),
                           KeepCurrent("serving_modes")]
    return [solver.name for solver in planner.solvers]


def publish_times(optimizer: Any) -> list[tuple[int, float]]:
    """(version, perf_counter) of every plan the optimizer's PlanStore publishes to its watchers from now on: the
    instant a plan is put in force (after its transaction commits)."""
    plans = optimizer_loop(optimizer).plans
    out: list[tuple[int, float]] = []
    publish = plans._publish

    def timed(plan: common_pb2.Plan) -> None:
        out.append((plan.version, time.perf_counter()))
        publish(plan)

    plans._publish = timed
    return out


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _run(ns: argparse.Namespace, addresses: dict[str, str], optimizer: Any) -> dict[str, Any]:
    import grpc

    from greenserve.common.clock import hour_floor_s, now_s
    from greenserve.optimizer import capacity
    from greenserve.v1 import forecaster_pb2, forecaster_pb2_grpc, optimizer_pb2, optimizer_pb2_grpc

    fleet = build_fleet(ns.pools, ns.gpus)
    engines = sum(len(p.engines) for p in fleet.pools)
    end = int(hour_floor_s(now_s()))
    fc_channel = grpc.aio.insecure_channel(addresses["forecaster"])
    forecaster = forecaster_pb2_grpc.ForecasterServiceStub(fc_channel)
    refs = []
    for region, base, amplitude in REGIONS[:min(len(REGIONS), ns.pools)]:
        refs.append((common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key=region,
                                          carbon_signal=common_pb2.CARBON_SIGNAL_DIRECT, unit=common_pb2.UNIT_G_PER_KWH),
                     base, amplitude))
    for i, pool in enumerate(fleet.pools):
        base = 0.5 + 2.5 * (i % 6) / 5
        refs.append((common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key=pool.name,
                                          unit=common_pb2.UNIT_REQUESTS_PER_S), base, 0.4 * base))
    for ref, base, amplitude in refs:
        await forecaster.IngestPoints(forecaster_pb2.IngestPointsRequest(
            series=ref, resolution_s=3600, points=_daily(base, amplitude, end, HISTORY_DAYS), source="bench"))
    for ref, _, _ in refs:  # every series answers before the first computation
        await forecaster.GetForecast(forecaster_pb2.GetForecastRequest(series=ref, horizon_steps=24))
    _log(f"forecaster: {len(refs)} series of {HISTORY_DAYS * 24} h")

    channel = grpc.aio.insecure_channel(addresses["optimizer"], options=[("grpc.max_receive_message_length", 64 << 20)])
    stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=fleet))
    _log(f"fleet: {ns.pools} pools, {len(fleet.gpus)} GPUs, {engines} engines")

    solvers = use_solvers(optimizer, ns.solvers)
    _log(f"solvers: {', '.join(solvers)}")
    request = optimizer_pb2.ComputePlanRequest(horizon_hours=ns.horizon_hours)
    capacity.predict.cache_clear()  # the first computation pays for the predictions, also when run twice
    t0 = time.perf_counter()
    first = await stub.ComputePlan(request, timeout=600)
    first_s = time.perf_counter() - t0
    plan_bytes = first.plan.ByteSize()
    _log(f"first ComputePlan: {first_s:.3f} s (server {first.solve_s:.3f} s), plan of {plan_bytes} bytes")

    # Watchers, each on its own channel: (version, receipt time) per plan received.
    received: list[asyncio.Queue[tuple[int, float]]] = [asyncio.Queue() for _ in range(ns.watchers)]
    watch_channels = [grpc.aio.insecure_channel(addresses["optimizer"],
                                                options=[("grpc.max_receive_message_length", 64 << 20)])
                      for _ in range(ns.watchers)]

    async def watch(i: int) -> None:
        stream = optimizer_pb2_grpc.OptimizerServiceStub(watch_channels[i]).WatchPlans(
            optimizer_pb2.WatchPlansRequest())
        async for reply in stream:
            received[i].put_nowait((reply.plan.version, time.perf_counter()))

    tasks = [asyncio.get_running_loop().create_task(watch(i)) for i in range(ns.watchers)]
    published = publish_times(optimizer)

    async def receipts(version: int, timeout_s: float = 10.0) -> list[float]:
        out = []
        for queue in received:
            while True:
                got, t = await asyncio.wait_for(queue.get(), timeout_s)
                if got == version:
                    out.append(t)
                    break
        return out

    try:
        await receipts(first.plan.version)  # each watcher starts with the plan in force
        compute_s, server_s, compute_delivery_ms = [], [], []
        versions = [first.plan.version]
        for _ in range(ns.repetitions):
            t0 = time.perf_counter()
            reply = await stub.ComputePlan(request, timeout=600)
            compute_s.append(time.perf_counter() - t0)
            server_s.append(reply.solve_s)
            versions.append(reply.plan.version)
            got = await receipts(reply.plan.version)
            t_publish = next(t for v, t in reversed(published) if v == reply.plan.version)
            compute_delivery_ms += [(t - t_publish) * 1000 for t in got]
        _log(f"ComputePlan x{ns.repetitions}: median {statistics.median(compute_s):.3f} s, "
             f"max {max(compute_s):.3f} s")

        delivery_ms, from_call_ms, after_reply_ms = [], [], []
        before_reply = 0
        pair = versions[-2:] if len(versions) >= 2 else versions * 2
        for i in range(ns.activations):
            version = pair[i % 2]
            t0 = time.perf_counter()
            await stub.ActivatePlan(optimizer_pb2.ActivatePlanRequest(version=version))
            t1 = time.perf_counter()
            got = await receipts(version)
            t_publish = next(t for v, t in reversed(published) if v == version)
            for t in got:
                before_reply += t < t1
                delivery_ms.append((t - t_publish) * 1000)
                from_call_ms.append((t - t0) * 1000)
                after_reply_ms.append(max(0.0, t - t1) * 1000)
        _log(f"ActivatePlan x{ns.activations} -> {ns.watchers} watchers: p99 {_percentile(delivery_ms, 99):.2f} ms "
             f"after activation, p99 {_percentile(from_call_ms, 99):.2f} ms from the call; {before_reply} of "
             f"{len(delivery_ms)} arrived before the ActivatePlan reply")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ch in (*watch_channels, channel, fc_channel):
            await ch.close()

    return {
        "benchmark": "plan", "pools": ns.pools, "gpus": len(fleet.gpus), "engines": engines,
        "horizon_hours": ns.horizon_hours, "plan_bytes": plan_bytes, "solvers": solvers,
        "compute_s": statistics.median(compute_s) if compute_s else first_s,
        "compute_s_max": max(compute_s) if compute_s else first_s,
        "compute_server_s": statistics.median(server_s) if server_s else first.solve_s,
        "compute_first_s": first_s, "compute_first_server_s": first.solve_s,
        "repetitions": ns.repetitions,
        "solver_s": {o.solver: o.solve_s for o in reply.plan.solver_outcomes} if ns.repetitions else {},
        "watchers": ns.watchers, "activations": ns.activations, "deliveries": len(delivery_ms),
        "watch_delivery_ms_p99": _percentile(delivery_ms, 99), "watch_delivery_ms_p50": _percentile(delivery_ms, 50),
        "watch_delivery_ms_max": max(delivery_ms, default=math.nan),
        "watch_delivery_from_call_ms_p99": _percentile(from_call_ms, 99),
        "watch_delivery_after_reply_ms_p99": _percentile(after_reply_ms, 99),
        "watch_delivered_before_reply": before_reply,
        "watch_delivery_after_compute_ms_max": max(compute_delivery_ms, default=math.nan),
        "targets": {"compute_s": 1.0, "watch_delivery_ms_p99": 100.0},
    }


def main(argv: list[str], prog: str = "greenserve bench plan") -> int:
    parser = Parser(prog=prog, description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--json", action="store_true", help="(the last line is always JSON; kept for symmetry)")
    parser.add_argument("--pools", type=int, default=16, help="pools (default 16)")
    parser.add_argument("--gpus", type=int, default=64, help="GPUs, shared out among the pools (default 64)")
    parser.add_argument("--horizon-hours", type=int, default=24, help="hourly intervals per plan (default 24)")
    parser.add_argument("--repetitions", type=int, default=7, help="timed ComputePlan calls after the first (default 7)")
    parser.add_argument("--activations", type=int, default=50, help="ActivatePlan calls watched (default 50)")
    parser.add_argument("--watchers", type=int, default=3, help="WatchPlans streams (default 3)")
    parser.add_argument("--solvers", choices=["issue17", "default"], default="issue17",
                        help="issue17: min-carbon routing weights and keep-current for cache, MIG and modes (the "
                             "figure's solvers); default: the optimizer's default set (default issue17)")
    ns = parser.parse_args(argv)
    if not 1 <= ns.pools <= 1024 or ns.gpus < ns.pools or ns.gpus > 65536:
        parser.error("--pools must be in 1..1024 and --gpus in pools..65536")
    if not 1 <= ns.horizon_hours <= 168:
        parser.error("--horizon-hours must be in 1..168")
    if ns.repetitions < 1 or ns.activations < 1 or not 1 <= ns.watchers <= 64:
        parser.error("--repetitions and --activations must be >= 1, --watchers in 1..64")
    with tempfile.TemporaryDirectory(prefix="greenserve-bench-plan-") as tmp, Services(Path(tmp)) as services:
        result = asyncio.run(_run(ns, services.addresses, services.optimizer))
    print(strict_json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
