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
        count_prefix_hits: true             # the planner's capacity counts prefix reuse (false: none assumed)

A pool may declare MIG-capable GPUs and the model variants its MIG instances may run (CLOVER's technique, the
``mig_variants`` strategy)::

        gpus: {model: A100-80GB, count: 4, mig: true}   # instead of hardware + engines
        variants: [3.1-8b-bf16, 3.1-8b-gptq-w4a16]      # the optimizer's catalogue (data/variants.toml) by name,
                                                        # or {name, simulator_model, quality_fraction, quality_source}

The strategies without the MIG solver run the pool's best variant on every GPU whole; ``mig_variants`` lets the
clover-exact solver partition the GPUs and pick a variant per instance.

A pool with a draft may run SpecDecode (target and draft on the same GPU) where the ``serving_modes`` solver picks
it; Full Cache + BASE and the strategies without that solver stay Standalone.

The load shape is the shipped Azure 2024 conversation trace unless the scenario names the user's own trace::

    load_shape:                       # next to pools; a CSV of request counts or rates (any unit: it is scaled)
      csv: my_trace.csv               # relative to the scenario file
      time_column: hour_start_utc     # ISO-8601, UTC when no offset; rows hourly or finer (averaged per UTC hour)
      value_column: requests

A trace of one row per request (Azure's LLM inference traces, a gateway's access log as CSV) is counted per UTC
hour: ``per_request: true`` in place of ``value_column`` (``time_column``: the arrival instant)::

    load_shape:
      csv: AzureLLMInferenceTrace_conv_1week.csv
      time_column: TIMESTAMP
      per_request: true

Its whole UTC days are used (up to 15): the last one with every hour is replayed as the evaluated day, the days
before it are the load forecast's history (a missing hour there is skipped). A trace whose times are offsets from
its own start (Mooncake, BurstGPT) names no day and cannot be placed on the grid's: give it absolute times first.
"""

from __future__ import annotations

import json
import math
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
    mig: bool = False  # the pool's GPUs are MIG-capable and may be partitioned (mig_variants)
    variants: tuple[common_pb2.ModelVariant, ...] = ()  # best first; empty: one "base" variant (the pool's model)
    # the planner's capacity per engine counts prefix reuse (day.py): the fraction measured in the last window sets
    # the conversations' shape, the engine's own KV memory the hits (capacity.predict); on by default since the
    # replay keeps each conversation's own prefix (evaluation.md: FR default and MIG scenarios >= 0.988 every hour)
    count_prefix_hits: bool = True

    @property
    def variant_protos(self) -> tuple[common_pb2.ModelVariant, ...]:
        return self.variants or (common_pb2.ModelVariant(
            name="base", model=self.model, quality_fraction=1.0, quality_source="reference",
            simulator_model=self.simulator_model),)

    @property
    def profile(self) -> str:
        return f"{self.simulator_model}@{self.hardware}"


@dataclass(frozen=True)
class LoadShape:
    """A user's load trace (``load_shape`` in a scenario file): its values per UTC hour over whole UTC days."""

    name: str
    start_s: int  # 00:00 UTC of its first day
    values: tuple[float, ...]  # one per hour, len a multiple of 24; NaN: missing (never in the last day)


@dataclass(frozen=True)
class Scenario:
    pools: tuple[PoolScenario, ...] = field(default_factory=lambda: (PoolScenario("chat"),))
    load_shape: LoadShape | None = None  # None: the shipped Azure 2024 conversation trace (run.load_shape)

    @property
    def has_mig(self) -> bool:
        return any(p.mig for p in self.pools)

    def fleet(self, region: str) -> common_pb2.FleetInventory:
        fleet = common_pb2.FleetInventory()
        for p in self.pools:
            pool = fleet.pools.add(
                name=p.name, model=p.model, region=region,
                slo=common_pb2.Slo(ttft_s=p.ttft_s, tpot_s=p.tpot_s, attainment_fraction=p.attainment_fraction),
                max_cache_dram_bytes=int(p.max_cache_dram_gib * GIB), cache_step_bytes=int(p.cache_step_gib * GIB),
                mean_prompt_tokens=WORKLOAD_PROMPT_TOKENS, mean_output_tokens=WORKLOAD_OUTPUT_TOKENS)
            pool.variants.extend(p.variant_protos)
            for i in range(p.engines):
                pool.engines.add(id=f"{p.name}-{i}", url=f"http://sim/{p.name}-{i}", pool=p.name, hardware=p.hardware,
                                 model_variant=p.variant_protos[0].name, kind=common_pb2.ENGINE_KIND_SIMULATED,
                                 gpu_uuid=f"GPU-{p.name}-{i}" if p.mig else "")
            if p.mig:  # MIG-capable GPUs the clover-exact solver may partition (no instances yet: whole GPUs)
                for i in range(p.engines):
                    fleet.gpus.add(uuid=f"GPU-{p.name}-{i}", pool=p.name, hardware=p.hardware, model=_gpu_enum(p.hardware),
                                   mig_enabled=True, reported_by="operator")
            if p.draft_model:  # the serving-mode solver reads the pool's GPUs and its draft
                pool.draft.CopyFrom(common_pb2.SpeculativeDraft(
                    model=p.draft_model, simulator_model=p.draft_model, acceptance_fraction=p.draft_acceptance_fraction,
                    num_speculative_tokens=p.draft_tokens, acceptance_source="scenario file"))
                for i in range(p.engines):
                    fleet.gpus.add(uuid=f"GPU-{p.name}-{i}", pool=p.name, hardware=p.hardware, reported_by="operator")
        return fleet


_FIELDS = {f: t for f, t in PoolScenario.__annotations__.items() if f not in ("mig", "variants")}
_VARIANT_KEYS = ("name", "model", "simulator_model", "quality_fraction", "quality_source")


def _gpu_enum(hardware: str) -> int:
    from greenserve.optimizer.fleet import GPU_HARDWARE

    return next(k for k, v in GPU_HARDWARE.items() if v == hardware)


def _mig_gpus(where: str, gpus: object) -> dict:
    """``gpus: {model, count, mig}`` as the pool's hardware, engines and mig flag (refused naming the key)."""
    from greenserve.optimizer.fleet import GPU_HARDWARE
    from greenserve.optimizer.solvers import mig_patterns as mp

    if not isinstance(gpus, dict):
        raise ScenarioError(f"{where}.gpus: must be a mapping {{model, count, mig}}")
    unknown = sorted(set(gpus) - {"model", "count", "mig"})
    if unknown:
        raise ScenarioError(f"{where}.gpus: unknown key {unknown[0]!r}")
    model, count, mig = gpus.get("model"), gpus.get("count", 1), gpus.get("mig", False)
    if not isinstance(mig, bool):
        raise ScenarioError(f"{where}.gpus.mig: must be true or false")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ScenarioError(f"{where}.gpus.count: must be an integer >= 1")
    if not isinstance(model, str) or not model:
        raise ScenarioError(f"{where}.gpus.model: required (a GPU model, e.g. A100-80GB)")
    if mig:
        mig_models = sorted(set(GPU_HARDWARE.values()) & set(mp.GPU_SMS))
        if model not in mig_models:
            raise ScenarioError(f"{where}.gpus.model: {model!r} has no MIG (MIG-capable: {', '.join(mig_models)})")
    return {"hardware": model, "engines": count, "mig": mig}


def _variants(where: str, entries: object) -> tuple[common_pb2.ModelVariant, ...]:
    """Declared variants, best first: catalogue names (the optimizer's data/variants.toml) or mappings."""
    from greenserve.optimizer.solvers import mig_patterns as mp
    from greenserve.optimizer.fleet import simulator_models

    if not isinstance(entries, list) or not entries:
        raise ScenarioError(f"{where}.variants: must be a non-empty list")
    out = []
    for j, entry in enumerate(entries):
        at = f"{where}.variants[{j}]"
        if isinstance(entry, str):
            cat = mp.catalogue().get(entry)
            if cat is None:
                raise ScenarioError(f"{at}: {entry!r} is not in the optimizer's variant catalogue (known: "
                                    f"{', '.join(mp.catalogue())})")
            out.append(cat.to_proto())
            continue
        if not isinstance(entry, dict):
            raise ScenarioError(f"{at}: must be a catalogue name or a mapping {{{', '.join(_VARIANT_KEYS)}}}")
        unknown = sorted(set(entry) - set(_VARIANT_KEYS))
        if unknown:
            raise ScenarioError(f"{at}: unknown key {unknown[0]!r}")
        for key in ("name", "simulator_model", "quality_source"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ScenarioError(f"{at}.{key}: required, a non-empty string")
        if entry["simulator_model"] not in simulator_models():
            raise ScenarioError(f"{at}.simulator_model: unknown simulator model {entry['simulator_model']!r}")
        q = entry.get("quality_fraction")
        if not isinstance(q, (int, float)) or isinstance(q, bool) or not 0 < q <= 1:
            raise ScenarioError(f"{at}.quality_fraction: required, a number in (0, 1]")
        model = entry.get("model", entry["name"])
        if not isinstance(model, str) or not model:
            raise ScenarioError(f"{at}.model: must be a non-empty string")
        out.append(common_pb2.ModelVariant(name=entry["name"], model=model, quality_fraction=float(q),
                                           quality_source=entry["quality_source"],
                                           simulator_model=entry["simulator_model"]))
    if len({v.name for v in out}) != len(out):
        raise ScenarioError(f"{where}.variants: names must be unique")
    return tuple(sorted(out, key=lambda v: -v.quality_fraction))


LOAD_SHAPE_KEYS = ("csv", "time_column", "value_column", "per_request")
DAY_S = 86400
MAX_LOAD_DAYS = 15  # the replayed day and 14 days of history, as for CI (run.HISTORY_DAYS)


def _load_shape(where: str, entry: object, folder: Path) -> LoadShape:
    """The ``load_shape`` mapping: the trace read like a CI CSV (grids.read_csv: hourly or finer rows, a negative
    or non-numeric value refused naming the row) or, with ``per_request``, its rows counted per UTC hour
    (grids.count_csv), cut to whole UTC days."""
    from greenserve.evaluation import grids

    if not isinstance(entry, dict):
        raise ScenarioError(f"{where}: must be a mapping {{{', '.join(LOAD_SHAPE_KEYS)}}}")
    unknown = sorted(set(entry) - set(LOAD_SHAPE_KEYS))
    if unknown:
        raise ScenarioError(f"{where}: unknown key {unknown[0]!r}")
    per_request = entry.get("per_request", False)
    if not isinstance(per_request, bool):
        raise ScenarioError(f"{where}.per_request: true or false, got {per_request!r}")
    if per_request and "value_column" in entry:
        raise ScenarioError(f"{where}: per_request counts rows; a value_column cannot be given with it")
    for key in ("csv", "time_column") if per_request else ("csv", "time_column", "value_column"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            extra = " (or per_request: true for a trace of one row per request)" if key == "value_column" else ""
            raise ScenarioError(f"{where}.{key}: required, a non-empty string{extra}")
    path = Path(entry["csv"])
    path = path if path.is_absolute() else folder / path
    try:
        if per_request:
            series = grids.count_csv(path, time_column=entry["time_column"], region=path.stem,
                                     time_name="load_shape.time_column")
        else:
            (series,) = grids.read_csv(path, time_column=entry["time_column"], value_column=entry["value_column"],
                                       region=path.stem,
                                       names=("load_shape.time_column", "load_shape.value_column")).values()
    except grids.GridDataError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    first = -(-series.start_s // DAY_S) * DAY_S
    end = (series.start_s + len(series.values) * grids.HOUR_S) // DAY_S * DAY_S
    while end - first >= DAY_S and any(math.isnan(v) for v in series.window(end - DAY_S, 24, allow_missing=True)):
        end -= DAY_S  # the replayed day is the last whole UTC day with every hour (a trace's gaps: history only)
    days = min(max(0, (end - first) // DAY_S), MAX_LOAD_DAYS)
    if days < 3:
        raise ScenarioError(f"{where}: {path.name} holds {days} whole UTC day(s) up to its last day with every hour;"
                            f" the evaluation needs 3 (the replayed day and 2 of history for the load forecast)")
    start = end - days * DAY_S
    values = series.window(start, days * 24, allow_missing=True)
    if sum(1 for v in values[:-24] if not math.isnan(v)) < 48 or max(values[-24:]) <= 0:
        raise ScenarioError(f"{where}: {path.name}: the load forecast needs 48 known hours before the replayed day, "
                            f"and that day a load above 0")
    return LoadShape(path.stem, start, values)


def load(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:  # the whole path: where it was looked for, not only its base name
        raise ScenarioError(f"{path.absolute()}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:  # a ValueError, not an OSError
        raise ScenarioError(f"{path.name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{path.name}: not valid YAML/JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(document, dict) or not isinstance(document.get("pools"), list) or not document["pools"]:
        raise ScenarioError(f"{path.name}: needs a non-empty 'pools' list")
    unknown_top = sorted(set(document) - {"pools", "load_shape"})
    if unknown_top:
        raise ScenarioError(f"{path.name}: unknown key {unknown_top[0]!r} (known: pools, load_shape)")
    shape = _load_shape(f"{path.name}: load_shape", document["load_shape"], path.parent) \
        if "load_shape" in document else None
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
        extra: dict = {}
        if "gpus" in values:
            if "hardware" in values or "engines" in values:
                raise ScenarioError(f"{where}.gpus: give either gpus or hardware + engines")
            extra.update(_mig_gpus(where, values.pop("gpus")))
        if "variants" in values:
            extra["variants"] = _variants(where, values.pop("variants"))
        unknown = sorted(set(values) - set(_FIELDS))
        if unknown:
            raise ScenarioError(f"{where}: unknown key {unknown[0]!r}")
        if "name" not in values:
            raise ScenarioError(f"{where}.name: required")
        for key, value in values.items():
            kind = _FIELDS[key]
            if kind in ("int",) and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ScenarioError(f"{where}.{key}: must be an integer >= 1")
            if kind == "float" and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                    or not math.isfinite(value) or value < 0):  # .inf / .nan: YAML reads them
                raise ScenarioError(f"{where}.{key}: must be a finite number >= 0")
            if kind == "bool" and not isinstance(value, bool):
                raise ScenarioError(f"{where}.{key}: must be true or false")
            if kind == "str" and (not isinstance(value, str) or not value):
                raise ScenarioError(f"{where}.{key}: must be a non-empty string")
        if "variants" in extra and not extra.get("mig"):
            raise ScenarioError(f"{where}.variants: only with MIG GPUs (gpus: {{model, count, mig: true}})")
        if extra.get("mig") and "simulator_model" not in values and "variants" in extra:
            values["simulator_model"] = extra["variants"][0].simulator_model
        if extra.get("mig") and "model" not in values and "variants" in extra:
            values["model"] = extra["variants"][0].model
        try:
            pool = PoolScenario(**values, **extra)
        except TypeError as exc:
            raise ScenarioError(f"{where}: {exc}") from None
        if pool.mig:
            from greenserve.simulator.engine_profile import list_profiles

            if pool.profile not in list_profiles():
                raise ScenarioError(f"{where}.gpus.model: the simulator has no profile {pool.profile!r} for the pool's "
                                    f"GPUs whole (what the strategies without MIG run)")
            if pool.draft_model:
                raise ScenarioError(f"{where}.draft_model: not with MIG GPUs (the evaluation runs one technique per "
                                    f"pool's engines)")
        if not 0 < pool.attainment_fraction <= 1 or pool.ttft_s <= 0 or pool.tpot_s <= 0:
            raise ScenarioError(f"{where}.slo: ttft_s and tpot_s > 0, attainment_fraction in (0, 1]")
        if pool.draft_model:
            from greenserve.optimizer.fleet import MAX_SPEC_TOKENS, simulator_models

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
    return Scenario(tuple(pools), shape)
