"""The fleet an evaluation plans: pools (model, engines and their performance model, SLO, workload, cache limits) as
a ``FleetInventory``, from a YAML/JSON scenario file or the default scenario.

Scenario file (YAML or JSON)::

    pools:
      - name: chat
        model: meta-llama/Meta-Llama-3-8B-Instruct
        simulator_model: llama3-8b          # performance model family (greenserve-engine-sim --list-profiles)
        hardware: A100-80GB                 # every engine's hardware
        engines: 4
        peak_requests_per_s: 12             # the load shape is scaled so that its peak is this
        slo: {ttft_s: 2.0, tpot_s: 0.15, attainment_fraction: 0.9}
        max_cache_dram_gib: 64              # DRAM tier the planner may size (GreenCache's choice), 0: none
        cache_step_gib: 8
        draft_model: llama3.2-1b            # optional: a speculative draft (simulator model) for GreenLLM's modes
        draft_acceptance_fraction: 0.457    # accepted / proposed draft tokens (GreenLLM Sec. V-A's 1B draft)

A pool with a draft may run SpecDecode (target and draft on the same GPU) where the ``serving_modes`` solver picks
it; Full Cache + BASE and the strategies without that solver stay Standalone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from greenserve.v1 import common_pb2

GIB = 1 << 30


def _workload_means() -> tuple[int, int]:
    """Mean prompt and output tokens of the replayed workload (multi-turn conversations), so that predicted
    capacities are for the traffic the evaluation replays."""
    from greenserve.simulator.workloads import multi_turn_workload

    sample = multi_turn_workload(400, 1.0, seed=1, mean_turns=4.0)
    return int(sum(sample.prompt_tokens) / len(sample)), int(sum(sample.output_tokens) / len(sample))


WORKLOAD_PROMPT_TOKENS, WORKLOAD_OUTPUT_TOKENS = _workload_means()


class ScenarioError(ValueError):
    """A scenario file the evaluation refuses (the message names the key)."""


@dataclass(frozen=True)
class PoolScenario:
    name: str
    model: str = "meta-llama/Meta-Llama-3-8B-Instruct"
    simulator_model: str = "llama3-8b"
    hardware: str = "A100-80GB"
    engines: int = 4
    peak_requests_per_s: float = 12.0
    ttft_s: float = 2.0
    tpot_s: float = 0.15
    attainment_fraction: float = 0.9
    max_cache_dram_gib: float = 64.0
    cache_step_gib: float = 8.0
    draft_model: str = ""
    draft_acceptance_fraction: float = 0.0
    draft_tokens: int = 3

    @property
    def profile(self) -> str:
        return f"{self.simulator_model}@{self.hardware}"


@dataclass(frozen=True)
class Scenario:
    pools: tuple[PoolScenario, ...] = field(default_factory=lambda: (PoolScenario("chat"),))

    def fleet(self, region: str) -> common_pb2.FleetInventory:
        fleet = common_pb2.FleetInventory()
        for p in self.pools:
            pool = fleet.pools.add(
                name=p.name, model=p.model, region=region,
                slo=common_pb2.Slo(ttft_s=p.ttft_s, tpot_s=p.tpot_s, attainment_fraction=p.attainment_fraction),
                max_cache_dram_bytes=int(p.max_cache_dram_gib * GIB), cache_step_bytes=int(p.cache_step_gib * GIB),
                mean_prompt_tokens=WORKLOAD_PROMPT_TOKENS, mean_output_tokens=WORKLOAD_OUTPUT_TOKENS)
            pool.variants.add(name="base", model=p.model, quality_fraction=1.0, quality_source="reference",
                              simulator_model=p.simulator_model)
            for i in range(p.engines):
                pool.engines.add(id=f"{p.name}-{i}", url=f"http://sim/{p.name}-{i}", pool=p.name, hardware=p.hardware,
                                 model_variant="base", kind=common_pb2.ENGINE_KIND_SIMULATED)
            if p.draft_model:  # the serving-mode solver reads the pool's GPUs and its draft
                pool.draft.CopyFrom(common_pb2.SpeculativeDraft(
                    model=p.draft_model, simulator_model=p.draft_model, acceptance_fraction=p.draft_acceptance_fraction,
                    num_speculative_tokens=p.draft_tokens, acceptance_source="scenario file"))
                for i in range(p.engines):
                    fleet.gpus.add(uuid=f"GPU-{p.name}-{i}", pool=p.name, hardware=p.hardware, reported_by="operator")
        return fleet


_FIELDS = {f: t for f, t in PoolScenario.__annotations__.items()}


def load(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(f"{path.name}: cannot read: {exc.strerror}") from None
    try:
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{path.name}: not valid YAML/JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(document, dict) or not isinstance(document.get("pools"), list) or not document["pools"]:
        raise ScenarioError(f"{path.name}: needs a non-empty 'pools' list")
    pools = []
    for i, entry in enumerate(document["pools"]):
        where = f"{path.name}: pools[{i}]"
        if not isinstance(entry, dict):
            raise ScenarioError(f"{where}: must be a mapping")
        values = dict(entry)
        slo = values.pop("slo", {}) or {}
        if not isinstance(slo, dict):
            raise ScenarioError(f"{where}.slo: must be a mapping")
        values.update(slo)
        unknown = sorted(set(values) - set(_FIELDS))
        if unknown:
            raise ScenarioError(f"{where}: unknown key {unknown[0]!r}")
        if "name" not in values:
            raise ScenarioError(f"{where}.name: required")
        for key, value in values.items():
            kind = _FIELDS[key]
            if kind in ("int",) and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ScenarioError(f"{where}.{key}: must be an integer >= 1")
            if kind == "float" and (not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0):
                raise ScenarioError(f"{where}.{key}: must be a number >= 0")
            if kind == "str" and (not isinstance(value, str) or not value):
                raise ScenarioError(f"{where}.{key}: must be a non-empty string")
        pool = PoolScenario(**values)
        if not 0 < pool.attainment_fraction <= 1 or pool.ttft_s <= 0 or pool.tpot_s <= 0:
            raise ScenarioError(f"{where}.slo: ttft_s and tpot_s > 0, attainment_fraction in (0, 1]")
        if pool.draft_model:
            from greenserve.optimizer.solvers.serving_modes import (
                MAX_SPEC_TOKENS,
                simulator_models,
            )

            if pool.draft_model not in simulator_models():
                raise ScenarioError(f"{where}.draft_model: unknown simulator model {pool.draft_model!r} (known: "
                                    f"{', '.join(simulator_models())})")
            if not 0 < pool.draft_acceptance_fraction <= 1:
                raise ScenarioError(f"{where}.draft_acceptance_fraction: must be in (0, 1] with a draft_model")
            if pool.draft_tokens > MAX_SPEC_TOKENS:
                raise ScenarioError(f"{where}.draft_tokens: at most {MAX_SPEC_TOKENS}")
        pools.append(pool)
    if len({p.name for p in pools}) != len(pools):
        raise ScenarioError(f"{path.name}: pool names must be unique")
    return Scenario(tuple(pools))
