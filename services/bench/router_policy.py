"""``greenserve bench router-policy``: CPU per routing decision of the router's ``RoutingPolicy.choose``.

Each (engines, case) pair gets its own ``RouterCore`` (no database, no peers, nothing started: no I/O) whose
registry holds the engines in the states the router sees in service, set through the router's own methods where it
has them (``set_draining``, ``apply_shared_ejection``, ``apply_metrics``). Decisions go through
``core.policy.choose``, the call the HTTP and gRPC fronts make through the dispatcher. The figure is thread CPU time
(``time.thread_time``) over ``--calls`` decisions, best of ``--repeats`` rounds, per decision: the best round is the
one other jobs on the machine disturbed least. After the timed rounds, one untimed round, whose requests are counted
in and out of their engines so that the loads move, records which engines were chosen: the figures come from decisions that
route only to engines that can take a request. During a timed round the registry does not change (the rounds
measure the decision, not the bookkeeping of a request's start and end).

Fleets (``--fleet``), engine i playing role i mod 8:

* ``mixed``: healthy (fresh metrics, light), loaded (fresh metrics, with other clients' requests: above the bounded
  load filter's bound), stale (never scraped), healthy (fresh metrics, a queue), draining (finishing its requests),
  asleep (sleep mode), ejected (backing off), ejected and due a half-open trial. Two engines: the first two roles.
* ``uniform``: every engine awake and never scraped, 0-2 requests in flight (i mod 3), 0-1 of them prefilling.

Cases (``--cases``): ``plain``: a prompt's block hashes only; ``plan``: the same with a plan in force for the pool
(weights 1 and 2 alternately; 0 for the engines the plan put to sleep or drains); ``prefix-session``: 5 of the
prompt's blocks cached on the first engine (and the whole prompt on the first draining one) and a session key;
``full``: both.
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import sys
import time
from collections import Counter, deque
from typing import Any

from greenserve.common import strict_json
from greenserve.common.cli_parser import Parser

CASES = ("plain", "plan", "prefix-session", "full")
FLEETS = ("mixed", "uniform")
ROLES = ("healthy", "loaded", "stale", "queued", "draining", "asleep", "ejected", "half_open")
CACHED_BLOCKS = 5  # blocks of the prompt cached on the first engine in the prefix cases
EJECTED_FOR_S = 3600.0  # far beyond any run: the ejected role stays ejected throughout
POOL = "default"
MODEL = "m"
SESSION_KEY = "bench-session"
MAX_ENGINES = 4096
MAX_PROMPT_CHARS = 1 << 20


def _prompt(chars: int) -> str:
    text = "lorem ipsum dolor "
    return (text * (chars // len(text) + 1))[:chars]


def _scrape(engine: Any, role: str, now: float) -> None:
    """What the monitor's scrape of ``/metrics`` gives the engines of the roles that have fresh metrics."""
    from greenserve.router.routing.scrape import EngineMetrics

    if role == "healthy":
        engine.apply_metrics(EngineMetrics(running=float(engine.in_flight), waiting=0.0), now)
    elif role == "loaded":  # other clients' requests beyond the router's own
        engine.apply_metrics(EngineMetrics(running=24.0, waiting=6.0), now)
    elif role == "queued":
        engine.apply_metrics(EngineMetrics(running=3.0, waiting=1.0), now)


class Setup:
    """One RouterCore with ``engines`` engines of ``fleet`` and the request of ``case``."""

    def __init__(self, core: Any, roles: list[str], hashes: Any, session_key: str) -> None:
        self.core = core
        self.roles = roles
        self.hashes = hashes
        self.session_key = session_key

    def refresh(self) -> None:
        """Scrapes again (as the monitor does every 0.5 s), so that fresh metrics stay fresh across the rounds."""
        now = time.monotonic()
        for engine, role in zip(self.core.registry.engines.values(), self.roles, strict=True):
            _scrape(engine, role, now)


async def build(engines: int, case: str, fleet: str, prompt_chars: int, meter: Any) -> Setup:
    from greenserve.router.core import CoreConfig, RouterCore
    from greenserve.router.routing.engines import RUN_ASLEEP, EngineState
    from greenserve.router.routing.prefix_index import chain_hashes
    from greenserve.v1 import common_pb2

    core = RouterCore(CoreConfig(watch_plans=False, feeds=False, default_pool=POOL), None, meter)
    roles = [ROLES[i % len(ROLES)] if fleet == "mixed" else "uniform" for i in range(engines)]
    for i in range(engines):
        core.add_engine(EngineState(id=f"e{i}", url=f"http://127.0.0.1:{9000 + i}", pool=POOL, model=MODEL,
                                    source="flag"), persist=False)
    now = time.monotonic()
    draining: list[str] = []
    for (engine_id, engine), role in zip(core.registry.engines.items(), roles, strict=True):
        i = int(engine_id[1:])
        # requests in flight and of those still waiting for their first token, as the dispatcher counts them
        if role == "uniform":
            engine.in_flight, engine.prefilling = i % 3, i % 2
        elif role in ("healthy", "loaded", "stale", "queued", "draining", "half_open"):
            engine.in_flight, engine.prefilling = 1 + i % 3, i % 2
        if role == "draining":
            draining.append(engine_id)
        elif role == "asleep":  # where engine_sleep.py leaves an engine the plan put to sleep
            engine.run_phase, engine.sleep_hold = RUN_ASLEEP, True
        elif role == "ejected":  # an ejection another replica recorded, still backing off
            engine.apply_shared_ejection(now + EJECTED_FOR_S, 1, now)
        elif role == "half_open":  # its backoff is over: one trial request may go to it
            engine.apply_shared_ejection(now - 1.0, 1, now - 2.0)
        _scrape(engine, role, now)
    await core.set_draining(draining, True)
    hashes = chain_hashes(_prompt(prompt_chars), core.config.prefix_block_chars)
    if case in ("plan", "full"):
        weights = [common_pb2.RoutingWeight(pool=POOL, engine_id=f"e{i}",
                                            weight=0.0 if roles[i] in ("draining", "asleep") else 1.0 + i % 2)
                   for i in range(engines)]
        if not core.plans.apply(common_pb2.Plan(version=3, intervals=[common_pb2.PlanInterval(
                routing_weights=weights)])):
            raise RuntimeError("the bench's plan was not put in force")
    session_key = ""
    if case in ("prefix-session", "full"):
        core.index.insert("e0", hashes[:CACHED_BLOCKS])
        if draining:  # what a draining engine served before its drain stays in the index
            core.index.insert(draining[0], hashes)
        session_key = SESSION_KEY
    return Setup(core, roles, hashes, session_key)


def _state_names(core: Any) -> dict[str, int]:
    from greenserve.v1 import common_pb2

    now, stale = time.monotonic(), core.registry.policy.stale_after_s
    names = Counter(common_pb2.EngineState.Name(e.state(now, stale)).removeprefix("ENGINE_STATE_").lower()
                    for e in core.registry.engines.values())
    return dict(sorted(names.items()))


def _end(engine: Any, now: float, saturation: int) -> None:
    engine.prefilling -= 1
    engine.end_request(now, saturation)


def run_case(setup: Setup, repeats: int, calls: int) -> dict[str, Any]:
    """Thread CPU per decision of each round (microseconds), then one untimed round's choices."""
    choose = setup.core.policy.choose
    hashes, session_key = setup.hashes, setup.session_key
    clock = time.thread_time
    rounds_us: list[float] = []
    for _ in range(repeats):
        setup.refresh()
        calls_left = range(calls)
        start = clock()
        for _i in calls_left:
            choose("", MODEL, hashes, session_key)
        rounds_us.append((clock() - start) / calls * 1e6)
    setup.refresh()
    core = setup.core
    policy = core.policy
    fallbacks_before = dict(policy.fallback_counts)
    routable_now = sum(e.routable(time.monotonic()) for e in core.registry.engines.values())
    chosen: Counter[str] = Counter()
    not_routable = 0
    # each decision's request is counted in on its engine and ends 2 x engines decisions later, so that the loads
    # move as they do in service and the choices spread; the engines are as before once the round is over
    in_flight: deque[Any] = deque()
    saturation = core.saturation_requests
    for _i in range(calls):
        engine = choose("", MODEL, hashes, session_key).engine
        now = time.monotonic()
        chosen[engine.id] += 1
        not_routable += not engine.routable(now)
        engine.start_request(now, saturation)
        engine.prefilling += 1  # as the dispatcher counts a request sent, until its first token
        in_flight.append(engine)
        if len(in_flight) > 2 * len(core.registry.engines):
            _end(in_flight.popleft(), now, saturation)
    while in_flight:
        _end(in_flight.popleft(), time.monotonic(), saturation)
    fallbacks = {name: count - fallbacks_before.get(name, 0) for name, count in policy.fallback_counts.items()
                 if count != fallbacks_before.get(name, 0)}
    return {"us_per_decision": round(min(rounds_us), 3),
            "us_per_decision_median": round(statistics.median(rounds_us), 3),
            "us_per_decision_rounds": [round(v, 3) for v in rounds_us], "states": _state_names(setup.core),
            "routable": routable_now,
            "chosen_engines": len(chosen), "chosen_not_routable": not_routable, "fallbacks": fallbacks}


async def measure(engines: list[int], cases: list[str], fleet: str, repeats: int, calls: int,
                  prompt_chars: int) -> dict[str, Any]:
    from greenserve.common.telemetry import setup_telemetry

    if repeats < 1 or calls < 1 or prompt_chars < 0 or not engines or min(engines) < 1:
        raise ValueError("repeats, calls and engines must be >= 1, prompt_chars >= 0")
    telemetry = setup_telemetry("bench-router-policy", install_global=False)
    load_start = os.getloadavg()
    rows = []
    blocks, block_chars = 0, 0
    for n in engines:
        for case in cases:
            setup = await build(n, case, fleet, prompt_chars, telemetry.meter)
            blocks, block_chars = len(setup.hashes), setup.core.config.prefix_block_chars
            gc.collect()  # the set-up's garbage is not collected inside a timed round
            rows.append({"engines": n, "case": case, **run_case(setup, repeats, calls)})
    load_end = os.getloadavg()
    return {"benchmark": "router-policy", "clock": "thread_time", "statistic": "best round", "fleet": fleet,
            "repeats": repeats, "calls": calls, "prompt_chars": prompt_chars,
            "prompt_blocks": blocks, "block_chars": block_chars,
            "load_average_1m": [round(load_start[0], 2), round(load_end[0], 2)],
            "python": sys.version.split()[0], "results": rows}


def table(result: dict[str, Any]) -> str:
    cases = list(dict.fromkeys(row["case"] for row in result["results"]))
    lines = ["engines  routable  " + "  ".join(f"{c:>16s}" for c in cases) + "   (us per decision, best round)"]
    by_n: dict[int, dict[str, dict[str, Any]]] = {}
    for row in result["results"]:
        by_n.setdefault(row["engines"], {})[row["case"]] = row
    for n, row_of in by_n.items():
        routable = next(iter(row_of.values()))["routable"]
        lines.append(f"{n:7d}  {routable:8d}  " + "  ".join(
            f"{row_of[c]['us_per_decision']:16.2f}" if c in row_of else f"{'':16s}" for c in cases))
    return "\n".join(lines)


def _positive_ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1 or max(values) > MAX_ENGINES:
        raise ValueError
    return values


def main(argv: list[str] | None = None, prog: str = "greenserve bench router-policy") -> int:
    parser = Parser(prog=prog, description="CPU per routing decision of the router's RoutingPolicy.choose, for "
                                           "engines in the states the router sees (thread CPU time, best round).")
    parser.add_argument("--json", action="store_true", help="print only the JSON line on stdout")
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 rounds of 100 decisions each")
    parser.add_argument("--engines", default="2,8,32", help="engines in the pool, comma-separated")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"request cases, comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--fleet", choices=FLEETS, default="mixed",
                        help="engine states: mixed (healthy, loaded, stale, draining, asleep, ejected, half-open) "
                             "or uniform (all awake, 0-2 requests in flight)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds; the best is reported (default 9, "
                                                                  "2 with --quick)")
    parser.add_argument("--calls", type=int, default=None, help="decisions per round (default 3000, 100 with --quick)")
    parser.add_argument("--prompt-chars", type=int, default=4096,
                        help="prompt length in characters (16 blocks of the router's 256 characters)")
    ns = parser.parse_args(argv)
    repeats = ns.repeats if ns.repeats is not None else (2 if ns.quick else 9)
    calls = ns.calls if ns.calls is not None else (100 if ns.quick else 3000)
    try:
        engines = _positive_ints(ns.engines)
    except ValueError:
        parser.error(f"--engines: comma-separated integers in [1, {MAX_ENGINES}] expected, got {ns.engines!r}")
    cases = [c.strip() for c in ns.cases.split(",") if c.strip()]
    if not cases or set(cases) - set(CASES):
        parser.error(f"--cases: comma-separated names of {', '.join(CASES)} expected, got {ns.cases!r}")
    if repeats < 1:
        parser.error("--repeats: must be >= 1")
    if calls < 1:
        parser.error("--calls: must be >= 1")
    if not 0 <= ns.prompt_chars <= MAX_PROMPT_CHARS:
        parser.error(f"--prompt-chars: must be in [0, {MAX_PROMPT_CHARS}]")
    result = asyncio.run(measure(engines, list(dict.fromkeys(cases)), ns.fleet, repeats, calls, ns.prompt_chars))
    if not ns.json:
        print(table(result))
    print(strict_json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
