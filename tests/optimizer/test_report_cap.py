"""Enforcement reports are kept for at most MAX_REPORTERS_PER_PLAN (component, instance) pairs per plan version, on
SQLite and PostgreSQL.

PlanStore.record_report kept the latest report of every (plan version, component, instance) it was sent: a caller
inventing instance names filled the table (and every GetPlanStatus of that plan) without bound. Found by an audit
(failed before the cap).
"""

from __future__ import annotations

import grpc
import pytest

from greenserve.common.errors import ResourceExhausted
from greenserve.common.persistence import Database
from greenserve.optimizer import plan_store
from greenserve.optimizer.plan_store import PlanStore
from greenserve.v1 import common_pb2, optimizer_pb2
from tests.concurrency import all_at_once
from tests.persistence.conftest import backend, db_url, db_url_factory, postgres_server  # noqa: F401 - fixtures

CAP = 8


def _store_plan(plans: PlanStore) -> int:
    plan = common_pb2.Plan()
    plan.created_at.FromSeconds(0)
    plan.valid_from.FromSeconds(0)
    plan.valid_until.FromSeconds(3600)
    return plans.store(plan, activate=True).version


def _report(version: int, instance: str, detail: str = "",
            component: str = "router") -> optimizer_pb2.EnforcementReport:
    return optimizer_pb2.EnforcementReport(component=component, instance=instance, plan_version=version, detail=detail,
                                           state=optimizer_pb2.ENFORCEMENT_STATE_APPLIED)


def test_the_cap_is_generous_and_documented() -> None:
    assert plan_store.MAX_REPORTERS_PER_PLAN == 4096


def test_new_instances_past_the_cap_are_refused_naming_report_instance(db_url: str, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setattr(plan_store, "MAX_REPORTERS_PER_PLAN", CAP)
    db = Database.open(db_url, "optimizer")
    try:
        plans = PlanStore(db)
        version = _store_plan(plans)
        for i in range(CAP - 1):
            plans.record_report(_report(version, f"r{i}"))
        plans.record_report(_report(version, "c0", component="cache-manager"))  # every component counts
        with pytest.raises(ResourceExhausted) as exc:
            plans.record_report(_report(version, "invented"))
        assert exc.value.field == "report.instance" and exc.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"{CAP} component instances" in exc.value.message
        assert len(plans.reports(version)) == CAP
        # A pair already kept always reports again (the latest replaces it), at the cap too.
        plans.record_report(_report(version, "r0", detail="again"))
        kept = {(r.component, r.instance): r.detail for r in plans.reports(version)}
        assert len(kept) == CAP and kept[("router", "r0")] == "again" and ("router", "invented") not in kept
        # The cap is per plan version: a newer plan takes reports of new instances.
        newer = _store_plan(plans)
        plans.record_report(_report(newer, "invented"))
        assert [r.instance for r in plans.reports(newer)] == ["invented"]
    finally:
        db.close()


def test_concurrent_new_instances_never_pass_the_cap(db_url: str, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setattr(plan_store, "MAX_REPORTERS_PER_PLAN", CAP)
    db = Database.open(db_url, "optimizer")
    try:
        plans = PlanStore(db)
        version = _store_plan(plans)
        errors = all_at_once(lambda i: plans.record_report(_report(version, f"r{i}")), 2 * CAP)
        assert len(errors) == CAP and all(isinstance(e, ResourceExhausted) for e in errors), errors[:2]
        assert len(plans.reports(version)) == CAP
    finally:
        db.close()
