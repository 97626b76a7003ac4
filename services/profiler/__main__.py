"""Entry point of greenserve-profiler (also: python -m greenserve.profiler)."""

from greenserve.common.app import run_service
from greenserve.profiler.service import ProfilerSettings, build


def main(argv: list[str] | None = None) -> int:
    return run_service(ProfilerSettings, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
