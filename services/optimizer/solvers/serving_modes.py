"""Serving modes per pool and hour (GreenLLM, Sec. II-V): the "serving_modes" knob.

A pool whose GPUs mix a newer model (the one with the most FP16 FLOP/s in the simulator's GPU table: "new") with
older ones ("old"), or that declares a draft model (``Pool.draft``), may serve in four modes (GreenLLM Sec. V-A):

* **Standalone**: the target model on each new GPU (GreenLLM's baseline: the old GPUs are not used, nor charged);
* **SpecDecode**: target and draft on the same new GPU (``k`` proposals per round, acceptance ``r`` = accepted /
  proposed: ``1 + k r`` tokens per round);
* **DPD**: prefill on the new GPU, decode on an old one; the prompt's KV cache crosses the fleet's link;
* **DSD**: target on the new GPU, draft on an old one; token ids and probabilities cross the link, the
  probabilities while the target verifies (Fig. 2).

Per pool and hour the solver picks the mode with the lowest carbon per output token (Eq. 1-3) among those that
meet the pool's SLO (TTFT and TPOT, both, at the pool's attainment target) and whose link traffic fits the link
the fleet declares (``FleetInventory.link_bandwidth_bytes_per_s``; GreenLLM: 16 Gbps). Each mode is evaluated in
the simulator (``greenserve.simulator.replay``): Poisson arrivals of the pool's mean request shape at the hour's
load per new GPU through one unit of the mode (one new GPU, with its old partner for DPD/DSD), then

    operational per token = the unit's energy over the replay, idle included (a new GPU waiting for its old
                            partner is charged, GreenLLM's accounting scope) x CI x PUE / output tokens
    embodied per token    = sum over the unit's GPUs g of  sum_requests t_req / (BS_g x LT_g) x C_e,g  / tokens
                            (Eq. 1: each GPU involved, its own embodied carbon and its own mean batch)

Disaggregated modes need one old GPU per new GPU and a declared link; speculative modes need ``Pool.draft``. A
pool is planned only in modes its engines can run: the rule of the launcher matching each engine kind the pool lists
(``greenserve.common.engine_modes.engines_mode_problem``, the one the gpu-partitioner refuses a plan with: vLLM
has no DSD, its SpecDecode needs the draft's model, its DPD cannot run beside the pool's LMCache server; the
emulator's speculative modes need the draft's simulator model). A pool with engines of several kinds gets only the
modes every kind can run; an engine of unspecified kind adds no rule (a pool that lists no engine, or only such
ones, is planned in all four modes). The pool's LMCache server is the one the cache-manager lists for it
(``PlanningInputs.cache_sizes``); without the cache-manager it is unknown and not counted (the partitioner still
refuses DPD beside one). A mode is switched only for a saving above ``switch_margin_fraction`` (a mode change
restarts the pool's engines).
Evaluations are cached per (mode, hardware, request shape, SLO, rate on a 10 % grid rounded up); a mode that
misses the SLO at one rate is not evaluated at higher rates of the same pool (attainment falls with load).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from greenserve.common.engine_modes import engines_mode_problem
from greenserve.common.errors import InvalidArgument
from greenserve.optimizer import capacity
from greenserve.optimizer.fleet import gpu_hardware, simulator_models
from greenserve.optimizer.inputs import guess_simulator_model
from greenserve.optimizer.planning import KnobPlan, PlanningInputs
from greenserve.simulator.mode_units import (
    DPD,
    DSD,
    SPEC_DECODE,
    STANDALONE,
    VOCAB_SIZE,
    Unavailable,
    engine_profile,
    gpu_table,
    mode_unit,
)
from greenserve.simulator.perf_model import PerfModel
from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import FleetConfig
from greenserve.simulator.workloads import Workload
from greenserve.v1 import common_pb2

MODES = (STANDALONE, SPEC_DECODE, DPD, DSD)
MODE_NAMES = {STANDALONE: "Standalone", SPEC_DECODE: "SpecDecode", DPD: "DPD", DSD: "DSD"}
DEFAULT_SPEC_TOKENS = 3  # GreenLLM Sec. V-A
PREDICTION_REQUESTS = 600
RATE_GRID = 1.1  # evaluated rates: powers of 1.1 req/s (rounded up: conservative)
MIN_RATE_PER_S = 0.05
DEFAULT_LIFETIME_S = 5 * 365 * 24 * 3600.0


# ----------------------------------------------------------------------------------------------------------------
# One mode evaluated in the simulator
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModeSetting:
    """What fixes the modes' performance for one pool (hashable: the evaluation cache's key)."""

    target_model: str  # simulator model of the pool's model
    draft_model: str  # simulator model of the draft ("" without one)
    new_hardware: str
    old_hardware: str  # "" without old GPUs
    new_embodied_g: float
    old_embodied_g: float
    lifetime_s: float
    acceptance_fraction: float = 0.0
    num_speculative_tokens: int = DEFAULT_SPEC_TOKENS
    link_bandwidth_bytes_per_s: float = 0.0


@dataclass(frozen=True)
class ModeEval:
    """One mode at one rate per unit: attainment, per-token figures, link traffic, and why it is out."""

    mode: common_pb2.ServingMode
    rate_per_s: float
    attainment_fraction: float
    energy_j_per_token: float
    embodied_g_per_token: float
    link_bytes_per_s: float
    feasible: bool
    reason: str = ""  # why not feasible

    def carbon_g_per_token(self, ci_g_per_kwh: float, pue: float = 1.0) -> float:
        return self.energy_j_per_token / 3.6e6 * ci_g_per_kwh * pue + self.embodied_g_per_token


def _unit(mode: int, s: ModeSetting) -> tuple[FleetConfig, list[float]] | str:
    """The replay fleet of one unit of the mode (``greenserve.simulator.mode_units``, shared with the profiler) and
    the embodied carbon of each engine's GPUs; a string says why the mode is not possible."""
    if mode in (SPEC_DECODE, DSD) and not s.draft_model:
        return "the pool declares no draft model"
    if mode in (DPD, DSD):
        if not s.old_hardware:
            return "the pool has no older GPU to pair with"
        if s.link_bandwidth_bytes_per_s <= 0:
            return "the fleet declares no link bandwidth"
    unit = mode_unit(mode, s.target_model, s.new_hardware, draft_model=s.draft_model, old_hardware=s.old_hardware,
                     acceptance_fraction=s.acceptance_fraction, num_speculative_tokens=s.num_speculative_tokens,
                     link_bandwidth_bytes_per_s=s.link_bandwidth_bytes_per_s)
    if isinstance(unit, Unavailable):
        return unit.reason
    embodied = {"new": s.new_embodied_g, "old": s.old_embodied_g}
    return unit.fleet, [sum(embodied[g] for g in gpus) for gpus in unit.engine_gpus]


@lru_cache(maxsize=4096)
def evaluate(mode: common_pb2.ServingMode, setting: ModeSetting, rate_per_s: float, prompt_tokens: int,
             output_tokens: int, ttft_s: float, tpot_s: float, attainment_fraction: float,
             requests: int = PREDICTION_REQUESTS, seed: int = 7) -> ModeEval:
    """One unit of ``mode`` at ``rate_per_s`` in the simulator (see the module docstring); deterministic."""
    unit = _unit(mode, setting)
    if isinstance(unit, str):
        return ModeEval(mode, rate_per_s, 0.0, math.inf, math.inf, 0.0, False, unit)
    fleet, embodied = unit
    rate = max(rate_per_s, MIN_RATE_PER_S)
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, requests)).tolist()
    result = replay(Workload(f"modes@{rate:g}", arrivals, [prompt_tokens] * requests, [output_tokens] * requests),
                    fleet)
    attained = result.slo_attainment(ttft_s, tpot_s)["both"]
    done = result.completed
    tokens = int(result.output_tokens[done].sum())
    if tokens == 0:
        return ModeEval(mode, rate_per_s, attained, math.inf, math.inf, 0.0, False, "no request completed")
    energy_per_token = result.fleet_energy_j / tokens
    time_sum = float(np.nansum(result.e2e_s[done]))
    embodied_g = sum(c_e * time_sum / (max(1.0, float(bs)) * setting.lifetime_s)
                     for c_e, bs in zip(embodied, result.engine_mean_batch, strict=True))
    link = 0.0
    if mode == DPD:
        target = engine_profile(setting.target_model, setting.new_hardware)
        assert target is not None  # _unit built the mode's unit from this profile
        link = rate * prompt_tokens * PerfModel(target).profile.kv_bytes_per_token
    elif mode == DSD:
        k, r = setting.num_speculative_tokens, setting.acceptance_fraction
        link = rate * output_tokens * k / (1 + k * r) * (VOCAB_SIZE * 4 + 4)
    reasons = []
    if attained < attainment_fraction:
        reasons.append(f"SLO attainment {attained:.0%} < {attainment_fraction:.0%} at {rate_per_s:.2f} req/s")
    if mode in (DPD, DSD) and link > setting.link_bandwidth_bytes_per_s:
        reasons.append(f"link traffic {link / 1e9:.2f} GB/s > {setting.link_bandwidth_bytes_per_s / 1e9:.2f} GB/s")
    return ModeEval(mode, rate_per_s, attained, energy_per_token, embodied_g / tokens, link, not reasons,
                    "; ".join(reasons))


def grid_rate(rate_per_s: float) -> float:
    """The evaluated rate for a load: the next power of ``RATE_GRID`` (at least ``MIN_RATE_PER_S``)."""
    rate = max(rate_per_s, MIN_RATE_PER_S)
    return RATE_GRID ** math.ceil(math.log(rate, RATE_GRID) - 1e-9)


def choose(setting: ModeSetting, rate_per_s: float, prompt_tokens: int, output_tokens: int, slo: common_pb2.Slo,
           ci_g_per_kwh: float, pue: float = 1.0, current: common_pb2.ServingMode | None = None,
           switch_margin_fraction: float = 0.0, requests: int = PREDICTION_REQUESTS,
           missed: dict[common_pb2.ServingMode, ModeEval] | None = None,
           unsupported: dict[common_pb2.ServingMode, str] | None = None,
           ) -> tuple[common_pb2.ServingMode, dict[common_pb2.ServingMode, ModeEval]]:
    """(mode, evaluations): the feasible mode with the lowest carbon per token; the current one unless another
    saves more than ``switch_margin_fraction``; without a feasible mode, the one with the highest attainment.
    ``missed``: per mode, an evaluation at a lower rate that missed the SLO (kept up to date here): the mode is
    not evaluated again at a higher rate. ``unsupported``: per mode the pool's engines cannot run, why: such a
    mode is not evaluated nor chosen, even as the fallback (Standalone is run by every engine)."""
    rate = grid_rate(rate_per_s)
    missed = {} if missed is None else missed
    unsupported = {} if unsupported is None else unsupported
    evals: dict[common_pb2.ServingMode, ModeEval] = {}
    for m in MODES:
        if m in unsupported:
            evals[m] = ModeEval(m, rate, 0.0, math.inf, math.inf, 0.0, False, f"not considered: {unsupported[m]}")
            continue
        low = missed.get(m)
        if low is not None and low.rate_per_s <= rate:
            evals[m] = low
            continue
        evals[m] = evaluate(m, setting, rate, prompt_tokens, output_tokens, slo.ttft_s, slo.tpot_s,
                            slo.attainment_fraction, requests)
        if evals[m].attainment_fraction < slo.attainment_fraction and (low is None or rate < low.rate_per_s):
            missed[m] = evals[m]
    feasible = [m for m in MODES if evals[m].feasible]
    if not feasible:
        runnable = [m for m in MODES if m not in unsupported] or [STANDALONE]
        return max(runnable, key=lambda m: (evals[m].attainment_fraction, m == STANDALONE)), evals
    best = min(feasible, key=lambda m: (evals[m].carbon_g_per_token(ci_g_per_kwh, pue), m))
    if current in feasible and current != best:
        keep = evals[current].carbon_g_per_token(ci_g_per_kwh, pue)
        if keep <= evals[best].carbon_g_per_token(ci_g_per_kwh, pue) * (1 + switch_margin_fraction):
            return current, evals
    return best, evals


# ----------------------------------------------------------------------------------------------------------------
# From the fleet to settings, and the solver
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class PoolModes:
    setting: ModeSetting
    units: int  # new GPUs
    old_units: int
    note: str = ""
    unsupported: dict[common_pb2.ServingMode, str] = field(default_factory=dict)  # mode -> why the pool's engines cannot run it


def mode_target(pool: str, mode: common_pb2.ServingMode, setting: ModeSetting) -> common_pb2.ServingModeTarget:
    """The plan's target of ``pool`` in ``mode``: disaggregated modes name the older GPU and the link."""
    target = common_pb2.ServingModeTarget(pool=pool, serving_mode=mode)
    if mode in (DPD, DSD):
        target.old_hardware = setting.old_hardware
        target.link_bandwidth_bytes_per_s = setting.link_bandwidth_bytes_per_s
    return target


def unsupported_modes(inputs: PlanningInputs, pool: common_pb2.Pool, setting: ModeSetting,
                      ) -> dict[common_pb2.ServingMode, str]:
    """Per mode the pool's engines cannot run, why (the launchers' own rule, see the module docstring)."""
    kinds = {e.kind for e in pool.engines}
    # the cache-manager lists an LMCache server for the pool: mode_problem asks only whether there is one
    lmcache = "the pool's LMCache server (cache-manager)" if pool.name in inputs.cache_sizes else ""
    out = {}
    for m in MODES:
        if m in (DPD, DSD) and not setting.old_hardware:
            continue  # no older GPU: out for the hardware already, and the evaluation says so
        problem = engines_mode_problem(kinds, mode_target(pool.name, m, setting), pool, lmcache)
        if problem:
            out[m] = problem
    return out


def _peak_flops(hardware: str) -> float | None:
    g = gpu_table().get(hardware)
    return float(g["peak_fp16_flops"]) if g else None


def _embodied(inputs: PlanningInputs, uuids: list[str]) -> tuple[float, float]:
    """(embodied g of one GPU, lifetime s) from the inputs' platforms (0 when no figure is cited)."""
    for uuid in uuids:
        platform = inputs.gpu_platform.get(uuid)
        if platform is not None and platform.items:
            return platform.embodied_g, platform.items[0].component.lifetime_s
    return 0.0, DEFAULT_LIFETIME_S


def pool_modes(inputs: PlanningInputs, pool: common_pb2.Pool, pool_index: int) -> PoolModes | None:
    """The pool's mode setting; None when it has no alternative to Standalone (no draft, one GPU type) or no GPU.
    InvalidArgument names the field that keeps the modes from being evaluated."""
    gpus = [(i, g) for i, g in enumerate(inputs.fleet.gpus) if g.pool == pool.name]
    if not gpus:
        return None
    by_hw: dict[str, list[str]] = {}
    unknown = set()
    for _, g in gpus:
        hw = gpu_hardware(g)
        if _peak_flops(hw) is None:
            unknown.add(hw or g.uuid)
            continue
        by_hw.setdefault(hw, []).append(g.uuid)
    if not by_hw:
        return None
    ranked = sorted(by_hw, key=lambda hw: (-(_peak_flops(hw) or 0.0), hw))
    new = ranked[0]
    old = ranked[1] if len(ranked) > 1 else ""
    if not old and not pool.HasField("draft"):
        return None
    target = (pool.variants[0].simulator_model if pool.variants and pool.variants[0].simulator_model else None) \
        or guess_simulator_model(pool.variants[0].model if pool.variants else pool.model) \
        or guess_simulator_model(pool.model)
    if target is None:
        raise InvalidArgument(f"fleet.pools[{pool_index}].variants[0].simulator_model" if pool.variants
                              else f"fleet.pools[{pool_index}].model",
                              f"no simulator model for {pool.model!r}: its serving modes cannot be evaluated")
    draft = ""
    k, r = DEFAULT_SPEC_TOKENS, 0.0
    if pool.HasField("draft"):
        draft = pool.draft.simulator_model or guess_simulator_model(pool.draft.model) or ""
        if not draft:
            raise InvalidArgument(f"fleet.pools[{pool_index}].draft.simulator_model",
                                  f"no simulator model for the draft {pool.draft.model!r}: set one of "
                                  f"{', '.join(simulator_models())}")
        k = pool.draft.num_speculative_tokens or DEFAULT_SPEC_TOKENS
        r = pool.draft.acceptance_fraction
    new_e, lifetime = _embodied(inputs, by_hw[new])
    old_e, _ = _embodied(inputs, by_hw[old]) if old else (0.0, lifetime)
    setting = ModeSetting(target, draft, new, old, new_e, old_e, lifetime, r, k,
                          inputs.fleet.link_bandwidth_bytes_per_s)
    notes = []
    if old and len(by_hw[old]) < len(by_hw[new]):
        notes.append(f"{len(by_hw[old])} {old} for {len(by_hw[new])} {new}: disaggregated modes need one each")
    if unknown:
        notes.append(f"GPUs {', '.join(sorted(unknown))} left out (the simulator has no figures for them)")
    if len(ranked) > 2:
        notes.append(f"GPUs {', '.join(ranked[2:])} not used by the modes (one older type is paired)")
    return PoolModes(setting, len(by_hw[new]), len(by_hw[old]) if old else 0, "; ".join(notes),
                     unsupported_modes(inputs, pool, setting))


class GreenLlmModes:
    """The "serving_modes" knob, GreenLLM's SLO- and bandwidth-aware choice (see the module docstring)."""

    knob = "serving_modes"
    name = "serving_modes.greenllm"

    def __init__(self, *, load_bound: str = "upper", switch_margin_fraction: float = 0.02,
                 requests: int = PREDICTION_REQUESTS) -> None:
        if load_bound not in ("upper", "mean"):
            raise ValueError("load_bound: must be upper or mean")
        if not 0 <= switch_margin_fraction < 1:
            raise ValueError("switch_margin_fraction: must be in [0, 1)")
        self.load_bound = load_bound
        self.margin = switch_margin_fraction
        self.requests = requests

    def solve(self, inputs: PlanningInputs) -> KnobPlan:
        started = time.perf_counter()
        per_interval: list[list[common_pb2.ServingModeTarget]] = [[] for _ in range(inputs.horizon_hours)]
        lines: list[str] = []
        planned = 0
        for pi, pool in enumerate(inputs.fleet.pools):
            modes = pool_modes(inputs, pool, pi)
            if modes is None:
                continue
            planned += 1
            if modes.note:
                lines.append(f"pool {pool.name}: {modes.note}")
            lines += [f"{MODE_NAMES[m]} not considered for pool {pool.name}: {why}"
                      for m, why in modes.unsupported.items()]
            fc = inputs.load.get(pool.name)
            ci = inputs.ci.get(pool.region)
            prompt = pool.mean_prompt_tokens or capacity.DEFAULT_PROMPT_TOKENS
            output = pool.mean_output_tokens or capacity.DEFAULT_OUTPUT_TOKENS
            in_force = inputs.current_interval(0)
            current = next((t.serving_mode for t in in_force.serving_modes if t.pool == pool.name), None) \
                if in_force is not None else None
            missed: dict[common_pb2.ServingMode, ModeEval] = {}
            for h in range(inputs.horizon_hours):
                load = (fc.upper[h] if self.load_bound == "upper" else fc.mean[h]) if fc else 0.0
                ci_h = ci.mean[h] if ci else 0.0
                units = modes.units
                mode, evals = choose(modes.setting, load / units, prompt, output, pool.slo, ci_h, inputs.params.pue,
                                     current, self.margin, self.requests, missed, modes.unsupported)
                per_interval[h].append(mode_target(pool.name, mode, modes.setting))
                if h == 0 or mode != current:
                    lines.append(explain_line(pool.name, h, modes, load, ci_h, inputs.params.pue, mode, evals, current))
                current = mode
        took = time.perf_counter() - started
        if not planned:  # no target: every pool Standalone (a mode left from an earlier fleet is not kept)
            return KnobPlan(per_interval, detail="no pool has an older GPU or a draft model: every pool Standalone")
        info = evaluate.cache_info()
        return KnobPlan(per_interval, explanation=lines,
                        detail=f"GreenLLM mode choice (lowest carbon per token meeting the SLO and the link) for "
                               f"{planned} pool(s) over {inputs.horizon_hours} h in {took:.2f} s "
                               f"({info.currsize} simulator evaluations cached)")


def explain_line(pool: str, hour: int, modes: PoolModes, load: float, ci: float, pue: float,
                 mode: common_pb2.ServingMode, evals: dict[common_pb2.ServingMode, ModeEval],
                 previous: common_pb2.ServingMode | None) -> str:
    s = modes.setting
    pair = {STANDALONE: s.new_hardware, SPEC_DECODE: f"{s.new_hardware} target + draft",
            DPD: f"{s.new_hardware} prefill + {s.old_hardware} decode",
            DSD: f"{s.new_hardware} target + {s.old_hardware} draft"}[mode]
    base = evals[STANDALONE]
    chosen = evals[mode]
    parts = []
    for m in MODES:
        e = evals[m]
        if e.feasible:
            parts.append(f"{MODE_NAMES[m]} {e.carbon_g_per_token(ci, pue) * 1e3:.4f} mg/token")
        elif m in modes.unsupported:
            parts.append(f"{MODE_NAMES[m]} not considered (its engines cannot run it)")
        else:
            parts.append(f"{MODE_NAMES[m]} out ({e.reason})")
    saving = ""
    if chosen.feasible and base.feasible and mode != STANDALONE:
        b = base.carbon_g_per_token(ci, pue)
        saving = f", {100 * (b - chosen.carbon_g_per_token(ci, pue)) / b:.1f} % below Standalone"
    was = f" (was {MODE_NAMES.get(previous, 'unset')})" if previous is not None and previous != mode else ""
    verdict = "" if chosen.feasible else "; no mode meets the SLO: the one with the highest attainment"
    return (f"pool {pool}, hour {hour}: {MODE_NAMES[mode]}{was} on {pair}, {load:.2f} req/s over {modes.units} "
            f"unit(s), CI {ci:.0f} g/kWh{saving}{verdict}; " + "; ".join(parts))
