"""`greenserve bench profiler` refuses bad flags with a message naming them and exit 2, not a traceback, and the
emulated engine of its part 2 does not outlive it.

Found by an adversarial audit of the profiler's CLIs (each test failed before its fix)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from greenserve.bench.profiler import main
from tests.up_process import children_of, pids_alive, wait_until_gone

SMALL = ["--cache-sizes", "1", "--rates", "1"]


@pytest.mark.parametrize(("flags", "named"), [
    (["--point-duration-s", "nan"], "--point-duration-s"),
    (["--point-duration-s", "-5"], "--point-duration-s"),
    (["--agreement", "--agreement-rates", "abc"], "--agreement-rates"),
    (["--agreement", "--agreement-rates", "4,2"], "--agreement-rates"),
    (["--agreement", "--agreement-time-scale", "0"], "--agreement-time-scale"),
    (["--agreement", "--agreement-duration-s", "inf"], "--agreement-duration-s"),
    (["--model", "nosuch"], "spec.configs[0].model"),
    (["--workload", "nosuch"], "spec.workload"),
])
def test_a_bad_flag_exits_2_naming_it(flags: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: the sweep's INVALID_ARGUMENT (an AioRpcError) or a ValueError went out as a traceback, exit 1.
    with pytest.raises(SystemExit) as done:
        main([*SMALL, *flags])
    assert done.value.code == 2
    assert named in capsys.readouterr().err


@pytest.mark.slow
def test_the_emulated_engine_of_part_2_dies_with_a_killed_bench() -> None:
    # Part 2 starts greenserve-engine-sim in a session of its own; after kill -9 of the bench nothing stopped it.
    bench = subprocess.Popen([sys.executable, "-m", "greenserve.bench.profiler", *SMALL, "--agreement",
                              "--agreement-rates", "1", "--agreement-duration-s", "600", "--agreement-workloads",
                              "sharegpt"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "OTEL_SDK_DISABLED": "true"})
    engines: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not (engines := pids_alive(children_of(bench.pid))):
            assert bench.poll() is None and time.monotonic() < deadline, "the bench started no engine"
            time.sleep(0.1)
        time.sleep(1.0)  # the engine's own start-up is past (it runs the emulator module)
        bench.kill()
        bench.wait(timeout=10)
        assert not wait_until_gone(engines, 15), "the emulated engine outlived kill -9 of the bench"
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for pid in pids_alive(engines):
            os.killpg(pid, signal.SIGKILL)
