"""Entry point of greenserve-router (also: python -m greenserve.router).

The router is on the request path, so it runs on uvloop when it is installed (the event loop's own
overhead is a large part of a Python proxy's per-request cost), and its garbage collector is tuned for
latency: everything imported at start (grpc, SQLAlchemy, OpenTelemetry, pydantic: most of the heap) is
moved out of the collector's sight with ``gc.freeze()``, and the young-generation threshold is raised
so that collections are rarer. Measured before this: full collections of 40-150 ms stalled the event
loop under load (bench router, 256 streams), i.e. every request in flight.
"""

import asyncio
import gc

from greenserve.router.front.service import RouterSettings, build
from greenserve.router.workers import run_router

GC_THRESHOLDS = (20_000, 20, 50)
"""Young-generation threshold 20 000 allocations (CPython's default is 700): a request allocates a few
hundred container objects, so the default collected every few requests."""


def main(argv: list[str] | None = None) -> int:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # optional at runtime
        pass
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return run_router(RouterSettings, build, argv)  # one process, a worker, or the supervisor of --workers N


if __name__ == "__main__":
    raise SystemExit(main())
