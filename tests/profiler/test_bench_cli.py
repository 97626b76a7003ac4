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

from greenserve.profiler.bench import main
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
