"""Deterministic prefix affinity (issue 22, item 4): the conversation key and weighted rendezvous hashing."""

from __future__ import annotations

from greenserve.router.routing.enforcer import ActivePlan
from greenserve.router.routing.engines import EngineRegistry, EngineState, HealthPolicy
from greenserve.router.routing.policy import PolicyConfig, RoutingPolicy
from greenserve.router.routing.prefix_index import PrefixIndex, chain_hashes, render_chat
from greenserve.router.routing.scorers import rendezvous

SYSTEM = ("system", "You answer questions about the grid. " * 30)  # ~1 KiB shared by every conversation


def _engines(n: int) -> list[EngineState]:
    return [EngineState(id=f"e{i}", url=f"http://h{i}:8000", pool="p", model="m") for i in range(n)]


def test_chat_key_is_the_same_for_every_turn_and_differs_between_conversations() -> None:
    turn1 = chain_hashes(render_chat([SYSTEM, ("user", "first question of A")]))
    turn3 = chain_hashes(render_chat([SYSTEM, ("user", "first question of A"), ("assistant", "x" * 900),
                                      ("user", "second"), ("assistant", "y" * 400), ("user", "third")]))
    other = chain_hashes(render_chat([SYSTEM, ("user", "first question of B")]))
    assert turn1.conversation and turn3.conversation
    assert turn1.affinity_key == turn3.affinity_key != other.affinity_key
    assert turn1.affinity_blocks == turn3.affinity_blocks == len(turn1)  # the blocks inside the key's part


def test_completion_key_is_its_first_blocks() -> None:
    long = chain_hashes("z" * 256 * 40)
    assert not long.conversation
    assert long.affinity_blocks == 16 and long.affinity_key == long[15]
    assert chain_hashes("z" * 256 * 40 + "different tail" * 100).affinity_key == long.affinity_key
    assert chain_hashes("short").affinity_key == 0  # no full block: no key


def test_rendezvous_shares_keys_by_weight_and_moves_only_the_removed_engines_keys() -> None:
    engines = _engines(4)
    weights = {"e0": 3.0, "e1": 1.0, "e2": 1.0, "e3": 1.0}
    keys = [chain_hashes(render_chat([SYSTEM, ("user", f"conversation {k}")])).affinity_key for k in range(3000)]
    chosen = [rendezvous(k, engines, weights).id for k in keys]
    share = chosen.count("e0") / len(keys)
    assert 0.44 < share < 0.56, share  # 3 / 6 of the weight
    # e2 leaves: its keys move, no other key does
    left = [e for e in engines if e.id != "e2"]
    after = [rendezvous(k, left, weights).id for k in keys]
    moved = [(a, b) for a, b in zip(chosen, after, strict=True) if a != b]
    assert moved and all(a == "e2" for a, _ in moved)
    assert rendezvous(keys[0], engines, {"e0": 0.0, "e1": 0.0, "e2": 0.0, "e3": 0.0}) is None


def test_policy_follows_the_key_not_a_replicas_index_and_the_load_bound_overrides_it() -> None:
    def policy() -> RoutingPolicy:
        registry = EngineRegistry(HealthPolicy())
        for e in _engines(4):
            registry.upsert(e)
        return RoutingPolicy(registry, PrefixIndex(), ActivePlan(), PolicyConfig())

    a, b = policy(), policy()
    # replica A has seen other conversations with the same system prompt on e3: B has not
    for k in range(20):
        a.index.insert("e3", chain_hashes(render_chat([SYSTEM, ("user", f"older {k}")])))
    for k in range(40):
        h = chain_hashes(render_chat([SYSTEM, ("user", f"conversation {k}")]))
        assert a.choose("p", "", h).engine.id == b.choose("p", "", h).engine.id
    h = chain_hashes(render_chat([SYSTEM, ("user", "conversation 0")]))
    target = b.choose("p", "", h).engine
    target.in_flight = 40  # far over the bound (mean + 8): the key's next engine takes it
    assert b.choose("p", "", h).engine is not target


def test_a_key_sent_in_parallel_does_not_pile_onto_its_engine() -> None:
    registry = EngineRegistry(HealthPolicy())
    for e in _engines(2):
        registry.upsert(e)
    policy = RoutingPolicy(registry, PrefixIndex(), ActivePlan(), PolicyConfig())
    h = chain_hashes(render_chat([SYSTEM, ("user", "the same question, many times at once")]))
    target = policy.choose("p", "", h).engine
    target.prefilling = target.in_flight = 3  # three requests awaiting their first token: still within the slack
    assert policy.choose("p", "", h).engine is target
    target.prefilling = target.in_flight = 4  # four ahead of a new request there, none on the other engine
    decision = policy.choose("p", "", h)
    assert decision.engine is not target and "affinity_busy" in decision.fallbacks


def test_a_completion_prefix_that_an_engine_holds_is_scored_by_prefix_and_load_not_affinity() -> None:
    """A completion's key is a preamble that unrelated prompts may share, not a conversation: only while no
    engine holds it does the rendezvous engine get the affinity bonus (so replicas agree on new prefixes);
    once an engine holds it, prefix and load scoring decide, as for any cached prefix."""
    registry = EngineRegistry(HealthPolicy())
    for e in _engines(2):
        registry.upsert(e)
    policy = RoutingPolicy(registry, PrefixIndex(), ActivePlan(), PolicyConfig())
    h = chain_hashes("You are a helpful assistant answering questions about carbon-aware serving. " * 64)
    assert not h.conversation and h.affinity_key
    fresh = policy.choose("p", "", h, explain=True)
    assert fresh.engine is rendezvous(h.affinity_key, list(registry.engines.values()))
    assert "affinity=this engine" in fresh.reason
    policy.index.insert(fresh.engine.id, h)  # the engine served it: this replica's index holds it there
    held = policy.choose("p", "", h, explain=True)
    assert "affinity=" not in held.reason and held.matched_blocks == held.total_blocks
    # a chat conversation keeps its affinity however its blocks are held
    chat = chain_hashes(render_chat([SYSTEM, ("user", "one conversation")]))
    first = policy.choose("p", "", chat, explain=True)
    policy.index.insert(first.engine.id, chat)
    assert "affinity=this engine" in policy.choose("p", "", chat, explain=True).reason
