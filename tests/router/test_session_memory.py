"""The session table's memory is bounded whatever the callers send (found by an adversarial audit of the HTTP
front's headers and body): the session key (x-greenserve-session, x-session-id, the body's "user" string, gRPC's
session_key) was stored as given, so up to --max-sessions (100,000) keys of up to 16 MiB each (a body's "user") or
8 KiB (a header) were kept: about 800 MB per router process with header keys alone. A long key is now stored as
its 128-bit BLAKE2b digest; a conversation still sticks to its engine."""

from __future__ import annotations

import sys

from greenserve.router.routing.enforcer import ActivePlan
from greenserve.router.routing.engines import EngineRegistry, EngineState, HealthPolicy
from greenserve.router.routing.policy import SESSION_KEY_MAX_CHARS, PolicyConfig, RoutingPolicy
from greenserve.router.routing.prefix_index import PrefixIndex


def _policy(max_sessions: int) -> RoutingPolicy:
    registry = EngineRegistry(HealthPolicy())
    for i in range(4):
        registry.upsert(EngineState(id=f"e{i}", url=f"http://127.0.0.1:{9000 + i}", pool="p", model="m"))
    return RoutingPolicy(registry, PrefixIndex(), ActivePlan(), PolicyConfig(max_sessions=max_sessions))


def test_long_session_keys_take_bounded_memory_and_still_stick() -> None:
    policy = _policy(max_sessions=50)
    first = {}
    for i in range(200):
        key = f"{i}:" + "u" * 1_000_000
        first[i] = policy.choose("p", "m", [], key).engine.id
    held = sum(sys.getsizeof(k) for k in policy.sessions)
    assert len(policy.sessions) == 50 and held < 50 * 200, held
    for i in range(150, 200):  # the last 50 conversations are remembered: each sticks to its engine
        assert policy.choose("p", "m", [], f"{i}:" + "u" * 1_000_000).engine.id == first[i]


def test_short_keys_are_kept_as_given() -> None:
    policy = _policy(max_sessions=10)
    key = "s" * SESSION_KEY_MAX_CHARS
    engine = policy.choose("p", "m", [], key).engine.id
    assert policy.sessions[key] == engine
