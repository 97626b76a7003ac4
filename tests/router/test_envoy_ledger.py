"""The Envoy ledger (router/envoy/ledger.py): bounded open requests, access-log entries into receipts or
failures, the router's in-flight counts given back in every case."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from envoy.data.accesslog.v3 import accesslog_pb2
import pytest
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


async def test_the_usage_filters_metadata_makes_the_receipts_tokens_and_ttft(
        emulators: Callable[..., Any], router: Callable[..., Any]) -> None:
    """The figures Envoy's usage filter writes (dynamic metadata ``greenserve``) become the receipt's token
    counts and first-token time; values of the wrong kind are not taken."""
    emus = await emulators(1)
    r = await router([emus[0].url])
    core = r.core
    ledger = Ledger(core)
    hashes = chain_hashes("a prompt " * 100)

    def close(request_id: str, fields: dict[str, Any]) -> dict[str, Any]:
        assert core.admit()
        ledger.open(request_id, core.policy.choose("", "", hashes), hashes, 900)
        time.sleep(0.02)
        entry = _entry(request_id, 200, 0.001)
        if fields.get("first_token_us") == "5 ms ago":  # the first token 5 ms before the log's arrival
            fields["first_token_us"] = str(int((time.time() - 0.005) * 1e6))
        entry.common_properties.metadata.filter_metadata["greenserve"].update(fields)
        ledger.close(entry)
        receipt = ledger.receipt(request_id)
        assert receipt is not None
        return receipt

    receipt = close("read", {"prompt_tokens": 300, "completion_tokens": 40, "cached_tokens": 256,
                             "first_token_us": "5 ms ago", "strip_usage": True})
    assert (receipt["prompt_tokens"], receipt["completion_tokens"], receipt["cached_prompt_tokens"]) == (300, 40, 256)
    assert 0.01 < receipt["ttft_s"] < receipt["e2e_s"]  # from the first token, not Envoy's first byte (1 ms)
    assert receipt["tpot_s"] == pytest.approx((receipt["e2e_s"] - receipt["ttft_s"]) / 39, abs=2e-6)

    receipt = close("wrong-kinds", {"prompt_tokens": "300", "completion_tokens": -4, "first_token_us": 12.5})
    assert receipt["completion_tokens"] == 0  # no usage taken: the router's estimate of the prompt, no tokens
    assert receipt["prompt_tokens"] == int(900 / core.chars_per_token)
    assert receipt["ttft_s"] >= 0.02  # Envoy's first upstream byte (the entry starts after the 20 ms sleep)
    assert core.in_flight == 0 and ledger.open_count == 0
