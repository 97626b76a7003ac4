"""Process entry point shared by the six services: settings -> logging/telemetry -> database -> server.

A service's `__main__` defines its settings class and a `build` function that turns the settings and its
migrated database into the servicers to register; `run_service` does the rest and blocks until SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from greenserve.common.clock import set_clock
from greenserve.common.config import ServiceSettings, load_settings
from greenserve.common.file_errors import os_error_text
from greenserve.common.persistence import Database
from greenserve.common.server import Registration, ServiceServer
from greenserve.common.telemetry import Telemetry, setup_logging, setup_telemetry

log = logging.getLogger("greenserve.app")


@dataclass
class ServiceContext:
    """What a service's build function gets: its settings, database and telemetry."""

    settings: ServiceSettings
    db: Database
    telemetry: Telemetry
    on_stop: list[Callable[[], Awaitable[None] | None]] = field(default_factory=list)
    # called as a stop begins (gRPC health already NOT_SERVING), before --shutdown-delay-s
    on_draining: list[Callable[[], None]] = field(default_factory=list)


BuildFn = Callable[[ServiceContext], Awaitable[list[Registration]] | list[Registration]]


async def start_service(
    settings: ServiceSettings, build: BuildFn, *, telemetry: Telemetry | None = None, reuse_port: bool = False
) -> ServiceServer:
    """Open the database (migrating it), build the servicers and start serving; returns the server.
    ``reuse_port``: bind with SO_REUSEPORT (only for worker processes that share a port on purpose)."""
    name = settings.service_name
    set_clock(settings.make_clock())
    telemetry = telemetry or setup_telemetry(name)
    db = await asyncio.to_thread(Database.open, settings.database_url, name)
    ctx = ServiceContext(settings=settings, db=db, telemetry=telemetry)
    try:
        built = build(ctx)
        registrations = built if isinstance(built, list) else await built
        server = ServiceServer(name, settings, list(registrations), telemetry, on_stop=[*ctx.on_stop, db.close],
                               on_draining=ctx.on_draining, reuse_port=reuse_port)
        await server.start()
    except BaseException:
        db.close()
        raise
    return server


def run_service(settings_cls: type[ServiceSettings], build: BuildFn, argv: list[str] | None = None, *,
                reuse_port: bool = False, on_serving: Callable[[ServiceServer], None] | None = None) -> int:
    """Console-script body: parse flags/env, serve until SIGTERM/SIGINT, exit 0 after a clean stop.
    ``reuse_port`` and ``on_serving`` (called once serving) are for worker processes (greenserve.router.workers)."""
    prog = "greenserve-" + settings_cls.service_name.replace("_", "-")
    settings = load_settings(settings_cls, argv, prog=prog)
    setup_logging(settings.log_level, settings.log_json)

    async def main() -> None:
        telemetry = setup_telemetry(settings.service_name)
        try:
            server = await start_service(settings, build, telemetry=telemetry, reuse_port=reuse_port)
            if on_serving is not None:
                on_serving(server)
            loop = asyncio.get_running_loop()
            stop = asyncio.Event()
            import signal

            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            await server.stop()
        finally:
            telemetry.shutdown()

    try:
        asyncio.run(main())
    except (OSError, ValueError) as exc:  # bind failure, bad TLS files, unreadable token file
        print(f"{prog}: error: {os_error_text(exc) if isinstance(exc, OSError) else exc}", file=sys.stderr)
        return 1
    return 0
