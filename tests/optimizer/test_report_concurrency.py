"""Concurrent enforcement reports of one component instance about one plan are all taken (the latest kept), on
SQLite and PostgreSQL.

PlanStore.record_report read the (plan, component, instance) row and inserted it when there was none; on PostgreSQL
two first reports at once both found none and the second insert's primary-key violation went out as an
IntegrityError: INTERNAL to the reporting enforcer. Found by an adversarial audit of the optimizer's concurrent
writes (failed before the fix on PostgreSQL)."""

from __future__ import annotations

from greenserve.common.persistence import Database
from greenserve.optimizer.plan_store import PlanStore
from greenserve.v1 import common_pb2, optimizer_pb2
from tests.concurrency import all_at_once
from tests.persistence.conftest import backend, db_url, db_url_factory, postgres_server  # noqa: F401 - fixtures

WRITERS = 16


def test_concurrent_first_reports_of_one_instance_are_all_taken(db_url: str) -> None:  # noqa: F811
    db = Database.open(db_url, "optimizer")
    try:
        plans = PlanStore(db)
        plan = common_pb2.Plan()
        plan.created_at.FromSeconds(0)
        plan.valid_from.FromSeconds(0)
        plan.valid_until.FromSeconds(3600)
        version = plans.store(plan, activate=True).version

        def report(i: int) -> None:
            plans.record_report(optimizer_pb2.EnforcementReport(
                component="router", instance="r1", plan_version=version, detail=f"report {i}",
                state=optimizer_pb2.ENFORCEMENT_STATE_APPLIED))

        errors = all_at_once(report, WRITERS)
        assert not errors, errors[:2]
        (kept,) = plans.reports(version)
        assert kept.instance == "r1" and kept.detail.startswith("report ")
    finally:
        db.close()
