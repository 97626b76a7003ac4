"""Plans (WatchPlans subscription, persistence, routing without a plan) and the feeds, against small
gRPC peers that implement the contract (the real optimizer/forecaster/cache-manager are other issues)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import grpc
import pytest
from greenserve.common.errors import InvalidArgument
from greenserve.common.persistence import Database
from greenserve.router.accounting.feeds import AccessFeed, LoadFeed
from greenserve.router.routing.enforcer import ActivePlan, PlanError
from greenserve.v1 import (
    cache_manager_pb2,
    cache_manager_pb2_grpc,
    common_pb2,
    forecaster_pb2,
    forecaster_pb2_grpc,
    optimizer_pb2,
    optimizer_pb2_grpc,
    router_pb2,
)
from grpc_status import rpc_status

from tests.conftest import free_port


class Peers(optimizer_pb2_grpc.OptimizerServiceServicer, forecaster_pb2_grpc.ForecasterServiceServicer,
            cache_manager_pb2_grpc.CacheManagerServiceServicer):
    def __init__(self) -> None:
        self.plans: asyncio.Queue[common_pb2.Plan] = asyncio.Queue()
        self.fleet = common_pb2.FleetInventory()
        self.loads: list[forecaster_pb2.StreamLoadRequest] = []
        self.accesses: list[cache_manager_pb2.ReportAccessesRequest] = []
        self.ci = 42.0
        self.refuse_pools: set[str] = set()  # StreamLoad refuses a call holding a sample of these (all or nothing)
        self.load_calls = 0
        self.reports: list[optimizer_pb2.ReportEnforcementRequest] = []

    async def WatchPlans(self, request, context):
        while True:
            yield optimizer_pb2.WatchPlansResponse(plan=await self.plans.get())

    async def GetFleet(self, request, context):
        return optimizer_pb2.GetFleetResponse(fleet=self.fleet)

    async def ReportEnforcement(self, request, context):
        self.reports.append(request)
        return optimizer_pb2.ReportEnforcementResponse()

    async def GetCurrentCarbonIntensity(self, request, context):
        return forecaster_pb2.GetCurrentCarbonIntensityResponse(
            carbon_intensity=common_pb2.CarbonIntensity(region=request.region, ci_g_per_kwh=self.ci))

    async def StreamLoad(self, request_iterator, context):
        self.load_calls += 1
        msgs = [msg async for msg in request_iterator]
        for i, msg in enumerate(msgs):
            if msg.pool in self.refuse_pools:
                err = InvalidArgument(f"samples[{i}].time", "hour 09:00 of the pool is closed")
                await context.abort_with_status(rpc_status.to_status(err.to_status("forecaster")))
        self.loads.extend(msgs)
        return forecaster_pb2.StreamLoadResponse(accepted_samples=len(msgs))

    async def ReportAccesses(self, request_iterator, context):
        n = 0
        async for msg in request_iterator:
            self.accesses.append(msg)
            n += 1
        return cache_manager_pb2.ReportAccessesResponse(accepted_events=n)


@pytest.fixture
async def peers():
    servicer = Peers()
    server = grpc.aio.server()
    optimizer_pb2_grpc.add_OptimizerServiceServicer_to_server(servicer, server)
    forecaster_pb2_grpc.add_ForecasterServiceServicer_to_server(servicer, server)
    cache_manager_pb2_grpc.add_CacheManagerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield servicer, f"127.0.0.1:{port}"
    await server.stop(0)


def _plan(version: int, weights: dict[str, float], pool: str = "default") -> common_pb2.Plan:
    return common_pb2.Plan(version=version, intervals=[common_pb2.PlanInterval(routing_weights=[
        common_pb2.RoutingWeight(pool=pool, engine_id=e, weight=w) for e, w in weights.items()])])


def test_plan_store_persists_and_refuses_bad_plans(tmp_path) -> None:
    db = Database.open(f"sqlite:///{tmp_path / 'r.db'}", "router")
    store = ActivePlan(db)
    assert store.weights_for("p") == (None, 0)  # never a plan: route by load and affinity
    with pytest.raises(PlanError, match=r"routing_weights\[0\].weight"):
        store.apply(_plan(1, {"e": float("nan")}, "p"))
    assert store.version == 0
    plan = _plan(5, {"e1": 2.0, "e2": 1.0}, "p")
    assert store.apply(plan)
    store.persist(plan)
    again = ActivePlan(db)
    assert again.load_persisted()
    assert again.weights_for("p") == ({"e1": 2.0, "e2": 1.0}, 5)
    db.close()


def test_plan_interval_in_force_follows_the_clock() -> None:
    now = [1000.0]
    store = ActivePlan(None, clock=lambda: now[0])
    plan = common_pb2.Plan(version=1)
    for start, weight in ((900, 1.0), (1100, 3.0)):
        iv = plan.intervals.add()
        iv.start.FromSeconds(start)
        iv.end.FromSeconds(start + 200)
        iv.routing_weights.add(pool="p", engine_id="e", weight=weight)
    store.apply(plan)
    assert store.weights_for("p")[0] == {"e": 1.0}
    now[0] = 1150.0
    assert store.weights_for("p")[0] == {"e": 3.0}
    now[0] = 5000.0  # past the plan: the last interval stays in force
    assert store.weights_for("p")[0] == {"e": 3.0}


def test_a_plans_mig_placement_weights_every_engine_on_the_instance() -> None:
    # The fleet lists an instance's engines in engine_ids (engine_id is only the first, for old readers): the
    # router took engine_id alone and weighted the prefiller but not its decoder. An old gpu-partitioner's engine_id
    # (ids joined by ',') still resolves to each of them.
    store = ActivePlan(None)
    gpu = common_pb2.Gpu(uuid="GPU-a", instances=[
        common_pb2.MigInstance(profile="3g.40gb", placement_start=0, engine_id="n1-a", engine_ids=["n1-a", "n1-a/d"]),
        common_pb2.MigInstance(profile="3g.40gb", placement_start=4, engine_id="n1-b,n1-b/d")])
    store.apply_fleet(common_pb2.FleetInventory(gpus=[gpu]))
    store.apply(_plan(1, {"mig:GPU-a/3g.40gb@0": 2.0, "mig:GPU-a/3g.40gb@4": 1.0}, "p"))
    assert store.weights_for("p")[0] == {"n1-a": 2.0, "n1-a/d": 2.0, "n1-b": 1.0, "n1-b/d": 1.0}


async def test_router_follows_watched_plans_and_keeps_last_when_optimizer_dies(peers, emulators, router) -> None:
    servicer, addr = peers
    emus = await emulators(2)
    extra = await emulators(1)
    r = await router([e.url for e in emus], watch_plans=True, optimizer_addr=addr)
    ids = sorted(r.core.registry.engines)
    servicer.fleet = common_pb2.FleetInventory(pools=[common_pb2.Pool(
        name="default", model=emus[0].model, region="FR", slo=common_pb2.Slo(ttft_s=5, tpot_s=1),
        engines=[common_pb2.Engine(id="planned", url=extra[0].url, pool="default", model=emus[0].model)])])
    await servicer.plans.put(_plan(7, {ids[0]: 0.0, ids[1]: 1.0, "planned": 0.0}))
    for _ in range(100):
        if r.core.plans.version == 7 and "planned" in r.core.registry.engines:
            break
        await asyncio.sleep(0.05)
    assert r.core.plans.version == 7
    assert r.core.registry.engines["planned"].source == "plan"  # engines from the plan
    async with aiohttp.ClientSession() as s:
        for _ in range(4):
            async with s.post(r.http + "/v1/completions", json={"model": emus[0].model, "prompt": "x", "max_tokens": 2}) as resp:
                assert resp.headers["x-greenserve-engine"] == ids[1]
                body = await resp.json()
                assert body["greenserve"]["plan_version"] == 7
    # a restarted router routes on the stored plan with the optimizer unreachable
    r2 = await router([e.url for e in emus], watch_plans=True, optimizer_addr=f"127.0.0.1:{free_port()}",
                      data_dir=r.running.server.settings.data_dir)
    assert r2.core.plans.version == 7
    d = r2.core.policy.choose("default", "", [])
    assert d.engine.id in (ids[1], "planned") and d.plan_version == 7


async def test_feeds_deliver_to_peers_and_drop_without_blocking(peers) -> None:
    servicer, addr = peers
    channel = grpc.aio.insecure_channel(addr)
    load = LoadFeed(channel, interval_s=60)
    load.record("p", 100, 10)
    load.record("p", 50, 5)
    await load.flush()
    assert len(servicer.loads) == 1
    sample = servicer.loads[0]
    assert (sample.pool, sample.requests, sample.input_tokens, sample.output_tokens) == ("p", 2, 150, 15)
    access = AccessFeed(channel, interval_s=60, bytes_per_token=10)
    access.record("p", 0xABC, 0x12, tokens=64, hit_tokens=32, session="s")
    await access.flush()
    kinds = [a.kind for a in servicer.accesses]
    assert kinds == [cache_manager_pb2.ACCESS_KIND_HIT, cache_manager_pb2.ACCESS_KIND_STORE]
    assert servicer.accesses[0].entry_key == "0000000000000012" and servicer.accesses[0].size_bytes == 320
    await channel.close()
    # a dead peer: the batch is dropped and counted, quickly; the queue is bounded
    dead = grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}")
    feed = AccessFeed(dead, interval_s=60, max_items=100)
    t0 = time.perf_counter()
    for i in range(250):
        feed.record("p", i + 1, 0, 64, 0, "")
    assert (time.perf_counter() - t0) < 0.1 and len(feed.queue) == 100 and feed.dropped == 150
    await asyncio.wait_for(feed.flush(), 10)
    assert feed.dropped == 250 and feed.sent == 0
    await dead.close()


async def test_refused_load_batch_is_logged_counted_and_retried_without_the_named_sample(peers, caplog) -> None:
    """The forecaster takes a StreamLoad call all or nothing: one refused sample (a late one of a closed hour)
    used to drop every pool's samples with only a debug log."""
    servicer, addr = peers
    async with grpc.aio.insecure_channel(addr) as channel:
        load = LoadFeed(channel, interval_s=60)
        for pool in ("a", "bad", "c"):
            load.record(pool, 10, 1)
        servicer.refuse_pools = {"bad"}
        with caplog.at_level("WARNING", logger="greenserve.router.accounting.feeds"):
            await load.flush()
        # the retry without samples[1] delivered the other pools; the refused one is counted as dropped
        assert sorted(m.pool for m in servicer.loads) == ["a", "c"] and servicer.load_calls == 2
        assert (load.sent, load.dropped) == (2, 1)
        assert any("samples[1].time" in r.getMessage() and "closed" in r.getMessage() for r in caplog.records)
        # refused again on the retry: the rest is dropped and counted too, and nothing else is sent
        servicer.refuse_pools = {"a", "bad"}
        for pool in ("a", "bad", "c"):
            load.record(pool, 10, 1)
        await load.flush()
        assert servicer.load_calls == 4 and len(servicer.loads) == 2 and (load.sent, load.dropped) == (2, 4)


async def test_receipt_uses_forecaster_ci_for_the_pool_region(peers, emulators, router) -> None:
    _, addr = peers
    emus = await emulators(1)
    r = await router([emus[0].url], forecaster_addr=addr, region="FR", ci_refresh_s=0.1)
    async with aiohttp.ClientSession() as s:
        for _ in range(50):
            async with s.post(r.http + "/v1/completions", json={"model": emus[0].model, "prompt": "x", "max_tokens": 2}) as resp:
                receipt = (await resp.json())["greenserve"]
            if receipt["ci_g_per_kwh"] == 42.0:
                break
            await asyncio.sleep(0.1)
    assert receipt["ci_g_per_kwh"] == 42.0
    assert receipt["carbon"]["operational_g"] == pytest.approx(receipt["energy_kwh"] * 42.0)


async def test_receipt_metrics_are_batched_off_the_request_path_and_all_recorded() -> None:
    """record() only queues; the background task hands every value to OTel (in slices), stop()
    flushes the rest: counts and sums match what was recorded, per engine and protocol."""
    from greenserve.router.accounting.receipt import Measurement, Receipt, ReceiptMetrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics = ReceiptMetrics(MeterProvider(metric_readers=[reader]).get_meter("t"), interval_s=0.05)

    def receipt(engine: str) -> Receipt:
        m = Measurement(engine_id=engine, pool="p", ttft_s=0.1, e2e_s=1.0, prompt_tokens=10,
                        cached_prompt_tokens=0, completion_tokens=5, energy_j=1.0, busy_slot_s=1.0,
                        ci_g_per_kwh=100.0, plan_version=3)
        return Receipt(m, tpot_s=0.2, energy_kwh=1e-6, operational_g=0.5, embodied_g=0.25, slo_met=True)

    metrics.start()
    for i in range(100):
        metrics.record(receipt("a" if i % 4 else "b"), "http")
    assert len(metrics._pending) == 100  # nothing recorded on the request path
    await asyncio.sleep(0.3)
    assert not metrics._pending
    metrics.record(receipt("a"), "grpc")
    await metrics.stop()

    points = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    attrs = dict(point.attributes or {})
                    points[(metric.name, attrs.get("engine"), attrs.get("protocol"))] = point
    assert points[("greenserve.router.requests", "a", "http")].value == 75
    assert points[("greenserve.router.requests", "b", "http")].value == 25
    assert points[("greenserve.router.requests", "a", "grpc")].value == 1
    assert points[("greenserve.router.ttft", "a", "http")].count == 75
    assert points[("greenserve.router.carbon", "b", "http")].value == pytest.approx(25 * 0.75)
    assert points[("greenserve.router.plan_version", None, None)].value == 3


async def test_receipt_metrics_queue_nothing_when_no_metric_reader_is_set() -> None:
    """Without a metric reader or OTLP endpoint, telemetry hands out a no-op meter: nothing could read the
    values, so the request path queues none and no flush task runs; with a reader the meter is the SDK's."""
    from greenserve.common.telemetry import setup_telemetry
    from greenserve.router.accounting.receipt import Measurement, Receipt, ReceiptMetrics
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    quiet = setup_telemetry("t", install_global=False)
    assert not quiet.metrics_exported
    metrics = ReceiptMetrics(quiet.meter, interval_s=0.05)
    m = Measurement(engine_id="a", pool="p", ttft_s=0.1, e2e_s=1.0, prompt_tokens=10, cached_prompt_tokens=0,
                    completion_tokens=5, energy_j=1.0, busy_slot_s=1.0, ci_g_per_kwh=100.0, plan_version=3)
    metrics.start()
    metrics.record(Receipt(m, tpot_s=0.2, energy_kwh=1e-6, operational_g=0.5, embodied_g=0.25, slo_met=True), "http")
    assert not metrics.enabled and metrics._pending == [] and metrics._task is None
    await metrics.stop()

    read = setup_telemetry("t", metric_reader=InMemoryMetricReader(), install_global=False)
    assert read.metrics_exported and ReceiptMetrics(read.meter).enabled


async def test_a_mig_placement_gets_its_engine_without_a_new_plan(peers, emulators, router, monkeypatch) -> None:
    """A plan that creates a MIG instance names it by placement; the gpu-partitioner creates it, starts and registers
    its engine, and reports it to the optimizer after the plan arrived, which makes no new plan. The router reads
    the fleet again while a placement of the interval in force has no engine, so the new engine gets the plan's
    weight within seconds; before, until the next plan (up to an hour later), it had the pool's mean weight as an
    engine the plan does not name, and the placement's weight went to no engine."""
    from greenserve.router import core as router_core

    monkeypatch.setattr(router_core, "PLACEMENT_RETRY_FIRST_S", 0.1)
    monkeypatch.setattr(router_core, "PLACEMENT_RETRY_MAX_S", 0.2)
    servicer, addr = peers
    plain, on_mig = await emulators(1), await emulators(1)
    r = await router([plain[0].url], watch_plans=True, optimizer_addr=addr)
    (plain_id,) = r.core.registry.engines
    placement = "mig:GPU-a/3g.40gb@4"
    servicer.fleet = common_pb2.FleetInventory(gpus=[common_pb2.Gpu(uuid="GPU-a", mig_enabled=True)])  # not yet
    await servicer.plans.put(_plan(3, {plain_id: 0.0, placement: 1.0}))
    for _ in range(100):
        if r.core.plans.version == 3:
            break
        await asyncio.sleep(0.05)
    assert r.core.plans.unresolved_placements() == {placement}
    # the gpu-partitioner starts the engine, registers it with the router and reports it to the optimizer
    await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
        id="mig-engine", url=on_mig[0].url, pool="default", model=on_mig[0].model, mig_uuid="MIG-4")))
    servicer.fleet = common_pb2.FleetInventory(gpus=[common_pb2.Gpu(uuid="GPU-a", mig_enabled=True, instances=[
        common_pb2.MigInstance(uuid="MIG-4", profile="3g.40gb", placement_start=4, engine_ids=["mig-engine"],
                               engine_id="mig-engine")])])
    for _ in range(100):
        if not r.core.plans.unresolved_placements():
            break
        await asyncio.sleep(0.05)
    assert not r.core.plans.unresolved_placements()
    assert r.core.plans.version == 3  # no new plan was needed
    assert r.core.plans.weights_for("default")[0] == {plain_id: 0.0, "mig-engine": 1.0}  # the plan's weight, by id
    for _ in range(100):  # and the router's report to the optimizer says so
        details = [rep.report.detail for rep in servicer.reports if rep.report.plan_version == 3]
        if details and "unknown to the router" not in details[-1] and "applying" not in details[-1]:
            break
        await asyncio.sleep(0.05)
    assert any("unknown to the router" in d for d in details), details
    assert "unknown to the router" not in details[-1] and details[-1].startswith("plan v3: weights"), details
    async with aiohttp.ClientSession() as s:
        for _ in range(4):
            async with s.post(r.http + "/v1/completions",
                              json={"model": on_mig[0].model, "prompt": "x", "max_tokens": 2}) as resp:
                assert resp.status == 200 and resp.headers["x-greenserve-engine"] == "mig-engine"


async def test_an_engine_deregistered_is_not_registered_again_from_a_stale_fleet(peers, emulators, router,
                                                                               monkeypatch) -> None:
    """A plan that replaces a GPU's MIG layout weights the engines of the destroyed instances 0 and the new instance
    by placement. The gpu-partitioner drains and deregisters those engines, then applies the layout, starts the new
    engine and reports the GPU; until that report the optimizer's fleet still lists the old engines, with their URLs
    (MigInstance.engine_urls). The router, reading the fleet for the unresolved placement meanwhile, registered them
    again (source "plan") and kept them for good (tests/integration/test_loop_end_to_end.py: 3 chat MIG engines
    instead of 1 after the layout change). An engine deregistered is registered from the plan only once registered
    again explicitly, or once the fleet has stopped listing it."""
    from greenserve.router import core as router_core

    monkeypatch.setattr(router_core, "PLACEMENT_RETRY_FIRST_S", 0.05)
    monkeypatch.setattr(router_core, "PLACEMENT_RETRY_MAX_S", 0.1)
    servicer, addr = peers
    old, new = await emulators(1), await emulators(1)
    r = await router([], watch_plans=True, optimizer_addr=addr)
    model = old[0].model

    def fleet(*instances: common_pb2.MigInstance) -> common_pb2.FleetInventory:
        pool = common_pb2.Pool(name="default", model=model)
        for inst in instances:
            for eid in inst.engine_ids:
                pool.engines.add(id=eid, url=inst.engine_urls[eid], pool="default", model=model, mig_uuid=inst.uuid)
        return common_pb2.FleetInventory(pools=[pool], gpus=[common_pb2.Gpu(uuid="GPU-a", mig_enabled=True,
                                                                           instances=instances)])

    old_inst = common_pb2.MigInstance(uuid="MIG-old", profile="3g.40gb", placement_start=0, engine_ids=["old"],
                                      engine_id="old", engine_urls={"old": old[0].url})
    await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
        id="old", url=old[0].url, pool="default", model=model, mig_uuid="MIG-old")))
    servicer.fleet = fleet(old_inst)
    # the plan: the old engine weight 0, the new 7g.40gb instance by placement (no engine there yet)
    await servicer.plans.put(_plan(4, {"old": 0.0, "mig:GPU-a/7g.40gb@0": 1.0}))
    for _ in range(100):
        if r.core.plans.version == 4:
            break
        await asyncio.sleep(0.05)
    assert r.core.plans.unresolved_placements() == {"mig:GPU-a/7g.40gb@0"}
    # the gpu-partitioner deregisters the old engine; its GPU report is not in yet: the fleet still lists it
    await r.stub.DeregisterEngine(router_pb2.DeregisterEngineRequest(engine_id="old"))
    await asyncio.sleep(0.5)  # the router reads the (stale) fleet several times meanwhile
    assert "old" not in r.core.registry.engines
    # the new engine is registered and reported
    await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
        id="new", url=new[0].url, pool="default", model=model, mig_uuid="MIG-new")))
    servicer.fleet = fleet(common_pb2.MigInstance(uuid="MIG-new", profile="7g.40gb", placement_start=0,
                                                  engine_ids=["new"], engine_id="new",
                                                  engine_urls={"new": new[0].url}))
    for _ in range(100):
        if not r.core.plans.unresolved_placements():
            break
        await asyncio.sleep(0.05)
    assert not r.core.plans.unresolved_placements()
    assert sorted(r.core.registry.engines) == ["new"]
    assert "old" not in r.core.deregistered  # the fleet no longer lists it: forgotten
    # an engine deregistered and registered again explicitly comes back from the plan as before
    await r.stub.DeregisterEngine(router_pb2.DeregisterEngineRequest(engine_id="new"))
    assert r.core.deregistered == {"new"}
    await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
        id="new", url=new[0].url, pool="default", model=model, mig_uuid="MIG-new")))
    assert not r.core.deregistered
