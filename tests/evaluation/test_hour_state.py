"""State carried from hour to hour in the evaluation's replay (hour.py): conversations straddling the window's end,
cache contents, and the DRAM tier that a resize restarts empty."""

from __future__ import annotations

from greenserve.evaluation.hour import ID_STRIDE, PoolState, hour_rows, replay_hour, split_window

PROFILE = "llama3-8b@A100-80GB"
ENGINES = ["chat-0", "chat-1"]
GIB = 1 << 30


def _hour(state: PoolState, hour: int, cache_bytes: int, seed: int = 11):
    return replay_hour(PROFILE, ENGINES, 2.0, {}, cache_bytes, 2.0, 0.15, seed, hour, 90.0, state)


def test_turns_after_the_window_are_the_next_windows_first_arrivals() -> None:
    rows = hour_rows(2.0, 90.0, seed=3, hour=4)
    assert all(b >= 5 * ID_STRIDE or b < 0 for r in rows for b in r[3])  # ids unique to hour 4
    inside, after = split_window(rows, 90.0)
    assert after and inside and len(inside) + len(after) == len(rows)
    assert all(r[0] < 90.0 for r in inside) and all(r[0] >= 0 for r in after)
    late = sorted(r[0] for r in rows if r[0] >= 90.0)
    assert sorted(r[0] + 90.0 for r in after) == late


def test_carried_state_warms_the_next_hour_and_a_resize_empties_dram() -> None:
    cold = _hour(PoolState(), 1, 8 * GIB)
    state = PoolState()
    _hour(state, 0, 8 * GIB)
    assert state.tail and set(state.contents) == set(ENGINES) and state.cache_bytes == 8 * GIB
    warm = _hour(state, 1, 8 * GIB)
    # the same hour from the previous hour's caches and conversations finds more of its prompts cached
    assert warm.prefix_hit_fraction > cold.prefix_hit_fraction
    assert warm.cache_restarts == 0 and warm.requests_measured > cold.requests_measured  # + the carried turns
    assert any(held["dram"] for held in state.contents.values())
    # a new size restarts every engine's LMCache: the DRAM tier is empty (HBM and disk are kept)
    hbm_before = {eid: held["hbm"] for eid, held in state.contents.items()}
    quiet = replay_hour(PROFILE, ENGINES, 0.0, {}, 16 * GIB, 2.0, 0.15, 1, 2, 90.0, PoolState(
        contents=dict(state.contents), cache_bytes=state.cache_bytes))
    assert quiet.cache_restarts == len(ENGINES)
    resized = PoolState(contents=dict(state.contents), cache_bytes=state.cache_bytes)
    replay_hour(PROFILE, ENGINES, 0.0, {}, 16 * GIB, 2.0, 0.15, 1, 2, 90.0, resized)
    assert all(held["dram"] == () for held in resized.contents.values())
    assert {eid: held["hbm"] for eid, held in resized.contents.items()} == hbm_before
    assert resized.cache_bytes == 16 * GIB


def test_no_cache_never_restarts() -> None:
    state = PoolState()
    for h in range(2):
        assert _hour(state, h, 0).cache_restarts == 0
    assert all(not held["dram"] for held in state.contents.values())


def test_conversation_affinity_routes_by_conversation_and_weight() -> None:
    from types import SimpleNamespace

    from greenserve.evaluation.hour import ConversationAffinity

    engines = [SimpleNamespace(outstanding=0) for _ in range(3)]
    sim = SimpleNamespace(w=SimpleNamespace(session_ids=list(range(4000))), engines=engines)
    policy = ConversationAffinity([3.0, 1.0, 0.0], [11, 22, 33])
    picks = [policy.choose(sim, r, [0, 1, 2]) for r in range(4000)]
    assert picks == [policy.choose(sim, r, [0, 1, 2]) for r in range(4000)]  # a conversation's turns: one engine
    assert 2 not in picks  # weight 0 never wins
    assert 0.70 < picks.count(0) / len(picks) < 0.80  # shares follow the weights (3:1)
    engines[0].outstanding = 20  # over the load bound: its conversations go to the next engine in their order
    assert all(policy.choose(sim, r, [0, 1, 2]) == 1 for r in range(50))
