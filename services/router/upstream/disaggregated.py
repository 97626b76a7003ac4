"""Disaggregated prefill/decode (DPD) pairs behind the router: one registered engine, two processes.

A pair registers as one engine (``common_pb2.Engine``) whose ``url`` is the decoder's and whose ``prefill_url`` is
the prefiller's. Each request of such an engine is proxied as vLLM's and LMCache's disaggregated-prefill proxies do
(vLLM ``examples/disaggregated``, LMCache ``examples/disagg_prefill``): first the request to the prefiller with
``max_tokens`` (and ``max_completion_tokens`` when given) set to 1, not streamed (``stream_options`` dropped); its
answer is read and discarded (the prefiller's KV connector has shipped the prompt's KV cache to the decoder by
then); then the real request goes to the decoder, which streams the text. The dispatcher (``dispatcher.py``) calls
``prefill`` right before it sends the request to ``engine.url``, inside the same first-token deadline.

LMCache's PD mode needs the prefiller told where the decoder listens: the pair's registration may carry
``prefill_kv_transfer_params`` (JSON, ``{"disagg_spec": {"receiver_host": ..., "receiver_init_port": [..],
"receiver_alloc_port": [..]}}``), added to every prefill request as ``kv_transfer_params`` with a fresh
``disagg_spec.req_id``, as LMCache's proxies do. The prefiller then answers once the KV cache is sent (its
``pd_skip_proxy_notification``: no ZMQ message to a proxy, the HTTP answer is the signal).

Errors of the prefill step: a connection failure, a timeout, HTTP 5xx/429 or an unreadable answer raise
``PrefillFailed`` (an ``EngineHttpError``, as the router's engine client raises), which the dispatcher treats like any failed attempt before the first
token (charged to the engine, retried on another one, else 503/UNAVAILABLE); a 4xx is the request's own fault and
is passed back to the caller as the prefiller's answer (``UpstreamClientError``), as the decoder's would be.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from greenserve.router.upstream.engine_pool import EnginePool
from greenserve.router.upstream.engine_wire import EngineHttpError, UpstreamClientError

PREFILL_MAX_BODY_BYTES = 16 * 1024 * 1024
"""Cap of the prefiller's answer (one token of a completion; read and discarded)."""


class PrefillFailed(EngineHttpError):
    """The prefill step of a DPD pair failed (the attempt fails; nothing reached the caller)."""


def kv_transfer_params(text: str) -> dict[str, Any]:
    """A registration's ``prefill_kv_transfer_params``: a JSON object whose ``disagg_spec``, when present, is an
    object; ValueError saying what is wrong."""
    try:
        params = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"must be a JSON object ({exc})") from None
    if not isinstance(params, dict):
        raise ValueError("must be a JSON object")  # a bad field value (INVALID_ARGUMENT)
    if "disagg_spec" in params and not isinstance(params["disagg_spec"], dict):
        raise ValueError("disagg_spec must be a JSON object")
    return params


def prefill_body(body: bytes, params: str = "") -> bytes:
    """The request for the prefiller: ``max_tokens`` 1 (and ``max_completion_tokens`` 1 when set), not streamed,
    with the pair's ``kv_transfer_params`` (``params``, a fresh ``disagg_spec.req_id``) when it has some."""
    try:
        obj: dict[str, Any] = json.loads(body)
    except ValueError as exc:
        raise PrefillFailed(f"request body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise PrefillFailed("request body is not a JSON object")
    obj["max_tokens"] = 1
    if "max_completion_tokens" in obj:
        obj["max_completion_tokens"] = 1
    obj["stream"] = False
    obj.pop("stream_options", None)
    if params:
        transfer = kv_transfer_params(params)  # checked at registration; parsed per request (DPD engines only)
        if isinstance(transfer.get("disagg_spec"), dict):
            transfer["disagg_spec"] = {**transfer["disagg_spec"], "req_id": uuid.uuid4().hex}
        obj["kv_transfer_params"] = transfer
    return json.dumps(obj, separators=(",", ":")).encode()


async def prefill(pool: EnginePool, engine: Any, path: str, body: bytes) -> None:
    """Runs the prefill step of one request on the pair's prefiller (``engine``: the pair's ``EngineState``; see
    the module docstring)."""
    prefill_url = engine.prefill_url
    resp = await pool.post(prefill_url, path, prefill_body(body, engine.prefill_kv_transfer_params))
    try:
        data = await resp.read(PREFILL_MAX_BODY_BYTES)
    except BaseException:
        resp.close()  # cut, too large or given up (the attempt's deadline): the prefiller aborts
        raise
    resp.release()
    if resp.status >= 500 or resp.status == 429:
        raise PrefillFailed(f"prefiller {prefill_url} answered HTTP {resp.status}")
    if resp.status >= 400:
        raise UpstreamClientError(resp.status, data, resp.content_type)
    try:
        answer = json.loads(data)
    except ValueError:
        raise PrefillFailed(f"prefiller {prefill_url} answered an unreadable body") from None
    if not isinstance(answer, dict) or "choices" not in answer:
        raise PrefillFailed(f"prefiller {prefill_url} answered no completion: {data[:200]!r}")
