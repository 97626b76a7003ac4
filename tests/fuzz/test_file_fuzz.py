"""Fuzz the two YAML readers an operator feeds by hand (issue 36): the fleet file (`greenserve fleet set`) and the
evaluation's scenario file (`greenserve evaluate --scenario`).

Each case starts from a valid document (deploy/fleet.example.yaml; the shipped MIG scenario and a whole-GPU one)
and breaks it: a value somewhere replaced by an adversarial one (wrong type, NaN, infinities, huge or negative
numbers, long or odd strings, nested lists and maps), a key deleted or an unknown one added, or the text itself cut,
a byte flipped, a line doubled. The reader must answer the document or refuse it with its own error naming where
(FleetFileError / ScenarioError); a fleet it answers must then be answered by the optimizer's checks
(``validate_fleet``: OK or INVALID_ARGUMENT naming the field), as SetFleet does. Any other exception fails, naming
the seed and the case (GREENSERVE_FUZZ_N cases per reader, GREENSERVE_FUZZ_SEED).
"""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from greenserve.common.errors import InvalidArgument
from greenserve.evaluation import scenario as scenario_module
from greenserve.optimizer.fleet import validate_fleet
from greenserve_client.commands.fleet import FleetFileError, load_fleet_file
from tests.fuzz.conftest import fuzz_cases, fuzz_seed

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "deploy" / "fleet.example.yaml"
SCENARIOS = [ROOT / "services" / "evaluation" / "data" / "scenario_mig.yaml"]
WHOLE_GPU_SCENARIO = {"pools": [{"name": "chat", "hardware": "A100-80GB", "engines": 2, "peak_requests_per_s": 4,
                                 "slo": {"ttft_s": 2.0, "tpot_s": 0.15, "attainment_fraction": 0.9},
                                 "max_cache_dram_gib": 16}]}
VALUES: list[Any] = [None, True, False, 0, -1, 1, 2**31, 2**63, 2**70, -(2**70), 1e308, -1e308, float("nan"),
                     float("inf"), -float("inf"), 0.5, "", " ", "x" * 5000, "a\x00b", "\n", "🙂", "-1", "NaN", "1e999",
                     "256GiB", "-4 TB", "1 PB", "GPU-a100-n1-0", "chat", [], {}, [1, [2, [3]]], {"a": {"b": None}},
                     ["x"] * 300, "ENGINE_KIND_UNKNOWN", 3.5, -0.0]


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value (map key or list index) in the document."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


def _parent(doc: Any, path: tuple) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


def mutate(doc: Any, rng: random.Random) -> Any:
    doc = copy.deepcopy(doc)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        paths = _paths(doc)
        if not paths:
            return copy.deepcopy(rng.choice(VALUES))
        path = rng.choice(paths)
        parent, key = _parent(doc, path), path[-1]
        action = rng.random()
        if action < 0.6:
            parent[key] = copy.deepcopy(rng.choice(VALUES))
        elif action < 0.75:
            del parent[key]
        elif action < 0.9 and isinstance(parent, dict):
            parent[rng.choice(["bogus", "nameX", "poolsX", "slo", "engines", "gpus", "1"])] = copy.deepcopy(
                rng.choice(VALUES))
        elif isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))  # a repeated item (a pool or engine named twice)
        else:
            parent[key] = [copy.deepcopy(parent[key]) for _ in range(rng.randint(0, 3))]
    return doc


def text_of(doc: Any, rng: random.Random) -> str:
    text = yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    if rng.random() < 0.25:  # break the text itself
        lines = text.splitlines(keepends=True)
        choice = rng.random()
        if choice < 0.3 and text:
            text = text[: rng.randrange(len(text))]
        elif choice < 0.6 and text:
            i = rng.randrange(len(text))
            text = text[:i] + rng.choice([":", "-", "[", "{", "\t", "'", '"', "&a", "*a", "!!python/object x", "\x00"]) \
                + text[i + 1:]
        elif lines:
            i = rng.randrange(len(lines))
            lines.insert(i, lines[i])
            text = "".join(lines)
    return text


def _fail(seed: int, case: int, what: str, exc: BaseException, text: str) -> None:
    pytest.fail(f"seed {seed} case {case} ({what}): {type(exc).__name__}: {exc}\n--- document ---\n{text[:3000]}")


def test_fleet_file_reader_refuses_cleanly(tmp_path) -> None:
    seed, cases = fuzz_seed(), fuzz_cases()
    rng = random.Random(seed * 1009 + 1)
    base = yaml.safe_load(FLEET.read_text())
    load_fleet_file(FLEET)  # the example itself reads
    path = tmp_path / "fleet.yaml"
    refused = 0
    for case in range(cases):
        text = text_of(mutate(base, rng), rng)
        path.write_text(text, encoding="utf-8")
        try:
            fleet = load_fleet_file(path)
        except FleetFileError as exc:
            refused += 1
            assert str(exc), f"seed {seed} case {case}: an empty refusal"
            continue
        except Exception as exc:  # noqa: BLE001 - the finding
            _fail(seed, case, "fleet file", exc, text)
        try:
            validate_fleet(fleet)
        except InvalidArgument as exc:
            assert exc.field, f"seed {seed} case {case}: a refusal naming no field: {exc}"
        except Exception as exc:  # noqa: BLE001 - the finding
            _fail(seed, case, "validate_fleet", exc, text)
    assert refused > 0  # the harness does break documents


@pytest.mark.parametrize("source", ["scenario_mig.yaml", "whole-gpu"])
def test_scenario_file_reader_refuses_cleanly(tmp_path, source: str) -> None:
    seed, cases = fuzz_seed(), fuzz_cases()
    rng = random.Random(seed * 1013 + len(source))
    base = yaml.safe_load(SCENARIOS[0].read_text()) if source != "whole-gpu" else WHOLE_GPU_SCENARIO
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(base), encoding="utf-8")
    scenario_module.load(path)  # the base itself reads
    refused = 0
    for case in range(cases):
        text = text_of(mutate(base, rng), rng)
        path.write_text(text, encoding="utf-8")
        try:
            loaded = scenario_module.load(path)
        except scenario_module.ScenarioError as exc:
            refused += 1
            assert str(exc).startswith("scenario.yaml"), f"seed {seed} case {case}: {exc}"
            continue
        except Exception as exc:  # noqa: BLE001 - the finding
            _fail(seed, case, "scenario file", exc, text)
        for pool in loaded.pools:  # what it answers is usable: finite numbers
            for name, value in vars(pool).items():
                if isinstance(value, float):
                    assert math.isfinite(value), f"seed {seed} case {case}: pool {pool.name}.{name} = {value}"
    assert refused > 0
