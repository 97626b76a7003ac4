"""Entry point of greenserve-gpu-partitioner (also: python -m greenserve.gpu_partitioner)."""

from greenserve.common.app import run_service
from greenserve.gpu_partitioner.service import GpuPartitionerSettings, build


def main(argv: list[str] | None = None) -> int:
    return run_service(GpuPartitionerSettings, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
