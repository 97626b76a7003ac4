"""Entry point of greenserve-forecaster (also: python -m greenserve.forecaster)."""

from greenserve.common.app import run_service
from greenserve.forecaster.service import build
from greenserve.forecaster.settings import ForecasterSettings


def main(argv: list[str] | None = None) -> int:
    return run_service(ForecasterSettings, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
