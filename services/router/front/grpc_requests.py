"""A gRPC RequestDescriptor / GenerateRequest as the engine's OpenAI request (path, prompt, JSON body),
with INVALID_ARGUMENT naming the field that is malformed; used by Generate and Route."""

from __future__ import annotations

import math
from typing import Any

from greenserve.common.errors import InvalidArgument
from greenserve.router.routing.prefix_index import render_chat
from greenserve.v1 import router_pb2

_ROLES = {
    router_pb2.CHAT_ROLE_SYSTEM: "system",
    router_pb2.CHAT_ROLE_USER: "user",
    router_pb2.CHAT_ROLE_ASSISTANT: "assistant",
    router_pb2.CHAT_ROLE_TOOL: "tool",
}


def _finite(field: str, value: float, lo: float, hi: float) -> float:
    if not math.isfinite(value) or not lo <= value <= hi:
        raise InvalidArgument(field, f"must be a finite number in [{lo:g}, {hi:g}], got {value!r}")
    return value


def describe(desc: router_pb2.RequestDescriptor, field: str = "request") -> tuple[str, str, list[dict[str, str]] | None]:
    """(path, prompt text, chat messages or None) of a request descriptor; InvalidArgument when malformed."""
    which = desc.WhichOneof("input")
    if which == "chat":
        if not desc.chat.messages:
            raise InvalidArgument(f"{field}.chat.messages", "must hold at least one message")
        messages = []
        for i, m in enumerate(desc.chat.messages):
            role = _ROLES.get(m.role)
            if role is None:
                raise InvalidArgument(f"{field}.chat.messages[{i}].role", "must be SYSTEM, USER, ASSISTANT or TOOL")
            messages.append({"role": role, "content": m.content})
        return "/v1/chat/completions", render_chat((m["role"], m["content"]) for m in messages), messages
    if which == "completion":
        return "/v1/completions", desc.completion.prompt, None
    raise InvalidArgument(f"{field}.input", "set chat or completion")


def _body(request: router_pb2.GenerateRequest, messages: list[dict[str, str]] | None, prompt: str) -> dict[str, Any]:
    s = request.sampling
    body: dict[str, Any] = {"model": request.request.model, "stream": True,
                            "stream_options": {"include_usage": True}}
    if messages is not None:
        body["messages"] = messages
    else:
        body["prompt"] = prompt
    if s.max_tokens:
        body["max_tokens"] = s.max_tokens
    if s.HasField("temperature"):
        body["temperature"] = _finite("sampling.temperature", s.temperature, 0.0, 2.0)
    if s.HasField("top_p"):
        body["top_p"] = _finite("sampling.top_p", s.top_p, 0.0, 1.0)
    if s.stop:
        body["stop"] = list(s.stop)
    if s.HasField("seed"):
        body["seed"] = s.seed
    if request.request.session_key:
        body["user"] = request.request.session_key
    return body
