"""What `greenserve evaluate` prints on a terminal while it runs: each phase named (forecasting, planning and
replaying hour N of the day, checking the method, writing the report), counted in steps that go up one at a time
with no rate (a step is a forecast, an hour or a check, not a unit per second), and no HiGHS banner from the solvers
of the worker processes (a banner goes to stdout, which is the same terminal).

The command runs on a pseudo-terminal: tqdm draws nothing when stderr is not a terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # about 20 s on 2 cores at load average 5


def _on_a_terminal(argv: list[str], timeout_s: float = 300.0) -> tuple[int, str]:
    """Exit status and everything ``argv`` wrote on a 200-column terminal (stdout and stderr both)."""
    main_fd, side_fd = pty.openpty()
    fcntl.ioctl(side_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))  # a pty starts 0 columns wide
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=side_fd, stderr=side_fd, close_fds=True)
    os.close(side_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # EIO: every writer of the terminal has closed it
                break
            if not chunk:
                break
            chunks.append(chunk)
        else:
            pytest.fail(f"evaluate still running after {timeout_s} s")
        return child.wait(timeout=30), b"".join(chunks).decode(errors="replace")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(main_fd)


def test_evaluate_says_each_phase_in_steps_and_no_solver_banner(tmp_path: Path) -> None:
    out = tmp_path / "report"
    code, text = _on_a_terminal([
        sys.executable, "-m", "greenserve_client.cli", "evaluate", "--grids", "ES", "--hours", "2",
        "--strategies", "greencache", "--forecast", "seasonal_naive", "--headlines", "none", "--window-s", "60",
        "--workers", "2", "--out", str(out)])
    assert code == 0, text
    assert "HiGHS" not in text and "Copyright" not in text, text
    frames = [f.strip() for f in re.split(r"[\r\n]+", text) if f.strip()]
    bars = [m for m in (re.match(r"(\d+)/(\d+) steps \[[\d:]+\] (.*)", f) for f in frames) if m]
    # the ES CI and the load forecast, 2 hours of one day, the simulator's fidelity check
    total = 2 + 2 + 1
    shown = [(int(m[1]), m[3].rstrip()) for m in bars if int(m[2]) == total]
    assert shown, text
    doing = [d for _, d in shown]
    assert any(d.startswith("forecasting the day's CI of ES and its load (seasonal_naive)") for d in doing), doing
    for hour in (1, 2):
        assert any(f"planning and replaying hour {hour} of 2: ES/greencache" in d for d in doing), doing
    assert any("checking the method: simulator fidelity" in d for d in doing), doing
    assert any(d.startswith("writing the report") for d in doing), doing
    counts = [n for n, _ in shown]
    assert counts == sorted(counts) and counts[-1] == total, counts
    assert set(range(2, total + 1)) <= set(counts), f"the count skipped a step: {counts}"
    # the phases come in order: forecasting, then the day and the check, then the report
    first = {key: next(i for i, d in enumerate(doing) if d.startswith(key))
             for key in ("forecasting", "planning", "writing the report")}
    assert first["forecasting"] < first["planning"] < first["writing the report"], doing
    assert not re.search(r"\b(day|it|step)s?/s\b", text), "a rate in a unit that is not counted"
    assert (out / "index.html").is_file()
