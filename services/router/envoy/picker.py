"""The endpoint picker: Envoy's external processing service (envoy.service.ext_proc.v3.ExternalProcessor).

The protocol is the Gateway API Inference Extension's endpoint picker's: Envoy sends the request headers,
then the whole request body (``request_body_mode: BUFFERED``); the picker parses the body only for what the
routing needs (``model``, the prompt's text for prefix affinity), chooses an engine with the router's own
policy, plans, prefix index and engine registry, and answers the body with the chosen ``ip:port`` in the
``x-gateway-destination-endpoint`` request header and in the ``envoy.lb`` dynamic metadata under the same key;
Envoy's ORIGINAL_DST cluster sends the request there and streams the response without the picker. An
engine registered by host name is resolved first (addresses.py). When Envoy reads the response's usage
(its stream's ``x-greenserve-usage-reader`` metadata, usage_filter.py), a streamed request's body is
answered with ``stream_options.include_usage`` added, so the receipt gets the engine's token counts; with
the ``ext_proc`` reader the response's chunks come back here and are read by a ``UsageScanner``.

Routing hints are the HTTP front's: ``x-greenserve-pool``, ``x-greenserve-session`` / ``x-session-id``, else
the body's ``user``. A request the picker cannot route gets an immediate response, never a crash: 400 naming
the field (no body, not JSON, a bad field), 413 past the body limit, 404 for an unknown pool or model (as
vLLM answers), 503 with ``Retry-After`` when no engine of a known pool is up, 429 with ``Retry-After`` when
the router is at ``max_in_flight`` (the protocol's answer for a request dropped under load). The picker runs on
the router's gRPC server, so its bearer token / TLS apply (Envoy sends the token as ``authorization`` metadata,
see bootstrap.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from greenserve.router.core import RouterCore
from greenserve.router.envoy.addresses import EngineAddresses, UnresolvableEngine, destination
from greenserve.router.envoy.ledger import PROTOCOL, Ledger
from greenserve.router.envoy.usage_filter import READER_METADATA_KEY, STRIP_USAGE_HEADER, UsageScanner
from greenserve.router.front.http_front import MAX_JSON_DEPTH, BadRequest, json_too_deep, prompt_text
from greenserve.router.routing.policy import NoEngineError, UnknownTargetError
from greenserve.router.routing.prefix_index import chain_hashes

log = logging.getLogger("greenserve.router.envoy")

DESTINATION_HEADER = "x-gateway-destination-endpoint"
"""The Inference Extension's header (and ``envoy.lb`` metadata key) naming the chosen endpoint."""
LB_METADATA_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
"""Where a gateway may name the endpoints (``ip:port``) the picker must choose among (the protocol's subset hint)."""
CHAT_PATH = "/v1/chat/completions"


class _Refusal(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, err_type: str = "invalid_request_error",
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.err_type = err_type
        self.retry_after_s = retry_after_s


def _immediate(refusal: _Refusal) -> ext_pb2.ProcessingResponse:
    body = {"error": {"message": str(refusal), "type": refusal.err_type, "param": refusal.param,
                      "code": refusal.status}}
    headers = [base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key="content-type",
                                                                      raw_value=b"application/json"))]
    if refusal.retry_after_s is not None:
        headers.append(base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(
            key="retry-after", raw_value=str(refusal.retry_after_s).encode())))
    return ext_pb2.ProcessingResponse(immediate_response=ext_pb2.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=refusal.status),
        headers=ext_pb2.HeaderMutation(set_headers=headers), body=json.dumps(body).encode(),
        details=f"greenserve_picker_{refusal.status}"))


def _subset(request: ext_pb2.ProcessingRequest) -> set[str] | None:
    """The subset hint of the request's filter metadata: None when absent (any engine), else the endpoints."""
    namespace = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if namespace is None or SUBSET_KEY not in namespace.fields:
        return None
    value = namespace.fields[SUBSET_KEY]
    if value.WhichOneof("kind") != "list_value":
        raise _Refusal(400, f"{SUBSET_KEY}: the subset hint must be a list of ip:port strings", SUBSET_KEY)
    return {v.string_value for v in value.list_value.values if v.WhichOneof("kind") == "string_value"}


def _header_map(headers: Any) -> dict[str, str]:
    return {h.key.lower(): (h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value)
            for h in headers.headers}


class EndpointPicker(ext_grpc.ExternalProcessorServicer):
    """One ``Process`` stream per HTTP request: headers in, body in, the chosen endpoint out."""

    def __init__(self, core: RouterCore, ledger: Ledger, max_body_bytes: int) -> None:
        self.core = core
        self.ledger = ledger
        self.max_body_bytes = max_body_bytes
        self.addresses = EngineAddresses()

    async def Process(self, request_iterator: AsyncIterator[ext_pb2.ProcessingRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[ext_pb2.ProcessingResponse]:
        headers: dict[str, str] = {}
        subset: set[str] | None = None
        scanner: UsageScanner | None = None
        request_id = ""
        chunks: list[bytes] = []
        size = 0
        async for request in request_iterator:
            kind = request.WhichOneof("request")
            if kind == "request_headers":
                headers = _header_map(request.request_headers.headers)
                try:
                    subset = _subset(request)
                except _Refusal as refusal:
                    yield _immediate(refusal)
                    return
                if request.request_headers.end_of_stream:
                    yield _immediate(_Refusal(400, "a JSON request body is required", None))
                    return
                yield ext_pb2.ProcessingResponse(request_headers=ext_pb2.HeadersResponse())
            elif kind == "request_body":
                body = request.request_body
                size += len(body.body)
                if size > self.max_body_bytes:
                    yield _immediate(_Refusal(413, f"request body larger than the limit of {self.max_body_bytes}"
                                                   " bytes (--http-max-body-bytes)"))
                    return
                chunks.append(body.body)
                if not body.end_of_stream:  # streamed body mode: wait for the rest
                    yield ext_pb2.ProcessingResponse(request_body=ext_pb2.BodyResponse())
                    continue
                if subset is not None:  # engines registered by name are compared by their addresses
                    await self._resolve_all()
                reader = _reader(context)
                try:
                    request_id, url, new_body = self._pick(headers, b"".join(chunks), subset, reader is not None)
                    endpoint = self.addresses.cached(url) or await self._resolve_picked(request_id, url)
                except _Refusal as refusal:
                    yield _immediate(refusal)
                    return
                if reader == "ext_proc":
                    scanner = UsageScanner(strip=new_body is not None)
                yield self._routed(endpoint, new_body, strip_header=reader == "lua")
            elif kind == "response_headers":
                yield ext_pb2.ProcessingResponse(response_headers=ext_pb2.HeadersResponse())
            elif kind == "response_body":
                mutation = None
                if scanner is not None:
                    kept = scanner.feed(request.response_body.body)
                    if kept is not None:
                        mutation = ext_pb2.BodyMutation(body=kept)
                    if request.response_body.end_of_stream:  # before Envoy ends the stream and logs it
                        self.ledger.note_usage(request_id, scanner.usage, scanner.first_token_wall_s)
                yield ext_pb2.ProcessingResponse(response_body=ext_pb2.BodyResponse(
                    response=ext_pb2.CommonResponse(body_mutation=mutation) if mutation is not None else None))
            elif kind == "request_trailers":
                yield ext_pb2.ProcessingResponse(request_trailers=ext_pb2.TrailersResponse())
            elif kind == "response_trailers":
                yield ext_pb2.ProcessingResponse(response_trailers=ext_pb2.TrailersResponse())

    async def _resolve_all(self) -> None:
        for engine in list(self.core.registry.engines.values()):
            try:
                await self.addresses.resolve(engine.url)
            except UnresolvableEngine:
                pass  # compared by its name; a pick of it is refused in _resolve_picked

    async def _resolve_picked(self, request_id: str, url: str) -> str:
        try:
            return await self.addresses.resolve(url)
        except UnresolvableEngine as exc:
            engine = self.ledger.abandon_unsent(request_id)
            if engine is not None:
                self.core.registry.record_failure(engine, time.monotonic(), str(exc))
            self.core.count_failure(PROTOCOL, "unavailable")
            raise _Refusal(503, str(exc), err_type="service_unavailable", retry_after_s=1) from None

    def _pick(self, headers: dict[str, str], raw: bytes, subset: set[str] | None = None, read_usage: bool = False
              ) -> tuple[str, str, bytes | None]:
        """The request id, the chosen engine's URL, and the body to send instead of the caller's (None: the
        caller's as is). ``read_usage``: Envoy reads the response's usage (usage_filter.py): ask the engine
        for it."""
        core = self.core
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Refusal(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise _Refusal(400, "request body must be a JSON object")
        if json_too_deep(body, MAX_JSON_DEPTH):
            raise _Refusal(400, f"request body nests deeper than {MAX_JSON_DEPTH} levels")
        model = body.get("model", "")
        try:
            if not isinstance(model, str):
                raise BadRequest("model", "must be a string")
            text = prompt_text(body, headers.get(":path", "").split("?", 1)[0] == CHAT_PATH)
            new_body = with_usage_requested(raw, body) if read_usage else None
        except BadRequest as exc:
            raise _Refusal(400, f"{exc.param}: {exc}", exc.param) from None
        request_id = headers.get("x-request-id", "")
        if not request_id:
            raise _Refusal(400, "x-request-id: missing (Envoy's HTTP connection manager sets it unless "
                                "generate_request_id is off)", "x-request-id")
        pool = headers.get("x-greenserve-pool", "")
        user = body.get("user")
        session_key = headers.get("x-greenserve-session") or headers.get("x-session-id") or \
            (user if isinstance(user, str) else "")
        hashes = chain_hashes(text, core.config.prefix_block_chars)
        if not core.admit():  # released when Envoy's access log closes the request (ledger.py)
            # the protocol's answer for a request dropped under load (and the HTTP front's at the same limit)
            raise _Refusal(429, "the router is at its in-flight limit (--max-in-flight); retry later",
                           err_type="overloaded", retry_after_s=1)
        tried: set[str] = set()
        outside: set[str] = set()  # engines the gateway's subset hint leaves out
        try:
            if subset is not None:
                candidates = core.registry.candidates(pool, model)
                outside = {e.id for e in candidates
                           if (self.addresses.cached(e.url) or destination(e.url)) not in subset}
                if candidates and len(outside) == len(candidates):  # (none at all: choose names the pool/model)
                    raise NoEngineError(f"{SUBSET_KEY}: no engine of the request is among the {len(subset)} "
                                        "endpoints the gateway allows")
            decision = core.policy.choose(pool, model, hashes, session_key, exclude=outside)
            # a DPD pair needs the router's own front (the prefill step): Envoy would send to its decoder only
            while decision.engine.prefill_url:
                tried.add(decision.engine.id)
                decision = core.policy.choose(pool, model, hashes, session_key, exclude=tried | outside)
        except UnknownTargetError as exc:
            core.release()
            core.count_failure(PROTOCOL, exc.outcome)
            raise _Refusal(404, str(exc), exc.http_param, err_type="NotFoundError") from None
        except NoEngineError as exc:
            core.release()
            core.count_failure(PROTOCOL, "unavailable")
            raise _Refusal(503, str(exc) + (" (disaggregated prefill/decode pairs are served by the router's own "
                                            "front, not through Envoy)" if tried else ""),
                           err_type="service_unavailable", retry_after_s=1) from None
        if hashes:
            core.index.insert(decision.engine.id, hashes)
        self.ledger.open(request_id, decision, hashes, len(text))
        return request_id, decision.engine.url, new_body

    @staticmethod
    def _routed(endpoint: str, new_body: bytes | None = None, strip_header: bool = False
                ) -> ext_pb2.ProcessingResponse:
        headers = [_set(DESTINATION_HEADER, endpoint.encode())]
        mutation = None
        if new_body is not None:  # Envoy sends the mutated body with the caller's content-length: set it too
            headers.append(_set("content-length", str(len(new_body)).encode()))
            if strip_header:  # the Lua filter drops the usage event the caller did not ask for
                headers.append(_set(STRIP_USAGE_HEADER, b"1"))
            mutation = ext_pb2.BodyMutation(body=new_body)
        metadata = struct_pb2.Struct()
        metadata.update({LB_METADATA_NAMESPACE: {DESTINATION_HEADER: endpoint}})
        return ext_pb2.ProcessingResponse(
            request_body=ext_pb2.BodyResponse(response=ext_pb2.CommonResponse(
                header_mutation=ext_pb2.HeaderMutation(set_headers=headers), body_mutation=mutation,
                clear_route_cache=True)),
            dynamic_metadata=metadata)


def _reader(context: grpc.aio.ServicerContext) -> str | None:
    """The usage reader the Envoy of this stream runs (its gRPC metadata, bootstrap.py); None: none."""
    for key, value in context.invocation_metadata() or ():
        if key == READER_METADATA_KEY:
            return value if value in ("lua", "ext_proc") else None
    return None


def _set(key: str, value: bytes) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value),
                                      append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)


def with_usage_requested(raw: bytes, body: dict[str, Any]) -> bytes | None:
    """For a streamed request whose caller did not ask for usage: its body asking the engine for it (the usage
    filter reads it and drops it from the caller's stream, usage_filter.py). None when nothing changes: not
    streamed, or the caller asked for usage itself."""
    if body.get("stream") is not True:
        return None
    options = body.get("stream_options")
    if options is None:
        trimmed = raw.rstrip()
        if trimmed.endswith(b"}"):  # the caller's bytes with the request spliced in (no re-encoding)
            return trimmed[:-1] + b',"stream_options":{"include_usage":true}}'
    elif not isinstance(options, dict):
        raise BadRequest("stream_options", "must be an object")
    elif options.get("include_usage") is True:
        return None
    body = {**body, "stream_options": {**(options or {}), "include_usage": True}}
    return json.dumps(body, separators=(",", ":")).encode()
