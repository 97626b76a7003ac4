"""Entry point of greenserve-router (also: python -m greenserve.router)."""

from greenserve.common.app import run_service
from greenserve.router.service import RouterSettings, build


def main(argv: list[str] | None = None) -> int:
    return run_service(RouterSettings, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
