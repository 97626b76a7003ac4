"""What the router reports about storing plans: a plan in force it cannot store says so, and a plan read back from
its database at start is reported again (the killed process may not have sent its report)."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.common.persistence import Database
from greenserve.common.plan_follow import APPLIED
from greenserve.router.routing.enforcer import ActivePlan, PlanWatcher
from greenserve.v1 import common_pb2
from sqlalchemy import exc as sa_exc


def _plan(version: int, engine: str) -> common_pb2.Plan:
    now = int(time.time())
    plan = common_pb2.Plan(version=version)
    interval = plan.intervals.add(start=Timestamp(seconds=now - 60), end=Timestamp(seconds=now + 3600))
    interval.routing_weights.add(pool="p", engine_id=engine, weight=1.0)
    return plan


async def test_a_plan_that_cannot_be_stored_is_in_force_and_reported_not_stored(monkeypatch) -> None:
    store = ActivePlan()

    def locked(plan: common_pb2.Plan) -> None:
        raise sa_exc.OperationalError("UPDATE last_plan", {}, sqlite3.OperationalError("database is locked"))

    monkeypatch.setattr(store, "persist", locked)
    watcher = PlanWatcher(store, None)
    plan = _plan(2, "e2")
    outcome = await watcher._reconcile(plan, plan.intervals[0])
    assert store.version == 2 and store.weights_for("p") == ({"e2": 1.0}, 2)  # routed on
    assert outcome.state == APPLIED, outcome
    assert "not stored in the router's database" in outcome.detail and "database is locked" in outcome.detail
    # stored at the next plan: the report no longer says it
    monkeypatch.setattr(store, "persist", lambda plan: None)
    nxt = _plan(3, "e3")
    outcome = await watcher._reconcile(nxt, nxt.intervals[0])
    assert outcome.state == APPLIED and "not stored" not in outcome.detail, outcome


@pytest.mark.parametrize("stored", [True, False])
async def test_a_plan_read_back_at_start_is_reported_again(tmp_path, stored: bool) -> None:
    db = Database.open(f"sqlite:///{tmp_path / 'router.db'}", "router")
    if stored:
        ActivePlan(db).persist(_plan(4, "e4"))
    store = ActivePlan(db)
    store.load_persisted()
    watcher = PlanWatcher(store, None)
    watcher.start()
    try:
        for _ in range(100):
            if watcher.follower.reconciled is not None and watcher.follower.last_outcome is not None:
                break
            await asyncio.sleep(0.02)
        if stored:
            assert watcher.follower.last_outcome is not None, "the stored plan was not reported"
            assert watcher.follower.last_outcome.state == APPLIED
            assert watcher.follower.last_outcome.detail.startswith("plan v4: weights for 1 pool(s), 1 engine(s)")
        else:
            assert watcher.follower.last_outcome is None  # nothing in force, nothing reported
    finally:
        await watcher.stop()
        db.close()

