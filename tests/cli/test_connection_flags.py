"""The `greenserve` commands' connection flags are checked before any call: a --tls-ca / --tls-cert / --tls-key
that cannot be read and a token that cannot travel in a gRPC header (control or non-ASCII characters, from
--auth-token or GREENSERVE_AUTH_TOKEN) exit 2 naming the flag. Before (found by an adversarial audit of the CLI),
the first ended in a FileNotFoundError traceback from the channel's certificate read (status, fleet, plan, mig,
profile), the second in grpc's ExecuteBatchError traceback on the first call (every command, forecast too)."""

from __future__ import annotations

import pytest
from greenserve_client.cli import main

CLOSED = "127.0.0.1:1"
COMMANDS = [["status", "--router-addr", CLOSED], ["fleet", "show", "--optimizer-addr", CLOSED],
            ["plan", "list", "--optimizer-addr", CLOSED], ["mig", "show", "--gpu-partitioner-addr", CLOSED],
            ["profile", "list", "--profiler-addr", CLOSED], ["forecast", "list", "--addr", CLOSED]]
FLAGS = [(["--tls-ca", "/nonexistent/ca.pem"], "--tls-ca"), (["--auth-token", "tok\x01"], "--auth-token"),
         (["--auth-token", "t\u00e9"], "--auth-token")]
CASES = [(cmd, flags, name) for cmd in COMMANDS for flags, name in FLAGS]


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize("cmd,flags,name", CASES, ids=[f"{c[0]} {f[0]}={f[1]!r}" for c, f, _ in CASES])
def test_a_connection_flag_that_cannot_work_exits_2(cmd: list[str], flags: list[str], name: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code = _exit_code([*cmd, *flags, "--timeout-s", "1"])
    err = capsys.readouterr().err
    assert code == 2, err[-1500:]
    assert name in err and "Traceback" not in err, err[-1500:]


def test_a_token_from_the_environment_is_checked_too(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GREENSERVE_AUTH_TOKEN", "a\nb")
    code = _exit_code(["status", "--router-addr", CLOSED, "--timeout-s", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "GREENSERVE_AUTH_TOKEN" in err, err[-1500:]
