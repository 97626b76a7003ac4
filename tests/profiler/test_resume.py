"""A real greenserve-profiler process killed with SIGKILL mid-sweep resumes after restart: no point lost or
measured twice, and the points equal an uninterrupted measurement."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from greenserve.common.persistence import Database
from greenserve.profiler.method import resolve
from greenserve.profiler.models import Sweep, SweepPoint
from greenserve.profiler.sim_backend import simulate_point
from greenserve.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc

from tests.conftest import free_port

from .conftest import config, sim_spec


def _start(port: int, db_url: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OTEL_SDK_DISABLED": "true"}
    return subprocess.Popen(
        [sys.executable, "-m", "greenserve.profiler", "--port", str(port), "--db-url", db_url,
         "--no-import-published", "--no-log-json"],
        stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stub(port: int, proc: subprocess.Popen) -> tuple[grpc.Channel, profiler_pb2_grpc.ProfilerServiceStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=60)
    assert proc.poll() is None
    return channel, profiler_pb2_grpc.ProfilerServiceStub(channel)


@pytest.mark.slow
def test_sigkill_mid_sweep_resumes_without_loss_or_repeat(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'profiler.db'}"
    port = free_port()
    rates = [0.5 * (i + 1) for i in range(10)]
    spec = sim_spec(rates=rates, configs=[config(cache_dram_bytes=g << 30) for g in range(8)], workload="poisson",
                    point_duration_s=40.0)
    spec.method.stop_rule = common_pb2.LADDER_STOP_RULE_FULL_LADDER
    proc = _start(port, db_url, tmp_path / "run1.log")
    try:
        channel, stub = _stub(port, proc)
        sweep_id = stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec)).sweep.id
        deadline = time.monotonic() + 60
        while stub.GetSweep(profiler_pb2.GetSweepRequest(sweep_id=sweep_id)).sweep.done_points < 5:
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.01)
        channel.close()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    killed_at = datetime.now(timezone.utc)
    assert proc.returncode == -signal.SIGKILL

    db = Database.open(db_url, "profiler")
    try:
        with db.session(readonly=True) as s:
            row = s.get(Sweep, sweep_id)
            assert row.state == "running" and 5 <= row.done_points < 80
            before = {i: b for i, b in s.execute(sa.select(SweepPoint.point_index, SweepPoint.body)
                                                .where(SweepPoint.sweep_id == sweep_id))}
            assert sorted(before) == list(range(row.done_points))  # committed in order, nothing half-written
    finally:
        db.close()

    proc = _start(port, db_url, tmp_path / "run2.log")
    try:
        channel, stub = _stub(port, proc)
        deadline = time.monotonic() + 120
        while (sweep := stub.GetSweep(profiler_pb2.GetSweepRequest(sweep_id=sweep_id)).sweep).state in (
                profiler_pb2.SWEEP_STATE_PENDING, profiler_pb2.SWEEP_STATE_RUNNING):
            assert time.monotonic() < deadline, "resumed sweep did not finish"
            time.sleep(0.05)
        channel.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert sweep.state == profiler_pb2.SWEEP_STATE_SUCCEEDED, sweep.error
    assert sweep.done_points == sweep.total_points == 80
    assert any(n.startswith("resumed") and f"after {len(before)} of 80" in n for n in sweep.notes)
    assert len(sweep.profile_ids) == 8

    db = Database.open(db_url, "profiler")
    try:
        with db.session(readonly=True) as s:
            rows = s.execute(sa.select(SweepPoint.point_index, SweepPoint.body, SweepPoint.created_at)
                             .where(SweepPoint.sweep_id == sweep_id).order_by(SweepPoint.point_index)).all()
    finally:
        db.close()
    assert [r.point_index for r in rows] == list(range(80))  # none lost, none twice (unique per cell)
    for index, body, created in rows:
        if index in before:  # measured before the kill: kept as it was, not measured again
            assert body == before[index] and created < killed_at
        else:
            assert created >= killed_at.replace(microsecond=0)
    method = resolve(spec)
    for index in (0, len(before) - 1, len(before), 79):  # resumed points equal an uninterrupted measurement
        expected = simulate_point(spec.configs[index // 10], rates[index % 10], spec, method)
        point = common_pb2.ProfilePoint.FromString(rows[index].body)
        assert point == expected
