"""Simulated MIG backend: the NVML rules and errors of the real backend, state kept in the service database.

It follows `geometry` (profiles, placements, overlap, counts, compute, +me, driver rules) and NVML's behaviour
around them: the placement rules of NVIDIA's MIG User Guide
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/, "Supported MIG Profiles"), the return codes of the NVML
API reference (https://docs.nvidia.com/deploy/nvml-api/, "Multi Instance GPU Management" functions) and the MIG
mode and reset rules of the user guide's "Getting Started with MIG" (enable MIG mode):

* creating a GI needs MIG mode on (NOT_SUPPORTED otherwise); an illegal start or size is
  INVALID_ARGUMENT; an overlap or a limit is INSUFFICIENT_RESOURCES;
* destroying a GI with a process on it is IN_USE;
* changing MIG mode with processes on the GPU is IN_USE, disabling it with GIs present is IN_USE;
  on an A100 the change stays *pending* until a GPU reset (`reset_gpu`), on H100/H200 it is immediate;
* a GPU reset drops every GI and CI (they never persist across a reset);
* a GPU without MIG (a model of the simulator's GPU table that MIG tables do not know: ``T4``, ``V100``, ``L40``)
  is listed with ``mig_capable`` false and runs engines as a whole GPU (DPD's decoder on the older GPU); every MIG
  call on it is NOT_SUPPORTED, as NVML answers.

Power limits and locked SM clocks follow NVML too (``nvmlDeviceSetPowerManagementLimit`` within the board's
limits, INVALID_ARGUMENT outside; ``nvmlDeviceSetGpuLockedClocks`` with supported clocks; NO_PERMISSION on a GPU the
simulator marks as not ours to change, as without root): the board's range is ``MIN_POWER_LIMIT_W`` up to its TDP
(the default limit), the SM clock ladder runs from the family's highest clock (``simulator.clocks``) down to
``MIN_SM_CLOCK_MHZ`` in ``SM_CLOCK_STEP_MHZ`` steps, as ``nvidia-smi -q -d SUPPORTED_CLOCKS`` lists an A100's
(1410 ... 210 MHz, 15 MHz apart; the same ladder is assumed for the other families).

Every mutation is one database transaction, so the simulated GPUs survive a restart of the service
exactly as they were (as real GPUs survive a restart of the partitioner process). Power follows a
simple model (idle + share of max power by busy compute slices; a locked SM clock scales the active part as
``simulator.clocks`` models a memory-bound decode step, a power limit caps the draw) and feeds a monotonic energy
counter.
"""

from __future__ import annotations

import json
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from greenserve.common.persistence import Database
from greenserve.common import mig_geometry as geometry_mod
from greenserve.gpu_partitioner.backend import (
    GpuState,
    hardware_name,
    simulator_gpus,
    InstanceState,
    InsufficientResourcesError,
    InUseError,
    InvalidPlacementError,
    NoPermissionError,
    NotFoundError,
    NotSupportedError,
    PowerLimits,
    PowerReading,
    ResetRequiredError,
)
from greenserve.common.mig_geometry import (
    CURRENT_DRIVER,
    REASON_INVALID,
    REASON_NOT_SUPPORTED,
    GpuGeometry,
    Placement,
)
from greenserve.gpu_partitioner.models import SimulatedGpu
from greenserve.simulator.clocks import CLOCK_POWER_EXPONENT, MEMORY_BOUND_FIXED_SHARE, max_sm_clock_mhz
from sqlalchemy import select

MIB = 1024 * 1024
# ``nvidia-smi -q`` "Min Power Limit" of the SXM / PCIe boards the simulator models (the max and default limit is
# the board's TDP): A100 100 W, H100/H200 SXM 200 W, V100 SXM2 150 W, L40 100 W, T4 60 W
MIN_POWER_LIMIT_W = {"A100": 100.0, "H100": 200.0, "H200": 200.0, "V100": 150.0, "L40": 100.0, "T4": 60.0}
MIN_SM_CLOCK_MHZ = 210
SM_CLOCK_STEP_MHZ = 15


def parse_gpu_spec(spec: str) -> list[tuple[str, bool]]:
    """"A100-40GB,H100-80GB:nomig,T4" -> [(model, mig_enabled), ...]; ValueError on an unknown model. A model
    without MIG (the simulator's GPU table: "T4", "V100", "L40") is a whole GPU (mig_enabled False)."""
    out = []
    mig_models = geometry_mod.models()
    whole_models = sorted(set(simulator_gpus()) - set(mig_models))
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        model, _, flag = item.partition(":")
        if model not in mig_models and model not in whole_models:
            raise ValueError(f"unknown simulated GPU model {model!r}; known: {', '.join([*mig_models, *whole_models])}")
        if flag not in ("", "mig", "nomig"):
            raise ValueError(f"simulated GPU {item!r}: the suffix must be ':mig' or ':nomig'")
        if model not in mig_models and flag == "mig":
            raise ValueError(f"simulated GPU {item!r}: {model} has no MIG")
        out.append((model, flag != "nomig" and model in mig_models))
    return out


def _has_mig(model: str) -> bool:
    return model in geometry_mod.models()


class SimulatedBackend:
    """MigBackend over simulated GPUs stored in the `simulated_gpus` table."""

    kind = "simulated"

    def __init__(
        self, db: Database, gpus: Sequence[tuple[str, bool]] = (("A100-40GB", True),), *,
        clock: Callable[[], float] = time.time, driver_branch: int = CURRENT_DRIVER,
    ) -> None:
        self.db = db
        self.clock = clock
        self._driver = driver_branch
        self._lock = threading.RLock()
        with self.db.session() as s:
            existing = s.scalars(select(SimulatedGpu)).all()
            if not existing:
                for index, (model, mig) in enumerate(gpus):
                    state: dict[str, Any] = {"index": index, "pending": None, "instances": [], "gpu_processes": 0,
                             "energy_j": 0.0, "energy_at": self.clock()}
                    s.add(SimulatedGpu(gpu_uuid=f"GPU-{uuidlib.uuid4()}", model=model, mig_enabled=mig,
                                       state_json=json.dumps(state)))

    # ---------------------------------------------------------------------------------------------
    # Storage
    # ---------------------------------------------------------------------------------------------

    @contextmanager
    def _gpu_row(self, gpu_uuid: str, *, write: bool) -> Iterator[tuple[SimulatedGpu, dict[str, Any]]]:
        with self._lock, self.db.session() as s:
            row = s.get(SimulatedGpu, gpu_uuid)
            if row is None:
                raise NotFoundError(f"no simulated GPU {gpu_uuid}")
            state = json.loads(row.state_json)
            yield row, state
            if write:
                row.state_json = json.dumps(state)

    def _advance_energy(self, row: SimulatedGpu, state: dict[str, Any]) -> None:
        now = self.clock()
        dt = max(0.0, now - float(state["energy_at"]))
        state["energy_j"] = float(state["energy_j"]) + self._power_w(row, state) * dt
        state["energy_at"] = now

    def _power_w(self, row: SimulatedGpu, state: dict[str, Any]) -> float:
        if not _has_mig(row.model):
            figures = simulator_gpus()[row.model]
            idle, peak = float(figures["idle_w"]), float(figures["tdp_w"])
            fraction = 1.0 if state["gpu_processes"] > 0 else 0.0
        else:
            geo = geometry_mod.geometry(row.model)
            idle, peak = geo.sim_idle_power_w, geo.max_power_w
            if row.mig_enabled:
                busy = sum(geo.profile(i["profile"]).compute_slices for i in state["instances"] if i["processes"] > 0)
                fraction = busy / geo.compute_slices
            else:
                fraction = 1.0 if state["gpu_processes"] > 0 else 0.0
        active = (peak - idle) * fraction
        locked = state.get("locked_clocks")
        top = max_sm_clock_mhz(row.model)
        if locked and top:  # the active draw of a memory-bound decode step at that clock (simulator.clocks)
            f = min(1.0, locked[1] / top)
            active *= MEMORY_BOUND_FIXED_SHARE + (1.0 - MEMORY_BOUND_FIXED_SHARE) * f ** CLOCK_POWER_EXPONENT
        limit = state.get("power_limit_w")
        return min(idle + active, limit) if limit is not None else idle + active

    # ---------------------------------------------------------------------------------------------
    # Power limit and SM clocks (what power.py applies)
    # ---------------------------------------------------------------------------------------------

    @staticmethod
    def _limit_range(row: SimulatedGpu) -> tuple[float, float]:
        tdp = float(simulator_gpus()[row.model]["tdp_w"]) if not _has_mig(row.model) \
            else geometry_mod.geometry(row.model).max_power_w
        family = row.model.split("-")[0]
        return MIN_POWER_LIMIT_W.get(family, tdp / 4.0), tdp

    @staticmethod
    def _clock_ladder(row: SimulatedGpu) -> list[int]:
        top = max_sm_clock_mhz(row.model)
        if not top:
            raise NotSupportedError(f"GPU {row.gpu_uuid} ({row.model}): no supported clocks known")
        return list(range(top, MIN_SM_CLOCK_MHZ - 1, -SM_CLOCK_STEP_MHZ))

    @staticmethod
    def _need_permission(row: SimulatedGpu, state: dict[str, Any], what: str) -> None:
        if state.get("no_permission"):
            raise NoPermissionError(f"{what} on {row.gpu_uuid}: NVML_ERROR_NO_PERMISSION (needs root)")

    def power_limits(self, gpu_uuid: str) -> PowerLimits:
        with self._gpu_row(gpu_uuid, write=False) as (row, state):
            low, high = self._limit_range(row)
            current = state.get("power_limit_w")
            return PowerLimits(min_w=low, max_w=high, default_w=high, current_w=high if current is None else current)

    def set_power_limit(self, gpu_uuid: str, watts: float) -> None:
        with self._gpu_row(gpu_uuid, write=True) as (row, state):
            self._need_permission(row, state, "nvmlDeviceSetPowerManagementLimit")
            low, high = self._limit_range(row)
            milliwatts = int(round(watts * 1000.0))
            if not low * 1000.0 <= milliwatts <= high * 1000.0:
                raise InvalidPlacementError(f"power limit {watts:g} W outside [{low:g}, {high:g}] W "
                                            "(NVML_ERROR_INVALID_ARGUMENT)")
            self._advance_energy(row, state)
            state["power_limit_w"] = None if milliwatts == int(high * 1000.0) else milliwatts / 1000.0

    def supported_sm_clocks(self, gpu_uuid: str) -> list[int]:
        with self._gpu_row(gpu_uuid, write=False) as (row, _):
            return self._clock_ladder(row)

    def set_locked_clocks(self, gpu_uuid: str, min_mhz: int, max_mhz: int) -> None:
        with self._gpu_row(gpu_uuid, write=True) as (row, state):
            self._need_permission(row, state, "nvmlDeviceSetGpuLockedClocks")
            ladder = self._clock_ladder(row)
            if min_mhz not in ladder or max_mhz not in ladder or min_mhz > max_mhz:
                raise InvalidPlacementError(f"locked clocks {min_mhz}-{max_mhz} MHz are not supported clocks "
                                            "(NVML_ERROR_INVALID_ARGUMENT)")
            self._advance_energy(row, state)
            state["locked_clocks"] = [int(min_mhz), int(max_mhz)]

    def reset_locked_clocks(self, gpu_uuid: str) -> None:
        with self._gpu_row(gpu_uuid, write=True) as (row, state):
            self._need_permission(row, state, "nvmlDeviceResetGpuLockedClocks")
            self._advance_energy(row, state)
            state["locked_clocks"] = None

    @staticmethod
    def _to_state(row: SimulatedGpu, state: dict[str, Any]) -> GpuState:
        if not _has_mig(row.model):
            return GpuState(uuid=row.gpu_uuid, index=state["index"], name=f"{row.model} (simulated)", model=None,
                            memory_bytes=int(float(simulator_gpus()[row.model]["memory_bytes"])), mig_capable=False,
                            mig_enabled=False, hardware=row.model)
        geo = geometry_mod.geometry(row.model)
        instances = [
            InstanceState(profile=i["profile"], start=i["start"], size=i["size"], gpu_instance_id=i["gi"],
                          compute_instance_id=i["ci"], uuid=i["uuid"],
                          memory_bytes=geo.profile(i["profile"]).memory_mib * MIB)
            for i in sorted(state["instances"], key=lambda i: i["start"])
        ]
        return GpuState(uuid=row.gpu_uuid, index=state["index"], name=f"{geo.display_name} (simulated)",
                        model=row.model, memory_bytes=geo.memory_mib * MIB, mig_capable=True,
                        mig_enabled=row.mig_enabled, mig_pending=state["pending"] is not None,
                        instances=instances, hardware=hardware_name("", row.model))

    # ---------------------------------------------------------------------------------------------
    # MigBackend
    # ---------------------------------------------------------------------------------------------

    def driver_version(self) -> str:
        return ""

    def driver_branch(self) -> int:
        return self._driver

    def list_gpus(self) -> list[GpuState]:
        with self._lock, self.db.session(readonly=True) as s:
            rows = s.scalars(select(SimulatedGpu)).all()
            states = [self._to_state(r, json.loads(r.state_json)) for r in rows]
        return sorted(states, key=lambda g: g.index)

    def gpu(self, gpu_uuid: str) -> GpuState:
        with self._gpu_row(gpu_uuid, write=False) as (row, state):
            return self._to_state(row, state)

    def geometry(self, gpu_uuid: str) -> GpuGeometry:
        with self._gpu_row(gpu_uuid, write=False) as (row, _):
            self._need_mig(row)
            return geometry_mod.geometry(row.model)

    @staticmethod
    def _need_mig(row: SimulatedGpu) -> None:
        if not _has_mig(row.model):
            raise NotSupportedError(f"GPU {row.gpu_uuid} ({row.model}) has no MIG")

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> None:
        with self._gpu_row(gpu_uuid, write=True) as (row, state):
            self._need_mig(row)
            geo = geometry_mod.geometry(row.model)
            effective = row.mig_enabled if state["pending"] is None else bool(state["pending"])
            if effective == enabled:
                if state["pending"] is not None:
                    raise ResetRequiredError(
                        f"MIG mode change to {'enabled' if enabled else 'disabled'} is pending a GPU reset")
                return
            if state["gpu_processes"] > 0 or any(i["processes"] > 0 for i in state["instances"]):
                raise InUseError("processes run on the GPU; idle it before changing MIG mode")
            if not enabled and state["instances"]:
                raise InUseError("GPU instances exist; destroy them before disabling MIG mode")
            self._advance_energy(row, state)
            pending = geo.mode_change_needs_reset
            if pending:
                state["pending"] = enabled  # stored: the transaction commits, the error comes after
            else:
                row.mig_enabled = enabled
        if pending:
            raise ResetRequiredError(
                f"MIG mode change to {'enabled' if enabled else 'disabled'} is pending a GPU reset "
                f"({row.model} needs a reset; run `nvidia-smi -r` when the GPU is idle)")

    def create_instance(self, gpu_uuid: str, placement: Placement) -> InstanceState:
        with self._gpu_row(gpu_uuid, write=True) as (row, state):
            self._need_mig(row)
            if not row.mig_enabled:
                raise NotSupportedError("MIG mode is not enabled on this GPU")
            geo = geometry_mod.geometry(row.model)
            layout = [Placement(start=i["start"], size=i["size"], profile=i["profile"]) for i in state["instances"]]
            problem = geo.check_add_reason(layout, placement, driver=self._driver)
            if problem is not None:
                reason, message = problem
                if reason == REASON_INVALID:
                    raise InvalidPlacementError(message)
                if reason == REASON_NOT_SUPPORTED:
                    raise NotSupportedError(message)
                raise InsufficientResourcesError(message)
            self._advance_energy(row, state)
            used = {i["gi"] for i in state["instances"]}
            gi = next(n for n in range(1, 64) if n not in used)
            mig_uuid = f"MIG-{uuidlib.uuid4()}"
            record = {"profile": placement.profile, "start": placement.start, "size": placement.size,
                      "gi": gi, "ci": 0, "uuid": mig_uuid, "processes": 0}
            state["instances"].append(record)
            return InstanceState(profile=placement.profile, start=placement.start, size=placement.size,
                                 gpu_instance_id=gi, compute_instance_id=0, uuid=mig_uuid,
                                 memory_bytes=geo.profile(placement.profile).memory_mib * MIB)

    def destroy_instance(self, gpu_uuid: str, placement: Placement) -> None:
        with self._gpu_row(gpu_uuid, write=True) as (row, state):
            self._need_mig(row)
            if not row.mig_enabled:
                raise NotSupportedError("MIG mode is not enabled on this GPU")
            match = [i for i in state["instances"]
                     if (i["start"], i["size"], i["profile"]) == (placement.start, placement.size, placement.profile)]
            if not match:
                raise NotFoundError(f"no GPU instance {placement} on {gpu_uuid}")
            if match[0]["processes"] > 0:
                raise InUseError(f"processes run on {match[0]['uuid']} ({placement})")
            self._advance_energy(row, state)
            state["instances"].remove(match[0])

    def read_power(self, gpu_uuid: str) -> PowerReading:
        with self._gpu_row(gpu_uuid, write=True) as (row, state):
            self._advance_energy(row, state)
            return PowerReading(power_w=self._power_w(row, state), energy_j=float(state["energy_j"]))

    def instance_activity(self, gpu_uuid: str) -> dict[str, float] | None:
        with self._gpu_row(gpu_uuid, write=False) as (_, state):
            return {i["uuid"]: (1.0 if i["processes"] > 0 else 0.0) for i in state["instances"]}

    def close(self) -> None:
        return None

    # ---------------------------------------------------------------------------------------------
    # What only a simulator can do (what an operator or a workload does to a real GPU)
    # ---------------------------------------------------------------------------------------------

    def start_process(self, gpu_uuid: str, mig_uuid: str | None = None) -> None:
        """A process (an engine) opens the MIG device `mig_uuid`, or the whole GPU when None."""
        with self._gpu_row(gpu_uuid, write=True) as (row, state):
            self._advance_energy(row, state)
            if mig_uuid is None:
                state["gpu_processes"] += 1
                return
            for inst in state["instances"]:
                if inst["uuid"] == mig_uuid:
                    inst["processes"] += 1
                    return
            raise NotFoundError(f"no MIG device {mig_uuid}")

    def stop_process(self, gpu_uuid: str, mig_uuid: str | None = None) -> None:
        """The process started by `start_process` exits."""
        with self._gpu_row(gpu_uuid, write=True) as (row, state):
            self._advance_energy(row, state)
            if mig_uuid is None:
                state["gpu_processes"] = max(0, state["gpu_processes"] - 1)
                return
            for inst in state["instances"]:
                if inst["uuid"] == mig_uuid:
                    inst["processes"] = max(0, inst["processes"] - 1)
                    return
            raise NotFoundError(f"no MIG device {mig_uuid}")

    def set_permission(self, gpu_uuid: str, allowed: bool) -> None:
        """Whether this process may change the GPU's power limit and clocks (False: NVML_ERROR_NO_PERMISSION, as for
        a process without root)."""
        with self._gpu_row(gpu_uuid, write=True) as (_, state):
            state["no_permission"] = not allowed

    def power_settings(self, gpu_uuid: str) -> tuple[float | None, tuple[int, int] | None]:
        """(power limit in force or None for the default, locked clocks or None): what the device holds."""
        with self._gpu_row(gpu_uuid, write=False) as (_, state):
            locked = state.get("locked_clocks")
            return state.get("power_limit_w"), (int(locked[0]), int(locked[1])) if locked else None

    def reset_gpu(self, gpu_uuid: str) -> None:
        """`nvidia-smi -r`: applies a pending MIG mode change and drops every GI/CI; IN_USE when busy."""
        with self._gpu_row(gpu_uuid, write=True) as (row, state):
            if state["gpu_processes"] > 0 or any(i["processes"] > 0 for i in state["instances"]):
                raise InUseError("GPU reset refused: processes run on the GPU")
            self._advance_energy(row, state)
            if state["pending"] is not None:
                row.mig_enabled = bool(state["pending"])
                state["pending"] = None
            state["instances"] = []
