"""Routing policy (filters, scorers, fallbacks) and engine health/energy bookkeeping, without I/O."""

from __future__ import annotations

import time

import pytest
from greenserve.router.routing.enforcer import ActivePlan
from greenserve.router.routing.engines import EngineRegistry, EngineState, HealthPolicy
from greenserve.router.routing.policy import NoEngineError, PolicyConfig, RoutingPolicy
from greenserve.router.routing.prefix_index import PrefixIndex
from greenserve.v1 import common_pb2


def _setup(n: int = 3, **policy) -> tuple[EngineRegistry, RoutingPolicy, ActivePlan]:
    registry = EngineRegistry(HealthPolicy(eject_after_failures=2, eject_base_s=1.0, eject_max_s=4.0))
    for i in range(n):
        registry.upsert(EngineState(id=f"e{i}", url=f"http://h{i}", pool="p", model="m"))
    index = PrefixIndex(1 << 20)
    for e in registry.engines:
        index.add_engine(e)
    plans = ActivePlan(None)
    return registry, RoutingPolicy(registry, index, plans, PolicyConfig(**policy)), plans


def _plan(version: int, weights: dict[str, float]) -> common_pb2.Plan:
    interval = common_pb2.PlanInterval(routing_weights=[
        common_pb2.RoutingWeight(pool="p", engine_id=e, weight=w) for e, w in weights.items()])
    return common_pb2.Plan(version=version, intervals=[interval])


def test_fewest_awaiting_first_token_wins_and_ties_rotate() -> None:
    registry, policy, _ = _setup()
    for e, (in_flight, prefilling) in {"e0": (5, 2), "e1": (5, 1), "e2": (9, 0)}.items():
        registry.engines[e].in_flight, registry.engines[e].prefilling = in_flight, prefilling
    # e2 has the most requests in flight but none queued for prefill: a new one starts soonest there
    d = policy.choose("p", "", [], explain=True)
    assert d.engine.id == "e2" and "queue_load=0" in d.reason
    registry.engines["e2"].prefilling = 1
    # decoding requests do not count by default: e1 and e2 tie on one queued prefill each and rotate
    assert {policy.choose("p", "", []).engine.id for _ in range(6)} == {"e1", "e2"}


def test_decoding_requests_count_with_their_weight_and_the_load_bound() -> None:
    registry, policy, _ = _setup(decode_load_weight=0.5)
    registry.engines["e0"].in_flight = 4  # 4 decoding x 0.5 = 2 > e1's one queued prefill
    registry.engines["e1"].in_flight, registry.engines["e1"].prefilling = 1, 1
    registry.engines["e2"].in_flight = 3  # 1.5
    assert policy.choose("p", "", []).engine.id == "e1"
    registry, policy, _ = _setup()
    registry.engines["e0"].in_flight = 40  # nothing queued, but far above max(1.25 x mean, mean + 8)
    assert "e0" not in {policy.choose("p", "", []).engine.id for _ in range(6)}


def test_prefix_affinity_until_the_load_bound() -> None:
    registry, policy, _ = _setup()
    hashes = list(range(1, 21))
    policy.index.insert("e1", hashes)
    d = policy.choose("p", "", hashes, explain=True)
    assert d.engine.id == "e1" and d.matched_blocks == 20 and "prefix=20/20" in d.reason
    registry.engines["e1"].in_flight = 40  # hot spot: far above the bound max(1.25 x mean, mean + 8)
    assert policy.choose("p", "", hashes).engine.id != "e1"


def test_session_sticks_with_bounded_load() -> None:
    registry, policy, _ = _setup()
    first = policy.choose("p", "", [], session_key="s1").engine.id
    registry.engines[first].in_flight = 3  # a little busier: still sticky
    assert policy.choose("p", "", [], session_key="s1").engine.id == first
    registry.engines[first].in_flight = 50  # over the bound: moves, and sticks to the new one
    moved = policy.choose("p", "", [], session_key="s1").engine.id
    assert moved != first
    registry.engines[first].in_flight = 0
    assert policy.choose("p", "", [], session_key="s1").engine.id == moved


def test_plan_weights_steer_and_zero_excludes_with_fail_open() -> None:
    _, policy, plans = _setup()
    assert plans.apply(_plan(3, {"e0": 0.0, "e1": 1.0, "e2": 0.2}))
    chosen = [policy.choose("p", "", []).engine.id for _ in range(5)]
    assert set(chosen) == {"e1"} and policy.choose("p", "", []).plan_version == 3
    assert plans.apply(_plan(4, {"e0": 0.0, "e1": 0.0, "e2": 0.0}))
    d = policy.choose("p", "", [])
    assert "plan_excludes_all" in d.fallbacks  # fail-open: route rather than refuse
    assert not plans.apply(_plan(2, {"e0": 1.0}))  # older: ignored


def test_unavailable_cases_and_ejected_fallback() -> None:
    registry, policy, _ = _setup(2)
    with pytest.raises(NoEngineError):
        policy.choose("other-pool", "", [])
    now = time.monotonic()
    for e in registry.engines.values():
        registry.record_failure(e, now, "x")
        registry.record_failure(e, now, "x")
        assert e.ejected_until > now
    d = policy.choose("p", "", [])  # all ejected: the one back soonest is tried
    assert "all_ejected" in d.fallbacks
    for e in registry.engines.values():
        e.draining = True
    with pytest.raises(NoEngineError):
        policy.choose("p", "", [])
    with pytest.raises(NoEngineError):
        policy.choose("p", "", [], exclude={"e0", "e1"})


def test_ejection_backoff_doubles_and_half_open_recovers() -> None:
    registry, _, _ = _setup(1)
    e = registry.engines["e0"]
    now = 1000.0
    registry.record_failure(e, now, "x")
    assert not e.ejected_until  # one failure does not eject (threshold 2)
    registry.record_failure(e, now, "x")
    assert e.ejected_until == now + 1.0 and not e.routable(now + 0.5)
    assert e.routable(now + 1.5)  # half-open: one trial allowed
    registry.record_failure(e, now + 1.5, "trial failed")
    assert e.ejected_until == now + 1.5 + 2.0  # re-ejected at once, backoff doubled
    registry.record_failure(e, now + 4, "x")
    registry.record_failure(e, now + 9, "x")
    assert e.ejected_until - (now + 9) == 4.0  # capped at eject_max_s
    registry.record_success(e)
    assert not e.ejected_until and e.consecutive_failures == 0 and e.eject_count == 0


def test_energy_accumulator_shares_power_among_concurrent_requests() -> None:
    e = EngineState(id="e", url="http://x", pool="p", model="m", busy_power_w=400.0)
    e._acc_t = 0.0
    a0 = e.start_request(0.0, 256)  # A alone for 1 s, then with B for 2 s
    b0 = e.start_request(1.0, 256)
    a1 = e.end_request(3.0, 256)
    b1 = e.end_request(4.0, 256)
    energy_a = a1[0] - a0[0]
    energy_b = b1[0] - b0[0]
    assert energy_a == pytest.approx(400 * 1 + 200 * 2)
    assert energy_b == pytest.approx(200 * 2 + 400 * 1)
    assert energy_a + energy_b == pytest.approx(400 * 4)  # all the engine's energy, none twice
    assert (a1[1] - a0[1]) / 3.0 == pytest.approx(5 / 3)  # mean batch over A's lifetime


def test_stale_metrics_fall_back_to_own_in_flight() -> None:
    e = EngineState(id="e", url="http://x", pool="p", model="m")
    e.in_flight = 2
    e.running, e.waiting, e.in_flight_at_scrape, e.metrics_at = 10, 5, 2, 100.0
    assert e.load(100.5, 2.0) == 2 + 13  # others' requests seen in fresh metrics
    assert e.load(103.0, 2.0) == 2  # stale: only what the router knows
    assert e.state(103.0, 2.0) == common_pb2.ENGINE_STATE_STALE


def test_success_sent_before_the_ejection_does_not_close_the_circuit() -> None:
    """A reply already on the wire when the engine failed (a buffered first token) is stale: only a
    trial sent after the ejection closes the circuit."""
    registry, _, _ = _setup(1)
    e = registry.engines["e0"]
    now = 1000.0
    registry.record_failure(e, now, "x")
    registry.record_failure(e, now + 0.1, "x")
    assert e.ejected_until == now + 0.1 + 1.0
    registry.record_success(e, started_at=now - 0.5)  # sent before the failures
    assert e.ejected_until == now + 0.1 + 1.0 and e.eject_count == 1
    registry.record_success(e, started_at=now + 1.2)  # the half-open trial
    assert not e.ejected_until and e.consecutive_failures == 0


def test_loads_gives_load_and_queue_load_at_once() -> None:
    """EngineState.loads (what the policy reads per candidate) equals (load, queue_load) in every state:
    fresh or stale metrics, other clients' requests running or waiting, any decode weight."""
    import random

    rnd = random.Random(3)
    for _ in range(2000):
        e = EngineState(id="e", url="http://e", pool="p", model="m")
        now = 100.0
        e.in_flight = rnd.randint(0, 20)
        e.prefilling = rnd.randint(0, e.in_flight)
        e.metrics_at = rnd.choice([0.0, now - 0.5, now - 5.0])
        e.running, e.waiting = rnd.uniform(0, 30), rnd.choice([0.0, rnd.uniform(0, 10)])
        e.in_flight_at_scrape, e.prefilling_at_scrape = rnd.randint(0, 20), rnd.randint(0, 5)
        weight = rnd.choice([0.0, 0.25, 1.0])
        assert e.loads(now, 2.0, weight) == (e.load(now, 2.0), e.queue_load(now, 2.0, weight))
    e.in_flight, e.prefilling, e.metrics_at, e.running, e.waiting = 3, 1, now, 6.0, 2.0
    e.in_flight_at_scrape, e.prefilling_at_scrape = 3, 1
    # others' requests: 6 + 2 - 3 = 5, of them 2 - 1 = 1 waiting; decoding: 2 own + 4 others'
    assert e.loads(now, 2.0, 0.5) == (3 + 5.0, 1 + 1.0 + 0.5 * 6.0)
