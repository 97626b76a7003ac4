"""The routing policy's filters and scorers as parts (routing/filters.py, routing/scorers.py), and the decisions
they make together, pinned over many random registry states."""

from __future__ import annotations

import hashlib
import random
import time

from greenserve.router.routing.choice import Choice
from greenserve.router.routing.enforcer import ActivePlan
from greenserve.router.routing.engines import EngineRegistry, EngineState, HealthPolicy
from greenserve.router.routing.filters import AvailabilityFilter, BoundedLoadFilter, PlanFilter
from greenserve.router.routing.policy import NoEngineError, PolicyConfig, RoutingPolicy
from greenserve.router.routing.prefix_index import PrefixHashes, PrefixIndex, chain_hashes
from greenserve.router.routing.scorers import (
    AffinityScorer,
    LoadScorer,
    PlanScorer,
    PrefixScorer,
    SessionScorer,
)
from greenserve.v1 import common_pb2


def _engines(n: int) -> list[EngineState]:
    return [EngineState(id=f"e{i}", url=f"http://h{i}", pool="p", model="m") for i in range(n)]


def _choice(engines: list[EngineState], hashes: list[int] | None = None) -> Choice:
    return Choice("p", hashes or [], frozenset(), time.monotonic(), list(engines), 10.0, 0.0)


def _plan(version: int, weights: dict[str, float]) -> common_pb2.Plan:
    interval = common_pb2.PlanInterval(routing_weights=[
        common_pb2.RoutingWeight(pool="p", engine_id=e, weight=w) for e, w in weights.items()])
    return common_pb2.Plan(version=version, intervals=[interval])


def test_the_policy_is_built_from_its_config() -> None:
    config = PolicyConfig(plan_weight=0.5, load_weight=1.5, prefix_weight=2.5, session_weight=7.0,
                          affinity_weight=4.0, affinity_queue_slack=2.0, bounded_load_factor=1.5,
                          bounded_load_slack=3.0)
    policy = RoutingPolicy(EngineRegistry(HealthPolicy()), PrefixIndex(), ActivePlan(), config)
    assert [type(f) for f in policy.filters] == [AvailabilityFilter, PlanFilter, BoundedLoadFilter]
    assert [(type(s), s.weight) for s in policy.scorers] == [
        (LoadScorer, 1.5), (PlanScorer, 0.5), (PrefixScorer, 2.5), (SessionScorer, 7.0), (AffinityScorer, 4.0)]
    bounded = policy.filters[2]
    assert isinstance(bounded, BoundedLoadFilter) and (bounded.factor, bounded.slack) == (1.5, 3.0)


def test_availability_drops_draining_asleep_and_tried_engines_and_falls_back_to_the_soonest_ejected() -> None:
    engines = _engines(4)
    engines[0].draining = True
    engines[1].sleep_hold = True
    choice = _choice(engines)
    choice.exclude = {"e2"}
    AvailabilityFilter().apply(choice)
    assert [e.id for e in choice.live] == ["e3"] and choice.fallbacks == []
    now = time.monotonic()
    engines[2].ejected_until, engines[3].ejected_until = now + 50, now + 20
    choice = _choice(engines)
    AvailabilityFilter().apply(choice)
    assert [e.id for e in choice.live] == ["e3"] and choice.fallbacks == ["all_ejected"]
    engines[3].probe_in_flight = engines[2].probe_in_flight = True  # each already has its one trial
    choice = _choice(engines)
    AvailabilityFilter().apply(choice)
    assert choice.live == []


def test_the_plan_filter_drops_weight_zero_and_fails_open_when_the_plan_weighs_all_zero() -> None:
    plans = ActivePlan()
    plans.apply(_plan(1, {"e0": 0.0, "e1": 2.0}))  # e2 unnamed: the mean weight, 1.0
    choice = _choice(_engines(3))
    PlanFilter(plans).apply(choice)
    assert [e.id for e in choice.live] == ["e1", "e2"]
    assert choice.plan_version == 1 and choice.unnamed_weight == 1.0
    plans.apply(_plan(2, {"e0": 0.0, "e1": 0.0, "e2": 0.0}))
    choice = _choice(_engines(3))
    PlanFilter(plans).apply(choice)
    assert len(choice.live) == 3 and choice.fallbacks == ["plan_excludes_all"]


def test_the_bounded_load_filter_narrows_the_measured_loads_with_the_engines() -> None:
    engines = _engines(3)
    engines[0].in_flight, engines[0].prefilling = 30, 4
    engines[1].in_flight, engines[1].prefilling = 2, 1
    choice = _choice(engines)
    BoundedLoadFilter(1.25, 8.0).apply(choice)
    assert [e.id for e in choice.live] == ["e1", "e2"]
    assert choice.loads == [2.0, 0.0] and choice.queue == [1.0, 0.0]  # e0's loads left with it
    for e in engines:
        e.in_flight = 40
    choice = _choice(engines)
    BoundedLoadFilter(1.0, 0.0).apply(choice)  # all at the mean: none over the bound, none dropped
    assert len(choice.live) == 3 and choice.fallbacks == []


def test_scorers_add_their_weight_times_a_score_in_0_to_1() -> None:
    engines = _engines(3)
    choice = _choice(engines, list(range(1, 11)))
    choice.measure_loads()
    choice.queue = [0.0, 1.0, 3.0]
    choice.min_queue = 0.0
    choice.matches = {"e1": 10, "e2": 5}
    choice.sticky = "e2"
    totals = [0.0, 0.0, 0.0]
    LoadScorer(2.0).add(choice, totals)
    assert totals == [2.0, 1.0, 0.5]
    PrefixScorer(3.0).add(choice, totals)
    assert totals == [2.0, 4.0, 2.0]
    SessionScorer(10.0).add(choice, totals)
    PlanScorer(1.0).add(choice, totals)  # no plan: 1 for every engine
    assert totals == [3.0, 5.0, 13.0]


def test_the_affinity_target_counts_as_holding_its_key_for_the_prefix_scorer() -> None:
    engines = _engines(4)
    hashes = PrefixHashes(range(1, 9), affinity_key=12345, affinity_blocks=4, conversation=True)
    choice = _choice(engines, hashes)
    choice.measure_loads()
    affinity = AffinityScorer(3.0, 3.0)
    affinity.prepare(choice)
    target = choice.target
    assert target is not None and choice.live[choice.target_index] is target
    totals = [0.0] * 4
    PrefixScorer(2.0).add(choice, totals)
    affinity.add(choice, totals)
    assert totals[choice.target_index] == 2.0 * 4 / 8 + 3.0 and sum(totals) == totals[choice.target_index]
    # a target whose queue is too long is skipped
    choice = _choice(engines, hashes)
    choice.measure_loads()
    choice.queue[engines.index(target)] = 10.0
    affinity.prepare(choice)
    assert choice.target is None and choice.fallbacks == ["affinity_busy"]


def test_loads_match_load_and_queue_load_from_others() -> None:
    rnd = random.Random(7)
    now = time.monotonic()
    for _ in range(2000):
        e = EngineState(id="e", url="u", pool="p", model="m")
        e.in_flight = rnd.randint(0, 20)
        e.prefilling = rnd.randint(0, e.in_flight)
        e.metrics_at = rnd.choice([0.0, now, now - 100.0])
        e.running, e.waiting = rnd.choice([0.0, 3.0, 30.0]), rnd.choice([0.0, 2.0, 9.0])
        e.in_flight_at_scrape, e.prefilling_at_scrape = rnd.randint(0, 20), rnd.randint(0, 5)
        weight = rnd.choice([0.0, 0.5])
        load, queue = e.loads(now, 10.0, weight)
        assert load == e.load(now, 10.0)
        others = e.others(now, 10.0)
        waiting = min(others, max(0.0, e.waiting - e.prefilling_at_scrape)) if others else 0.0
        assert queue == e.prefilling + waiting + weight * (e.in_flight - e.prefilling + others - waiting)


def decisions(rounds: int, seed: int = 11) -> tuple[int, str]:
    """Runs ``rounds`` random registries (engines draining, asleep, ejected, loaded, with and without a plan,
    cached prefixes, sessions, exclusions, explanations) through the policy; the count of decisions and a
    digest of every decision and error."""
    rnd = random.Random(seed)
    digest = hashlib.sha256()
    count = 0
    for _ in range(rounds):
        n = rnd.choice([1, 2, 3, 4, 8])
        config = PolicyConfig() if rnd.random() < 0.5 else PolicyConfig(
            plan_weight=rnd.choice([0.0, 1.0, 2.5]), load_weight=rnd.choice([0.0, 2.0, 1.3]),
            prefix_weight=rnd.choice([0.0, 3.0, 0.7]), session_weight=rnd.choice([0.0, 10.0]),
            affinity_weight=rnd.choice([0.0, 3.0]), affinity_queue_slack=rnd.choice([0.0, 3.0]),
            decode_load_weight=rnd.choice([0.0, 0.5]), bounded_load_slack=rnd.choice([0.0, 8.0]))
        registry = EngineRegistry(HealthPolicy())
        index = PrefixIndex(1 << 20)
        engines = _engines(n)
        for e in engines:
            registry.upsert(e)
            index.add_engine(e)
        plans = ActivePlan(None)
        policy = RoutingPolicy(registry, index, plans, config)
        now = time.monotonic()
        for e in engines:
            e.in_flight = rnd.choice([0, 0, 1, 2, 5, 40])
            e.prefilling = rnd.randint(0, e.in_flight)
            if rnd.random() < 0.3:
                e.metrics_at = now + 1000.0  # fresh for the whole test
                e.running, e.waiting = rnd.choice([0.0, 3.0, 7.0]), rnd.choice([0.0, 2.0])
            e.draining = rnd.random() < 0.1
            e.sleep_hold = rnd.random() < 0.1
            if rnd.random() < 0.15:
                e.ejected_until = now + rnd.choice([1000.0, -1000.0])
                e.probe_in_flight = rnd.random() < 0.3
        if rnd.random() < 0.5:
            plans.apply(_plan(rnd.randint(1, 9), {e.id: rnd.choice([0.0, 0.0, 1.0, 2.0, 0.5])
                                                  for e in engines if rnd.random() < 0.8}))
        prompts = ["".join(rnd.choice("ab ") for _ in range(rnd.choice([0, 50, 300, 900]))) for _ in range(4)]
        for _k in range(12):
            hashes: list[int] = chain_hashes(rnd.choice(prompts), 64) if rnd.random() < 0.8 \
                else list(range(rnd.randint(0, 5)))
            if isinstance(hashes, PrefixHashes) and rnd.random() < 0.4:
                hashes.conversation = True
            if hashes and rnd.random() < 0.3:
                index.insert(rnd.choice(engines).id, hashes[:rnd.randint(1, len(hashes))])
            session = rnd.choice(["", "", "s1", "s2", "x" * 300])
            exclude = set(rnd.sample([e.id for e in engines], rnd.randint(0, min(2, n)))) \
                if rnd.random() < 0.3 else frozenset()
            pool = rnd.choice(["p", "", "p"])
            try:
                d = policy.choose(pool, "m", hashes, session, exclude, explain=rnd.random() < 0.5)
                seen = repr((d.engine.id, d.matched_blocks, d.total_blocks, d.plan_version, d.fallbacks, d.reason))
                if rnd.random() < 0.5:
                    d.engine.in_flight += 1
            except NoEngineError as exc:
                seen = repr((type(exc).__name__, str(exc)))
            digest.update(seen.encode())
            count += 1
        digest.update(repr(sorted(policy.fallback_counts.items())).encode())
    return count, digest.hexdigest()


# The digest of the decisions the policy made as one function, before it was cut into filters and scorers: the
# parts decide exactly as it did (same engines, ties, fallbacks and explanations). A deliberate change of the
# policy changes it: then check the new decisions and pin them again.
PINNED_DECISIONS = (3600, "8f14e370dbfc313ead4e9b43fc58f05e5c018a598bf95ec08c99f9de2b4f41e6")


def test_the_parts_decide_as_pinned() -> None:
    assert decisions(300) == PINNED_DECISIONS
