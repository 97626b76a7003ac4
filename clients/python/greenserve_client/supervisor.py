"""`greenserve up`: run the six services as child processes on one machine.

Each service is its own process (`python -m greenserve.<service>`), with its SQLite file in the data dir
and its log in DATA_DIR/logs/<service>.log. Beside them run the sidecars of a local fleet
(`greenserve_client.sidecars`): vLLM engines that the router is given with `--engines` (emulated, or real vLLM on
CPU with `--engine vllm`), and a real
LMCache server that is registered with the cache-manager once it is SERVING. `up` waits until everything is
healthy, prints the addresses, and on Ctrl-C/SIGTERM (or when any process dies) stops the services, then
the sidecars, with SIGTERM, then SIGKILL for any that outlive the grace period.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from greenserve.common.cli_parser import Parser
from greenserve.common.client import ChannelConfig, create_channel, wait_until_serving
from greenserve.common.config import DEFAULT_ROUTER_HTTP_PORT, ServiceSettings
from greenserve.common.parent_death import dies_with_parent
from greenserve.v1 import cache_manager_pb2, cache_manager_pb2_grpc

from greenserve_client import lmcache_control, sidecars
from greenserve_client.local_loop import (
    LocalLoopOptions,
    first_plan_summary,
    start_local_loop,
)
from greenserve_client.services import SERVICES, ServiceInfo

LMCACHE_SERVER_ID = "local-lmcache"

STOP_GRACE_S = 15.0


@dataclass
class Child:
    info: ServiceInfo
    address: str
    process: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class FleetOptions:
    """The local fleet beside the services: emulated engines and an LMCache server."""

    engines: int = 2
    engine: str = "sim"  # "sim": greenserve-engine-sim; "vllm": real vLLM (CPU build) on the tiny local model
    engine_profile: str | None = None
    engine_time_scale: float = 1.0
    lmcache: str = "auto"  # "auto": start it when the lmcache executable is found; "on": required; "off"
    lmcache_l1_size_gb: float = 1.0
    pool: str = "default"
    router_http_port: int = DEFAULT_ROUTER_HTTP_PORT
    gateway: str = "none"  # "envoy": Envoy in front of the engines, the router its endpoint picker
    gateway_port: int = 0  # Envoy's listener (0: a free port)
    loop: bool = True  # seed history, declare the local fleet and compute the first plan


def _service_command(info: ServiceInfo, host: str, port: int, data_dir: Path, ports: dict[str, int],
                     extra: list[str]) -> list[str]:
    deps = [f"--{s.display}-addr={'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{ports[s.name]}" for s in SERVICES]
    return [sys.executable, "-m", f"greenserve.{info.name}", f"--host={host}", f"--port={port}",
            f"--data-dir={data_dir}", *deps, *extra]


def service_token(args: list[str]) -> str | None:
    """The bearer token a service started with ``args`` sends on its own calls, read from the same places the
    service reads it: --auth-token-file / --auth-token among ``args`` (the last of each), else the
    GREENSERVE_AUTH_TOKEN_FILE / GREENSERVE_AUTH_TOKEN environment; a file wins over a token. None: auth off.
    ValueError for an empty file, OSError for an unreadable one."""
    parser = Parser(add_help=False)
    parser.add_argument("--auth-token")
    parser.add_argument("--auth-token-file", type=Path)
    given, _ = parser.parse_known_args(args)
    return ServiceSettings(**{k: v for k, v in vars(given).items() if v is not None}).token()


async def _register_lmcache(address: str, url: str, pool: str) -> None:
    channel = create_channel(ChannelConfig(address=address, default_timeout_s=10.0))
    try:
        stub = cache_manager_pb2_grpc.CacheManagerServiceStub(channel)
        server = cache_manager_pb2.CacheServer(id=LMCACHE_SERVER_ID, pool=pool, url=url)
        await stub.RegisterCacheServer(cache_manager_pb2.RegisterCacheServerRequest(server=server))
    finally:
        await channel.close()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_all(children: list[Child], grace_s: float = STOP_GRACE_S) -> dict[str, int | None]:
    """SIGTERM every live child, wait up to `grace_s`, SIGKILL the rest; returns exit codes by service."""
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    codes: dict[str, int | None] = {}
    for child in children:
        try:
            codes[child.info.display] = child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            codes[child.info.display] = child.process.wait()
    return codes


async def _wait_serving(children: list[Child], timeout_s: float) -> None:
    async def one(child: Child) -> None:
        channel = create_channel(ChannelConfig(address=child.address, default_timeout_s=2.0))
        try:
            waiter = asyncio.ensure_future(wait_until_serving(channel, child.info.grpc_service, timeout_s))
            while not waiter.done():
                if child.process.poll() is not None:
                    waiter.cancel()
                    raise RuntimeError(
                        f"{child.info.display} exited with code {child.process.returncode} during start-up; "
                        f"last log lines ({child.log_path}):\n{_tail(child.log_path)}"
                    )
                await asyncio.wait([waiter], timeout=0.1)
            waiter.result()
        finally:
            await channel.close()

    await asyncio.gather(*(one(c) for c in children))


def up(*, host: str, ports: dict[str, int], data_dir: Path, startup_timeout_s: float, extra_args: list[str],
       fleet: FleetOptions | None = None, loop_options: LocalLoopOptions | None = None,
       after_start: Callable[[dict[str, str], str], int] | None = None) -> int:
    """Starts everything, then waits for Ctrl-C/SIGTERM, a dead process, or ``after_start`` (run in a thread with
    the services' addresses and the router's HTTP URL) to return; stops everything in order."""
    fleet = fleet or FleetOptions(engines=0, lmcache="off")
    data_dir.mkdir(parents=True, exist_ok=True)
    logs = data_dir / "logs"
    logs.mkdir(exist_ok=True)
    if len(set(ports.values())) != len(ports):
        print("greenserve up: error: two services were given the same port", file=sys.stderr)
        return 2
    children: list[Child] = []
    cars: list[sidecars.Sidecar] = []
    stop_requested = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        lmcache_bin = sidecars.find_lmcache() if fleet.lmcache != "off" else None
        if fleet.lmcache == "on" and (lmcache_bin is None or not lmcache_bin.exists()):
            print("greenserve up: error: --lmcache=on but no lmcache executable was found (run "
                  "scripts/install-lmcache.sh or set GREENSERVE_LMCACHE_BIN)", file=sys.stderr)
            return 2
        if fleet.lmcache == "auto" and lmcache_bin is None:
            print("greenserve up: warning: no lmcache executable found (scripts/install-lmcache.sh installs it); "
                  "running without an LMCache server", file=sys.stderr)
        # The services bind their ports after the sidecars start: no sidecar may take one of them meanwhile.
        promised = frozenset([*ports.values(), fleet.router_http_port])
        if fleet.engine == "vllm":
            # the engines also answer to the model name the local loop's fleet declares (and the demo sends)
            alias = (loop_options or LocalLoopOptions(pool=fleet.pool)).model
            try:
                engines = sidecars.start_vllm_engines(fleet.engines, data_dir=data_dir, logs=logs, aliases=(alias,),
                                                      avoid=promised)
            except RuntimeError as exc:
                print(f"greenserve up: error: --engine vllm: {exc}", file=sys.stderr)
                return 2
        else:
            engines = sidecars.start_engines(fleet.engines, profile=fleet.engine_profile,
                                             time_scale=fleet.engine_time_scale, logs=logs, avoid=promised)
        cars.extend(engines)
        promised |= {int(e.url.rsplit(":", 1)[1]) for e in engines}
        lmcache = sidecars.start_lmcache(lmcache_bin, l1_size_gb=fleet.lmcache_l1_size_gb, logs=logs,
                                         avoid=promised) if lmcache_bin is not None else None
        if lmcache is not None:
            cars.append(lmcache)
        try:
            sidecars.wait_ready(cars, startup_timeout_s)
        except (RuntimeError, TimeoutError) as exc:
            print(f"greenserve up: error: {exc}", file=sys.stderr)
            return 1
        router_args = [f"--http-port={fleet.router_http_port}"]
        if engines:
            router_args += [f"--engines={','.join(e.url for e in engines)}", f"--default-pool={fleet.pool}"]
        if fleet.gateway == "envoy":
            router_args.append("--envoy-picker")
        per_service = {"router": router_args}
        controller: lmcache_control.LmcacheController | None = None
        if lmcache is not None and lmcache_bin is not None:
            # The cache-manager resizes LMCache's DRAM tier by a controlled restart that this supervisor does.
            size = {"gb": fleet.lmcache_l1_size_gb}
            binary = lmcache_bin

            def restart(l1_size_gb: float) -> str:
                old = next(c for c in cars if c.name == "lmcache")
                fresh, failure = sidecars.restart_lmcache(old, binary, l1_size_gb=l1_size_gb, previous_gb=size["gb"],
                                                          logs=logs, grace_s=STOP_GRACE_S, timeout_s=startup_timeout_s)
                cars[cars.index(old)] = fresh
                if failure is not None:
                    raise RuntimeError(f"LMCache did not come up at {l1_size_gb:g} GB ({failure}); "
                                       f"restarted at {size['gb']:g} GB")
                before, size["gb"] = size["gb"], l1_size_gb
                detail = f"LMCache restarted at {l1_size_gb:g} GB (was {before:g} GB), pid {fresh.process.pid}"
                print(f"cache plan: {detail}", flush=True)
                return detail

            controller = lmcache_control.LmcacheController(data_dir / "lmcache-control", restart)
            per_service["cache_manager"] = [
                f"--lmcache-restart-command={lmcache_control.restart_command(controller.control_dir)}"]
            loop_options = loop_options or LocalLoopOptions(pool=fleet.pool)
            if loop_options.cache_dram_limit_bytes == 0:
                # Let the planner size the DRAM tier from none to twice the start size, in steps of half of it.
                gib = 1024**3
                loop_options = dataclasses.replace(
                    loop_options, cache_dram_limit_bytes=int(2 * fleet.lmcache_l1_size_gb * gib),
                    cache_step_bytes=int(fleet.lmcache_l1_size_gb * gib / 2))
        for info in SERVICES:
            log_path = logs / f"{info.display}.log"
            cmd = _service_command(info, host, ports[info.name], data_dir, ports,
                                   [*per_service.get(info.name, []), *extra_args])
            with open(log_path, "ab") as log_file:
                # Own process group: a terminal's Ctrl-C reaches only `up`, which then stops them in order.
                # SIGTERM when `up` dies (even by kill -9): the service then stops what it started itself.
                proc = subprocess.Popen(dies_with_parent(cmd, signal.SIGTERM), stdout=log_file,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            probe_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
            children.append(Child(info, f"{probe_host}:{ports[info.name]}", proc, log_path))
        try:
            asyncio.run(_wait_serving(children, startup_timeout_s))
            if lmcache is not None:
                cache_manager = next(c for c in children if c.info.name == "cache_manager")
                asyncio.run(_register_lmcache(cache_manager.address, lmcache.url, fleet.pool))
        except (RuntimeError, TimeoutError, grpc.RpcError) as exc:
            print(f"greenserve up: error: {exc}", file=sys.stderr)
            stop_all(children)
            return 1
        gateway_url = None
        if fleet.gateway == "envoy":
            router = next(c for c in children if c.info.name == "router")
            try:
                token = service_token([*per_service.get("router", []), *extra_args])
                car, gateway_url = sidecars.start_envoy(router.address, logs=logs, data_dir=data_dir,
                                                        port=fleet.gateway_port, avoid=promised,
                                                        timeout_s=startup_timeout_s, token=token)
            except (RuntimeError, TimeoutError, ValueError, OSError) as exc:
                print(f"greenserve up: error: --gateway envoy: {exc}", file=sys.stderr)
                stop_all(children)
                return 1
            cars.append(car)
        from greenserve_client.cli import print_table

        rows = [{"service": c.info.display, "address": c.address, "pid": str(c.process.pid), "status": "SERVING",
                 "log": str(c.log_path)} for c in children]
        rows += [{"service": car.name, "address": car.url, "pid": str(car.process.pid), "status": "HEALTHY",
                  "log": str(car.log_path)} for car in cars]
        print_table(rows, ["service", "address", "pid", "status", "log"])
        if engines and fleet.router_http_port > 0:
            http_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
            print(f"OpenAI-compatible API through the router: http://{http_host}:{fleet.router_http_port}/v1",
                  flush=True)
        if gateway_url is not None:
            print(f"OpenAI-compatible API through Envoy (the router picks the engine): {gateway_url}/v1", flush=True)
        if fleet.loop and engines:
            try:
                plan = asyncio.run(start_local_loop({c.info.name: c.address for c in children},
                                                    loop_options or LocalLoopOptions(pool=fleet.pool)))
                print(f"control loop: {first_plan_summary(plan)} (greenserve plan status shows its enforcement)",
                      flush=True)
            except grpc.RpcError as exc:  # the services keep running; the scheduler retries on its own
                detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                print(f"greenserve up: warning: first plan not computed ({detail}); the optimizer retries on "
                      f"its schedule", file=sys.stderr, flush=True)
        print("all services SERVING; press Ctrl-C to stop", flush=True)
        outcome: dict[str, int] = {}
        if after_start is not None:
            http_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
            addresses = {c.info.name: c.address for c in children}

            def work() -> None:
                try:
                    outcome["code"] = after_start(addresses, f"http://{http_host}:{fleet.router_http_port}")
                except Exception as exc:  # noqa: BLE001 - reported, then everything stops
                    print(f"greenserve: error: {exc!r}", file=sys.stderr, flush=True)
                    outcome["code"] = 1

            threading.Thread(target=work, name="after-start", daemon=True).start()
        while not stop_requested and "code" not in outcome:
            if controller is not None:
                controller.poll()
            dead = [c for c in children if c.process.poll() is not None]
            dead_cars = [car for car in cars if car.process.poll() is not None]
            if dead or dead_cars:
                for c in dead:
                    print(f"greenserve up: {c.info.display} exited with code {c.process.returncode}; stopping all\n"
                          f"{_tail(c.log_path)}", file=sys.stderr)
                for car in dead_cars:
                    print(f"greenserve up: {car.name} exited with code {car.process.returncode}; stopping all\n"
                          f"{_tail(car.log_path)}", file=sys.stderr)
                stop_all(children)
                return 1
            time.sleep(0.2)
        print("stopping ...", flush=True)
        codes = stop_all(children)
        bad = {name: code for name, code in codes.items() if code != 0}
        if bad:
            print(f"greenserve up: unclean exit: {bad}", file=sys.stderr)
            return 1
        print("all services stopped", flush=True)
        return outcome.get("code", 0)
    finally:
        if any(c.process.poll() is None for c in children):
            stop_all(children)
        sidecars.stop(cars, STOP_GRACE_S)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
