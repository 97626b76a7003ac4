"""Concurrent stores of one series' forecast in the optimizer's forecast cache all succeed, on SQLite and PostgreSQL.

ForecastSource._store read the series' cache row and inserted it when there was none. One computation fetches all
its series at once (asyncio.gather, each store on a worker thread), and two pools may share a load series
(load_series_key), as may the CI monitor and a computation: on PostgreSQL two first stores of one series both found
no row and the second insert's primary-key violation ended the computation (ComputePlan: INTERNAL). Found by an
adversarial audit of the optimizer's concurrent writes (failed before the fix on PostgreSQL)."""

from __future__ import annotations

from greenserve.common.persistence import Database
from greenserve.optimizer.inputs import ForecastSource
from greenserve.v1 import common_pb2
from tests.concurrency import all_at_once
from tests.persistence.conftest import backend, db_url, db_url_factory, postgres_server  # noqa: F401 - fixtures

WRITERS = 16


def test_concurrent_first_stores_of_one_series_all_succeed(db_url: str) -> None:  # noqa: F811
    db = Database.open(db_url, "optimizer")
    try:
        source = ForecastSource(db, None)
        errors = all_at_once(
            lambda i: source._store("load/shared", 1000.0 + i, common_pb2.Forecast(model=f"m{i}")), WRITERS)
        assert not errors, errors[:2]
        assert ForecastSource(db, None).cache["load/shared"][1].model.startswith("m")
    finally:
        db.close()
