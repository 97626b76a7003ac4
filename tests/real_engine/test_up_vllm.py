"""`greenserve up --engine vllm`: a real vLLM engine (CPU build, tiny model) started beside the six services,
health-checked, given to the router, serving OpenAI requests through the router's HTTP front under both its own
name and the fleet's model name, and gone with its whole process tree after Ctrl-C, SIGTERM or kill -9 of `up`."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import grpc
import httpx
import pytest

from greenserve.profiler import engine_metrics
from greenserve.v1 import router_pb2, router_pb2_grpc
from greenserve.vllm_cpu import engines as vllm
from tests.conftest import free_port
from tests.real_engine.conftest import skip_reason
from tests.up_process import pids_alive, service_ports, start_up

FLEET_MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"  # what the local loop declares and the demo sends


def _group(pgid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "-g", str(pgid)], capture_output=True, text=True, timeout=10).stdout
    return [int(p) for p in out.split()]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "sigterm", "kill-9"])
def test_up_engine_vllm_serves_through_the_router_and_leaves_no_process(tmp_path: Path, stop_signal: int) -> None:
    """Stopped by Ctrl-C or SIGTERM, `up` stops the engine's process group itself; killed with kill -9, the engine's
    API server gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and vLLM takes EngineCore and the worker down."""
    why = skip_reason()
    if why:
        pytest.skip(why)
    ports, http = service_ports(), free_port()
    up, lines = start_up(tmp_path, ports, "--engine=vllm", "--engines=1", f"--router-http-port={http}",
                         "--lmcache=off", ready_within_s=vllm.START_TIMEOUT_S + 120)
    try:
        row = next(line.split() for line in lines if line.split()[:1] == ["engine-0"])
        url, pid, state = row[1], int(row[2]), row[3]
        assert state == "HEALTHY"
        assert (tmp_path / "models" / "tiny-llama" / "model.safetensors").exists()
        # a real vLLM: its process tree is the API server, EngineCore and the worker, in one group
        tree = _group(pid)
        assert len(tree) >= 3, tree
        assert httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["owned_by"] == "vllm"
        with grpc.insecure_channel(f"127.0.0.1:{ports['router']}") as channel:
            listed = router_pb2_grpc.RouterServiceStub(channel).ListEngines(router_pb2.ListEnginesRequest(), timeout=10)
        assert url in [e.engine.url for e in listed.engines]

        before = engine_metrics.parse(httpx.get(url + "/metrics", timeout=10).text).values
        served = 0
        for model in ("tiny-llama", FLEET_MODEL):
            for _ in range(3):
                reply = httpx.post(f"http://127.0.0.1:{http}/v1/completions", timeout=120, json={
                    "model": model, "prompt": "carbon-aware serving", "max_tokens": 7, "ignore_eos": True})
                assert reply.status_code == 200, reply.text
                assert reply.json()["usage"]["completion_tokens"] == 7
                served += reply.headers["x-greenserve-engine"] == url.split("://")[1]
        after = engine_metrics.parse(httpx.get(url + "/metrics", timeout=10).text).values
        # what the router sent to the real engine, its own counters saw (7 tokens each)
        assert served > 0
        generated = after["vllm:generation_tokens_total"] - before.get("vllm:generation_tokens_total", 0.0)
        assert generated == 7 * served

        up.send_signal(stop_signal)
        if stop_signal == signal.SIGKILL:
            assert up.wait(timeout=30) == -signal.SIGKILL
            deadline = time.monotonic() + 60
            while pids_alive(tree) and time.monotonic() < deadline:
                time.sleep(0.2)
        else:
            assert up.wait(timeout=120) == 0, up.stderr.read()
            assert "all services stopped" in up.stdout.read()
        assert not pids_alive(tree), "no process of the vLLM engine outlives `greenserve up`"
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/health", timeout=5)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_up_engine_vllm_without_vllm_says_how_to_install_it(tmp_path: Path) -> None:
    import os
    import sys

    ports = service_ports()
    env = {**os.environ, "GREENSERVE_VLLM_VENV": str(tmp_path / "no-venv")}
    done = subprocess.run([sys.executable, "-m", "greenserve_client.cli", "up", "--engine=vllm", "--lmcache=off",
                           f"--data-dir={tmp_path}", *(f"--{k.replace('_', '-')}-port={v}" for k, v in ports.items())],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2
    assert "--engine vllm" in done.stderr and "scripts/install-vllm.sh" in done.stderr, done.stderr
