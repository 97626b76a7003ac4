"""The Envoy ledger (router/envoy/ledger.py): bounded open requests, access-log entries into receipts or
failures, the router's in-flight counts given back in every case."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from envoy.data.accesslog.v3 import accesslog_pb2
from greenserve.router.envoy.ledger import Ledger
from greenserve.router.routing.prefix_index import chain_hashes


def _entry(request_id: str, code: int, first_byte_s: float | None) -> accesslog_pb2.HTTPAccessLogEntry:
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.request.request_id = request_id
    entry.response.response_code.value = code
    entry.common_properties.start_time.FromNanoseconds(int(time.time() * 1e9))
    if first_byte_s is not None:
        entry.common_properties.time_to_first_upstream_rx_byte.FromNanoseconds(int(first_byte_s * 1e9))
    return entry


async def test_ledger_closes_into_receipts_failures_and_stays_bounded(
        emulators: Callable[..., Any], router: Callable[..., Any]) -> None:
    emus = await emulators(1)
    r = await router([emus[0].url])
    core = r.core
    ledger = Ledger(core, max_open=2, max_receipts=1)
    hashes = chain_hashes("a prompt " * 100)

    def pick(request_id: str) -> Any:
        assert core.admit()
        decision = core.policy.choose("", "", hashes)
        ledger.open(request_id, decision, hashes, 900)
        return decision.engine

    engine = pick("a")
    pick("b")
    pick("c")  # past max_open: the oldest ("a") is closed without a receipt
    assert ledger.open_count == 2 and ledger.abandoned == 1 and not ledger.is_open("a")
    assert core.in_flight == 2 and engine.in_flight == 2

    ledger.close(_entry("b", 200, 0.01))
    receipt = ledger.receipt("b")
    assert receipt is not None and receipt["engine_id"] == engine.id and receipt["carbon"]["total_g"] > 0
    failures = engine.consecutive_failures
    ledger.close(_entry("c", 503, None))  # Envoy could not reach the engine: charged to it, no receipt
    assert ledger.receipt("c") is None and engine.consecutive_failures == failures + 1
    ledger.close(_entry("a", 200, 0.01))  # already closed: counted, nothing else
    assert ledger.unmatched_logs == 1 and ledger.receipt("a") is None
    assert core.in_flight == 0 and engine.in_flight == 0 and ledger.open_count == 0

    pick("d")
    ledger.close(_entry("d", 200, 0.01))
    assert ledger.receipt("d") is not None and ledger.receipt("b") is None  # max_receipts 1: the oldest goes
