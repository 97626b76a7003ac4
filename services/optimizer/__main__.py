"""Entry point of greenserve-optimizer (also: python -m greenserve.optimizer)."""

from greenserve.common.app import run_service
from greenserve.optimizer.service import OptimizerSettings, build


def main(argv: list[str] | None = None) -> int:
    return run_service(OptimizerSettings, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
