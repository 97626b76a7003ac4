"""The seeds' headlines reproduced in their own settings: one module per seed, one table in the evaluation report.

Each module here exposes ``run(quick: bool = False) -> dict`` with the keys of ``REQUIRED_KEYS``: ``seed``,
``setting`` (the paper's own setting, as reproduced), ``paper`` (its figures, each with its section or table),
``ours`` (the same figures from greenserve), ``within_tolerance`` (bool) and ``notes`` (list of strings).
``HEADLINES`` names the modules; they are imported only when run, so a module that has not landed yet, or whose
imports fail, is reported as such and the others still run. A headline's parts may live in modules named after it
(``greencache_setting``, ``greencache_profile``, ``greencache_carbon``): they are not headlines.

``greenserve bench headlines [--quick] [--only a,b] [--json]`` runs them (``main``) and prints one JSON object on its
last line; ``greenserve evaluate`` puts the same table in its report (``--headlines``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from collections.abc import Mapping
from typing import Any

from greenserve.common.cli_parser import Parser

HEADLINES: dict[str, str] = {
    "greencache": "greenserve.evaluation.headlines.greencache",
    "greenllm": "greenserve.evaluation.headlines.greenllm",
    "clover": "greenserve.evaluation.headlines.clover",
}
REQUIRED_KEYS = ("seed", "setting", "paper", "ours", "within_tolerance", "notes")


class HeadlineError(ValueError):
    """A headline module returned something that is not the convention's dict (the message says what)."""


def landed(registry: Mapping[str, str] | None = None) -> list[str]:
    """The names whose module exists (without importing it)."""
    registry = HEADLINES if registry is None else registry
    out = []
    for name, module in registry.items():
        try:
            if importlib.util.find_spec(module) is not None:
                out.append(name)
        except ModuleNotFoundError:  # its package does not exist
            continue
    return out


def check(name: str, row: Any) -> dict[str, Any]:
    """``row`` if it follows the convention; ``HeadlineError`` naming the key otherwise."""
    if not isinstance(row, dict):
        raise HeadlineError(f"{name}: run() returned {type(row).__name__}, not a dict")
    missing = [k for k in REQUIRED_KEYS if k not in row]
    if missing:
        raise HeadlineError(f"{name}: run() result lacks {', '.join(missing)}")
    for key in ("paper", "ours"):
        if not isinstance(row[key], dict):
            raise HeadlineError(f"{name}: {key} must be a dict of figures")
    if not isinstance(row["within_tolerance"], bool):
        raise HeadlineError(f"{name}: within_tolerance must be true or false")
    if not isinstance(row["notes"], list) or not all(isinstance(n, str) for n in row["notes"]):
        raise HeadlineError(f"{name}: notes must be a list of strings")
    return row


def run_one(name: str, quick: bool = False, registry: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One headline: ``{"name", "status": "ok" | "failed" | "missing", "cpu_s", "wall_s", "result" | "error"}``.
    A module that fails (import, run or convention) is reported, never raised, so one seed cannot sink the table."""
    registry = HEADLINES if registry is None else registry
    if name not in registry:
        raise KeyError(f"headline {name!r} unknown; known: {', '.join(registry)}")
    if name not in landed(registry):
        return {"name": name, "status": "missing", "error": f"{registry[name]} has not landed"}
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        row = check(name, importlib.import_module(registry[name]).run(quick=quick))
    except Exception as exc:  # noqa: BLE001 - any failure of a seed's module is reported in its row
        return {"name": name, "status": "failed", "error": f"{type(exc).__name__}: {exc}"[:500],
                "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
    return {"name": name, "status": "ok", "result": row, "wall_s": time.perf_counter() - wall,
            "cpu_s": time.process_time() - cpu}


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):  # a figure with its citation, e.g. {"value": 0.15, "source": "Sec. 6.2"}
        return ", ".join(f"{k}: {_cell(v)}" for k, v in value.items())
    return str(value)


def table_rows(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Flat rows for a table: one per (seed, figure): seed, setting, figure, paper, ours, within tolerance."""
    out = []
    for row in rows:
        if row["status"] != "ok":
            out.append({"seed": row["name"], "setting": "", "figure": "", "paper": "", "ours": "",
                        "within_tolerance": row["status"] + ": " + row.get("error", "")})
            continue
        result = row["result"]
        figures = list(dict.fromkeys([*result["paper"], *result["ours"]]))
        for i, figure in enumerate(figures or [""]):
            out.append({"seed": str(result["seed"]) if i == 0 else "", "setting": _cell(result["setting"]) if i == 0 else "",
                        "figure": figure, "paper": _cell(result["paper"].get(figure, "")),
                        "ours": _cell(result["ours"].get(figure, "")),
                        "within_tolerance": ("yes" if result["within_tolerance"] else "no") if i == 0 else ""})
    return out


def main(argv: list[str], prog: str = "greenserve bench headlines") -> int:
    parser = Parser(prog=prog, description="the seeds' headlines reproduced in their own settings")
    parser.add_argument("--quick", action="store_true", help="each module's quick setting (tests, CI)")
    parser.add_argument("--only", help=f"comma-separated subset of {', '.join(HEADLINES)}")
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the last line is always JSON")
    ns = parser.parse_args(argv)
    names = list(HEADLINES)
    if ns.only is not None:
        names = [n.strip() for n in ns.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in HEADLINES]
        if unknown or not names:
            parser.error(f"--only: unknown {unknown or 'none given'}; known: {', '.join(HEADLINES)}")
    from greenserve.common.strict_json import dumps

    rows = []
    for name in names:
        print(f"{prog}: {name} ...", file=sys.stderr, flush=True)
        rows.append(run_one(name, quick=ns.quick))
        print(f"{prog}: {name}: {rows[-1]['status']}", file=sys.stderr, flush=True)
    for r in table_rows(rows):
        print(" | ".join(r.values()), file=sys.stderr)
    print(dumps({"quick": ns.quick, "headlines": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
