"""`parent_death.dies_with_parent`: a child that dies with the process that started it, without running Python
between fork and exec. The old ``preexec_fn`` did, and beside a busy grpc.aio server the child crashed with
SIGSEGV before exec (26 of 300 starts; the gpu-partitioner's engines failed their start-up that way, and the
demo's fleet then did not match its plan)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc

from greenserve.common.parent_death import dies_with_parent

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def test_a_missing_program_raises_in_the_caller_like_subprocess() -> None:
    with pytest.raises(FileNotFoundError, match="no-such-program-here"):
        dies_with_parent(["no-such-program-here", "--x"])
    with pytest.raises(FileNotFoundError):
        dies_with_parent(["true"], env={"PATH": "/nonexistent-dir"})


@linux_only
def test_the_command_runs_with_its_own_argv0_and_exit_code() -> None:
    run = subprocess.run(dies_with_parent(["sh", "-c", 'head -c 2 /proc/$$/cmdline; echo " $0 $1"; exit 3', "a", "b"]),
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 3 and run.stdout == "sh a b\n", run


@linux_only
def test_the_child_gets_the_signal_when_its_parent_is_killed() -> None:
    middle = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from greenserve.common.parent_death import dies_with_parent\n"
        "p = subprocess.Popen(dies_with_parent(['sleep', '120']), start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert middle.stdout is not None
        child = int(middle.stdout.readline())
        time.sleep(0.5)  # the wrapper has exec'd sleep by now (or it is about to: the signal is set before exec)
        os.kill(child, 0)
        middle.kill()
        middle.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            with open(f"/proc/{child}/stat") as stat:  # reaped by init, or a zombie: either way it is gone
                if stat.read().split(")")[-1].split()[0] == "Z":
                    break
            time.sleep(0.05)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail("the child outlived its parent killed with SIGKILL")
    finally:
        middle.kill()


@linux_only
def test_children_start_cleanly_beside_a_busy_grpc_aio_server() -> None:
    async def main() -> list[int]:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health_async.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = health_pb2_grpc.HealthStub(channel)
        stop = asyncio.Event()

        async def hammer() -> None:
            while not stop.is_set():
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)

        callers = [asyncio.create_task(hammer()) for _ in range(8)]
        codes = []
        try:
            for _ in range(60):
                proc = await asyncio.create_subprocess_exec(*dies_with_parent(["true"]), start_new_session=True)
                codes.append(await proc.wait())
        finally:
            stop.set()
            await asyncio.gather(*callers)
            await channel.close()
            await server.stop(None)
        return codes

    codes = asyncio.run(main())
    assert codes == [0] * 60, f"{sum(c != 0 for c in codes)} of 60 starts failed: {sorted(set(codes))}"
