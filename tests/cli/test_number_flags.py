"""The `greenserve` commands' number flags must be finite and in range: nan and inf passed every '<= 0' / '< 0'
check (found by an adversarial audit of the CLI). --timeout-s nan, inf or 1e300 made every call end at once in
DEADLINE_EXCEEDED, so `greenserve status` reported a serving service UNREACHABLE and fleet/plan/mig/profile/
forecast failed against a running one; --wait-s of `plan status`, --drain-timeout-s of `mig apply`, and `up`'s
--startup-timeout-s ('not SERVING after nans'), --engine-time-scale and --lmcache-l1-size-gb (an engine or
LMCache exiting during start-up) were taken too. Each now exits 2 naming the flag before any call."""

from __future__ import annotations

import sys

import pytest
from greenserve_client import demo, supervisor
from greenserve_client.cli import main

CLOSED = "127.0.0.1:1"  # nothing listens: a flag that got through fails with exit 1, not 2

CASES = [
    *[(["status", "--router-addr", CLOSED, "--timeout-s", v], "--timeout-s") for v in ("nan", "inf", "1e300")],
    *[([*cmd, "--timeout-s", v], "--timeout-s")
      for cmd in (["fleet", "show"], ["plan", "list"], ["mig", "show"], ["profile", "list"], ["forecast", "list"])
      for v in ("nan", "inf", "1e300", "-1")],
    *[(["plan", "status", "--wait-s", v], "--wait-s") for v in ("nan", "inf")],
    *[(["mig", "apply", "--gpu-uuid", "GPU-1", "--layout", "7x1g.10gb", "--drain-timeout-s", v], "--drain-timeout-s")
      for v in ("nan", "inf")],
    (["up", "--startup-timeout-s", "nan"], "--startup-timeout-s"),
    (["up", "--startup-timeout-s", "inf"], "--startup-timeout-s"),
    (["up", "--engine-time-scale", "nan"], "--engine-time-scale"),
    (["up", "--engine-time-scale", "inf"], "--engine-time-scale"),
    (["up", "--lmcache-l1-size-gb", "inf"], "--lmcache-l1-size-gb"),
    (["demo", "--engine-time-scale", "nan"], "--engine-time-scale"),
]


@pytest.mark.parametrize("argv,flag", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_number_flag_that_is_not_finite_exits_2(argv: list[str], flag: str, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("FORECASTER", "PROFILER", "OPTIMIZER", "CACHE_MANAGER", "GPU_PARTITIONER", "ROUTER"):
        monkeypatch.setenv(f"GREENSERVE_{name}_ADDR", CLOSED)

    def started(*args: object, **kwargs: object) -> int:  # a flag that got through must not start a fleet here
        print("started", file=sys.stderr)
        return 1

    monkeypatch.setattr(supervisor, "up", started)
    monkeypatch.setattr(demo, "run", started)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2, capsys.readouterr().err
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err, err
