"""Entry point of greenserve-router (also: python -m greenserve.router).

The router is on the request path, so it runs on uvloop when it is installed (the event loop's own
overhead is a large part of a Python proxy's per-request cost).
"""

import asyncio

from greenserve.common.app import run_service
from greenserve.router.service import RouterSettings, build


def main(argv: list[str] | None = None) -> int:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # optional at runtime
        pass
    return run_service(RouterSettings, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
