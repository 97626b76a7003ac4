"""Fidelity of the simulator against published numbers it was not fitted on.

``fidelity_rows()`` recomputes every comparison from the model and the replay (deterministic seeds), and
``render_markdown()`` prints the table that docs/simulator.md carries, so the table is reproducible:

    .venv/bin/python -m greenserve.simulator.fidelity

No parameter of data/profiles.toml was tuned to any row below (the synthetic ShareGPT-like workload's turn
count was chosen to match GreenCache's context-length statistic, Fig. 4: 77.2 % of prompts > 1,000 tokens;
that shapes the workload, not the model). Where a paper gives a bound or an SLO instead of a value, the row
is a check (``kind = "bound"``) and the relative error column shows the margin.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np
from greenserve.common.cli_parser import Parser
from greenserve.simulator.engine_profile import load_profile
from greenserve.simulator.perf_model import PerfModel
from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import EngineSpec, FleetConfig
from greenserve.simulator.workloads import (
    load_mooncake_jsonl,
    multi_turn_workload,
    trace_path,
)

__all__ = ["FidelityRow", "fidelity_rows", "main", "render_markdown"]


@dataclass(frozen=True)
class FidelityRow:
    """One comparison: ``model`` vs ``published`` (same unit), with where the number comes from."""

    source: str
    quantity: str
    setup: str
    published: float
    model: float
    unit: str
    kind: str = "value"  # "value": relative error; "bound": published is an upper/lower bound or SLO
    bound: str = ""      # for kind == "bound": "<=" (model must not exceed) or ">=" (model must reach)
    before: float | None = None  # the earlier model's value (reload latency hidden behind queueing) (None: unchanged or new row)

    @property
    def relative_error(self) -> float:
        """``model / published - 1`` (for a bound: the margin, negative = inside the bound for '<=')."""
        if self.published == 0:
            return math.nan
        return self.model / self.published - 1.0

    @property
    def holds(self) -> bool | None:
        """For a bound row: whether the model satisfies it; None for value rows."""
        if self.kind != "bound":
            return None
        return self.model <= self.published if self.bound == "<=" else self.model >= self.published


def _greencache_rows() -> list[FidelityRow]:
    profile = "llama3-70b-int8@4xL40"
    pm = PerfModel(load_profile(profile))
    # ShareGPT-like multi-turn chat: 8k context window (GreenCache Sec. 6.1); mean_turns=6 gives 75 % of prompts
    # over 1,000 tokens (GreenCache Fig. 4: 77.2 %).
    light = multi_turn_workload(60, 0.05, seed=1, mean_turns=6)
    unloaded = float(np.mean([pm.prefill_time_s(p) for p in light.prompt_tokens]))
    nocache = replay(light, FleetConfig((EngineSpec(profile, prefix_caching=False),)))
    cached_fleet = FleetConfig((EngineSpec(profile, disk_capacity_tokens=50_000_000, prefix_caching=False),))
    cached = replay(light, cached_fleet)
    disk_hits = cached.hit_disk_tokens[cached.hit_disk_tokens > 0]
    load_s = float(np.mean([pm.load_time_s(int(h), "disk") for h in disk_hits])) if len(disk_hits) else math.nan
    kv_tb = pm.kv_bytes(1000) * 1e6 / 1e12
    setup = "Llama-3 70B INT8, 4x L40, ShareGPT-like multi-turn (8k window)"
    return [
        # the published 1.7 s is measured under GreenCache's load (queueing included): the unloaded prefill
        # alone must not exceed it
        FidelityRow("GreenCache Sec. 2.2", "mean TTFT, no cache, unloaded (prefill only)", setup, 1.7, unloaded, "s",
                    "bound", "<=", before=1.89),
        FidelityRow("GreenCache Sec. 2.2", f"mean TTFT, no cache, replay at {len(light) / light.duration_s:.2f} prompts/s "
                    "(queueing included)", setup,
                    1.7, float(np.nanmean(nocache.ttft_s)), "s", before=3.41),
        FidelityRow("GreenCache Sec. 2.2", "mean KV load time of the cached context (SSD tier)", setup, 0.03, load_s, "s"),
        FidelityRow("GreenCache Sec. 2.2", "KV size of a 1,000-token context x 1M prompts (paper: 'more than 300 TB')",
                    "Llama-3 70B, BF16 KV", 300.0, kv_tb, "TB", "bound", ">="),
    ]


def _kareto_rows() -> list[FidelityRow]:
    # Kareto Table 1 (clean rows of the OCR text; the 350 MB/s and 1 GB/s rows are unreadable in the seed)
    published_ms = {5: 2995.42, 20: 1915.50, 40: 1787.81, 60: 1757.50, 100: 1744.31}
    trace = load_mooncake_jsonl(trace_path("mooncake"))
    base = load_profile("llama3-8b@H100-80GB")
    mean_ttft: dict[int, float] = {}
    for bw in published_ms:
        profile = base.with_overrides(dram_bandwidth_bytes_per_s=bw * 1e9)
        # Kareto's simulator, like LMCache, loads every hit when the request is scheduled (reuse_rule "always")
        spec = EngineSpec(profile, dram_capacity_tokens=4_000_000, reuse_rule="always")
        fleet = FleetConfig(tuple(spec for _ in range(4)), policy="prefix_affinity")
        mean_ttft[bw] = float(np.nanmean(replay(trace, fleet).ttft_s))
    setup = "Mooncake conversation hour, 4x Llama-3 8B H100, DRAM tier 4M tokens/engine, every hit loaded"
    # the earlier model's figures: the latency rule (reloads hidden behind queueing)
    before = {5: 1.11, 20: 1.03, 40: 1.01, 60: 0.996}
    rows = [FidelityRow("Kareto Table 1", f"mean TTFT at {bw} GB/s / mean TTFT at 100 GB/s", setup,
                        published_ms[bw] / published_ms[100], mean_ttft[bw] / mean_ttft[100], "ratio",
                        before=before[bw])
            for bw in (5, 20, 40, 60)]
    rows.append(FidelityRow("Kareto Table 1", "mean TTFT at 100 GB/s DRAM bandwidth (absolute; Kareto's engine and "
                            "trace differ)", setup, published_ms[100] / 1000.0, mean_ttft[100], "s", before=1.68))
    return rows


def _storellm_rows() -> list[FidelityRow]:
    pm = PerfModel(load_profile("llama3-8b@A100-80GB"))
    ratio = pm.load_time_s(10_000, "disk") / pm.load_time_s(10_000, "dram")
    rows = [FidelityRow("StoreLLM Table 6", "per-token KV read time SSD / DRAM (Llama: 0.779 ms / 0.079 ms)",
                        "Llama-3 8B, A100 PCIe Gen4 host link vs one Gen4 NVMe", 0.779 / 0.079, ratio, "ratio")]
    # StoreLLM's read-or-recompute rule (reuse_rule "energy", Algorithm 1) on a prompt whose whole context is on a
    # storage tier slower than recomputing it (StoreLLM's setting: SSD reads slower than the GPU), under a delay
    # budget below and above the all-read time (Appendix E, Fig. 8: t_max 10 s vs 20 s).
    slow = PerfModel(load_profile("llama3-8b@A100-80GB").with_overrides(disk_bandwidth_bytes_per_s=2.7e8,
                                                                        disk_latency_s=8e-3))
    n = 1024  # Fig. 8: Wikitext prompts of 1,024 tokens on average
    cached = n - 1
    read_s = slow.load_time_s(cached, "disk")
    compute_all_s = slow.prefill_time_s(n)
    tight = slow.plan_prefix_reuse(0, 0, cached, n, 0.0, "energy", delay_budget_s=0.5 * (read_s + compute_all_s))
    loose = slow.plan_prefix_reuse(0, 0, cached, n, 0.0, "energy", delay_budget_s=2.0 * (read_s + compute_all_s))
    e_compute = compute_all_s * slow.power_w(1.0)
    e_read = loose.load_s * slow.power_w(0.0) + slow.prefill_time_s(loose.recompute_tokens, 1, cached) * slow.power_w(1.0)
    setup = (f"Llama-3 8B on one A100, 1,024-token prompt cached on a 270 MB/s disk (read {read_s:.2f} s > recompute "
             f"{compute_all_s:.2f} s), reuse rule 'energy'")
    rows += [
        FidelityRow("StoreLLM App. E Fig. 8", "share of the prompt recomputed, delay budget below the all-read time "
                    "('all the tokens are required to be computed')", setup, 1.0, tight.recompute_tokens / n, "ratio"),
        FidelityRow("StoreLLM App. E Fig. 8", "share of the cached tokens read, budget above the all-read time "
                    "('reading all tokens from storage')", setup, 1.0, loose.used_disk_tokens / cached, "ratio"),
        FidelityRow("StoreLLM App. E Fig. 8", "energy saved by reading all vs computing all (StoreLLM replaces only the "
                    "KVQ linear layers: 28.76 %; a KV-cache read skips the whole prefill of the token)", setup,
                    28.76, 100.0 * (1.0 - e_read / e_compute), "%", "bound", ">="),
    ]
    return rows


def _greenllm_rows() -> list[FidelityRow]:
    pm = PerfModel(load_profile("llama2-7b@A100-40GB"))
    # GreenLLM Table II: SLOs and P50 (input, output) sizes; the Standalone A100 baseline meets them at low QPS
    table = {"ShareGPT": (0.200, 0.080, 160, 140), "HumanEval": (0.125, 0.200, 136, 55),
             "LongBench": (15.0, 0.150, 1495, 275)}
    rows = []
    for name, (ttft_slo, tpot_slo, n_in, n_out) in table.items():
        ttft, tpot = pm.unloaded_request_s(n_in, n_out)
        setup = f"Llama-2 7B on one A100-40GB, {name} P50 request ({n_in}, {n_out}), unloaded"
        rows.append(FidelityRow("GreenLLM Table II", f"{name} TTFT within SLO", setup, ttft_slo, ttft, "s", "bound", "<="))
        rows.append(FidelityRow("GreenLLM Table II", f"{name} TPOT within SLO", setup, tpot_slo, tpot, "s", "bound", "<="))
    return rows


def fidelity_rows(include_trace_rows: bool = True) -> list[FidelityRow]:
    """All comparisons; ``include_trace_rows=False`` skips the Kareto rows (they replay the Mooncake hour 5x)."""
    rows = _greencache_rows()
    if include_trace_rows:
        rows += _kareto_rows()
    rows += _storellm_rows()
    rows += _greenllm_rows()
    return rows


def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:.3g}"
    return f"{x:.3g}"


def render_markdown(rows: list[FidelityRow]) -> str:
    """The fidelity table in Markdown (as in docs/simulator.md)."""
    lines = ["| source | quantity | setup | published | model | unit | relative error | earlier model |",
             "|---|---|---|---:|---:|---|---:|---:|"]
    for r in rows:
        if r.kind == "bound":
            verdict = "holds" if r.holds else "VIOLATED"
            err = f"{verdict} (model {r.bound} published; {r.relative_error:+.0%})"
        else:
            err = f"{r.relative_error:+.1%}"
        before = "" if r.before is None else _fmt(r.before)
        lines.append(f"| {r.source} | {r.quantity} | {r.setup} | {_fmt(r.published)} | {_fmt(r.model)} | {r.unit} | {err} "
                     f"| {before} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the fidelity table (Markdown)."""
    Parser(prog="python -m greenserve.simulator.fidelity", description="the simulator's fidelity table against "
           "published numbers it was not fitted on, recomputed and printed as Markdown (docs/simulator.md)",
           ).parse_args(argv)
    print(render_markdown(fidelity_rows()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
