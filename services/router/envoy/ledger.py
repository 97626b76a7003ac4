"""Requests routed through Envoy, from the pick to their carbon receipt.

The picker opens an entry when it chooses an engine (the engine's energy accumulators at the start, the
decision, the prompt's size); Envoy's gRPC access log (envoy.service.accesslog.v3.AccessLogService) closes it
when the response has left, keyed by the ``x-request-id`` Envoy gives every request. Closing runs the same
``RouterCore.finish`` as the built-in fronts, so the receipt's carbon is computed the same way: energy
accumulated on the engine between the pick and the log's arrival, duration from the pick to then; token
counts and the first token's time come from the entry's dynamic metadata, written by Envoy's Lua usage filter
(usage_filter.py) as the response passed. No Python runs per token: Envoy streams the response and sends one
log entry per request.

Memory is bounded: at most ``max_open`` open entries (the oldest is closed without a receipt past it, and
entries older than ``open_ttl_s`` are closed the same way: Envoy never logged them) and ``max_receipts``
receipts kept for lookup by request id.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from greenserve.router.core import RouterCore
from greenserve.router.envoy.usage_filter import METADATA_NAMESPACE
from greenserve.router.routing.policy import Decision
from greenserve.router.routing.prefix_index import PrefixHashes
from greenserve.router.upstream.dispatcher import Call

log = logging.getLogger("greenserve.router.envoy")

PROTOCOL = "envoy"
"""The ``protocol`` label of the router's request metrics and receipts for requests routed through Envoy."""


@dataclass
class OpenRequest:
    decision: Decision
    hashes: PrefixHashes
    prompt_chars: int
    t0: float  # monotonic, at the pick
    t0_wall_s: float  # wall clock at the pick (Envoy's log times are wall-clock)
    acc_start: tuple[float, float]
    usage: dict[str, Any] | None = None  # read by the picker (the ext_proc usage reader), else None
    first_token_wall_s: float | None = None


class Ledger:
    def __init__(self, core: RouterCore, *, max_open: int = 100_000, max_receipts: int = 65_536,
                 open_ttl_s: float = 3600.0) -> None:
        self.core = core
        self.max_open = max_open
        self.max_receipts = max_receipts
        self.open_ttl_s = open_ttl_s
        self._open: OrderedDict[str, OpenRequest] = OrderedDict()
        self._receipts: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.unmatched_logs = 0  # log entries of requests the picker did not route (or already closed)
        self.abandoned = 0  # entries closed without a log (``open_ttl_s`` or ``max_open``)

    def open(self, request_id: str, decision: Decision, hashes: PrefixHashes, prompt_chars: int) -> None:
        now = time.monotonic()
        engine = decision.engine
        acc = engine.start_request(now, self._saturation())
        if request_id in self._open:  # a retried pick of the same request: the first one never reached Envoy's log
            self._abandon(request_id, now)
        self._open[request_id] = OpenRequest(decision, hashes, prompt_chars, now, time.time(), acc)
        while self._open:
            oldest_id, oldest = next(iter(self._open.items()))
            if len(self._open) <= self.max_open and now - oldest.t0 <= self.open_ttl_s:
                break
            self._abandon(oldest_id, now)

    def _saturation(self) -> int:
        assert self.core.dispatcher is not None
        return self.core.dispatcher.saturation_requests

    def _abandon(self, request_id: str, now: float) -> None:
        entry = self._open.pop(request_id)
        entry.decision.engine.end_request(now, self._saturation())
        self.core.release()
        self.abandoned += 1

    def note_usage(self, request_id: str, usage: dict[str, Any] | None, first_token_wall_s: float | None) -> None:
        """What the picker read from the response (the ext_proc usage reader), for the receipt at the close."""
        item = self._open.get(request_id)
        if item is not None:
            item.usage, item.first_token_wall_s = usage, first_token_wall_s

    def abandon_unsent(self, request_id: str) -> Any:
        """Closes, without a receipt, a request picked but never sent (its engine's address unknown); returns
        its engine (None when the request is not open)."""
        item = self._open.get(request_id)
        if item is None:
            return None
        self._abandon(request_id, time.monotonic())
        return item.decision.engine

    @property
    def open_count(self) -> int:
        return len(self._open)

    def is_open(self, request_id: str) -> bool:
        return request_id in self._open

    def receipt(self, request_id: str) -> dict[str, Any] | None:
        return self._receipts.get(request_id)

    def close(self, entry: Any) -> None:
        """Closes the request of one HTTPAccessLogEntry: a receipt when the engine answered 2xx, a failure
        charged to the engine when it could not be reached or answered 5xx."""
        request_id = entry.request.request_id
        item = self._open.pop(request_id, None)
        if item is None:
            self.unmatched_logs += 1
            return
        now = time.monotonic()
        core = self.core
        core.release()
        engine = item.decision.engine
        code = entry.response.response_code.value
        common = entry.common_properties
        if not common.HasField("time_to_first_upstream_rx_byte") or code >= 500 or code == 0:
            engine.end_request(now, self._saturation())
            if not common.HasField("time_to_first_upstream_rx_byte") or code >= 500:
                core.registry.record_failure(engine, now, f"through envoy: HTTP {code}")
            core.count_failure(PROTOCOL, "unavailable")
            return
        if code >= 400:  # the caller's error, answered by the engine: no receipt, the engine is fine
            engine.end_request(now, self._saturation())
            core.count_failure(PROTOCOL, "client_error")
            return
        usage, first_token_wall_s = read_usage(common.metadata.filter_metadata.get(METADATA_NAMESPACE))
        usage = usage or item.usage
        first_token_wall_s = first_token_wall_s or item.first_token_wall_s
        if first_token_wall_s is None:  # no usage reader in this Envoy: its first byte from the engine
            start_wall_s = common.start_time.ToNanoseconds() / 1e9
            first_token_wall_s = start_wall_s + common.time_to_first_upstream_rx_byte.ToNanoseconds() / 1e9
        t_first = item.t0 + max(0.0, first_token_wall_s - item.t0_wall_s)
        acc_end = engine.end_request(now, self._saturation())
        core.registry.record_success(engine, started_at=item.t0)
        call = Call(decision=item.decision, engine=engine, response=None, t0=item.t0,  # type: ignore[arg-type]
                    t_first=min(t_first, now), acc_start=item.acc_start, hashes=item.hashes, usage=usage)
        receipt = core.finish(call, PROTOCOL, acc_end, item.prompt_chars)
        self._receipts[request_id] = receipt.to_json()
        while len(self._receipts) > self.max_receipts:
            self._receipts.popitem(last=False)


def read_usage(fields: Any) -> tuple[dict[str, Any] | None, float | None]:
    """What the usage filter (usage_filter.py) wrote for one request: the engine's usage in the shape
    ``RouterCore.finish`` reads (None when the filter found none), and the first token's wall-clock time in
    seconds (None when unknown)."""
    if fields is None:
        return None, None
    values = fields.fields
    first = values.get("first_token_us")
    first_s = None
    if first is not None and first.WhichOneof("kind") == "string_value" and first.string_value.isdigit():
        first_s = int(first.string_value) / 1e6
    counts = {key: int(v.number_value) for key in ("prompt_tokens", "completion_tokens", "cached_tokens")
              if (v := values.get(key)) is not None and v.WhichOneof("kind") == "number_value"
              and 0 <= v.number_value < 2**53}
    if "completion_tokens" not in counts or "prompt_tokens" not in counts:
        return None, first_s
    usage: dict[str, Any] = {"prompt_tokens": counts["prompt_tokens"], "completion_tokens": counts["completion_tokens"]}
    if "cached_tokens" in counts:
        usage["prompt_tokens_details"] = {"cached_tokens": counts["cached_tokens"]}
    return usage, first_s


class AccessLogReceiver(als_pb2_grpc.AccessLogServiceServicer):
    """envoy.service.accesslog.v3.AccessLogService: Envoy's HTTP access log entries close the ledger's requests."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def StreamAccessLogs(self, request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage],
                               context: grpc.aio.ServicerContext) -> als_pb2.StreamAccessLogsResponse:
        async for message in request_iterator:
            for entry in message.http_logs.log_entry:
                try:
                    self.ledger.close(entry)
                except Exception:  # one bad entry must not end Envoy's log stream
                    log.exception("envoy access log entry not applied")
        return als_pb2.StreamAccessLogsResponse()
