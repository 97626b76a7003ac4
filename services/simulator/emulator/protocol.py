"""Validation of OpenAI-compatible request bodies, with vLLM's error shapes.

Errors are ``{"error": {"message", "type", "param", "code"}}`` (vLLM's ``ErrorResponse``), status 400
(``BadRequestError``) naming the offending field in ``param`` and in the message, or 404
(``NotFoundError``) for an unknown model, as ``vllm serve`` answers. Sampling parameters that change
only *which* tokens a real model picks (temperature, top_p, seed, ...) are type-checked and ignored:
the emulator's text is deterministic filler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from greenserve.simulator.emulator.tokenizer import (
    CHAT_ROLES,
    apply_chat_template,
    tokenize,
)

#: max_tokens of a completion request that names none (OpenAI's and vLLM's default for /v1/completions)
DEFAULT_COMPLETION_MAX_TOKENS = 16


class ApiError(Exception):
    """An OpenAI-style error answer."""

    def __init__(self, status: int, message: str, param: str | None = None, err_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.err_type = err_type or {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
                                     503: "ServiceUnavailableError"}.get(status, "Error")

    def body(self) -> dict[str, Any]:
        """JSON body of the error response."""
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}


def bad(param: str, message: str) -> ApiError:
    """400 naming ``param``."""
    return ApiError(400, f"{param}: {message}", param)


@dataclass
class GenerationRequest:
    """A validated /v1/completions or /v1/chat/completions request."""

    chat: bool
    prompt_token_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    continuous_usage_stats: bool


def _opt_bool(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(key, "must be a boolean")
    return value


def _opt_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(key, f"must be an integer, got {value!r}")
    return value


def _opt_number(body: dict[str, Any], key: str, lo: float, hi: float) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not lo <= value <= hi:
        raise bad(key, f"must be a number in [{lo}, {hi}], got {value!r}")


def _check_model(body: dict[str, Any], served_model: str) -> None:
    model = body.get("model")
    if model is None:
        raise bad("model", "field required")
    if not isinstance(model, str):
        raise bad("model", "must be a string")
    if model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")


def _prompt_ids(prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        ids = tokenize(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
        if any(t < 0 for t in ids):
            raise bad("prompt", "token ids must be >= 0")
    elif isinstance(prompt, list) and len(prompt) == 1:
        return _prompt_ids(prompt[0])
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise bad("prompt", "a list of several prompts is not supported by the emulator; send one prompt per request")
    else:
        raise bad("prompt", "must be a string, a list of token ids, or a one-element list of either")
    if not ids:
        raise bad("prompt", "must not be empty")
    return ids


def _message_text(i: int, message: Any) -> tuple[str, str]:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise bad(where, "must be an object with role and content")
    role = message.get("role")
    if not isinstance(role, str) or role not in CHAT_ROLES:  # a dict or list role is unhashable: check the type first
        raise bad(f"{where}.role", f"must be one of {', '.join(sorted(CHAT_ROLES))}, got {role!r}")
    content = message.get("content")
    if content is None:
        if role == "assistant":
            return role, ""
        raise bad(f"{where}.content", "field required")
    if isinstance(content, str):
        return role, content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"{where}.content[{j}]", "only {\"type\": \"text\", \"text\": ...} parts are supported")
            texts.append(part["text"])
        return role, "\n".join(texts)
    raise bad(f"{where}.content", "must be a string or a list of text parts")


def parse_generation(
    body: Any, *, chat: bool, served_model: str, max_model_len: int, default_chat_max_tokens: int
) -> GenerationRequest:
    """Validate a request body; raise ApiError (400 naming the field, or 404 for the model)."""
    if not isinstance(body, dict):
        raise bad("body", "must be a JSON object")
    _check_model(body, served_model)
    if chat:
        messages = body.get("messages")
        if messages is None:
            raise bad("messages", "field required")
        if not isinstance(messages, list) or not messages:
            raise bad("messages", "must be a non-empty list")
        pairs = [_message_text(i, m) for i, m in enumerate(messages)]
        prompt_ids = tokenize(apply_chat_template(pairs, add_generation_prompt=True))
        prompt_field = "messages"
    else:
        if "prompt" not in body or body["prompt"] is None:
            raise bad("prompt", "field required")
        if body.get("suffix") is not None:
            raise bad("suffix", "suffix is not currently supported")
        prompt_ids = _prompt_ids(body["prompt"])
        prompt_field = "prompt"

    n = _opt_int(body, "n")
    if n is not None and n != 1:
        raise bad("n", f"only n=1 is supported by the emulator, got {n}")
    best_of = _opt_int(body, "best_of")
    if best_of is not None and best_of != 1:
        raise bad("best_of", f"only best_of=1 is supported by the emulator, got {best_of}")
    for key in ("logprobs", "top_logprobs", "prompt_logprobs"):
        value = body.get(key)
        if value not in (None, False):
            raise bad(key, "log probabilities are not produced by the emulator")
    if body.get("echo") not in (None, False):
        raise bad("echo", "echo is not supported by the emulator")
    _opt_number(body, "temperature", 0.0, 2.0)
    _opt_number(body, "top_p", 1e-9, 1.0)
    _opt_number(body, "presence_penalty", -2.0, 2.0)
    _opt_number(body, "frequency_penalty", -2.0, 2.0)
    _opt_int(body, "seed")

    max_tokens_key = "max_tokens"
    max_tokens = _opt_int(body, "max_tokens")
    if chat and max_tokens is None and body.get("max_completion_tokens") is not None:
        max_tokens_key = "max_completion_tokens"
        max_tokens = _opt_int(body, "max_completion_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise bad(max_tokens_key, f"must be at least 1, got {max_tokens}")
    prompt_tokens = len(prompt_ids)
    if prompt_tokens >= max_model_len:
        raise bad(
            prompt_field,
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input.",
        )
    if max_tokens is None:
        max_tokens = default_chat_max_tokens if chat else DEFAULT_COMPLETION_MAX_TOKENS
        max_tokens = min(max_tokens, max_model_len - prompt_tokens)
    elif prompt_tokens + max_tokens > max_model_len:
        raise bad(
            max_tokens_key,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {prompt_field}, {max_tokens} in the "
            "completion). Please reduce the length of the input or completion.",
        )
    min_tokens = _opt_int(body, "min_tokens") or 0
    if min_tokens < 0 or min_tokens > max_tokens:
        raise bad("min_tokens", f"must be in [0, max_tokens={max_tokens}], got {min_tokens}")

    stop_raw = body.get("stop")
    if stop_raw is None:
        stop: tuple[str, ...] = ()
    elif isinstance(stop_raw, str):
        stop = (stop_raw,)
    elif isinstance(stop_raw, list) and all(isinstance(s, str) for s in stop_raw):
        stop = tuple(stop_raw)
    else:
        raise bad("stop", "must be a string or a list of strings")
    if any(not s for s in stop):
        raise bad("stop", "stop strings must not be empty")

    stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    include_usage = continuous = False
    if options is not None:
        if not stream:
            raise bad("stream_options", "Stream options can only be defined when `stream=True`.")
        if not isinstance(options, dict):
            raise bad("stream_options", "must be an object")
        for key in ("include_usage", "continuous_usage_stats"):
            if options.get(key) is not None and not isinstance(options[key], bool):
                raise bad(f"stream_options.{key}", "must be a boolean")
        include_usage = bool(options.get("include_usage"))
        continuous = bool(options.get("continuous_usage_stats"))
    return GenerationRequest(
        chat=chat,
        prompt_token_ids=prompt_ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_opt_bool(body, "ignore_eos"),
        stop=stop,
        stream=stream,
        include_usage=include_usage,
        continuous_usage_stats=continuous,
    )
