"""The router's SLO-attainment window and its report to the optimizer: a breach triggers a new plan."""

from __future__ import annotations

import grpc
from greenserve.router.accounting.attainment import AttainmentReporter, AttainmentWindow
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc

from tests.optimizer.conftest import ci_ref, engine, ingest_daily, load_ref, pool


def test_window_counts_recent_buckets_only() -> None:
    window = AttainmentWindow(window_s=60.0, bucket_s=10.0)
    for i in range(30):
        window.record("chat", met=i % 3 != 0, at_s=1000.0 + i)  # 20 of 30 met
    window.record("chat", met=False, at_s=900.0)  # older than the window at t=1040
    (snap,) = window.snapshot(at_s=1040.0)
    assert snap.pool == "chat" and snap.requests == 30 and abs(snap.attainment_fraction - 20 / 30) < 1e-9
    assert window.snapshot(at_s=5000.0) == []


async def test_breach_reported_to_the_optimizer_triggers_a_plan(forecaster, optimizer) -> None:
    fc = grpc.aio.insecure_channel(forecaster.address)
    await ingest_daily(fc, ci_ref("FR"), 50.0, 20.0)
    await ingest_daily(fc, load_ref("chat"), 2.0, 1.0)
    running = await optimizer(plan_lead_s=0)
    channel = grpc.aio.insecure_channel(running.address)
    stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[pool("chat", [engine("e")])])))
    window = AttainmentWindow()
    reporter = AttainmentReporter(window, channel, instance="r1")
    for i in range(40):
        window.record("chat", met=i % 2 == 0)  # 50 % against a 90 % target
    assert await reporter.report_once() is True and reporter.sent == 1
