"""Units of the engine emulator: tokenizer, block pool / prefix cache, scheduler (queueing, preemption)."""

from __future__ import annotations

import asyncio

import pytest
from greenserve.simulator.emulator.engine import EmulatedEngine, EngineRequest
from greenserve.simulator.emulator.faults import FaultState
from greenserve.simulator.emulator.metrics import EngineMetrics, FastHistogram
from greenserve.simulator.emulator.pacing import (
    EngineShape,
    StepTimer,
    load_perf_model,
    resolve_shape,
)
from greenserve.simulator.emulator.prefix_cache import BlockPool, block_hashes
from greenserve.simulator.emulator.tokenizer import filler_offset, filler_text, tokenize


def test_tokenizer_is_deterministic_and_bpe_like() -> None:
    assert tokenize("") == []
    assert len(tokenize("a b c")) == 3
    assert len(tokenize("internationalization")) == 4  # 20 characters, at most 6 per piece
    assert tokenize("Hello, world") == tokenize("Hello, world")
    english = "The quick brown fox jumps over the lazy dog. " * 20
    chars_per_token = len(english) / len(tokenize(english))
    assert 3.5 < chars_per_token < 5.0
    assert filler_offset(0) == 0 and filler_offset(7) == len(filler_text(0, 7))
    assert filler_offset(1000) == len(filler_text(0, 1000))


def test_block_hashes_chain_prefixes() -> None:
    a = block_hashes(list(range(40)), 16)
    b = block_hashes(list(range(32)) + [99] * 8, 16)
    c = block_hashes([7] + list(range(1, 40)), 16)
    assert len(a) == 2  # the partial third block has no hash
    assert a == b[:2]
    assert a[0] != c[0] and a[1] != c[1]  # a different first block changes every later hash


def test_block_pool_lru_eviction_and_dedup() -> None:
    pool = BlockPool(num_blocks=4, block_size_tokens=16)
    h = block_hashes(list(range(64)), 16)  # 4 blocks
    pool.take_new(2)
    assert pool.publish(h[0]) and pool.publish(h[1])
    assert pool.used_blocks == 2 and pool.usage == 0.5
    pool.release([h[0], h[1]], 0)
    assert pool.used_blocks == 0 and pool.cached_blocks == 2
    assert pool.cached_prefix_blocks(h, 4) == 2
    # taking 3 fresh blocks evicts one cached block: the tail (h[1]) goes first
    pool.take_new(3)
    assert pool.evictions == 1 and pool.cached_prefix_blocks(h, 4) == 1
    # a second request publishing an already cached hash returns its fresh block
    pool.hold_cached([h[0]])
    assert not pool.can_allocate([], 1)
    pool.release([h[0]], 3)
    pool.take_new(1)
    assert not pool.publish(h[0])  # h[0] was cached: our block goes back to the free pool
    assert pool.used_blocks == 1
    with pytest.raises(RuntimeError):
        pool.take_new(10)


def _engine(num_blocks: int, max_num_seqs: int = 8, batched: int = 8192) -> EmulatedEngine:
    profile, pm, name = load_perf_model(None)
    shape = resolve_shape(profile, pm, name, "m", None, num_blocks, batched)
    return EmulatedEngine(shape, StepTimer(pm), EngineMetrics("m"), FaultState(), time_scale=1e6, max_num_seqs=max_num_seqs)


async def _run_all(engine: EmulatedEngine, reqs: list[EngineRequest]) -> None:
    engine.start()
    for r in reqs:
        engine.add_request(r)
    while not all(r.finished for r in reqs):
        await asyncio.sleep(0.001)
    await engine.stop()


async def test_preemption_under_block_pressure_still_completes() -> None:
    engine = _engine(num_blocks=12)  # 192 tokens of KV for everyone
    reqs = [EngineRequest(f"r{i}", list(range(i * 100, i * 100 + 40)), max_tokens=60) for i in range(3)]
    await _run_all(engine, reqs)
    assert all(r.num_output_tokens == 60 and r.finish_reason == "length" for r in reqs)
    assert engine.metrics.num_preemptions > 0
    assert engine.pool.used_blocks == 0
    assert engine.metrics.generation_tokens == 180


async def test_chunked_prefill_and_ttft_grow_with_prompt() -> None:
    engine = _engine(num_blocks=4000, batched=512)
    short = EngineRequest("s", list(range(100)), max_tokens=1)
    await _run_all(engine, [short])
    engine2 = _engine(num_blocks=4000, batched=512)
    long = EngineRequest("l", list(range(3000)), max_tokens=1)
    await _run_all(engine2, [long])
    assert engine2.steps >= 6  # 3000 tokens in 512-token chunks
    assert long.first_token_s - long.arrival_s > short.first_token_s - short.arrival_s


def test_step_timer_uses_the_perf_models_one_step_cost() -> None:
    _, pm, _ = load_perf_model(None)
    timer = StepTimer(pm)
    assert timer.step([], 0, 0) == (0.0, pm.power_w(0.0))
    assert timer.step([], 8, 8000)[0] == pytest.approx(pm.decode_step_time_s(8, 8000))
    assert timer.step([(2000, 0)], 0, 0)[0] == pytest.approx(pm.prefill_time_s(2000, batch_size=1))
    assert timer.step([(512, 1024)], 0, 0)[0] == pytest.approx(pm.prefill_time_s(512, 1, 1024))
    # a mixed step is one forward pass: one roofline over the chunks and the decode batch (the weights
    # streamed once), exactly what the replay charges; less than a prefill step plus a decode step
    chunks = [(2000, 0), (300, 700)]
    flops = pm.prefill_flops(2000, 1, 0) + pm.prefill_flops(300, 1, 700)
    mixed, power_w = timer.step(chunks, 8, 8000)
    assert mixed == pytest.approx(pm.step_time_s(flops, 700, 8, 8000), rel=1e-12)
    mem_s, compute_s = pm.step_parts_s(flops, 700, 8, 8000)
    assert mixed == pytest.approx(pm.profile.step_overhead_s + max(mem_s, compute_s), rel=1e-12)
    assert max(pm.prefill_time_s(2000), pm.decode_step_time_s(8, 8000)) < mixed
    assert mixed < pm.prefill_time_s(2000) + pm.prefill_time_s(300, 1, 700) + pm.decode_step_time_s(8, 8000)
    assert pm.profile.idle_w < power_w <= pm.profile.max_w
    assert power_w == pytest.approx(pm.power_w(pm.step_utilisation(mem_s, compute_s)))


async def test_modelled_energy_counter_and_power_gauge() -> None:
    engine = _engine(num_blocks=4000)
    m = engine.metrics
    idle_w = engine.timer.idle_power_w
    assert m.engine_power_w == idle_w
    reqs = [EngineRequest(f"e{i}", list(range(i * 1000, i * 1000 + 500)), max_tokens=20) for i in range(3)]
    engine.start()
    e0, t0 = engine.energy_j(), engine.now_s()
    for r in reqs:
        engine.add_request(r)
    while not all(r.finished for r in reqs):
        await asyncio.sleep(0.001)
    e1, t1 = engine.energy_j(), engine.now_s()
    await engine.stop()
    # busy steps draw more than idle: the mean over the window is between idle and max power
    assert t1 > t0
    mean_w = (e1 - e0) / (t1 - t0)
    assert idle_w < mean_w <= engine.timer.step([(500, 0)], 0, 0)[1] + 1e-9
    text = m.registry()
    from prometheus_client import generate_latest

    body = generate_latest(text).decode()
    assert "greenserve:engine_energy_joules_total{" in body and "greenserve:engine_power_watts{" in body


def test_per_request_tpot_is_observed_when_a_request_finishes_as_vllm_observes_it() -> None:
    """vLLM's ``request_time_per_output_token_seconds``: one observation per finished request, (e2e - TTFT) /
    (tokens - 1), preemptions included, and 0 for a one-token request (vllm/v1/metrics/stats.py)."""
    engine = _engine(num_blocks=12)  # 192 tokens of KV: the three long requests preempt each other
    lengths = (1, 2, 7, 60, 60, 60)
    reqs = [EngineRequest(f"t{i}", list(range(i * 100, i * 100 + 40)), max_tokens=n) for i, n in enumerate(lengths)]
    engine.run_virtual([(0.001 * i, r) for i, r in enumerate(reqs)])
    m = engine.metrics
    assert all(r.finished for r in reqs) and m.num_preemptions > 0
    expected = FastHistogram(m.request_tpot.bounds)
    for r in reqs:
        e2e, ttft = r.last_token_s - r.arrival_s, r.first_token_s - r.arrival_s
        expected.observe((e2e - ttft) / (r.num_output_tokens - 1) if r.num_output_tokens > 1 else 0.0)
    assert m.request_tpot.count == len(reqs) == m.e2e.count
    assert m.request_tpot.counts == expected.counts and m.request_tpot.sum == pytest.approx(expected.sum, rel=1e-12)
    # a one-token request is a 0 there, not left out
    assert m.request_tpot.counts[0] >= 1


async def test_an_aborted_request_is_no_per_request_tpot_observation() -> None:
    """As its e2e latency, an aborted request's TPOT is not observed (vLLM's stats skip client aborts too)."""
    engine = _engine(num_blocks=4000)
    req = EngineRequest("a", list(range(50)), max_tokens=100_000)
    engine.start()
    engine.add_request(req)
    while req.num_output_tokens < 3:
        await asyncio.sleep(0.001)
    engine.abort(req)
    await engine.stop()
    m = engine.metrics
    assert m.request_success == {"abort": 1} and m.e2e.count == 0 and m.request_tpot.count == 0


def test_unknown_profile_lists_choices() -> None:
    with pytest.raises(KeyError, match="choices"):
        load_perf_model("no-such-profile")


def test_shape_caps_context_by_kv_pool() -> None:
    profile, pm, name = load_perf_model(None)
    shape: EngineShape = resolve_shape(profile, pm, name, None, 100_000, 10, None)
    assert shape.max_model_len_tokens == 160 and shape.served_model_name == profile.model


def test_fast_histogram_cumulative_family() -> None:
    h = FastHistogram((0.1, 1.0))
    h.observe(0.05)
    h.observe_many(0.5, 3)
    h.observe(5.0)
    assert h.count == 5 and h.sum == pytest.approx(0.05 + 1.5 + 5.0)
    fam = h.family("x_seconds", "doc", ["a"], ["b"])
    buckets = [(s.labels["le"], s.value) for s in fam.samples if s.name.endswith("_bucket")]
    assert buckets == [("0.1", 1), ("1.0", 4), ("+Inf", 5)]


async def test_pseudo_eos_is_deterministic_and_respects_min_tokens_and_ignore_eos() -> None:
    engine = _engine(num_blocks=1000)

    def req(rid: str, prompt: list[int], **kw: object) -> EngineRequest:
        return EngineRequest(rid, prompt, max_tokens=200, eos_probability=0.1, eos_seed=5, **kw)  # type: ignore[arg-type]

    a, b = req("a", [1, 2, 3]), req("b", [1, 2, 3])
    other = req("c", [4, 5, 6])
    held = req("d", [1, 2, 3], min_tokens=150)
    ignored = req("e", [1, 2, 3], ignore_eos=True)
    await _run_all(engine, [a, b, other, held, ignored])
    assert a.finish_reason == "stop" and a.num_output_tokens < 200
    assert b.num_output_tokens == a.num_output_tokens  # same prompt, same seed: same length
    assert held.num_output_tokens >= 150
    assert ignored.finish_reason == "length" and ignored.num_output_tokens == 200


@pytest.mark.parametrize(("prompt", "output", "rate_per_s"), [(160, 140, 16.0), (1495, 275, 8.0), (1495, 275, 16.0)])
def test_emulator_scheduler_in_virtual_time_agrees_with_the_replay(prompt: int, output: int, rate_per_s: float) -> None:
    """Both charge a step PerfModel.step_time_s: on the same Poisson arrivals (GreenLLM Table II's ShareGPT and
    LongBench P50 sizes, the profiler's agreement workloads) the emulator's scheduler, driven in virtual time,
    gives the replay's mean TTFT and TPOT on the profiler's agreement profile (with the emulator's former mixed-step
    cost, prefill step + decode extra, they were 4 % apart for ShareGPT and 10 % for LongBench at 16 req/s)."""
    import numpy as np
    from greenserve.simulator.replay import replay
    from greenserve.simulator.replay_fleet import EngineSpec as ReplayEngine
    from greenserve.simulator.replay_fleet import FleetConfig
    from greenserve.simulator.workloads import Workload

    n = 120
    arrivals = np.cumsum(np.random.default_rng(7).exponential(1.0 / rate_per_s, n)).tolist()
    profile_name = "llama3-8b@H100-80GB"
    result = replay(Workload("agreement", arrivals, [prompt] * n, [output] * n),
                    FleetConfig((ReplayEngine(profile_name),)))
    profile, pm, name = load_perf_model(profile_name)
    shape = resolve_shape(profile, pm, name, "m")
    engine = EmulatedEngine(shape, StepTimer(pm), EngineMetrics("m"), FaultState(), max_num_seqs=profile.max_num_seqs)
    reqs = [EngineRequest(f"v{i}", list(range(i * prompt, (i + 1) * prompt)), max_tokens=output, ignore_eos=True)
            for i in range(n)]
    engine.run_virtual(list(zip(arrivals, reqs)))
    assert all(r.finished and r.num_output_tokens == output for r in reqs)
    ttft = np.array([r.first_token_s - r.arrival_s for r in reqs])
    tpot = np.array([(r.last_token_s - r.first_token_s) / (output - 1) for r in reqs])
    assert ttft.mean() == pytest.approx(np.nanmean(result.ttft_s), rel=0.005)
    assert tpot.mean() == pytest.approx(np.nanmean(result.tpot_s), rel=0.005)
    # the histograms the profiler scrapes hold the same figures
    assert engine.metrics.ttft.sum / engine.metrics.ttft.count == pytest.approx(ttft.mean(), rel=1e-9)
    assert engine.metrics.request_tpot.sum / engine.metrics.request_tpot.count == pytest.approx(tpot.mean(), rel=1e-9)
    # modelled energy: idle power over the clock plus the steps' draw, as the replay's fleet energy
    assert engine.energy_j() == pytest.approx(result.fleet_energy_j, rel=0.005)
