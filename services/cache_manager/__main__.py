"""Entry point of greenserve-cache-manager (also: python -m greenserve.cache_manager)."""

from greenserve.common.app import run_service
from greenserve.cache_manager.service import build
from greenserve.cache_manager.settings import CacheManagerSettings


def main(argv: list[str] | None = None) -> int:
    return run_service(CacheManagerSettings, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
