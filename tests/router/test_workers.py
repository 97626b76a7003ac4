"""greenserve-router --workers 2: both workers serve, /metrics is the whole router's, a killed worker is
replaced while the other serves (no request that had not started streaming fails, no retries), a second
supervisor or a single router cannot share the ports, SIGTERM stops every worker, and kill -9 of the
supervisor leaves no worker behind (workers.py)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import grpc
import pytest
from greenserve.router.workers import (
    WORKER_HEADER,
    PortClaim,
    cgroup_cpu_limit,
    supported,
)
from greenserve.v1 import router_pb2, router_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not supported(), reason="router workers need Linux (SO_REUSEPORT)")]

ERRORS: list[str] = []
READY_WITHIN_S = 120.0  # a worker imports grpc, SQLAlchemy, OTel...: slow on a loaded 2-core machine


def children(pid: int) -> set[int]:
    """Live child processes of ``pid`` (zombies excluded)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {c for c in map(int, text.split()) if alive(c)}


def alive(pid: int) -> bool:
    """Running (a zombie is dead: its sockets are closed)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_for(predicate, timeout_s: float, what: str, step_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(step_s)


@contextmanager
def supervisor(tmp_path: Path, port: int, http_port: int, *extra: str, log: str = "router.log"
               ) -> Iterator[subprocess.Popen[bytes]]:
    """``greenserve-router --workers 2`` (the supervisor process); killed with its workers at the end."""
    argv = [sys.executable, "-m", "greenserve.router", "--host", "127.0.0.1", "--port", str(port),
            "--http-port", str(http_port), "--data-dir", str(tmp_path / "data"), "--workers", "2",
            "--no-watch-plans", "--no-feeds", "--scrape-interval-s", "0.2", "--stale-after-s", "1",
            "--health-interval-s", "0.5", "--shutdown-grace-s", "2", *extra]
    with open(tmp_path / log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=out)
    try:
        yield proc
    finally:
        workers = children(proc.pid)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def assert_port_free(port: int) -> None:
    """Nobody listens on ``port``: a plain socket (SO_REUSEADDR for the closed connections' TIME_WAIT, no
    SO_REUSEPORT) can listen on it."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()


def log_text(tmp_path: Path, name: str = "router.log") -> str:
    return (tmp_path / name).read_text(errors="replace")[-3000:]


async def wait_two_workers(http: str, proc: subprocess.Popen[bytes], tmp_path: Path) -> set[int]:
    """Waits until both workers answer /health (new connection per probe); returns their pids."""
    seen: set[int] = set()
    deadline = time.monotonic() + READY_WITHIN_S
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        while len(seen) < 2:
            assert proc.poll() is None, f"supervisor exited {proc.returncode}: {log_text(tmp_path)}"
            assert time.monotonic() < deadline, f"two workers not serving: {log_text(tmp_path)}"
            try:
                async with s.get(http + "/health") as resp:
                    if resp.status == 200:
                        seen.add(int(resp.headers[WORKER_HEADER]))
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05 if seen else 0.2)
    return seen


async def completion(s: aiohttp.ClientSession, http: str, model: str, max_tokens: int,
                     started: asyncio.Future[int | None] | None = None) -> tuple[int | None, bool, bool]:
    """One streamed completion: (worker pid, streaming had started, the stream ended with [DONE]);
    ``started`` gets the worker's pid at the first body bytes. Never retried: any error is a failure."""
    body = {"model": model, "prompt": "hello workers", "max_tokens": max_tokens, "stream": True}
    pid, started_streaming, data = None, False, b""
    try:
        async with s.post(http + "/v1/completions", json=body) as resp:
            pid = int(resp.headers.get(WORKER_HEADER, "0")) or None
            if resp.status != 200:
                return pid, False, False
            async for chunk in resp.content.iter_any():
                if chunk and not started_streaming:
                    started_streaming = True
                    if started is not None:
                        started.set_result(pid)
                data += chunk
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        ERRORS.append(f"{time.monotonic():.3f} pid={pid} started={started_streaming}: {exc!r}")
        return pid, started_streaming, False
    return pid, started_streaming, data.rstrip().endswith(b"data: [DONE]")


def scrape(text: str) -> dict[str, float]:
    """Sample name (labels folded by summing) -> value."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert "pid" not in sample.labels, f"per-process series in the whole router's metrics: {sample}"
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def test_two_workers_serve_sum_metrics_survive_a_killed_worker_and_stop_on_sigterm(
        tmp_path: Path, emulators) -> None:
    (emu,) = await emulators(1, time_scale=1.0)
    port, http_port = free_port(), free_port()
    http = f"http://127.0.0.1:{http_port}"
    with supervisor(tmp_path, port, http_port, "--engines", emu.url) as proc:
        ready = await wait_two_workers(http, proc, tmp_path)
        workers = children(proc.pid)
        assert ready == workers and len(workers) == 2

        # both workers serve: requests over separate connections land on both
        fresh = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=fresh) as s:
            results = await asyncio.gather(*(completion(s, http, emu.model, 2) for _ in range(16)))
        assert all(ok for _, _, ok in results), results
        assert {pid for pid, _, _ in results} == workers
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = router_pb2_grpc.RouterServiceStub(channel)
            request = router_pb2.GenerateRequest(
                request=router_pb2.RequestDescriptor(model=emu.model, completion=router_pb2.CompletionInput(
                    prompt="hello over gRPC")), sampling=router_pb2.SamplingParams(max_tokens=2))
            replies = [m async for m in stub.Generate(request)]
        assert replies[-1].finish_reason and replies[-1].HasField("receipt")

        # /metrics is the whole router's, whichever worker answers: the answering worker's counts exactly, the
        # other's as it last published them (every second: folded_metrics.py), so the counters reach exactly
        # 17 and the in-flight level settles to 0 within about a second, never overshooting
        answered: set[int] = set()
        in_flight, counted = [], []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            for _ in range(40):
                async with s.get(http + "/metrics") as resp:
                    answered.add(int(resp.headers[WORKER_HEADER]))
                    values = scrape(await resp.text())
                assert values["greenserve_router_requests_total"] <= 17, values
                assert values["greenserve_router_ttft_seconds_count"] == values["greenserve_router_requests_total"]
                counted.append(values["greenserve_router_requests_total"])
                in_flight.append(values["greenserve_router_in_flight"])
                if answered == workers and in_flight[-1] == 0 and counted[-1] == 17:
                    break
                await asyncio.sleep(0.1)
        assert answered == workers and in_flight[-1] == 0 and counted[-1] == 17, (in_flight, counted)

        # kill -9 one worker while streams are running on both
        s = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                  timeout=aiohttp.ClientTimeout(total=120))
        try:
            # streams (~6 s each) until both workers are streaming at least one
            long_streams, streaming_on = [], set()
            while streaming_on != workers:
                assert len(long_streams) < 24, streaming_on
                first_bytes: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
                long_streams.append(asyncio.create_task(completion(s, http, emu.model, 400, first_bytes)))
                streaming_on.add(await asyncio.wait_for(first_bytes, 60))
            victim = min(workers)
            survivor = max(workers)
            # short requests from the kill on, in a closed loop over new connections, never retried, until
            # the replacement has served some; each remembers when it was sent
            short: list[tuple[float, tuple[int | None, bool, bool]]] = []
            deadline = time.monotonic() + READY_WITHIN_S

            async def client() -> None:
                while time.monotonic() < deadline:
                    sent = time.monotonic()
                    short.append((sent, await completion(s, http, emu.model, 2)))
                    if sum(1 for _, (pid, _, ok) in short if ok and pid not in workers) >= 3:
                        return

            os.kill(victim, signal.SIGKILL)
            clients = [asyncio.create_task(client()) for _ in range(3)]
            # gone from /proc: reaped by the supervisor, every thread exited, its sockets closed
            await asyncio.to_thread(wait_for, lambda: not Path(f"/proc/{victim}").exists(), 10,
                                    "the killed worker reaped", 0.005)
            reaped_at = time.monotonic()
            await asyncio.gather(*clients)
            finished = await asyncio.gather(*long_streams)
        finally:
            await s.close()
        failed = [(sent, r) for sent, r in short if not r[2]]
        # Once the killed worker is gone no request fails. Before (a few ms: its threads exiting), the
        # connections the kernel gave its socket are reset unless net.ipv4.tcp_migrate_req=1 hands them to
        # the survivor (docs/router.md); none of them had started streaming, so it is measured here.
        after = [r for sent, r in failed if sent >= reaped_at]
        assert not after, f"{len(after)} of {len(short)} requests sent after the kill failed: {ERRORS}"
        migrate = Path("/proc/sys/net/ipv4/tcp_migrate_req")  # Linux >= 5.14
        if migrate.exists() and migrate.read_text().strip() == "1":
            assert not failed, f"{len(failed)} requests failed with tcp_migrate_req=1: {ERRORS}"
        unstarted = [e for e in ERRORS if "started=False" in e]  # the streams cut by the kill had started
        dropped = ("reset by peer", "Broken pipe", "disconnected")  # the dying socket's RST, whenever it lands
        assert len(unstarted) == len(failed) and all(any(d in e for d in dropped) for e in unstarted), ERRORS
        replacement = {pid for _, (pid, _, ok) in short if ok} - workers
        assert len(replacement) == 1, (replacement, log_text(tmp_path))
        assert children(proc.pid) == {survivor, *replacement}
        # the streams on the survivor finished; only those that were streaming from the killed one broke
        for pid, streaming, ok in finished:
            assert streaming
            assert ok == (pid == survivor), (pid, ok, victim, survivor)
        assert any(pid == victim for pid, _, _ in finished) and any(pid == survivor for pid, _, _ in finished)
        # the dead worker's counts stay in the sum (the live workers' latest within their publishing second)
        ok_requests = 17 + sum(1 for _, r in short if r[2]) + sum(1 for r in finished if r[2])
        for _ in range(30):
            async with aiohttp.ClientSession() as s2, s2.get(http + "/metrics") as resp:
                values = scrape(await resp.text())
            if values["greenserve_router_requests_total"] >= ok_requests:
                break
            await asyncio.sleep(0.1)
        assert values["greenserve_router_requests_total"] >= ok_requests

        # Drain through any worker counts every worker's requests on the engine: busy while one of them
        # streams from it (whichever worker each of 4 gRPC connections reached), idle once that ends
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            first_bytes: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
            stream = asyncio.create_task(completion(s, http, emu.model, 2000, first_bytes))  # ~30 s
            await asyncio.wait_for(first_bytes, 60)
            channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
                        for _ in range(4)]
            try:
                stubs = [router_pb2_grpc.RouterServiceStub(c) for c in channels]
                listed = await stubs[0].ListEngines(router_pb2.ListEnginesRequest())
                (engine_id,) = [e.engine.id for e in listed.engines]
                drains = await asyncio.gather(*(stub.Drain(router_pb2.DrainRequest(
                    engine_ids=[engine_id], wait=True, timeout_s=3)) for stub in stubs))
                assert not stream.done()
                assert all(list(d.busy_engine_ids) == [engine_id] for d in drains), drains
                stream.cancel()  # the client goes away: the worker aborts the upstream request
                drains = await asyncio.gather(*(stub.Drain(router_pb2.DrainRequest(
                    engine_ids=[engine_id], wait=True, timeout_s=60)) for stub in stubs))
                assert all(list(d.idle_engine_ids) == [engine_id] for d in drains), drains
                await stubs[0].Undrain(router_pb2.UndrainRequest(engine_ids=[engine_id]))
            finally:
                for c in channels:
                    await c.close()

        # neither a second supervisor (its port claim) nor a single-process router (a plain bind, as grpc's
        # with so_reuseport 0) can take the ports
        for p in (port, http_port):
            with pytest.raises(OSError, match="another greenserve-router supervisor"):
                PortClaim("gRPC", "127.0.0.1", p)
            with socket.socket() as sock, pytest.raises(OSError) as refused:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", p))
            assert refused.value.errno == errno.EADDRINUSE

        # SIGTERM: every worker stops, the supervisor exits 0, the ports and the metrics files are freed
        live = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0, log_text(tmp_path)
        assert not any(alive(pid) for pid in live)
        assert not list((tmp_path / "data").glob("router-metrics-*"))
        for p in (port, http_port):
            assert_port_free(p)


def test_kill_9_of_the_supervisor_leaves_no_worker(tmp_path: Path) -> None:
    port = free_port()
    with supervisor(tmp_path, port, -1, "--log-level", "INFO") as proc:

        def serving() -> bool:
            assert proc.poll() is None, log_text(tmp_path)
            for line in (tmp_path / "router.log").read_text(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("logger") == "greenserve.router.workers" and entry.get("msg") == "serving":
                    return True
            return False

        wait_for(serving, READY_WITHIN_S, "the supervisor's 'serving' line", 0.2)
        workers = children(proc.pid)
        assert len(workers) == 2
        proc.kill()
        proc.wait(10)
        wait_for(lambda: not any(alive(pid) for pid in workers), 30, "workers gone after kill -9 of the supervisor")
        assert_port_free(port)


def test_cgroup_cpu_quota_caps_the_default(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path) is None  # no cgroup files: no quota
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: 2 workers
    assert cgroup_cpu_limit(tmp_path) == 2
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")  # cgroup v1, no quota
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    assert cgroup_cpu_limit(tmp_path) == 4


def test_port_claim_is_not_blocked_by_time_wait_of_an_earlier_server() -> None:
    """A server that closed its side first leaves the port's connections in TIME_WAIT; the supervisor's claim
    (like grpc's and asyncio's listeners) must still bind it, and a live claim still refuses a second one."""
    import socket as sk

    from greenserve.router.workers import PortClaim

    srv = sk.socket()
    srv.setsockopt(sk.SOL_SOCKET, sk.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    client = sk.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()  # the server's side closes first: TIME_WAIT on the server's port
    client.close()
    srv.close()
    claim = PortClaim("gRPC", "127.0.0.1", port)
    try:
        with pytest.raises(OSError, match="another greenserve-router supervisor"):
            PortClaim("gRPC", "127.0.0.1", port)
    finally:
        claim.close()
