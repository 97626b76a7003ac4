"""`greenserve up` starts the six services as separate processes, `greenserve status` sees them SERVING,
and Ctrl-C (SIGINT) stops every one of them cleanly."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import grpc
import httpx
import pytest

from greenserve.v1 import cache_manager_pb2, cache_manager_pb2_grpc, router_pb2, router_pb2_grpc
from greenserve_client.services import SERVICES
from greenserve_client.sidecars import find_lmcache
from tests.up_process import CLI, pids_alive, port_flags, service_ports, start_up


@pytest.mark.slow
def test_up_status_and_ctrl_c(tmp_path: Path) -> None:
    ports = service_ports()
    # The main job's local fleet: one emulated engine handed to the router, and LMCache when installed.
    lmcache = "on" if find_lmcache() is not None else "off"
    up, lines = start_up(tmp_path, ports, "--engines=1", "--engine-time-scale=20", "--router-http-port=0",
                         f"--lmcache={lmcache}", ready_within_s=90)
    try:
        # a short start-up (issue 35: a fresh clone's run.sh prints under 40 lines before the services are up): one
        # table row per process, the first plan, SERVING
        assert len(lines) <= 16, "".join(lines)
        table = [line.split() for line in lines if line.split() and line.split()[0] in {s.display for s in SERVICES}]
        assert [row[0] for row in table] == [s.display for s in SERVICES]
        pids = [int(row[2]) for row in table]
        assert len(set(pids)) == 6, "each service is its own process"

        status = subprocess.run([*CLI, "status", "--json", *port_flags(ports, "addr")],
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        rows = json.loads(status.stdout.strip().splitlines()[-1])["services"]
        assert {r["service"]: r["status"] for r in rows} == {s.display: "SERVING" for s in SERVICES}
        assert all((tmp_path / f"{s.name}.db").exists() for s in SERVICES)

        # the router was given the emulated engine, the cache-manager the LMCache server
        engine_rows = [row for row in (line.split() for line in lines) if row and row[0] == "engine-0"]
        assert len(engine_rows) == 1 and engine_rows[0][3] == "HEALTHY"
        with grpc.insecure_channel(f"127.0.0.1:{ports['router']}") as channel:
            engines = router_pb2_grpc.RouterServiceStub(channel).ListEngines(router_pb2.ListEnginesRequest(), timeout=10)
        # the flag engine, plus the engines the gpu-partitioner started on the simulated GPU's MIG instances
        assert engine_rows[0][1] in [e.engine.url for e in engines.engines]
        if lmcache == "on":
            # The plan may resize LMCache's DRAM tier by a controlled restart (a few seconds unreachable).
            deadline = time.monotonic() + 90
            while True:
                with grpc.insecure_channel(f"127.0.0.1:{ports['cache_manager']}") as channel:
                    servers = cache_manager_pb2_grpc.CacheManagerServiceStub(channel).ListCacheServers(
                        cache_manager_pb2.ListCacheServersRequest(), timeout=10)
                seen = [(s.id, s.reachable) for s in servers.servers]
                if seen == [("local-lmcache", True)] or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
            assert seen == [("local-lmcache", True)]
            lmcache_url = next(row[1] for row in (line.split() for line in lines) if row and row[0] == "lmcache")
            sidecar_pids = [int(row[2]) for row in (line.split() for line in lines) if row and row[0] == "lmcache"]
            assert len(sidecar_pids) == 1
            pids += sidecar_pids
        pids += [int(engine_rows[0][2])]

        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0, up.stderr.read()
        rest = up.stdout.read()
        assert "all services stopped" in rest
        assert not pids_alive(pids), "no service or sidecar process outlives `greenserve up`"
        if lmcache == "on":  # nor an LMCache server that a resize restarted under another pid
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"{lmcache_url}/healthcheck", timeout=5)
    finally:
        if up.poll() is None:
            up.kill()

    down = subprocess.run([*CLI, "status", *port_flags(ports, "addr"), "--timeout-s", "1"],
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "UNREACHABLE" in down.stdout


def test_up_fails_fast_when_a_service_cannot_start(tmp_path: Path) -> None:
    import socket

    ports = service_ports()
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", ports["router"]))
        blocker.listen()
        result = subprocess.run([*CLI, "up", "--data-dir", str(tmp_path), "--startup-timeout-s", "60",
                                 *port_flags(ports, "port")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "router exited" in result.stderr and "cannot bind" in result.stderr


def test_cli_rejects_bad_flags() -> None:
    result = subprocess.run([*CLI, "up", "--router-port", "70000"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "--router-port" in result.stderr
    result = subprocess.run([*CLI, "status", "--timeout-s", "0"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "--timeout-s" in result.stderr
    for flag, value in (("--engines", "-1"), ("--engine-time-scale", "0"), ("--router-http-port", "70000")):
        result = subprocess.run([*CLI, "up", f"{flag}={value}"], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2 and flag in result.stderr, (flag, result.stderr)
    result = subprocess.run([*CLI, "bench", "no-such-bench"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "no-such-bench" in result.stderr
