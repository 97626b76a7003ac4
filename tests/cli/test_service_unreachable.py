"""With the services down, a client command names the service and address it could not reach and how to start it,
in one line, and exits non-zero (issue 35: `plan status` printed grpc's 'UNAVAILABLE: failed to connect to all
addresses')."""

from __future__ import annotations

import pytest
from greenserve_client.cli import main

from tests.conftest import free_port


@pytest.mark.parametrize(("argv", "service", "flag"), [
    (["plan", "status"], "optimizer", "--optimizer-addr"),
    (["fleet", "show"], "optimizer", "--optimizer-addr"),
    (["forecast", "list"], "forecaster", "--addr"),
    (["mig", "show"], "gpu-partitioner", "--gpu-partitioner-addr"),
    (["profile", "list"], "profiler", "--profiler-addr"),
])
def test_a_service_that_is_down_is_named_with_its_address(argv: list[str], service: str, flag: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    assert main([*argv, flag, address]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"greenserve {argv[0]}")
    assert f"error: cannot reach the {service} at {address} (connection refused)" in line
    assert "`greenserve up` starts the six services" in line and "UNAVAILABLE" not in line


def test_status_says_what_starts_the_services(capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{free_port()}"
    flags = [f"--{name}-addr" for name in ("forecaster", "profiler", "optimizer", "cache-manager",
                                            "gpu-partitioner", "router")]
    assert main(["status", *(arg for flag in flags for arg in (flag, address))]) == 1
    out, err = capsys.readouterr()
    assert out.count("UNREACHABLE  connection refused") == 6
    assert "`greenserve up` starts the six services" in err
