"""vLLM's sleep mode as the emulator plays it (``--enable-sleep-mode``): what sleeping and waking do and cost.

vLLM (``vllm serve --enable-sleep-mode``; the HTTP routes ``POST /sleep?level=N&mode=M``, ``POST /wake_up``,
``GET /is_sleeping``; ``EngineCore.sleep`` / ``pause_scheduler`` in ``vllm/v1/engine/core.py``):

* **level 1** offloads the weights to host memory and discards the KV cache (the prefix cache with it);
  **level 2** discards both (waking then needs the weights loaded again). Either way the GPU keeps only its bare
  idle draw: no weights or KV blocks are touched, no step runs.
* **mode** says what happens to the requests the engine holds when it is told to sleep (the scheduler is paused
  first): ``abort`` (vLLM's default) ends every running and waiting request as aborted; ``wait`` lets them finish
  first and only then sleeps; ``keep`` freezes them (with the KV cache gone they are recomputed from their prompt
  and the tokens already sent, like a preemption, once the engine is awake).
* a generation request that arrives while the engine sleeps is **accepted and held**, not refused: the paused
  scheduler takes it only after ``/wake_up`` (it shows in ``vllm:num_requests_waiting``). A router must therefore
  not send an asleep engine anything: the request would wait for as long as the engine sleeps.
* ``/wake_up`` answers once the weights are back; calls are served one after another (the engine core runs its
  utility calls in order), so ``/is_sleeping`` asked during a wake-up answers when it is over. Sleeping an asleep
  engine, or waking an awake one, changes nothing.
* ``vllm:engine_sleep_state{sleep_state="awake"|"weights_offloaded"|"discard_all"}`` (gauges, 0 or 1) tells the
  state in ``/metrics``; ``/health`` keeps answering 200 while the engine sleeps.

Modelled costs (engine seconds, divided by ``time_scale`` in wall time):

* moving the weights over the host link (offload at level 1, load on wake-up) takes
  ``weight_bytes / host link bandwidth + TRANSFER_FIXED_S``, the profile's own figures (``dram_bandwidth_bytes_per_s``
  is its PCIe host link, ~25 GB/s achieved on Gen4 x16); a level 2 sleep discards and takes ``TRANSFER_FIXED_S``;
* while the weights move the engine draws its peak power, as the planner charges a wake-up (optimizer/solvers/
  coupled.py, ``wake_energy``: full power for the wake time), so the emulator's energy counter and the plan agree;
* asleep it draws its profile's idle power, which the simulator's GPU table gives as the bare GPU's idle draw.

``TRANSFER_FIXED_S`` (allocator re-mapping, CUDA graphs kept) is an assumption until measured; ``sleep_s`` /
``wake_up_s`` of the emulator's settings override the modelled times.
"""

from __future__ import annotations

from typing import Any

SLEEP_LEVELS = (1, 2)
SLEEP_MODES = ("abort", "wait", "keep")
TRANSFER_FIXED_S = 0.5  # assumption: fixed part of a sleep or wake-up beyond moving the weights
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")  # vllm:engine_sleep_state's labels, by level 0, 1, 2


def weights_transfer_s(profile: Any) -> float:
    """Modelled engine seconds to move the profile's weights over its host link, plus the fixed part."""
    return float(profile.weight_bytes) / float(profile.dram_bandwidth_bytes_per_s) + TRANSFER_FIXED_S


def sleep_s(profile: Any, level: int) -> float:
    """Modelled time of ``POST /sleep?level=...``: level 1 offloads the weights, level 2 only discards."""
    return weights_transfer_s(profile) if level == 1 else TRANSFER_FIXED_S


def wake_up_s(profile: Any) -> float:
    """Modelled time of ``POST /wake_up``: the weights back over the host link (reloaded after level 2)."""
    return weights_transfer_s(profile)
