"""A gpu-partitioner node for the fault tests of issue 36, fault 4 (a plan the fleet cannot carry): the service in
its own process, following plans from an optimizer test double that keeps the plans and the enforcement reports in
the optimizer's own PlanStore and answers GetPlanStatus with the optimizer's own ``plan_status`` (so
``greenserve plan status`` shows what the partitioner reported).

Run as a module, it is the gpu-partitioner over the fake libnvidia-ml (tests/gpu_partitioner/fake_pynvml.py) with
GPUs that can fall off the bus: ``python -m tests.faults.partitioner_node GONE_FILE MODELS -- SERVICE_ARGS`` where
GONE_FILE lists the UUIDs of the GPUs that are gone (one per line; absent: none) and MODELS is ``A100-40GB,...``
(every one with MIG on). A gone GPU is not counted or listed, its UUID is NOT_FOUND and its handle answers
GPU_IS_LOST, as NVML answers for a GPU that fell off the bus; written out of GONE_FILE it is back, with the MIG
instances it had.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pynvml

from greenserve.common.persistence import Database
from greenserve.optimizer.plan_store import PlanStore
from greenserve.optimizer.service import plan_status
from greenserve.v1 import common_pb2, optimizer_pb2
from tests.gpu_partitioner.fake_pynvml import FakeNvml
from tests.gpu_partitioner.test_follow import InTestOptimizer, _serve
from tests.process import stop_process

REPO = Path(__file__).resolve().parents[2]


class DetachableNvml(FakeNvml):
    """FakeNvml whose devices listed in a file are gone (see the module docstring)."""

    def __init__(self, models: list[tuple[str, bool]], gone_file: Path) -> None:
        super().__init__(models)
        self.gone_file = gone_file

    def _gone(self) -> set[str]:
        try:
            return set(self.gone_file.read_text().split())
        except FileNotFoundError:
            return set()

    def _present(self) -> list[Any]:
        gone = self._gone()
        return [d for d in self.devices if d.uuid not in gone]

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self._present())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check_init()
        present = self._present()
        if not 0 <= index < len(present):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._handle(present[index].struct, pynvml.c_nvmlDevice_t)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        if uuid in self._gone():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return super().nvmlDeviceGetHandleByUUID(uuid)

    def _device(self, handle: Any) -> Any:
        device = super()._device(handle)
        if device.uuid in self._gone():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return device


class StatusOptimizer(InTestOptimizer):
    """InTestOptimizer whose plans are stored in a PlanStore (``publish``), enforcement reports recorded there too,
    and GetPlanStatus answered by the optimizer's ``plan_status``; ``pools`` is the fleet's pools."""

    def __init__(self, db_path: Path, pools: list[common_pb2.Pool]) -> None:
        super().__init__()
        self.db = Database.open(f"sqlite:///{db_path}", "optimizer")
        self.store = PlanStore(self.db)
        self.pools = pools
        self.arrivals: list[tuple[float, optimizer_pb2.EnforcementReport]] = []  # (monotonic s, report)

    async def publish(self, interval: common_pb2.PlanInterval) -> int:
        """Stores and activates a plan of this one interval (from 0 to far ahead); streams it; its version."""
        interval.start.FromSeconds(0)
        interval.end.FromSeconds(4_000_000_000)
        plan = common_pb2.Plan(intervals=[interval])
        plan.created_at.FromSeconds(0)
        plan.valid_from.FromSeconds(0)
        plan.valid_until.FromSeconds(4_000_000_000)
        stored = await asyncio.to_thread(self.store.store, plan, True)
        await self.plans.put(stored)
        return stored.version

    def reports_of(self, version: int, state: int) -> list[tuple[float, optimizer_pb2.EnforcementReport]]:
        return [(t, r) for t, r in self.arrivals if r.plan_version == version and r.state == state]

    async def GetFleet(self, request: Any, context: Any) -> optimizer_pb2.GetFleetResponse:
        return optimizer_pb2.GetFleetResponse(fleet=common_pb2.FleetInventory(pools=self.pools))

    async def ReportGpus(self, request: Any, context: Any) -> optimizer_pb2.ReportGpusResponse:
        self.gpu_reports.append(request)
        return optimizer_pb2.ReportGpusResponse(fleet=common_pb2.FleetInventory(gpus=request.gpus, pools=self.pools))

    async def ReportEnforcement(self, request: Any, context: Any) -> optimizer_pb2.ReportEnforcementResponse:
        await asyncio.to_thread(self.store.record_report, request.report)
        self.arrivals.append((time.monotonic(), request.report))
        return await super().ReportEnforcement(request, context)

    async def GetPlanStatus(self, request: Any, context: Any) -> optimizer_pb2.GetPlanStatusResponse:
        return await asyncio.to_thread(plan_status, self.store, request.version)


async def serve_status_optimizer(db_path: Path, pools: list[common_pb2.Pool]) -> tuple[StatusOptimizer,
                                                                                        grpc.aio.Server, int]:
    optimizer = StatusOptimizer(db_path, pools)
    server, port = await _serve(optimizer)
    return optimizer, server, port


def plan_status_cli(optimizer_port: int) -> subprocess.CompletedProcess[str]:
    """``greenserve plan status --json`` against the double (what an operator runs)."""
    return subprocess.run([sys.executable, "-c", "import sys; from greenserve_client.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "plan", "status", "--json",
                           f"--optimizer-addr=127.0.0.1:{optimizer_port}"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def start_partitioner(args: list[str], *, env: dict[str, str] | None = None,
                      gone_file: Path | None = None, models: str = "") -> subprocess.Popen[bytes]:
    """The gpu-partitioner process (over DetachableNvml when ``gone_file`` is given), its own session."""
    head = ([sys.executable, "-m", "tests.faults.partitioner_node", str(gone_file), models, "--"]
            if gone_file is not None else [sys.executable, "-m", "greenserve.gpu_partitioner"])
    return subprocess.Popen([*head, *args], env={**os.environ, **(env or {})}, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


async def stop_partitioner(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the service stops its engines), SIGKILL to its session after 30 s."""
    await stop_process(proc, group=True)


def _main(argv: list[str]) -> int:
    from greenserve.gpu_partitioner import service
    from greenserve.gpu_partitioner.__main__ import main
    from greenserve.gpu_partitioner.backend_nvml import NvmlBackend

    gone_file, models, sep, *rest = argv
    assert sep == "--", "usage: GONE_FILE MODELS -- SERVICE_ARGS"
    fake = DetachableNvml([(m, True) for m in models.split(",")], Path(gone_file))
    service.NvmlBackend = lambda: NvmlBackend(fake)  # type: ignore[assignment,misc]
    return main(rest)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
