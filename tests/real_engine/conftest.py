"""Fixtures of the real-engine tier: one real vLLM (CPU build, tiny random-weight Llama) and one emulator
(greenserve-engine-sim), each its own process, started once per module; tests parametrized over ``engine`` run
against both.

A real engine needs .venv-vllm (scripts/install-vllm.sh, run by scripts/bootstrap.sh); without it every vLLM case
skips, saying why. The tiny model is made once per test session. Each real engine's start-to-healthy time is
recorded and printed at the end of the run (``real vLLM start to healthy``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from greenserve.vllm_cpu import engines as vllm

EMULATOR_MODEL = "tiny-llama"  # the emulator serves the same name, so a request body fits both engines
STARTS: list[tuple[str, float]] = []  # (what, seconds from start to healthy) of every real engine started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Engine:
    kind: str  # "emulator" | "vllm"
    url: str
    model: str
    process: subprocess.Popen[bytes]
    log_path: Path
    healthy_after_s: float = 0.0
    pids: list[int] = field(default_factory=list)

    def metrics_text(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text


def skip_reason() -> str | None:
    why = vllm.unavailable_reason()
    return f"real vLLM unavailable: {why}" if why else None


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    why = skip_reason()
    if why:
        pytest.skip(why)
    return vllm.ensure_model(tmp_path_factory.mktemp("models") / "tiny-llama")


def start_vllm(model: Path, where: Path, name: str = "vllm", **kwargs: object) -> vllm.VllmEngine:
    """One real engine, waited for; its start-to-healthy time is recorded."""
    engine = vllm.start(model, port=free_port(), log_path=where / f"{name}.log", scratch=where / "scratch",
                        **kwargs)  # type: ignore[arg-type]
    try:
        STARTS.append((name, engine.wait_healthy()))
    except BaseException:
        engine.stop()
        raise
    return engine


def start_emulator(where: Path, **flags: str) -> Engine:
    port = free_port()
    log_path = where / "emulator.log"
    cmd = [sys.executable, "-m", "greenserve.simulator.emulator", "--host=127.0.0.1", f"--port={port}",
           f"--model={EMULATOR_MODEL}", *(f"--{k.replace('_', '-')}={v}" for k, v in flags.items())]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while True:
        assert proc.poll() is None, log_path.read_text()[-2000:]
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() - t0 < 30, "emulator not healthy in 30 s"
        time.sleep(0.05)
    return Engine("emulator", url, EMULATOR_MODEL, proc, log_path, time.monotonic() - t0)


@pytest.fixture(scope="module", params=["emulator", "vllm"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The emulator, then one real vLLM engine: each started once per module, stopped after it."""
    where = tmp_path_factory.mktemp(f"engine-{request.param}")
    if request.param == "emulator":
        emu = start_emulator(where)
        yield emu
        emu.process.terminate()
        emu.process.wait(10)
        return
    model = request.getfixturevalue("tiny_model")
    real = start_vllm(model, where)
    try:
        yield Engine("vllm", real.url, vllm.SERVED_MODEL_NAME, real.process, real.log_path,
                     real.healthy_after_s or 0.0)
    finally:
        real.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if STARTS:
        figures = ", ".join(f"{name} {s:.1f} s" for name, s in STARTS)
        terminalreporter.write_line(f"real vLLM start to healthy: {figures} (cores: {os.cpu_count()})")
