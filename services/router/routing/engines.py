"""The engines the router knows: registry, live load, health, ejection with half-open recovery, drain.

Everything the request path reads is a plain attribute of ``EngineState`` in memory; the database is
written only when the set of engines changes (register, deregister, drain), never per request.

Health, in the spirit of Envoy's outlier detection and SGLang's thresholds (sglang PR #9198: one failed
probe must not eject a worker):

* passive: ``eject_after_failures`` consecutive failed requests or probes eject an engine for
  ``eject_base_s``, doubling on each re-ejection up to ``eject_max_s`` (circuit open);
* half-open: once the ejection time has passed, one request (or the next active probe) may try the
  engine; success closes the circuit and resets the backoff, failure re-ejects it at once;
* active: ``/health`` is probed every ``health_interval_s`` (a dead engine is found without traffic);
* metrics: ``/metrics`` is scraped every ``scrape_interval_s``; when the last good scrape is older than
  ``stale_after_s`` the engine is STALE: still routable (fail-open, unlike llm-d #2514), but its load
  signal falls back to the router's own in-flight count, which is always fresh.

Load across replicas: an engine's load is what the engine itself reports (running + waiting, from its
``/metrics``, so it counts the requests every replica and worker sent), plus the net change of this
replica's own requests since that scrape (its starts minus its ends), so a burst this replica sends
between two scrapes counts at once; four replicas therefore never each believe an engine idle. The
recent TTFT and TPOT are the engine's own histograms' means over the last scrape interval.

Sleep mode: an engine the plan's ``engine_runs`` puts to sleep, or wakes, is held out of routing
(``sleep_hold``) from the moment its drain starts until it is awake and healthy again (engine_sleep.py drives it;
``run_phase`` says where it is: going to sleep, asleep, waking).

Verdicts are shared: an ejection (and a recovery) is reported through ``on_verdict`` (the router's core
writes it to the shared database, shared_state.py); an ejection learnt from another replica is applied
with ``apply_shared_ejection`` and lifted when that replica records the recovery.

Energy attribution (receipt.py) needs, per engine, the integral over time of power/concurrency; it is
kept here as an O(1) accumulator updated at every request start and end.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from greenserve.router.routing.scrape import EngineMetrics
from greenserve.router.upstream.engine_pool import _Origin
from greenserve.router.upstream.engine_wire import EngineHttpError
from greenserve.v1 import common_pb2

log = logging.getLogger("greenserve.router.routing.engines")

HEALTHY = common_pb2.ENGINE_STATE_HEALTHY
DRAINING = common_pb2.ENGINE_STATE_DRAINING
DRAINED = common_pb2.ENGINE_STATE_DRAINED
EJECTED = common_pb2.ENGINE_STATE_EJECTED
STALE = common_pb2.ENGINE_STATE_STALE
SLEEPING = common_pb2.ENGINE_STATE_SLEEPING
WAKING = common_pb2.ENGINE_STATE_WAKING

# EngineState.run_phase (engine_sleep.py): where an engine is between awake and asleep
RUN_AWAKE = "awake"
RUN_GOING_TO_SLEEP = "going_to_sleep"  # held out of routing, draining, POST /sleep not sent yet
RUN_ASLEEP = "asleep"
RUN_WAKING = "waking"  # POST /wake_up sent (or to send again), not yet awake and healthy


def engine_url_problem(url: str) -> str | None:
    """Why the router could not send requests to ``url``, or None when it can: the request path's own rules
    (engine_pool's origin: http(s), a host, a valid port, no query or fragment), and no whitespace or control
    characters (urlsplit silently drops tabs and newlines, and a space would go into the request line) nor user
    credentials (the engine client sends none, so they would be dropped on the way). Checked where an engine URL
    comes in (RegisterEngine, --engines), never per request."""
    if not url.isprintable() or " " in url:
        return "holds whitespace or control characters"
    try:
        _Origin(url)
    except EngineHttpError as exc:
        return str(exc)
    except (ValueError, UnicodeError) as exc:  # e.g. a host the IDNA codec refuses
        return f"has an invalid host ({exc})"
    if "@" in urlsplit(url).netloc:
        return "has user credentials (the router sends none to engines)"
    return None


@dataclass(frozen=True)
class HealthPolicy:
    """Thresholds of the health machinery (defaults documented in docs/router.md)."""

    eject_after_failures: int = 3
    eject_base_s: float = 1.0
    eject_max_s: float = 30.0
    stale_after_s: float = 2.0


@dataclass(eq=False)
class EngineState:
    """One engine with its live state. ``load`` is what the load scorer uses."""

    id: str
    url: str
    pool: str
    model: str
    kind: common_pb2.EngineKind = common_pb2.ENGINE_KIND_VLLM
    gpu_uuid: str = ""
    mig_uuid: str = ""
    idle_power_w: float = 0.0
    busy_power_w: float = 0.0
    source: str = "rpc"
    draining: bool = False
    prefill_url: str = ""  # DPD pair: the prefiller (disaggregated.py); ``url`` is the decoder
    prefill_kv_transfer_params: str = ""  # DPD pair: JSON added to each prefill request (disaggregated.py)
    # live load
    in_flight: int = 0
    prefilling: int = 0  # of in_flight: sent, no first token yet (queued or in prefill on the engine)
    running: float = 0.0
    waiting: float = 0.0
    in_flight_at_scrape: int = 0
    prefilling_at_scrape: int = 0
    kv_usage_fraction: float = 0.0
    metrics_at: float = 0.0  # time.monotonic() of the last good scrape; 0 = never
    metrics_wall_s: float = 0.0  # time.time() of the same, for ListEngines
    recent_ttft_s: float = 0.0  # the engine's mean TTFT over the last scrape interval with requests (0: none yet)
    recent_tpot_s: float = 0.0  # the same for its inter-token latency
    _hist_at_scrape: tuple[float, float, float, float] | None = None  # ttft sum/count, tpot sum/count
    # health
    consecutive_failures: int = 0
    ejected_until: float = 0.0  # monotonic; 0 = not ejected
    ejected_at: float = 0.0  # monotonic time of the (latest) ejection
    eject_count: int = 0
    probe_in_flight: bool = False
    shared_ejection: bool = False  # the ejection in force was learnt from the shared database
    # sleep mode (engine_sleep.py)
    run_phase: str = RUN_AWAKE
    sleep_hold: bool = False  # no new request: going to sleep, asleep or waking
    sleep_unsupported: bool = False  # POST /sleep answered 404 (vLLM without --enable-sleep-mode)
    # energy accounting: integral of power/n and of n over time (see receipt.py)
    energy_per_slot_j: float = 0.0
    busy_slot_s: float = 0.0
    _acc_t: float = field(default_factory=time.monotonic)
    idle_event: asyncio.Event | None = None
    id_hash: int = field(init=False, default=0)  # 64-bit hash of the id, for rendezvous hashing (policy.py)

    def __post_init__(self) -> None:
        self.id_hash = int.from_bytes(hashlib.blake2b(self.id.encode(), digest_size=8).digest(), "little")

    # -- load -------------------------------------------------------------------------------------

    def others(self, now: float, stale_after_s: float) -> float:
        """Requests on the engine that other clients sent: what fresh metrics count beyond the router's
        own in flight at the scrape (0 when the metrics are stale or show nothing more)."""
        if self.metrics_at and now - self.metrics_at <= stale_after_s:
            return max(0.0, self.running + self.waiting - self.in_flight_at_scrape)
        return 0.0

    def load(self, now: float, stale_after_s: float) -> float:
        """Requests on the engine: the router's own in flight plus what others sent (from metrics)."""
        return self.in_flight + self.others(now, stale_after_s)

    def queue_load(self, now: float, stale_after_s: float, decode_weight: float) -> float:
        """What delays a new request's first token here: requests still waiting for theirs (each
        ahead of it in the prefill queue) count 1, requests already decoding count ``decode_weight``
        (they only lengthen each step a little). Of the requests others sent (from metrics), those the
        engine reports waiting count 1, the rest as decoding."""
        return self.loads(now, stale_after_s, decode_weight)[1]

    def loads(self, now: float, stale_after_s: float, decode_weight: float) -> tuple[float, float]:
        """(``load``, ``queue_load``) at once: the routing policy needs both for every candidate, and
        ``others`` is then worked out once instead of twice (same values as the two methods)."""
        in_flight, prefilling = self.in_flight, self.prefilling
        # ``others``, inlined: this runs for every candidate of every request
        if self.metrics_at and now - self.metrics_at <= stale_after_s:
            others = self.running + self.waiting - self.in_flight_at_scrape
            if others > 0.0:
                waiting = min(others, max(0.0, self.waiting - self.prefilling_at_scrape))
                decoding = in_flight - prefilling + others - waiting
                return in_flight + others, prefilling + waiting + decode_weight * decoding
        # no request beyond the router's own (metrics stale, or showing no more)
        return in_flight + 0.0, prefilling + decode_weight * (in_flight - prefilling)

    def apply_metrics(self, metrics: EngineMetrics, now: float) -> None:
        self.running = metrics.running or 0.0
        self.waiting = metrics.waiting or 0.0
        self.kv_usage_fraction = metrics.kv_usage_fraction or 0.0
        self.in_flight_at_scrape = self.in_flight
        self.prefilling_at_scrape = self.prefilling
        self.metrics_at = now
        self.metrics_wall_s = time.time()
        hist = (metrics.ttft_sum_s or 0.0, metrics.ttft_count or 0.0, metrics.tpot_sum_s or 0.0,
                metrics.tpot_count or 0.0)
        prev = self._hist_at_scrape
        if prev is not None:
            d_count = hist[1] - prev[1]
            if d_count > 0 and hist[0] >= prev[0]:
                self.recent_ttft_s = (hist[0] - prev[0]) / d_count
            d_count = hist[3] - prev[3]
            if d_count > 0 and hist[2] >= prev[2]:
                self.recent_tpot_s = (hist[2] - prev[2]) / d_count
        self._hist_at_scrape = hist

    def apply_shared_ejection(self, until_s: float, eject_count: int, now: float) -> None:
        """An ejection another replica recorded, until ``until_s`` (monotonic clock of this process)."""
        if until_s <= self.ejected_until:
            return
        if not self.ejected_until:
            self.ejected_at = now
        self.ejected_until = until_s
        self.eject_count = max(self.eject_count, eject_count)
        self.shared_ejection = True

    def lift_shared_ejection(self) -> None:
        """The replica that ejected the engine recorded its recovery."""
        if self.shared_ejection:
            self.shared_ejection = False
            self.consecutive_failures = 0
            self.ejected_until = 0.0
            self.eject_count = 0

    # -- state ------------------------------------------------------------------------------------

    def state(self, now: float, stale_after_s: float) -> common_pb2.EngineState:
        if self.draining:
            return DRAINED if self.in_flight == 0 else DRAINING
        if self.run_phase != RUN_AWAKE:
            return {RUN_ASLEEP: SLEEPING, RUN_WAKING: WAKING}.get(self.run_phase, DRAINING)
        if self.ejected_until:
            return EJECTED
        if self.metrics_at == 0.0 or now - self.metrics_at > stale_after_s:
            return STALE
        return HEALTHY

    def routable(self, now: float) -> bool:
        """Eligible for a new request: not draining, not held out by sleep mode, and either not ejected or due a
        half-open trial."""
        if self.draining or self.sleep_hold:
            return False
        if not self.ejected_until:
            return True
        return now >= self.ejected_until and not self.probe_in_flight

    # -- energy -----------------------------------------------------------------------------------

    def power_w(self, n: int, saturation_requests: int) -> float:
        if n <= 0:
            return 0.0
        if self.idle_power_w <= 0.0:
            return self.busy_power_w
        share = min(1.0, n / saturation_requests)
        return self.idle_power_w + (self.busy_power_w - self.idle_power_w) * share

    def _advance(self, now: float, saturation_requests: int) -> None:
        dt = now - self._acc_t
        if dt > 0 and self.in_flight > 0:
            self.energy_per_slot_j += self.power_w(self.in_flight, saturation_requests) / self.in_flight * dt
            self.busy_slot_s += self.in_flight * dt
        self._acc_t = now

    def start_request(self, now: float, saturation_requests: int) -> tuple[float, float]:
        """Counts a request in; returns the accumulators at its start."""
        self._advance(now, saturation_requests)
        self.in_flight += 1
        return self.energy_per_slot_j, self.busy_slot_s

    def end_request(self, now: float, saturation_requests: int) -> tuple[float, float]:
        """Counts a request out; returns the accumulators at its end."""
        self._advance(now, saturation_requests)
        self.in_flight -= 1
        if self.in_flight == 0 and self.idle_event is not None:
            self.idle_event.set()
        return self.energy_per_slot_j, self.busy_slot_s

    def to_proto(self, now: float, stale_after_s: float) -> common_pb2.Engine:
        return common_pb2.Engine(
            id=self.id, url=self.url, pool=self.pool, model=self.model, kind=self.kind, gpu_uuid=self.gpu_uuid,
            mig_uuid=self.mig_uuid, state=self.state(now, stale_after_s), idle_power_w=self.idle_power_w,
            busy_power_w=self.busy_power_w, prefill_url=self.prefill_url,
            prefill_kv_transfer_params=self.prefill_kv_transfer_params,
        )


class EngineRegistry:
    """Engines by id, with per-pool and per-model views cached for the request path."""

    def __init__(self, policy: HealthPolicy, on_change: Callable[[], None] | None = None,
                 on_verdict: Callable[[EngineState, bool, str], None] | None = None) -> None:
        self.policy = policy
        self.engines: dict[str, EngineState] = {}
        self._by_pool: dict[str, list[EngineState]] = {}
        self._by_model: dict[str, list[EngineState]] = {}
        self._on_change = on_change
        self.on_verdict = on_verdict  # (engine, ejected, reason) on every ejection and recovery
        self.ejections = 0

    def reindex(self) -> None:
        """Rebuilds the pool/model views (after an engine's model became known)."""
        self._reindex()

    def _reindex(self) -> None:
        by_pool: dict[str, list[EngineState]] = {}
        by_model: dict[str, list[EngineState]] = {}
        for engine in self.engines.values():
            by_pool.setdefault(engine.pool, []).append(engine)
            by_model.setdefault(engine.model, []).append(engine)
        self._by_pool, self._by_model = by_pool, by_model
        if self._on_change is not None:
            self._on_change()

    def upsert(self, engine: EngineState) -> tuple[EngineState, bool]:
        """Adds an engine, or updates the static fields of a known one (live state is kept)."""
        known = self.engines.get(engine.id)
        if known is None:
            self.engines[engine.id] = engine
            self._reindex()
            return engine, True
        for name in ("url", "pool", "model", "kind", "gpu_uuid", "mig_uuid", "idle_power_w", "busy_power_w",
                     "source", "prefill_url", "prefill_kv_transfer_params"):
            setattr(known, name, getattr(engine, name))
        self._reindex()
        return known, False

    def remove(self, engine_id: str) -> EngineState | None:
        engine = self.engines.pop(engine_id, None)
        if engine is not None:
            self._reindex()
        return engine

    def get(self, engine_id: str) -> EngineState | None:
        return self.engines.get(engine_id)

    def by_url(self, url: str) -> EngineState | None:
        for engine in self.engines.values():
            if engine.url == url:
                return engine
        return None

    def candidates(self, pool: str, model: str) -> list[EngineState]:
        """Engines of ``pool``, else of ``model``, else every engine (one shared pool)."""
        if pool:
            return self._by_pool.get(pool, [])
        if model and model in self._by_model:
            return self._by_model[model]
        if model and len(self._by_model) > 1:
            return []
        return list(self.engines.values()) if len(self._by_model) <= 1 else []

    def model_unknown(self, model: str) -> bool:
        """Whether no engine serves ``model`` while the engines serve several models, all known (``candidates``
        then has none for it; one model, or an engine whose model is not known yet, takes every model)."""
        by_model = self._by_model
        return model not in by_model and len(by_model) > 1 and "" not in by_model

    def pools(self) -> list[str]:
        return sorted(self._by_pool)

    def models(self) -> list[str]:
        return sorted(self._by_model)

    # -- health -------------------------------------------------------------------------------------

    def record_success(self, engine: EngineState, started_at: float | None = None) -> None:
        """A request or probe succeeded. ``started_at``: when it was sent. A success sent before the
        engine's latest ejection is stale evidence (its reply was already on the way when the failures
        that ejected the engine happened, e.g. a first token buffered just before a crash): it leaves
        the circuit open; only a trial sent after the ejection closes it."""
        if engine.ejected_until and started_at is not None and started_at < engine.ejected_at:
            return
        if engine.consecutive_failures or engine.ejected_until:
            recovered = bool(engine.ejected_until)
            if recovered:
                log.info("engine recovered", extra={"engine_id": engine.id})
            engine.consecutive_failures = 0
            engine.ejected_until = 0.0
            engine.eject_count = 0
            engine.shared_ejection = False
            if recovered and self.on_verdict is not None:
                self.on_verdict(engine, False, "")
        engine.probe_in_flight = False

    def record_failure(self, engine: EngineState, now: float, reason: str) -> None:
        engine.consecutive_failures += 1
        engine.probe_in_flight = False
        half_open = bool(engine.ejected_until) and now >= engine.ejected_until
        if half_open or (not engine.ejected_until and engine.consecutive_failures >= self.policy.eject_after_failures):
            backoff = min(self.policy.eject_max_s, self.policy.eject_base_s * (2 ** engine.eject_count))
            engine.eject_count += 1
            engine.ejected_until = now + backoff
            engine.ejected_at = now
            self.ejections += 1
            engine.shared_ejection = False
            log.warning("engine ejected", extra={"engine_id": engine.id, "reason": reason, "for_s": backoff})
            if self.on_verdict is not None:
                self.on_verdict(engine, True, reason)
