"""A real engine starts as two interpreters, not three: the CPU build's worker runs inside EngineCore
(``--distributed-executor-backend=uni`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), because importing torch and vLLM
in one more spawned process was the largest part of its start; the cores it is given are its processes' affinity."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from greenserve.vllm_cpu import engines as vllm

from .conftest import start_vllm


def _cmdlines(pgid: int) -> list[str]:
    out = []
    for pid in vllm.group_members(pgid):
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    return out


def test_cpu_set_reads_lists_and_ranges() -> None:
    assert vllm.cpu_set("0") == {0}
    assert vllm.cpu_set("0,2") == {0, 2}
    assert vllm.cpu_set("1-3,5") == {1, 2, 3, 5}


def test_the_worker_runs_inside_enginecore_and_the_engine_keeps_its_cores(tiny_model: Path, tmp_path: Path) -> None:
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    core = min(os.sched_getaffinity(0))
    engine = start_vllm(tiny_model, tmp_path, name="one-worker", cpu_bind=str(core))
    try:
        names = _cmdlines(engine.pid)
        assert any("EngineCore" in n for n in names), names
        assert not any("Worker" in n for n in names), f"a separate worker process: {names}"
        for pid in vllm.group_members(engine.pid):
            assert os.sched_getaffinity(pid) == {core}, (pid, names)
        reply = httpx.post(engine.url + "/v1/completions", timeout=60, json={
            "model": vllm.SERVED_MODEL_NAME, "prompt": "hello", "max_tokens": 8, "min_tokens": 8, "ignore_eos": True})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 8
    finally:
        engine.stop()
    assert not vllm.group_alive(engine.pid)
