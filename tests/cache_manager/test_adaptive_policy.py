"""The adaptive LRU/LCS policy (adaptive.py), replayed (policies.py "Adaptive"): never below LRU where LCS misleads
itself, LCS's gain where reuse is skewed, both across a phase change. Small traces here; the shipped traces and
the bench's full shapes at the bench's capacities are the `slow` tests at the end (the figures:
`greenserve bench cache-policy`, docs/cache_manager.md)."""

from __future__ import annotations

import pytest

from greenserve.bench import cache_policies as policies
from greenserve.bench import cache_traces as traces
from greenserve.cache_manager import adaptive

CAPACITIES = (0.01, 0.05, 0.1, 0.25, 0.5)
#: Token hit rate the adaptive policy may lose to LRU (or to LCS where LCS wins) on a stationary trace.
TOL = 0.001
#: ... and on a trace whose better policy changes: each switch costs at most one turnover of the hits on the
#: entries the two policies disagree on (adaptive.py, "Guarantee").
TOL_SWITCH = 0.002


def _rates(trace: list[policies.Request] | policies.Compiled, capacity_blocks: int,
           names: tuple[str, ...] = ("LRU", "LCS", "Adaptive")) -> dict[str, float]:
    ct = trace if isinstance(trace, policies.Compiled) else policies.compile_trace(trace)
    return {p: policies.replay(ct, p, capacity_blocks) for p in names}


def _table(trace: list[policies.Request]) -> dict[float, dict[str, float]]:
    ct = policies.compile_trace(trace)
    return {f: _rates(ct, max(1, round(f * ct.n_blocks))) for f in CAPACITIES}


# ----- the duel's rule ------------------------------------------------------------------------------
def test_duel_lcs_needs_its_margin_lru_takes_back_at_once() -> None:
    d = adaptive.Duel(margin=0.5)
    assert d.leader == adaptive.LRU
    # LCS hits 140 where LRU hits 100 (40 % more on the disagreements): not enough.
    assert not d.observe(100, 0, 1, 10**9) and not d.observe(0, 140, 1, 10**9)
    assert d.name == "LRU"
    assert d.observe(0, 20, 1, 10**9)  # 160 > 1.5 x 100
    assert d.name == "LCS" and d.switches == 1
    assert not d.observe(50, 0, 1, 10**9)  # LRU 150 < LCS 160: LCS keeps the lead
    assert d.observe(20, 0, 1, 10**9) and d.name == "LRU" and d.switches == 2  # 170 > 160: back at once
    # Requests where both hit the same tokens are no evidence either way.
    assert not d.observe(500, 500, 1, 10**9) and d.won == [pytest.approx(170), pytest.approx(160)]


def test_duel_evidence_halves_every_half_life() -> None:
    d = adaptive.Duel(half_life_turnovers=2.0)
    d.observe(0, 100, 1, 1000)  # one half-life = 2 turnovers of a 1000-entry cache = 2000 references
    d.observe(0, 0, 2000, 1000)
    assert d.won[adaptive.LCS] == pytest.approx(50.0)
    assert d.earned[adaptive.LCS] == pytest.approx(50.0)
    with pytest.raises(ValueError):
        adaptive.Duel(half_life_turnovers=0)


# ----- replays on adversarial traces ----------------------------------------------------------------
def test_scan_loops_lru_beats_lcs_adaptive_keeps_lru() -> None:
    table = _table(traces.scan_loops(12, largest=1500))
    assert max(r["LRU"] - r["LCS"] for r in table.values()) > 0.03  # the shape is what it claims
    for f, r in table.items():
        assert r["Adaptive"] >= r["LRU"] - TOL, (f, r)
        assert r["Adaptive"] >= max(r["LRU"], r["LCS"]) - TOL, (f, r)


def test_zipf_scan_lcs_wins_adaptive_keeps_its_gain() -> None:
    table = _table(traces.zipf_scan(6000, n_documents=500))
    assert min(r["LCS"] - r["LRU"] for f, r in table.items() if f <= 0.25) > 0.004
    for f, r in table.items():
        assert r["Adaptive"] >= r["LRU"] - TOL, (f, r)
        if r["LCS"] > r["LRU"]:
            assert r["Adaptive"] >= r["LCS"] - TOL_SWITCH, (f, r)


def test_phase_change_follows_the_better_policy_each_phase() -> None:
    trace = traces.phase_change(3000, 8, n_documents=500, largest=1500)
    table = _table(trace)
    for f, r in table.items():
        assert r["Adaptive"] >= r["LRU"] - TOL_SWITCH, (f, r)
        assert r["Adaptive"] >= r["LCS"] - TOL_SWITCH, (f, r)
    # At 5 % each policy loses one phase: following the leader beats both.
    r = table[0.05]
    assert r["Adaptive"] > max(r["LRU"], r["LCS"]) + 0.002
    ct = policies.compile_trace(trace)
    leaders: list[int] = []
    policies._replay_adaptive(ct, round(0.05 * ct.n_blocks), trace_leader=leaders)
    first, second = 3000, len(trace) - 3000
    assert len(leaders) == len(trace)
    assert sum(leaders[first // 2:first]) / (first - first // 2) > 0.9  # LCS leads the skewed phase
    assert leaders[second - 1] == adaptive.LRU  # LRU by the end of the loops
    assert sum(leaders[second + 1500:]) / (len(trace) - second - 1500) > 0.9  # LCS again


def test_stale_hot_trace_pure_lcs_loses_adaptive_matches_lru() -> None:
    r = _rates(traces.stale_hot(epochs=2), 130)
    assert r["LCS"] < r["LRU"] - 0.2
    assert r["Adaptive"] >= r["LRU"] - TOL
    ct = policies.compile_trace(traces.stale_hot(epochs=2))
    leaders: list[int] = []
    policies._replay_adaptive(ct, 130, trace_leader=leaders)
    assert sum(leaders) / len(leaders) < 0.05  # LCS never earns the lead here


def test_multi_turn_where_lcs_is_below_lru() -> None:
    trace = traces.multi_turn(400)
    ct = policies.compile_trace(trace)
    r = _rates(ct, max(1, round(0.1 * ct.n_blocks)))
    assert r["LCS"] < r["LRU"]
    assert r["Adaptive"] >= r["LRU"] - TOL


def test_everything_fits_all_policies_equal() -> None:
    trace = traces.zipf_documents(0.4, 300, n_documents=50)
    ct = policies.compile_trace(trace)
    r = _rates(ct, ct.n_blocks)
    assert r["Adaptive"] == pytest.approx(r["LRU"]) and r["LCS"] == pytest.approx(r["LRU"])


def test_trace_shapes() -> None:
    mt = traces.multi_turn(50)
    assert any(len(set(a.blocks) & set(b.blocks)) for a, b in zip(mt, mt[1:])) or len(mt) > 50
    assert all(r.blocks for r in traces.stale_hot(epochs=1))
    z = traces.zipf_documents(0.7, 200, n_documents=20)
    assert len(z) == 200 and all(z[i].time_s <= z[i + 1].time_s for i in range(199))
    loops = traces.scan_loops(3, smallest=16, largest=17, reads=2, chunk=8)
    assert [r.blocks for r in loops[:4]] == [tuple(range(8)), tuple(range(8, 16)), tuple(range(8)),
                                             tuple(range(8, 16))]
    zs = traces.zipf_scan(500, n_documents=10)
    docs = [r for r in zs if max(r.blocks) < 40]
    scans = [r for r in zs if min(r.blocks) >= 40]
    assert len(docs) + len(scans) == 500 and len({r.blocks for r in scans}) == len(scans)
    pc = traces.phase_change(200, 2, n_documents=10, largest=40)
    assert all(pc[i].time_s < pc[i + 1].time_s for i in range(len(pc) - 1))
    with pytest.raises(ValueError, match="unknown trace shape"):
        traces.shape("nope")


def test_azure_conversations_chain_prompts() -> None:
    az = traces.azure_conversations()
    assert len(az) == 19366
    assert all(len(r.blocks) == max(1, -(-r.input_tokens // policies.BLOCK_TOKENS)) for r in az)
    seen: set[int] = set()
    continued = 0
    for r in az:
        continued += r.blocks[0] in seen
        seen.update(r.blocks)
    assert continued == 3498  # the docstring's figure: requests sharing a block with the request they continue


# ----- the bench's traces at the bench's capacities (minutes) ---------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", ["mooncake", "azure-conv", "scan-loops", "zipf-scan", "phase-change"])
def test_full_traces_adaptive_never_below_lru(name: str) -> None:
    from greenserve.bench.cache_manager import default_trace

    trace = {"mooncake": lambda: policies.load_trace(default_trace()),
             "azure-conv": traces.azure_conversations}.get(name, lambda: traces.shape(name))()
    tol = TOL_SWITCH if name == "phase-change" else TOL
    for f, r in _table(trace).items():
        assert r["Adaptive"] >= r["LRU"] - tol, (name, f, r)
        if name in ("zipf-scan", "azure-conv") and r["LCS"] > r["LRU"]:
            assert r["Adaptive"] >= r["LCS"] - TOL_SWITCH, (name, f, r)
