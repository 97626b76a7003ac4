"""A forecaster in its own process (`python -m greenserve.forecaster`), for the kill and memory tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.process import rss_bytes, start_service_process

__all__ = ["rss_bytes", "start_forecaster"]


def start_forecaster(data_dir: Path, port: int, **env: str) -> subprocess.Popen:
    """The forecaster on `port` with `data_dir`, SERVING; `env`: extra GREENSERVE_* settings. Its log (stderr)
    goes to `<data_dir>/forecaster.log`."""
    return start_service_process("greenserve.forecaster", "greenserve.v1.ForecasterService", data_dir, port,
                                 env={"GREENSERVE_LOG_LEVEL": "WARNING", "GREENSERVE_FIT_WORKERS": "1", **env},
                                 log_name="forecaster.log", ready_within_s=90)
