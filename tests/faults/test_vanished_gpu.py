"""Fault 4 of issue 36: a plan the fleet cannot carry. A layout for a GPU that vanished, through the running
gpu-partitioner.

Real processes: the gpu-partitioner in its own process over the fake libnvidia-ml with two A100-40GB, one of which
falls off the bus while the service runs and comes back later (tests/faults/partitioner_node.py: NVML stops
listing it, its UUID is NOT_FOUND, its handle GPU_IS_LOST); the optimizer's side is a test double that keeps the
plans and the reports in the optimizer's PlanStore and answers ``plan status``. The backend's own behaviour for a
vanished GPU is tests/gpu_partitioner/test_gpu_vanished.py.

What must hold: a plan changing both GPUs' layouts while one is gone is applied on the GPU that is there and
refused for the other, naming it, reported FAILED as partially applied (before: the vanished GPU's layout was
taken for another node's and the plan reported APPLIED); ``greenserve plan status`` shows it; the retries back off
(the waits double from --engine-check-interval-s up to --engine-retry-backoff-max-s: a few tries in 20 s, not one
per tick); once the GPU is back the service applies its layout by itself, with no new plan and no operator call.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
from greenserve.v1 import common_pb2, optimizer_pb2

from .conftest import until
from .partitioner_node import plan_status_cli, serve_status_optimizer, start_partitioner, stop_partitioner

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX sessions and signals")]

APPLIED = optimizer_pb2.ENFORCEMENT_STATE_APPLIED
FAILED = optimizer_pb2.ENFORCEMENT_STATE_FAILED
CHECK_S = 0.5  # --engine-check-interval-s: the watchdog's tick
BACKOFF_MAX_S = 8.0  # --engine-retry-backoff-max-s
LOADED_SLACK_S = 8.0  # what a try may take on a loaded 2-core CI machine, beyond the wait before it
WATCH_S = 20.0  # retries 1, 2, 4, 8 s apart (plus a tick each): 5 or 6 tries; one per tick would be 40


def _layout(gpu: str, *placements: tuple[str, int, int]) -> common_pb2.MigLayout:
    return common_pb2.MigLayout(gpu_uuid=gpu, placements=[
        common_pb2.MigPlacement(profile=profile, start=start, size=size) for profile, start, size in placements])


def _profiles(report: optimizer_pb2.ReportGpusRequest, gpu: str) -> list[str] | None:
    """The GPU's instance profiles in a GPU report (None: not listed)."""
    listed = [g for g in report.gpus if g.uuid == gpu]
    return sorted(i.profile for i in listed[0].instances) if listed else None


async def test_a_layout_for_a_vanished_gpu_is_refused_for_it_retried_with_backoff_and_applied_on_return(
        tmp_path: Path) -> None:
    optimizer, server, opt_port = await serve_status_optimizer(tmp_path / "optimizer.db", [])
    gone_file = tmp_path / "gone.txt"
    proc = start_partitioner(
        [f"--data-dir={tmp_path / 'gp'}", "--host=127.0.0.1", "--port=0", "--backend=nvml", "--node-name=n1",
         f"--optimizer-addr=127.0.0.1:{opt_port}", "--router-addr=127.0.0.1:9", "--no-require-router",
         "--engine-launcher=none", "--energy-sample-interval-s=0", "--gpu-report-interval-s=0.5",
         f"--engine-check-interval-s={CHECK_S}", f"--engine-retry-backoff-max-s={BACKOFF_MAX_S}", "--no-log-json",
         "--log-level=WARNING"],
        gone_file=gone_file, models="A100-40GB,A100-40GB")

    async def outcome(version: int, after: int = 0) -> optimizer_pb2.EnforcementReport:
        def done() -> list[optimizer_pb2.EnforcementReport]:
            return [r for _, r in optimizer.arrivals[after:]
                    if r.plan_version == version and r.state != optimizer_pb2.ENFORCEMENT_STATE_APPLYING]
        await until(lambda: done() or proc.poll() is not None, 60, f"the outcome of plan v{version}")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        return done()[0]

    try:
        await until(lambda: optimizer.gpu_reports or proc.poll() is not None, 60, "the node's GPU report")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        kept, gone = (g.uuid for g in optimizer.gpu_reports[0].gpus)

        # both GPUs take the first layout
        halves = (("3g.20gb", 4, 4), ("4g.20gb", 0, 4))
        v1 = await optimizer.publish(common_pb2.PlanInterval(
            mig_layouts=[_layout(kept, *halves), _layout(gone, *halves)]))
        first = await outcome(v1)
        assert first.state == APPLIED, first.detail

        # one falls off the bus; the node's next GPU report no longer lists it
        gone_file.write_text(gone + "\n")
        await until(lambda: _profiles(optimizer.gpu_reports[-1], gone) is None, 30, "a report without the GPU")

        whole = ("7g.40gb", 0, 8)
        v2 = await optimizer.publish(common_pb2.PlanInterval(
            mig_layouts=[_layout(kept, whole), _layout(gone, whole)]))
        report = await outcome(v2)
        failed_at = time.monotonic()
        assert report.state == FAILED, (optimizer_pb2.EnforcementState.Name(report.state), report.detail)
        assert "partially applied" in report.detail and f"GPU {gone}" in report.detail, report.detail
        assert "not on this node any more" in report.detail, report.detail
        assert f"GPU {kept}: layout applied" in report.detail, report.detail
        await until(lambda: _profiles(optimizer.gpu_reports[-1], kept) == ["7g.40gb"], 30, "the applied layout")

        # what an operator reads: the node's last report, which is the next retry's APPLYING while that runs
        # (the back-off leaves longer and longer gaps between them); read until it is the refusal again
        for _ in range(20):
            status = await asyncio.to_thread(plan_status_cli, opt_port)
            assert status.returncode == 3, status.stderr  # the fleet does not match the plan
            (shown,) = json.loads(status.stdout)["reports"]
            if shown["state"] != "applying":
                break
            await asyncio.sleep(0.5)
        assert shown["state"] == "failed" and gone in shown["detail"] and "partially applied" in shown["detail"]

        # the retries back off: count the reconciles of v2 over the window
        await asyncio.sleep(max(0.0, failed_at + WATCH_S - time.monotonic()))
        tries = [t for t, _ in optimizer.reports_of(v2, FAILED) if t <= failed_at + WATCH_S]
        gaps = [b - a for a, b in zip(tries, tries[1:])]
        assert 3 <= len(tries) <= 8, gaps  # it keeps trying, a few times (one per 0.5 s tick: 40)
        # the waits grow (relative: on a loaded machine each try itself takes longer) and are bounded
        assert gaps[-1] >= 2 * gaps[0], gaps
        assert all(g <= BACKOFF_MAX_S + CHECK_S + LOADED_SLACK_S for g in gaps), gaps
        assert not optimizer.reports_of(v2, APPLIED)

        # back on the bus right after a retry (the next one BACKOFF_MAX_S away): applied by the service itself at
        # its next check, no new plan
        retried = len(optimizer.reports_of(v2, FAILED))
        await until(lambda: len(optimizer.reports_of(v2, FAILED)) > retried, 3 * BACKOFF_MAX_S, "the next retry")
        gone_file.write_text("")
        back_at = time.monotonic()
        await until(lambda: optimizer.reports_of(v2, APPLIED) or proc.poll() is not None, 30,
                    "APPLIED once the GPU is back")
        arrived, converged = optimizer.reports_of(v2, APPLIED)[0]
        took_s = arrived - back_at
        # the previous layout was kept while it was gone: its two instances are what the apply replaced
        assert f"GPU {gone}: layout applied" in converged.detail and "2 GI destroyed, 1 created" in converged.detail, \
            converged.detail
        # the try that applied it began at the watchdog's next check, not when the back-off (8 s) ran out
        began_s = min(t for t, _ in optimizer.reports_of(v2, optimizer_pb2.ENFORCEMENT_STATE_APPLYING)
                      if t > back_at) - back_at
        assert began_s < BACKOFF_MAX_S - 2.0, began_s  # waiting out the back-off would be about BACKOFF_MAX_S
        await until(lambda: _profiles(optimizer.gpu_reports[-1], gone) == ["7g.40gb"], 30, "the returned GPU's layout")
        assert optimizer.store.active.version == v2  # no new plan was needed
        print(f"retried {began_s:.2f} s and converged {took_s:.2f} s after the GPU came back; tries while it was gone: {len(tries)}, "
              f"gaps {[round(g, 2) for g in gaps]}")
    finally:
        await stop_partitioner(proc)
        await server.stop(0)
        optimizer.db.close()
