"""Every table round-trips its values, and its constraints refuse bad rows, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, StatementError

from greenserve.cache_manager.models import CacheApplication, LmcacheServer
from greenserve.common.orm_conventions import UtcDateTime, utcnow
from greenserve.common.persistence import Database
from greenserve.forecaster.models import Point, Series
from greenserve.gpu_partitioner.models import ApplyJournalEntry, SimulatedGpu
from greenserve.optimizer.models import Plan
from greenserve.profiler.models import Profile, Sweep
from greenserve.router.models import Engine, LastPlan

IST = timezone(timedelta(hours=5, minutes=30))
T0 = datetime(2025, 3, 30, 0, 59, 59, 123456, tzinfo=timezone.utc)  # near a DST change in Europe
# Bytes that are not valid UTF-8 and contain NUL: what a serialized protobuf can look like.
BLOB = bytes(range(256)) * 3


def _count(db: Database, model: type) -> int:
    with db.session(readonly=True) as s:
        return s.scalar(sa.select(sa.func.count()).select_from(model))


def _assert_utc(value: datetime, expected: datetime) -> None:
    assert value == expected
    assert value.tzinfo is not None and value.utcoffset() == timedelta(0)


# -- round trips -----------------------------------------------------------------------------


def test_forecaster_series_and_points(db_url: str, open_db) -> None:
    db = open_db(db_url, "forecaster")
    with db.session() as s:
        ci = Series(kind="ci", key="DE", signal="direct", unit="gCO2e/kWh", resolution_s=3600)
        load = Series(kind="load", key="llama-3-8b/pool-a", signal="requests_per_s", unit="1/s", resolution_s=60)
        s.add_all([ci, load])
        s.flush()
        # Written out of order and in another zone; read back sorted, in UTC.
        for h in (3, 1, 2, 0):
            ci.points.add(Point(ts=(T0 + timedelta(hours=h)).astimezone(IST), value=400.0 + h / 3))
        load.points.add(Point(ts=T0, value=1e-300))
        ci_id = ci.id
    with db.session(readonly=True) as s:
        got = s.scalars(sa.select(Series).where(Series.kind == "ci", Series.key == "DE")).one()
        assert (got.signal, got.unit, got.resolution_s) == ("direct", "gCO2e/kWh", 3600)
        points = s.scalars(got.points.select().order_by(Point.ts)).all()
        assert [p.value for p in points] == [400.0 + h / 3 for h in range(4)]  # exact doubles
        for h, p in enumerate(points):
            _assert_utc(p.ts, T0 + timedelta(hours=h))
        # range query on the (series_id, ts) key
        window = s.scalars(
            sa.select(Point.value).where(
                Point.series_id == ci_id, Point.ts >= T0 + timedelta(hours=1), Point.ts < T0 + timedelta(hours=3)
            ).order_by(Point.ts)
        ).all()
        assert window == [400.0 + 1 / 3, 400.0 + 2 / 3]
        assert s.scalar(sa.select(Point.value).join(Series).where(Series.kind == "load")) == 1e-300


def test_forecaster_deleting_a_series_deletes_its_points(db_url: str, open_db) -> None:
    db = open_db(db_url, "forecaster")
    with db.session() as s:
        a = Series(kind="ci", key="FR", signal="direct", unit="gCO2e/kWh", resolution_s=3600)
        b = Series(kind="ci", key="FR", signal="lifecycle", unit="gCO2e/kWh", resolution_s=3600)
        s.add_all([a, b])
        s.flush()
        for h in range(5):
            a.points.add(Point(ts=T0 + timedelta(hours=h), value=50.0))
            b.points.add(Point(ts=T0 + timedelta(hours=h), value=60.0))
    with db.session() as s:
        s.delete(s.scalars(sa.select(Series).where(Series.signal == "direct")).one())
    assert _count(db, Series) == 1
    with db.session(readonly=True) as s:
        assert s.scalars(sa.select(Point.value).distinct()).all() == [60.0]
    assert _count(db, Point) == 5


def test_profiler_profiles_and_sweeps(db_url: str, open_db) -> None:
    db = open_db(db_url, "profiler")
    sweep_id = str(uuid.uuid4())
    with db.session() as s:
        for v in (1, 2):
            s.add(Profile(config_key="a100/llama-8b/l1=16GiB", version=v, source="measured", created_at=T0, body=BLOB[v:]))
        s.add(Profile(config_key="h100/llama-8b", version=1, source="published", created_at=T0, body=b""))
        s.add(Sweep(id=sweep_id, state="running", created_at=T0, updated_at=T0 + timedelta(seconds=5),
                    total_points=12, done_points=3, error=None, request=BLOB))
    with db.session() as s:
        sweep = s.get(Sweep, sweep_id)
        sweep.state, sweep.done_points, sweep.error = "failed", 4, "engine 10.0.0.7:8000 unreachable"
        sweep.updated_at = T0 + timedelta(minutes=1)
    with db.session(readonly=True) as s:
        latest = s.scalars(
            sa.select(Profile).where(Profile.config_key == "a100/llama-8b/l1=16GiB").order_by(Profile.version.desc())
        ).first()
        assert (latest.version, latest.source, latest.body) == (2, "measured", BLOB[2:])
        _assert_utc(latest.created_at, T0)
        assert s.scalars(sa.select(Profile.body).where(Profile.source == "published")).one() == b""
        sweep = s.get(Sweep, sweep_id)
        assert (sweep.state, sweep.total_points, sweep.done_points) == ("failed", 12, 4)
        assert sweep.error == "engine 10.0.0.7:8000 unreachable"
        assert sweep.request == BLOB
        _assert_utc(sweep.updated_at, T0 + timedelta(minutes=1))


def test_optimizer_plans_and_activation(db_url: str, open_db) -> None:
    db = open_db(db_url, "optimizer")

    def plan(version: int, state: str) -> Plan:
        start = T0 + timedelta(hours=version)
        return Plan(version=version, created_at=start - timedelta(minutes=5), valid_from=start,
                    valid_until=start + timedelta(hours=24), state=state,
                    expected_total_carbon_g=12345.678, body=BLOB)

    with db.session() as s:
        s.add_all([plan(1, "superseded"), plan(2, "active")])
    # Activate plan 3 and supersede plan 2 in one transaction.
    with db.session() as s:
        s.get(Plan, 2).state = "superseded"
        s.flush()
        s.add(plan(3, "active"))
    with db.session(readonly=True) as s:
        active = s.scalars(sa.select(Plan).where(Plan.state == "active")).one()
        assert active.version == 3
        assert active.expected_total_carbon_g == 12345.678
        assert active.body == BLOB
        _assert_utc(active.valid_from, T0 + timedelta(hours=3))
        assert s.scalars(sa.select(Plan.version).order_by(Plan.version)).all() == [1, 2, 3]


def test_cache_manager_servers_and_applications(db_url: str, open_db) -> None:
    db = open_db(db_url, "cache_manager")
    big = 80 * 2**30  # 80 GiB: needs a 64-bit column
    with db.session() as s:
        server = LmcacheServer(id="lmc-0", pool="pool-a", url="http://10.0.0.5:8100", registered_at=T0)
        s.add(server)
        server.applications.add(CacheApplication(plan_version=7, l1_size_bytes=big, l2_size_bytes=None,
                                                 state="applied", applied_at=T0))
        server.applications.add(CacheApplication(plan_version=8, l1_size_bytes=big // 2, l2_size_bytes=4 * big,
                                                 state="failed", detail="HTTP 503 from /reconfigure", applied_at=T0))
    with db.session(readonly=True) as s:
        apps = s.scalars(sa.select(CacheApplication).order_by(CacheApplication.plan_version)).all()
        assert [(a.plan_version, a.l1_size_bytes, a.l2_size_bytes, a.state) for a in apps] == [
            (7, big, None, "applied"),
            (8, big // 2, 4 * big, "failed"),
        ]
        assert apps[0].detail == "" and apps[1].detail == "HTTP 503 from /reconfigure"
        assert apps[0].server.url == "http://10.0.0.5:8100"
    with db.session() as s:
        s.delete(s.get(LmcacheServer, "lmc-0"))
    assert _count(db, CacheApplication) == 0


def test_gpu_partitioner_journal_and_simulated_gpus(db_url: str, open_db) -> None:
    db = open_db(db_url, "gpu_partitioner")
    apply_id = str(uuid.uuid4())
    steps = [
        {"op": "destroy_gi", "gi_id": 1, "profile": "3g.40gb"},
        {"op": "create_gi", "profile": "1g.10gb", "placement": {"start": 0, "size": 1}},
        {"op": "create_ci", "gi_id": 2, "nested": [1, 2.5, None, True, "ü"]},
    ]
    with db.session() as s:
        for i, step in enumerate(steps):
            s.add(ApplyJournalEntry(apply_id=apply_id, gpu_uuid="GPU-abc", plan_version=None if i == 0 else 4,
                                    step_index=i, step=step, state="pending", updated_at=T0))
        s.add(SimulatedGpu(gpu_uuid="GPU-abc", model="A100-SXM4-40GB", mig_enabled=True, state_json='{"gis": []}'))
        s.add(SimulatedGpu(gpu_uuid="GPU-def", model="H100-SXM5-80GB", mig_enabled=False, state_json="{}"))
    with db.session() as s:
        first = s.scalars(sa.select(ApplyJournalEntry).where(ApplyJournalEntry.step_index == 0)).one()
        first.state, first.updated_at = "done", T0 + timedelta(seconds=2)
    with db.session(readonly=True) as s:
        rows = s.scalars(sa.select(ApplyJournalEntry).where(ApplyJournalEntry.apply_id == apply_id)
                         .order_by(ApplyJournalEntry.step_index)).all()
        assert [r.step for r in rows] == steps
        assert [r.state for r in rows] == ["done", "pending", "pending"]
        assert [r.plan_version for r in rows] == [None, 4, 4]
        pending = s.scalars(sa.select(ApplyJournalEntry.step_index).where(
            ApplyJournalEntry.gpu_uuid == "GPU-abc", ApplyJournalEntry.state == "pending")).all()
        assert sorted(pending) == [1, 2]
        gpus = {g.gpu_uuid: g for g in s.scalars(sa.select(SimulatedGpu))}
        assert gpus["GPU-abc"].mig_enabled is True and gpus["GPU-def"].mig_enabled is False
        assert gpus["GPU-abc"].state_json == '{"gis": []}'


def test_router_engines_and_last_plan(db_url: str, open_db) -> None:
    db = open_db(db_url, "router")
    with db.session() as s:
        s.add(Engine(id="e1", url="http://10.0.0.1:8000", pool="a", model="llama-3-8b", source="flag", registered_at=T0))
        s.add(Engine(id="e2", url="http://10.0.0.2:8000", pool="a", model="llama-3-8b", source="rpc",
                     registered_at=T0, draining=True))
        s.add(LastPlan(plan_version=41, received_at=T0, body=BLOB))
    # Raw insert without 'draining': the server default applies.
    with db.session() as s:
        s.execute(sa.insert(Engine.__table__).values(id="e3", url="http://10.0.0.3:8000", pool="b", model="m",
                                                     source="plan", registered_at=T0))
    # Replace the last plan (singleton row).
    with db.session() as s:
        last = s.get(LastPlan, 1)
        last.plan_version, last.body, last.received_at = 42, b"\x00plan42", T0 + timedelta(hours=1)
    with db.session(readonly=True) as s:
        assert {e.id: e.draining for e in s.scalars(sa.select(Engine))} == {"e1": False, "e2": True, "e3": False}
        last = s.scalars(sa.select(LastPlan)).one()
        assert (last.id, last.plan_version, last.body) == (1, 42, b"\x00plan42")
        _assert_utc(last.received_at, T0 + timedelta(hours=1))


# -- timestamps ------------------------------------------------------------------------------


def test_naive_datetimes_are_rejected(db_url: str, open_db) -> None:
    db = open_db(db_url, "router")
    naive = datetime(2025, 1, 1, 12, 0)
    with pytest.raises(ValueError, match="naive datetime"):
        Engine(id="e1", url="http://x", pool="a", model="m", source="flag", registered_at=naive)
    engine = Engine(id="e1", url="http://x", pool="a", model="m", source="flag", registered_at=T0)
    with pytest.raises(ValueError, match="naive datetime"):
        engine.registered_at = naive
    # Core statements bypass the ORM attribute: the column type refuses it at bind time.
    with pytest.raises(StatementError) as exc_info:
        with db.session() as s:
            s.execute(sa.insert(LastPlan.__table__).values(id=1, plan_version=1, received_at=naive, body=b""))
    assert isinstance(exc_info.value.orig, ValueError)
    assert _count(db, LastPlan) == 0
    with pytest.raises(ValueError):
        UtcDateTime().process_bind_param(naive, db.engine.dialect)
    with pytest.raises(TypeError):
        UtcDateTime().process_bind_param("2025-01-01T00:00:00Z", db.engine.dialect)


def test_aware_datetimes_are_stored_as_utc(db_url: str, open_db) -> None:
    db = open_db(db_url, "profiler")
    local = datetime(2025, 7, 1, 23, 30, tzinfo=timezone(timedelta(hours=-7)))
    with db.session() as s:
        s.add(Sweep(id="s1", state="pending", created_at=local, updated_at=local, total_points=0, done_points=0,
                    request=b""))
    with db.session(readonly=True) as s:
        got = s.get(Sweep, "s1").created_at
        assert got == local
        assert got.tzinfo == timezone.utc and (got.day, got.hour) == (2, 6)
    # What is stored is the UTC wall time (compares correctly against other UTC values in SQL).
    with db.session(readonly=True) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Sweep).where(
            Sweep.created_at > datetime(2025, 7, 2, 5, 59, tzinfo=timezone.utc))) == 1
    assert abs(utcnow() - datetime.now(timezone.utc)) < timedelta(seconds=5)


# -- constraints -----------------------------------------------------------------------------

def _series(**kw) -> Series:
    return Series(**({"kind": "ci", "key": "DE", "signal": "direct", "unit": "gCO2e/kWh", "resolution_s": 3600} | kw))


def _plan(**kw) -> Plan:
    return Plan(**({"version": 1, "created_at": T0, "valid_from": T0, "valid_until": T0 + timedelta(hours=1),
                    "state": "proposed", "expected_total_carbon_g": 1.0, "body": b""} | kw))


def _sweep(**kw) -> Sweep:
    return Sweep(**({"id": "s1", "state": "pending", "created_at": T0, "updated_at": T0,
                     "total_points": 10, "done_points": 0, "request": b""} | kw))


def _engine(**kw) -> Engine:
    return Engine(**({"id": "e1", "url": "http://e1", "pool": "a", "model": "m", "source": "flag",
                      "registered_at": T0} | kw))


def _app(**kw) -> CacheApplication:
    return CacheApplication(**({"server_id": "lmc-0", "plan_version": 1, "l1_size_bytes": 1, "state": "applied",
                                "applied_at": T0} | kw))


def _server() -> LmcacheServer:
    return LmcacheServer(id="lmc-0", pool="a", url="http://lmc-0", registered_at=T0)


def _step(**kw) -> ApplyJournalEntry:
    return ApplyJournalEntry(**({"apply_id": "a1", "gpu_uuid": "GPU-1", "step_index": 0, "step": {},
                                 "state": "pending", "updated_at": T0} | kw))


# (service, rows that are fine, the bad row, the table to check stays as the good rows left it)
BAD_ROWS = {
    "series-kind": ("forecaster", lambda: [], lambda: _series(kind="co2"), Series),
    "series-resolution": ("forecaster", lambda: [], lambda: _series(resolution_s=0), Series),
    "series-empty-key": ("forecaster", lambda: [], lambda: _series(key=""), Series),
    "series-duplicate": ("forecaster", lambda: [_series()], lambda: _series(unit="other"), Series),
    "point-unknown-series": ("forecaster", lambda: [], lambda: Point(series_id=999, ts=T0, value=1.0), Point),
    "profile-source": ("profiler", lambda: [], lambda: Profile(config_key="k", version=1, source="guessed",
                                                              created_at=T0, body=b""), Profile),
    "profile-version": ("profiler", lambda: [], lambda: Profile(config_key="k", version=0, source="measured",
                                                               created_at=T0, body=b""), Profile),
    "profile-duplicate": ("profiler",
                          lambda: [Profile(config_key="k", version=1, source="measured", created_at=T0, body=b"")],
                          lambda: Profile(config_key="k", version=1, source="simulated", created_at=T0, body=b""),
                          Profile),
    "sweep-state": ("profiler", lambda: [], lambda: _sweep(state="paused"), Sweep),
    "sweep-done-gt-total": ("profiler", lambda: [], lambda: _sweep(done_points=11), Sweep),
    "sweep-negative": ("profiler", lambda: [], lambda: _sweep(total_points=-1, done_points=-1), Sweep),
    "sweep-updated-before-created": ("profiler", lambda: [], lambda: _sweep(updated_at=T0 - timedelta(seconds=1)),
                                     Sweep),
    "plan-window": ("optimizer", lambda: [], lambda: _plan(valid_until=T0), Plan),
    "plan-state": ("optimizer", lambda: [], lambda: _plan(state="draft"), Plan),
    "plan-carbon": ("optimizer", lambda: [], lambda: _plan(expected_total_carbon_g=-0.5), Plan),
    "plan-version": ("optimizer", lambda: [], lambda: _plan(version=0), Plan),
    "plan-two-active": ("optimizer", lambda: [_plan(state="active")], lambda: _plan(version=2, state="active"), Plan),
    "server-duplicate-url": ("cache_manager", lambda: [_server()],
                             lambda: LmcacheServer(id="lmc-1", pool="a", url="http://lmc-0", registered_at=T0),
                             LmcacheServer),
    "app-unknown-server": ("cache_manager", lambda: [], lambda: _app(server_id="nope"), CacheApplication),
    "app-negative-size": ("cache_manager", lambda: [_server()], lambda: _app(l2_size_bytes=-1), CacheApplication),
    "app-state": ("cache_manager", lambda: [_server()], lambda: _app(state="maybe"), CacheApplication),
    "app-duplicate": ("cache_manager", lambda: [_server(), _app()], lambda: _app(l1_size_bytes=2), CacheApplication),
    "step-state": ("gpu_partitioner", lambda: [], lambda: _step(state="running"), ApplyJournalEntry),
    "step-index": ("gpu_partitioner", lambda: [], lambda: _step(step_index=-1), ApplyJournalEntry),
    "step-duplicate": ("gpu_partitioner", lambda: [_step()], lambda: _step(gpu_uuid="GPU-2"), ApplyJournalEntry),
    "engine-source": ("router", lambda: [], lambda: _engine(source="dns"), Engine),
    "engine-duplicate-url": ("router", lambda: [_engine()], lambda: _engine(id="e2"), Engine),
    "last-plan-second-row": ("router", lambda: [LastPlan(plan_version=1, received_at=T0, body=b"")],
                             lambda: LastPlan(id=2, plan_version=2, received_at=T0, body=b""), LastPlan),
    "last-plan-version": ("router", lambda: [], lambda: LastPlan(plan_version=0, received_at=T0, body=b""), LastPlan),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_constraint_violation_raises_and_stores_nothing(db_url: str, open_db, case: str) -> None:
    service, good_rows, bad_row, model = BAD_ROWS[case]
    db = open_db(db_url, service)
    good = good_rows()
    if good:
        with db.session() as s:
            s.add_all(good)
    before = _count(db, model)
    # The bad row last in a batch of rows that would be fine alone: none of the batch may remain.
    with pytest.raises(IntegrityError):
        with db.session() as s:
            for extra in range(3):
                if model is Series:
                    s.add(_series(key=f"batch-{extra}"))
                elif model is Sweep:
                    s.add(_sweep(id=f"batch-{extra}"))
            s.add(bad_row())
    assert _count(db, model) == before
    if model in (Series, Sweep):
        with db.session(readonly=True) as s:
            assert s.scalars(sa.select(model).where(
                (Series.key if model is Series else Sweep.id).like("batch-%"))).all() == []
    # The database is still usable afterwards.
    with db.session() as s:
        s.execute(sa.select(1))
