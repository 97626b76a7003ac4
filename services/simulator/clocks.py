"""Locked SM clocks: an engine profile as it runs with its GPU's SM clock locked below the maximum.

What a lower SM clock changes, per engine step of the roofline (``perf_model.py``):

* **time**: compute-bound work (prefill, large decode batches) runs at ``peak_flops x f``; memory-bound decode
  streams HBM at the same rate, since locking the SM clock (``nvmlDeviceSetGpuLockedClocks``) leaves the memory
  clock alone. Decode, most of a request's time, is therefore "largely insensitive to GPU frequency" (Maliakel et
  al., *Characterizing LLM Inference Energy-Performance Tradeoffs across Workloads and GPU Scaling*, arXiv
  2501.08219: 1-6 % more latency for 42 % less energy on average over their frequency range).
* **power**: the SM's dynamic power scales as ``f x V(f)^2``; over the upper DVFS range the voltage falls about
  linearly with the clock, which we take as ``f ** CLOCK_POWER_EXPONENT`` for the compute-bound share of the power
  span. In a memory-bound step only part of the span is SM power; the HBM share (``MEMORY_BOUND_FIXED_SHARE``)
  does not follow the SM clock.

The two constants are assumptions chosen to match published measurements until the profiler measures a GPU's own
clock ladder: at ``f = 0.7`` (about 1 GHz on an A100, whose SM clock tops at 1410 MHz) a memory-bound decode step
draws about 27 % less active power for the same duration. Ma et al., *The Illusion of Power Capping in LLM Decode*
(arXiv 2605.11999, H200) recover "up to 32 % of decode energy at minimal throughput loss" by locking SM clocks, and
report that a board power cap does not even trigger in decode (decode draws 137-300 W of 700 W): which is why this
lever locks clocks rather than setting a power limit. Energy per token is U-shaped in the clock (a lower clock
stretches compute-bound steps while idle power keeps flowing), so the planner weighs each clock with the simulator
instead of assuming that lower is better.

Only clocks down to ``MIN_CLOCK_FRACTION`` are modelled: below it the published curves leave the range where the
linear voltage model holds.
"""

from __future__ import annotations

import dataclasses

from greenserve.simulator.engine_profile import EngineProfile

CLOCK_POWER_EXPONENT = 2.5  # dynamic SM power ~ f x V^2 with V roughly linear in f over the upper DVFS range
MEMORY_BOUND_FIXED_SHARE = 0.4  # share of a memory-bound step's active power that HBM draws whatever the SM clock
MIN_CLOCK_FRACTION = 0.7
CLOCK_FRACTIONS: tuple[float, ...] = (1.0, 0.85, 0.7)  # the ladder the planner chooses from
# Highest SM clock per GPU family (NVIDIA's data sheets: boost clock); the planner turns a fraction into MHz for NVML.
MAX_SM_CLOCK_MHZ: dict[str, int] = {"A100": 1410, "H100": 1980, "H200": 1980, "L40": 2490, "V100": 1530, "T4": 1590}


def _check(fraction: float) -> None:
    if not MIN_CLOCK_FRACTION - 1e-9 <= fraction <= 1.0:
        raise ValueError(f"sm_clock_fraction: must be in [{MIN_CLOCK_FRACTION}, 1], got {fraction!r}")


def clocked_profile(profile: EngineProfile, sm_clock_fraction: float) -> EngineProfile:
    """``profile`` with its SM clock locked at ``sm_clock_fraction`` of the maximum (1.0: ``profile`` itself).

    The compute rate scales with the clock; the power span at full compute scales as ``f ** CLOCK_POWER_EXPONENT``;
    the memory-bound share keeps ``MEMORY_BOUND_FIXED_SHARE`` of its power and scales the rest like the SMs. Both are
    expressed through the profile's own fields (``peak_flops``, ``max_w``, ``memory_power_weight``), so every model
    that takes a profile (replays, capacity predictions, the emulator) runs the clocked engine unchanged."""
    _check(sm_clock_fraction)
    if sm_clock_fraction >= 1.0:
        return profile
    f = sm_clock_fraction
    scale = f ** CLOCK_POWER_EXPONENT
    span = profile.max_w - profile.idle_w
    memory_scale = MEMORY_BOUND_FIXED_SHARE + (1.0 - MEMORY_BOUND_FIXED_SHARE) * scale
    return dataclasses.replace(
        profile,
        name=f"{profile.name}@sm{f:.2f}",
        peak_flops=profile.peak_flops * f,
        max_w=profile.idle_w + span * scale,
        # active power of a memory-bound step: span x mem_w x memory_scale = (span x scale) x mem_w'
        memory_power_weight=min(1.0, profile.memory_power_weight * memory_scale / scale),
    )


def max_sm_clock_mhz(hardware: str) -> int:
    """The GPU family's highest SM clock (MHz) for a hardware name such as ``A100-80GB`` (0 when unknown)."""
    family = hardware.split("x")[-1].split("-")[0] if "x" in hardware.split("-")[0] else hardware.split("-")[0]
    return MAX_SM_CLOCK_MHZ.get(family, 0)
