"""The main job's numbers: what a new user reads after `greenserve up` must agree.

* one CI per hour: the plans in force price the current hour at the CI the forecaster's forecast and current CI (the
  router's receipts) give it, and name that forecast (not the seasonal-naive stand-in of the first seconds);
* no explanation built on zeros ("embodied carbon (0.0 g/h) outweighs the energy it would save (0.0 g/h)");
* the MIG line's load is the pool's, not the MIG GPUs' share of it;
* the engines the gpu-partitioner runs on MIG instances are listed in the fleet with their URLs;
* the attainment a plan states is the simulator's prediction (the plan's own figure, not the SLO target in every
  hour), the same in the explanation as in the plan's fields and in what `greenserve plan show` and `plan explain`
  print for the operator;
* a short start-up: `greenserve up` (run.sh's fleet: 2 engines and LMCache) prints few enough lines before it is
  ready that a fresh clone's `scripts/run.sh`, set-up included, stays under 40.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc, optimizer_pb2, optimizer_pb2_grpc
from greenserve.v1 import router_pb2, router_pb2_grpc
from greenserve_client.sidecars import find_lmcache
from tests.up_process import CLI, pids_alive, service_ports, start_up

# What a fresh clone's `bash scripts/run.sh` prints before `greenserve up` runs: one line per set-up step, 8 on a
# clone of a machine that has the vLLM install in its cache (measured: virtualenv, greenserve, npm ci twice, and
# LMCache's virtualenv, torch, lmcache, ready), and 7 more from install-vllm.sh on a machine without one.
FRESH_SET_UP_LINES = 8 + 7
RUN_SH_LINES_BEFORE_UP = 40


def _stderr_so_far(up: subprocess.Popen) -> str:
    """What `up` has written on stderr until now (without waiting for more)."""
    fd = up.stderr.fileno()
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(fd, True)
    return b"".join(chunks).decode(errors="replace")


def _cli(ports: dict[str, int], *argv: str) -> str:
    done = subprocess.run([*CLI, *argv, f"--optimizer-addr=127.0.0.1:{ports['optimizer']}"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_up_plans_forecast_receipts_and_fleet_agree(tmp_path: Path) -> None:
    ports = service_ports()
    lmcache = "on" if find_lmcache() is not None else "off"  # on: the plans size its DRAM tier
    up, lines = start_up(tmp_path, ports, "--engines=2", "--engine-time-scale=20", "--router-http-port=0",
                         f"--lmcache={lmcache}", ready_within_s=150)
    try:
        # stdout and stderr until ready, as a terminal shows them
        before_ready = len(lines) + len(_stderr_so_far(up).splitlines())
        assert before_ready <= RUN_SH_LINES_BEFORE_UP - FRESH_SET_UP_LINES, "".join(lines)
        pids = [int(row[2]) for row in (line.split() for line in lines) if len(row) > 2 and row[2].isdigit()]
        opt = optimizer_pb2_grpc.OptimizerServiceStub(grpc.insecure_channel(f"127.0.0.1:{ports['optimizer']}"))
        fc = forecaster_pb2_grpc.ForecasterServiceStub(grpc.insecure_channel(f"127.0.0.1:{ports['forecaster']}"))
        rtr = router_pb2_grpc.RouterServiceStub(grpc.insecure_channel(f"127.0.0.1:{ports['router']}"))

        # The engines on the MIG instances join the fleet with the URLs the router reaches them at.
        deadline = time.monotonic() + 120
        while True:
            fleet = opt.GetFleet(optimizer_pb2.GetFleetRequest(), timeout=10).fleet
            on_mig = {e.id: e.url for p in fleet.pools for e in p.engines if e.mig_uuid}
            if on_mig and all(on_mig.values()) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        routed = {s.engine.id: s.engine.url for s in rtr.ListEngines(router_pb2.ListEnginesRequest(), timeout=10).engines
                  if s.engine.mig_uuid}
        assert on_mig and on_mig == {eid: routed[eid] for eid in on_mig}, (on_mig, routed)

        hour = int(time.time()) // 3600 * 3600
        forecast = fc.GetForecast(forecaster_pb2.GetForecastRequest(series=common_pb2.SeriesRef(
            kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key="ES", carbon_signal=common_pb2.CARBON_SIGNAL_DIRECT,
            unit=common_pb2.UNIT_G_PER_KWH), horizon_steps=24), timeout=30).forecast
        current = fc.GetCurrentCarbonIntensity(forecaster_pb2.GetCurrentCarbonIntensityRequest(region="ES"),
                                               timeout=30).carbon_intensity
        forecast_ci = {p.time.ToSeconds(): p.mean for p in forecast.points}
        assert current.time.ToSeconds() == hour and current.ci_g_per_kwh == pytest.approx(forecast_ci[hour])
        versions = [p.version for p in opt.ListPlans(optimizer_pb2.ListPlansRequest(), timeout=10).plans]
        assert versions
        for version in versions:  # v1 (the first plan, asked right after the history was seeded) included
            plan = opt.GetPlan(optimizer_pb2.GetPlanRequest(version=version), timeout=10).plan
            (interval,) = [iv for iv in plan.intervals if iv.start.ToSeconds() == hour]
            assert interval.pools[0].ci_g_per_kwh == pytest.approx(forecast_ci[hour], rel=1e-6), version
            (used,) = [f for f in plan.forecasts if f.series.kind == common_pb2.SERIES_KIND_CARBON_INTENSITY]
            assert used.model == forecast.model != "seasonal_naive", (version, used.model)
            text = plan.explanation
            assert not re.search(r"\(0\.0 g/h|\b0\.0 g/h\)|charged 0\.0 g", text), (version, text)
            first = plan.intervals[0].pools[0]
            for line in text.splitlines():
                if ", hour 0: " in line and "MIG GPUs" in line:
                    assert f"pool load {first.load_requests_per_s:.2f} req/s" in line, (version, line)
            # attainment: predicted per pool and for the plan, stated as predicted
            stated = [(float(a), float(t)) for a, t in
                      re.findall(r"expected attainment (\d\.\d\d) \(target (\d\.\d\d)\)", text)]
            figures = [p.expected_slo_attainment_fraction for p in plan.intervals[0].pools]
            assert stated and sorted(a for a, _ in stated) == sorted(round(f, 2) for f in figures), (version, text)
            assert 0 < plan.expected_slo_attainment_fraction <= 1
            targets = {t for _, t in stated}
            assert not any(f in targets for f in figures), ("the target copied, not a prediction", figures, targets)
            assert f"attainment {plan.expected_slo_attainment_fraction:.2f}" in text.splitlines()[-1], (version, text)
            # a prediction per hour, not the target copied into every hour
            hourly = [p.expected_slo_attainment_fraction for iv in plan.intervals for p in iv.pools]
            assert all(0 < a <= 1 for a in hourly), (version, hourly)
            assert any(round(a, 2) not in targets for a in hourly), ("the target in every hour", version, hourly)
            # what the operator reads: `plan explain`'s header, `plan show`'s hourly table
            explained = _cli(ports, "plan", "explain", str(version))
            assert f"attainment {plan.expected_slo_attainment_fraction:.3f}" in explained.splitlines()[0], explained
            shown = _cli(ports, "plan", "show", str(version))
            table = [re.split(r"\s{2,}", line) for line in shown.splitlines() if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d  ", line)]
            header = next(re.split(r"\s{2,}", line) for line in shown.splitlines() if line.startswith("HOUR (UTC)"))
            column = header.index("ATTAINMENT")
            assert [row[column] for row in table] == [f"{iv.expected_slo_attainment_fraction:.3f}"
                                                      for iv in plan.intervals], shown
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=90) == 0, up.stderr.read()
        assert not pids_alive(pids)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
