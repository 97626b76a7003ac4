"""Concurrent Calibrate calls of one base profile each store their own model version, on SQLite and PostgreSQL.

calibrate.store numbered the new version max(ordinal) + 1 and inserted it in one transaction; on PostgreSQL (READ
COMMITTED) two writers read the same max, and the second insert's primary-key violation went out as an
IntegrityError: INTERNAL to the caller, the fit lost. ProfileStore.put already retries the same race. Found by an
adversarial audit of the profiler's concurrent writes (failed before the fix on PostgreSQL)."""

from __future__ import annotations


from greenserve.common.persistence import Database
from greenserve.profiler import calibrate
from greenserve.v1 import profiler_pb2
from tests.concurrency import all_at_once
from tests.persistence.conftest import backend, db_url, db_url_factory, postgres_server  # noqa: F401 - fixtures

WRITERS = 8


def test_concurrent_versions_of_one_base_all_stored(db_url: str) -> None:  # noqa: F811
    db = Database.open(db_url, "profiler")
    try:
        stored: list[str] = []

        def write(_: int) -> None:
            version = profiler_pb2.ModelVersion(base_profile="llama3-8b@H100-80GB", calibrated_from="k@1")
            stored.append(calibrate.store(db, version).name)

        errors = all_at_once(write, WRITERS)
        assert not errors, errors[:2]
        assert sorted(stored) == sorted(f"llama3-8b@H100-80GB+cal{n}" for n in range(1, WRITERS + 1))
    finally:
        db.close()
