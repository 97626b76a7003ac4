"""What an operator decides on, per strategy of a grid's day: carbon, energy, the SLO attainment of the worst hour,
and how often the fleet changes (cache sizes; engines: how many are weighted, asleep, their serving modes and MIG
layouts), from the hour records of an evaluation (run.py)."""

from __future__ import annotations

from typing import Any

CACHE_KEYS = ("cache_bytes",)
ENGINE_KEYS = ("engines_weighted", "engines_asleep", "serving_modes", "mig_layout")
BASE = "base_full_cache"  # the static fleet the savings are measured against


def changes(hours: list[dict[str, Any]], keys: tuple[str, ...]) -> int:
    """Hours whose value of any of ``keys`` differs from the hour before's (the first hour is the start, no change)."""
    return sum(1 for before, now in zip(hours, hours[1:]) if any(before.get(k) != now.get(k) for k in keys))


def rows(by_strategy: dict[str, Any], base: str = BASE) -> list[dict[str, Any]]:
    """One row per strategy: carbon (kg) and its saving against ``base``, energy (kWh), the worst hour's SLO
    attainment and that hour, and the changes of the cache and of the engines over the hours replayed."""
    base_g = by_strategy.get(base, {}).get("totals", {}).get("total_g")
    out = []
    for strategy, body in by_strategy.items():
        hours, totals = body["hours"], body["totals"]
        worst = min(range(len(hours)), key=lambda i: hours[i]["attainment_fraction"], default=None)
        out.append({
            "strategy": strategy,
            "carbon_kg": totals["total_g"] / 1000,
            "saved_fraction": (1 - totals["total_g"] / base_g) if base_g else None,
            "energy_kwh": totals["energy_kwh"],
            "worst_attainment_fraction": hours[worst]["attainment_fraction"] if worst is not None else None,
            "worst_hour": hours[worst].get("hour", worst) if worst is not None else None,
            "cache_changes": changes(hours, CACHE_KEYS),
            "engine_changes": changes(hours, ENGINE_KEYS),
            "accuracy_loss_fraction": totals.get("accuracy_loss_fraction", 0.0),
        })
    return out
