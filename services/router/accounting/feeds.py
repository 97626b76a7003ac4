"""Batched, asynchronous, bounded feeds to the forecaster (load) and the cache-manager (prefix accesses).

The request path only appends a tuple to a bounded deque (O(1), no protobuf, no I/O). A background task
drains it every ``interval_s`` into one client-streaming RPC (``StreamLoad`` / ``ReportAccesses``). When
a peer is down, the batch in hand is dropped and counted, the deque keeps only the newest items, and
routing never waits: losing telemetry must not slow requests.

A call the peer refuses (INVALID_ARGUMENT: the forecaster takes a StreamLoad call all or nothing, e.g. a sample
of an hour already closed) is logged at WARNING with the error's detail and counted as dropped; when the error
names one item (``samples[i]...``, the load feed), the batch is sent once more without it, so one refused sample
does not cost every pool's samples.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.common.clock import now_s
from greenserve.common.errors import error_detail_from_rpc_error
from greenserve.common.tasks import cancel_and_wait
from greenserve.v1 import (
    cache_manager_pb2,
    cache_manager_pb2_grpc,
    common_pb2,
    forecaster_pb2,
    forecaster_pb2_grpc,
)

log = logging.getLogger("greenserve.router.accounting.feeds")
#: The field of a StreamLoad refusal that names one sample: ``samples[3].time``.
_SAMPLE_FIELD = re.compile(r"samples\[(\d+)\]")


def _ts(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


class _BoundedFeed:
    """A bounded queue drained by a periodic sender; subclasses build and send the messages."""

    name = "feed"

    def __init__(self, max_items: int, interval_s: float, batch_max: int) -> None:
        self.queue: deque[Any] = deque(maxlen=max_items)
        self.interval_s = interval_s
        self.batch_max = batch_max
        self.enqueued = 0
        self.sent = 0
        self.dropped = 0
        self._task: asyncio.Task[None] | None = None

    def put(self, item: Any) -> None:
        if len(self.queue) == self.queue.maxlen:
            self.dropped += 1  # the oldest item falls out
        self.queue.append(item)
        self.enqueued += 1

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"{self.name}-sender")

    async def stop(self, flush: bool = True) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if flush:
            try:
                await asyncio.wait_for(self.flush(), 2.0)
            except (TimeoutError, Exception):  # noqa: BLE001 - best effort on shutdown
                pass

    def _take(self) -> list[Any]:
        batch: list[Any] = []
        while self.queue and len(batch) < self.batch_max:
            batch.append(self.queue.popleft())
        return batch

    async def flush(self) -> None:
        """Sends what is queued now (in batches); drops and counts a batch the peer did not take."""
        self.before_flush()
        while self.queue:
            batch = self._take()
            try:
                await self.send(batch)
                self.sent += len(batch)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    await self._refused(batch, exc)  # the peer is up: go on with the next batch
                    continue
                self._drop(batch, exc)
                return
            except (OSError, TimeoutError) as exc:
                self._drop(batch, exc)
                return

    def _drop(self, batch: list[Any], exc: BaseException) -> None:
        self.dropped += len(batch)
        log.debug("%s batch dropped", self.name, extra={"items": len(batch), "error": str(exc)})

    async def _refused(self, batch: list[Any], exc: grpc.aio.AioRpcError) -> None:
        """The peer refused the whole batch: WARNING with its detail; the item it names is dropped and counted,
        and the rest sent once more (dropped and counted if that fails too); no item named: all dropped."""
        detail = error_detail_from_rpc_error(exc)
        field = detail.field if detail is not None else ""
        index = self.refused_index(field)
        log.warning("%s batch of %d refused by the peer (%s): %s", self.name, len(batch), field or "no field",
                    exc.details())
        if index is None or index >= len(batch):
            self.dropped += len(batch)
            return
        self.dropped += 1
        rest = batch[:index] + batch[index + 1:]
        if not rest:
            return
        try:
            await self.send(rest)
            self.sent += len(rest)
        except (grpc.aio.AioRpcError, OSError, TimeoutError) as again:
            self.dropped += len(rest)
            log.warning("%s batch of %d dropped: refused again without item %d: %s", self.name, len(rest), index,
                        again.details() if isinstance(again, grpc.aio.AioRpcError) else again)

    def refused_index(self, field: str) -> int | None:
        """The batch item a refusal's field names, if the feed sends one message per item (else None)."""
        return None

    def before_flush(self) -> None:
        """Hook run before each flush (the load feed closes its window here)."""

    async def send(self, batch: list[Any]) -> None:
        raise NotImplementedError

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s sender error", self.name)


class LoadFeed(_BoundedFeed):
    """Per-pool request/token counts per window, streamed to ForecasterService.StreamLoad."""

    name = "load-feed"

    def __init__(self, channel: grpc.aio.Channel | None, interval_s: float = 10.0, max_items: int = 10_000,
                 clock: Callable[[], float] = now_s) -> None:
        super().__init__(max_items, interval_s, batch_max=1000)
        self._stub = forecaster_pb2_grpc.ForecasterServiceStub(channel) if channel is not None else None
        self.clock = clock
        self.window: dict[str, list[int]] = {}
        self.window_start = clock()

    def record(self, pool: str, input_tokens: int, output_tokens: int) -> None:
        """Counts one finished request (request path; a dict update)."""
        counts = self.window.get(pool)
        if counts is None:
            counts = self.window[pool] = [0, 0, 0]
        counts[0] += 1
        counts[1] += input_tokens
        counts[2] += output_tokens

    def refused_index(self, field: str) -> int | None:
        """``samples[i].<field>``: one StreamLoadRequest per batch item, in order."""
        match = _SAMPLE_FIELD.match(field)
        return int(match.group(1)) if match else None

    def before_flush(self) -> None:
        now = self.clock()
        window_s = max(1e-3, now - self.window_start)
        for pool, (requests, inp, out) in self.window.items():
            self.put((pool, now, window_s, requests, inp, out))
        self.window = {}
        self.window_start = now

    async def send(self, batch: list[Any]) -> None:
        if self._stub is None:
            raise OSError("no forecaster configured")

        async def messages() -> AsyncIterator[forecaster_pb2.StreamLoadRequest]:
            for pool, end, window_s, requests, inp, out in batch:
                yield forecaster_pb2.StreamLoadRequest(pool=pool, time=_ts(end), window_s=window_s, requests=requests,
                                                       input_tokens=inp, output_tokens=out)

        await self._stub.StreamLoad(messages(), timeout=5.0)


class AccessFeed(_BoundedFeed):
    """Prefix access events (hit / miss / store of chained block hashes) to CacheManagerService."""

    name = "access-feed"

    def __init__(self, channel: grpc.aio.Channel | None, interval_s: float = 1.0, max_items: int = 100_000,
                 bytes_per_token: int = 131072, clock: Callable[[], float] = now_s) -> None:
        super().__init__(max_items, interval_s, batch_max=5000)
        self._stub = cache_manager_pb2_grpc.CacheManagerServiceStub(channel) if channel is not None else None
        self.bytes_per_token = bytes_per_token
        self.clock = clock

    def record(self, pool: str, last_hash: int, hit_hash: int, tokens: int, hit_tokens: int, session: str) -> None:
        """One request's prefix access: the entry is the prompt's deepest block; a hit names how many
        tokens were reused (request path; one tuple appended)."""
        self.put((pool, last_hash, hit_hash, tokens, hit_tokens, session, self.clock()))

    async def send(self, batch: list[Any]) -> None:
        if self._stub is None:
            raise OSError("no cache-manager configured")
        bpt = self.bytes_per_token

        async def messages() -> AsyncIterator[cache_manager_pb2.ReportAccessesRequest]:
            for pool, last_hash, hit_hash, tokens, hit_tokens, session, at in batch:
                ts = _ts(at)
                if hit_tokens > 0:
                    yield cache_manager_pb2.ReportAccessesRequest(
                        pool=pool, entry_key=f"{hit_hash:016x}", kind=cache_manager_pb2.ACCESS_KIND_HIT,
                        tokens=hit_tokens, size_bytes=hit_tokens * bpt, hit_tokens=hit_tokens,
                        conversation_id=session, time=ts, tier=common_pb2.CACHE_TIER_HBM)
                elif tokens > 0:
                    yield cache_manager_pb2.ReportAccessesRequest(
                        pool=pool, entry_key=f"{last_hash:016x}", kind=cache_manager_pb2.ACCESS_KIND_MISS,
                        tokens=tokens, size_bytes=tokens * bpt, conversation_id=session, time=ts)
                if tokens > hit_tokens:
                    yield cache_manager_pb2.ReportAccessesRequest(
                        pool=pool, entry_key=f"{last_hash:016x}", kind=cache_manager_pb2.ACCESS_KIND_STORE,
                        tokens=tokens, size_bytes=tokens * bpt, conversation_id=session, time=ts)

        await self._stub.ReportAccesses(messages(), timeout=5.0)
