"""Power and energy per GPU, and the documented split of a GPU's energy among its MIG instances.

NVML reports power (``nvmlDeviceGetPowerUsage``, mW) and an energy counter (``...TotalEnergyConsumption``,
mJ since driver load) for the whole GPU only; there is no per-MIG power (Zeus refuses MIG devices because
"NVML ... currently does not support measuring the power or energy consumption of MIG slices"; Kepler's design
notes "NVML returns N/A for MIG power"). The partitioner therefore attributes each interval's energy with this rule
(idle share by reserved compute slices, the rest by activity, as Kepler splits GPU power):

    E_gpu  = counter(t1) - counter(t0)                     (a negative delta means a driver reload: E_gpu = counter(t1))
    E_idle = min(E_gpu, P_idle * dt)                        P_idle = minimum power seen on this GPU (Kepler's method)
    E_i    = E_idle * c_i / C  +  (E_gpu - E_idle) * w_i
    w_i    = c_i * a_i / sum_j(c_j * a_j)                   activity a_i in [0, 1] when the backend measures it,
           = c_i / sum_j(c_j)                               else by compute slices only (A100 NVML has no per-GI activity)
    E_unallocated = E_idle * (C - sum_i c_i) / C            idle share of compute slices no instance holds

with c_i the compute slices of instance i and C = 7. The same rule splits the current power. The interval
is the time between two samples; the service samples on every GetEnergy call, on a timer, and just before
every layout change, so each interval has one layout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.gpu_partitioner.backend import GpuState, PowerReading
from greenserve.common.mig_geometry import GpuGeometry
from greenserve.gpu_partitioner.models import EnergyAccount

SPLIT_RULE = "idle by compute slices (unallocated slices separate) + dynamic by compute slices x activity"


@dataclass(frozen=True)
class Share:
    """What the split needs to know about one instance."""

    mig_uuid: str
    compute_slices: int
    activity: float | None = None


@dataclass
class Split:
    """Energy (or power) of one interval, by instance and unallocated."""

    by_instance: dict[str, float] = field(default_factory=dict)
    unallocated: float = 0.0


def split(total: float, idle_part: float, shares: Sequence[Share], compute_slices: int = 7) -> Split:
    """Split `total` (J or W) of which `idle_part` is idle, with the module's rule. The parts add up to `total`."""
    if total < 0 or not math.isfinite(total):
        raise ValueError(f"total must be finite and >= 0, got {total}")
    idle = min(max(idle_part, 0.0), total)
    dynamic = total - idle
    out = Split()
    if not shares:
        out.unallocated = total
        return out
    allocated = sum(s.compute_slices for s in shares)
    for s in shares:
        out.by_instance[s.mig_uuid] = idle * s.compute_slices / compute_slices
    out.unallocated = idle * max(0, compute_slices - allocated) / compute_slices
    weights = {s.mig_uuid: s.compute_slices * s.activity for s in shares if s.activity is not None}
    if len(weights) != len(shares) or sum(weights.values()) <= 0:
        weights = {s.mig_uuid: float(s.compute_slices) for s in shares}
    norm = sum(weights.values())
    for uuid, w in weights.items():
        out.by_instance[uuid] += dynamic * w / norm
    return out


@dataclass
class InstanceEnergyView:
    """Per-instance numbers returned by GetEnergy."""

    mig_uuid: str
    power_w: float
    energy_j: float


@dataclass
class GpuEnergyView:
    """Per-GPU numbers returned by GetEnergy."""

    gpu_uuid: str
    power_w: float
    energy_j: float  # counter since driver load
    idle_power_w: float
    instances: list[InstanceEnergyView]
    unallocated_power_w: float
    unallocated_energy_j: float
    sampled_at: datetime


class EnergyAccountant:
    """Samples GPUs and accumulates attributed energy in the `energy_accounts` table."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def sample(
        self, gpu: GpuState, geo: GpuGeometry | None, reading: PowerReading,
        activity: Mapping[str, float] | None = None,
    ) -> GpuEnergyView:
        """Attribute the energy since the previous sample of `gpu` to its current instances."""
        now = utcnow()
        power_w = reading.power_w if reading.power_w is not None else 0.0
        compute_total = geo.compute_slices if geo is not None else 7
        shares = []
        if gpu.mig_enabled and geo is not None:
            for inst in gpu.instances:
                if not inst.uuid or not geo.has_profile(inst.profile):
                    continue
                act = None if activity is None else activity.get(inst.uuid)
                shares.append(Share(inst.uuid, geo.profile(inst.profile).compute_slices, act))
        with self.db.session() as s:
            gkey = f"gpu:{gpu.uuid}"
            grow = s.get(EnergyAccount, gkey)
            if grow is None:
                grow = EnergyAccount(key=gkey, gpu_uuid=gpu.uuid, energy_j=0.0, power_w=power_w, last_counter_j=None,
                                     idle_power_w=None, updated_at=now)
                s.add(grow)
                dt_s = 0.0
            else:
                dt_s = max(0.0, (now - grow.updated_at).total_seconds())
            if reading.energy_j is not None:
                if grow.last_counter_j is None:
                    delta_j = 0.0  # first reading: baseline only
                elif reading.energy_j >= grow.last_counter_j:
                    delta_j = reading.energy_j - grow.last_counter_j
                else:  # counter restarted (driver reload)
                    delta_j = reading.energy_j
                grow.last_counter_j = reading.energy_j
            else:  # no counter: integrate power (trapezoid between samples)
                delta_j = 0.5 * (grow.power_w + power_w) * dt_s
            if reading.power_w is not None:
                grow.idle_power_w = power_w if grow.idle_power_w is None else min(grow.idle_power_w, power_w)
            idle_w = grow.idle_power_w or 0.0
            grow.power_w = power_w
            grow.energy_j += delta_j
            grow.updated_at = now
            e_split = split(delta_j, idle_w * dt_s, shares, compute_total)
            p_split = split(power_w, idle_w, shares, compute_total)
            views = []
            for share in shares:
                key = f"mig:{share.mig_uuid}"
                row = s.get(EnergyAccount, key)
                if row is None:
                    row = EnergyAccount(key=key, gpu_uuid=gpu.uuid, energy_j=0.0, power_w=0.0, last_counter_j=None,
                                        idle_power_w=None, updated_at=now)
                    s.add(row)
                row.energy_j += e_split.by_instance[share.mig_uuid]
                row.power_w = p_split.by_instance[share.mig_uuid]
                row.updated_at = now
                views.append(InstanceEnergyView(share.mig_uuid, row.power_w, row.energy_j))
            ukey = f"unallocated:{gpu.uuid}"
            urow = s.get(EnergyAccount, ukey)
            if urow is None:
                urow = EnergyAccount(key=ukey, gpu_uuid=gpu.uuid, energy_j=0.0, power_w=0.0, last_counter_j=None,
                                     idle_power_w=None, updated_at=now)
                s.add(urow)
            urow.energy_j += e_split.unallocated
            urow.power_w = p_split.unallocated
            urow.updated_at = now
            return GpuEnergyView(
                gpu_uuid=gpu.uuid, power_w=power_w,
                energy_j=reading.energy_j if reading.energy_j is not None else grow.energy_j,
                idle_power_w=idle_w, instances=views, unallocated_power_w=urow.power_w,
                unallocated_energy_j=urow.energy_j, sampled_at=now,
            )
