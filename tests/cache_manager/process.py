"""Start `python -m greenserve.cache_manager` as its own process (for kill and memory tests)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.process import start_service_process


def start_cache_manager(data_dir: Path, port: int, **flags: object) -> subprocess.Popen:
    """`python -m greenserve.cache_manager` on `port`, SERVING; its log goes to `<data_dir>/service.log`."""
    args = [arg for name, value in flags.items() for arg in (f"--{name.replace('_', '-')}", str(value))]
    return start_service_process("greenserve.cache_manager", "greenserve.v1.CacheManagerService", data_dir, port,
                                 env={"GREENSERVE_FOLLOW_PLANS": "false"}, extra_args=args, log_name="service.log")
