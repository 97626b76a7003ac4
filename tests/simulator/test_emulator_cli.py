"""``greenserve-engine-sim`` as a process: the listening line, serving, SIGTERM, crash exit, bad flags."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest
from greenserve.simulator.emulator.__main__ import main

PREFIX = "greenserve-engine-sim listening on "


def _start(*flags: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "greenserve.simulator.emulator", "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith(PREFIX), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, line[len(PREFIX) :]


def test_cli_serves_and_exits_on_sigterm() -> None:
    proc, url = _start("--time-scale", "100", "--model", "cli-model", "--profile", "llama3-8b@H100-80GB")
    try:
        assert url.startswith("http://127.0.0.1:")
        models = httpx.get(url + "/v1/models", timeout=5).json()
        assert models["data"][0]["id"] == "cli-model"
        r = httpx.post(url + "/v1/completions", json={"model": "cli-model", "prompt": "hi", "max_tokens": 3}, timeout=5)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert "vllm:generation_tokens_total" in httpx.get(url + "/metrics", timeout=5).text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def test_cli_crash_after_exits_nonzero() -> None:
    proc, url = _start("--crash-after-s", "0.3")
    assert proc.wait(timeout=10) == 1
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=2)


def test_cli_admin_crash_exits(tmp_path: object) -> None:
    proc, url = _start("--time-scale", "50")
    try:
        r = httpx.post(url + "/admin/faults", json={"crash": True}, timeout=5)
        assert r.status_code == 200
        assert proc.wait(timeout=10) == 1
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--profile", "no-such-gpu"], "choices: "),
        (["--time-scale", "0"], "--time-scale"),
        (["--time-scale", "abc"], "--time-scale"),
        (["--port", "70000"], "--port"),
        (["--error-rate", "1.5"], "--error-rate"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
    ],
)
def test_cli_bad_flags_exit_2(flags: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(flags)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    if flags[0] == "--profile":
        assert "llama3-8b@A100-80GB" in err


def test_cli_list_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list-profiles"]) == 0
    assert "llama3-8b@A100-80GB" in capsys.readouterr().out.split()
