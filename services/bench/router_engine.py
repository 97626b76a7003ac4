"""A cheap OpenAI-compatible streaming engine for the router benchmarks (``--engine noop``).

The simulator's emulator (``services/simulator/emulator``) models an engine: a scheduler, KV blocks, a
prefix cache, a performance model. Under a router benchmark at 1 000 streams its own core saturates
before the router does, so the figure measures the emulator. This engine models nothing and costs as
little CPU per streamed token as Python allows, so that the router is what the bench measures:

* uvloop and a raw ``asyncio.Protocol`` with httptools' request parser (the parser uvicorn uses), no
  web framework, no task per request;
* every byte it sends is built once at start (each token event of the text cycle already framed as an
  HTTP chunk, per route), so a token costs one ``transport.write`` of a prebuilt ``bytes``;
* one timer per engine tick (``--tpot-s``, default 20 ms, about the emulator's ~19 ms per token) sends
  the next token of every open stream; no sleep or task per stream. The first token goes out on arrival
  (plus ``--ttft-s``, default 0), so a router's added TTFT is not hidden in a tick's phase;
  ``--tpot-s 0`` writes the whole stream at once (the workers phase's throughput engine).

Routes, the subset of ``vllm serve`` the router uses (``upstream/dispatcher.py``, ``routing/scrape.py``, ``core.py``):
``POST /v1/completions`` and ``/v1/chat/completions`` (``stream`` true or false, ``stream_options.
include_usage``; every request gets exactly ``max_tokens`` tokens, default 16), ``GET /health``,
``GET /v1/models`` and ``GET /metrics`` with the ``vllm:`` series the router scrapes (running, waiting,
KV usage, prefix-cache queries/hits, TTFT and inter-token latency histograms as sum and count). The SSE
is byte for byte the emulator's (one choice per event, ``"finish_reason":null`` on running events, a
usage event with ``choices: []``, ``data: [DONE]``). A bad body is a 400 naming the field, an unknown
model a 404, as vLLM answers.

Run: ``python -m greenserve.bench.router_engine serve [--port P] [--tpot-s S]`` (prints ``listening on
http://127.0.0.1:PORT``); ``python -m greenserve.bench.router_engine_cpu`` measures its CPU per streamed
token against the emulator's under the same load (one JSON line).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

import httptools
from greenserve.common.cli_parser import Parser

DEFAULT_MODEL = "noop"
DEFAULT_TPOT_S = 0.02
DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 1 << 20
#: the text cycle each stream repeats (token i is _TOKENS[i % len(_TOKENS)])
_TOKENS = (" the", " carbon", " aware", " router", " serves", " many", " streams", ".")
_CYCLE = len(_TOKENS)


def _chunk(data: bytes) -> bytes:
    """``data`` framed as one HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


_CHUNK_END = b"0\r\n\r\n"
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n"
             b"transfer-encoding: chunked\r\n\r\n")


def expected_text(tokens: int) -> str:
    """The text a request for ``tokens`` tokens receives."""
    return "".join(_TOKENS[i % _CYCLE] for i in range(tokens))


class _Route:
    """Everything one route (chat or completion) sends, prebuilt."""

    def __init__(self, model: str, chat: bool) -> None:
        self.chat = chat
        self.obj = "chat.completion.chunk" if chat else "text_completion"
        self.rid = "chatcmpl-bench" if chat else "cmpl-bench"
        common = f'"id":"{self.rid}","object":"{self.obj}","created":0,"model":{json.dumps(model)}'
        self.common = common
        if chat:
            head = 'data: {' + common + ',"choices":[{"index":0,"delta":{"content":'
            self.mid = '},"logprobs":null,"finish_reason":'
        else:
            head = 'data: {' + common + ',"choices":[{"index":0,"text":'
            self.mid = ',"logprobs":null,"finish_reason":'
        self.head = head
        self.model = model
        # running events, framed as chunks; [usage null variant, usage-less variant]
        self.running: dict[bool, list[bytes]] = {}
        self.running_sse: dict[bool, list[bytes]] = {}
        for include_usage in (False, True):
            tail = self.mid + 'null,"stop_reason":null}]' + (',"usage":null' if include_usage else "") + "}\n\n"
            events = [(head + json.dumps(t) + tail).encode() for t in _TOKENS]
            self.running_sse[include_usage] = events
            self.running[include_usage] = [_chunk(e) for e in events]
        self.role: dict[bool, bytes] = {
            u: ('data: {' + common + ',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                '"logprobs":null,"finish_reason":null}]' + (',"usage":null' if u else "") + "}\n\n").encode()
            for u in (False, True)
        }
        self._finals: dict[tuple[int, bool, int], bytes] = {}

    def usage(self, prompt_tokens: int, tokens: int) -> dict[str, Any]:
        return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + tokens, "completion_tokens": tokens,
                "prompt_tokens_details": {"cached_tokens": 0}}

    def final(self, tokens: int, include_usage: bool, prompt_tokens: int) -> bytes:
        """The last token event (finish reason ``length``), the usage event when asked, ``[DONE]`` and the
        chunked body's end, framed, as one write (cached per shape)."""
        key = (tokens, include_usage, prompt_tokens)
        data = self._finals.get(key)
        if data is None:
            usage_null = ',"usage":null' if include_usage else ""
            last = (self.head + json.dumps(_TOKENS[(tokens - 1) % _CYCLE]) + self.mid + '"length","stop_reason":null}]'
                    + usage_null + "}\n\n")
            events = [last]
            if include_usage:
                events.append("data: " + json.dumps({"id": self.rid, "object": self.obj, "created": 0,
                                                     "model": self.model, "choices": [],
                                                     "usage": self.usage(prompt_tokens, tokens)},
                                                    separators=(",", ":")) + "\n\n")
            events.append("data: [DONE]\n\n")
            data = _chunk("".join(events).encode()) + _CHUNK_END
            if len(self._finals) < 65536:
                self._finals[key] = data
        return data

    def unary(self, tokens: int, prompt_tokens: int) -> bytes:
        """A non-streamed response, whole (head and body)."""
        text = expected_text(tokens)
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                                      "logprobs": None, "finish_reason": "length", "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None,
                      "prompt_logprobs": None}
        body = json.dumps({"id": self.rid, "object": self.obj.removesuffix(".chunk"), "created": 0,
                           "model": self.model, "choices": [choice],
                           "usage": self.usage(prompt_tokens, tokens)}).encode()
        return _response(200, body, "application/json")


def _response(status: int, body: bytes, content_type: str) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}.get(status, "Error")
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
            .encode() + body)


def _error(status: int, message: str, param: str | None = None) -> bytes:
    err = {"object": "error", "message": message, "type": "BadRequestError" if status == 400 else "NotFoundError",
           "param": param, "code": status}
    return _response(status, json.dumps({"error": err}).encode(), "application/json")


class _ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.response = _error(status, message, param)


def _prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    """About a token per 4 characters of the prompt (this engine has no tokenizer)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _ApiError(400, "messages: must be a non-empty list", "messages")
        chars = 0
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise _ApiError(400, f"messages[{i}]: must be an object", f"messages[{i}]")
            content = m.get("content")
            chars += len(content) if isinstance(content, str) else len(json.dumps(content))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            chars = len(prompt)
        elif isinstance(prompt, list) and prompt:
            return len(prompt) if all(isinstance(x, int) for x in prompt) else max(1, len(json.dumps(prompt)) // 4)
        else:
            raise _ApiError(400, "prompt: must be a string or a non-empty list", "prompt")
    return max(1, chars // 4)


class _Stream:
    """One request being served: the connection and how many tokens are still to send."""

    __slots__ = ("conn", "done", "include_usage", "prompt_tokens", "route", "sent", "stream", "tokens")

    def __init__(self, conn: _Conn, route: _Route, tokens: int, include_usage: bool, prompt_tokens: int,
                 stream: bool) -> None:
        self.conn = conn
        self.route = route
        self.tokens = tokens
        self.sent = 0
        self.include_usage = include_usage
        self.prompt_tokens = prompt_tokens
        self.stream = stream
        self.done = False


class BenchEngine:
    """The engine's state: the routes, the open streams, the tick and the counters /metrics shows."""

    def __init__(self, model: str = DEFAULT_MODEL, tpot_s: float = DEFAULT_TPOT_S, ttft_s: float = 0.0) -> None:
        if tpot_s < 0 or ttft_s < 0:
            raise ValueError("tpot_s and ttft_s must be >= 0")
        self.model = model
        self.tpot_s = tpot_s
        self.ttft_s = ttft_s
        self.routes = {b"/v1/completions": _Route(model, False), b"/v1/chat/completions": _Route(model, True)}
        self.streams: list[_Stream] = []
        self.waiting = 0  # requests held by --ttft-s before their first token
        self._timer: asyncio.TimerHandle | None = None
        self._next_tick = 0.0
        self.loop: asyncio.AbstractEventLoop | None = None
        # counters for /metrics
        self.requests = 0
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.itl_count = 0
        self.ticks = 0  # engine steps run (one timer each, whatever the number of open streams)
        self.models_body = _response(200, json.dumps({"object": "list", "data": [
            {"id": model, "object": "model", "created": 0, "owned_by": "greenserve-bench", "root": model,
             "max_model_len": 1 << 20}]}).encode(), "application/json")

    # -- requests --------------------------------------------------------------------------------------

    def handle(self, conn: _Conn, method: bytes, path: bytes, body: bytes) -> None:
        path = path.split(b"?", 1)[0]
        if method == b"GET":
            if path == b"/health":
                conn.send(_response(200, b"", "text/plain"))
            elif path == b"/v1/models":
                conn.send(self.models_body)
            elif path == b"/metrics":
                conn.send(_response(200, self.metrics_text().encode(), "text/plain; version=0.0.4"))
            else:
                conn.send(_error(404, f"no route {path.decode('latin-1')}"))
            return
        route = self.routes.get(path)
        if route is None:
            conn.send(_error(404, f"no route {path.decode('latin-1')}"))
            return
        if method != b"POST":
            conn.send(_error(405, "use POST"))
            return
        try:
            stream = self._parse(route, body)
        except _ApiError as exc:
            conn.send(exc.response)
            return
        stream.conn = conn
        conn.busy = True
        self.requests += 1
        self.prompt_tokens += stream.prompt_tokens
        if self.ttft_s > 0:
            self.waiting += 1
            assert self.loop is not None
            self.loop.call_later(self.ttft_s, self._first, stream)
        else:
            self._first(stream)

    def _parse(self, route: _Route, raw: bytes) -> _Stream:
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise _ApiError(400, f"body: not JSON ({exc})", "body") from None
        if not isinstance(body, dict):
            raise _ApiError(400, "body: must be a JSON object", "body")
        model = body.get("model")
        if model not in (None, "", self.model):
            raise _ApiError(404, f"The model `{model}` does not exist.", "model")
        tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if tokens is None:
            tokens = DEFAULT_MAX_TOKENS
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_TOKENS_LIMIT:
            raise _ApiError(400, f"max_tokens: must be an integer in [1, {MAX_TOKENS_LIMIT}]", "max_tokens")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise _ApiError(400, "stream: must be a boolean", "stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise _ApiError(400, "stream_options: must be an object", "stream_options")
        include_usage = bool(options.get("include_usage")) and stream
        return _Stream(None, route, tokens, include_usage, _prompt_tokens(body, route.chat), stream)  # type: ignore[arg-type]

    def _first(self, s: _Stream) -> None:
        """The first token (with the head), or the whole response when there is no tick."""
        if self.ttft_s > 0:
            self.waiting -= 1
        conn = s.conn
        if conn.closed:
            return
        route = s.route
        if not s.stream:
            if self.tpot_s == 0 or s.tokens == 1:
                self._finish(s)
            else:
                s.sent = 1
                self._add(s)
            return
        head = _SSE_HEAD + _chunk(route.role[s.include_usage]) if route.chat else _SSE_HEAD
        if s.tokens == 1:
            conn.transport.write(head + route.final(1, s.include_usage, s.prompt_tokens))
            self._done(s)
            return
        if self.tpot_s == 0:  # the whole stream at once
            running = route.running[s.include_usage]
            conn.transport.write(head + b"".join(running[i % _CYCLE] for i in range(s.tokens - 1))
                                 + route.final(s.tokens, s.include_usage, s.prompt_tokens))
            self.itl_count += s.tokens - 1
            self._done(s)
            return
        conn.transport.write(head + route.running[s.include_usage][0])
        s.sent = 1
        self._add(s)

    def _add(self, s: _Stream) -> None:
        self.streams.append(s)
        if self._timer is None:
            assert self.loop is not None
            self._next_tick = self.loop.time() + self.tpot_s
            self._timer = self.loop.call_at(self._next_tick, self._tick)

    def _tick(self) -> None:
        """One engine step: the next token of every open stream."""
        self.ticks += 1
        keep: list[_Stream] = []
        emitted = 0
        for s in self.streams:
            if s.conn.closed:
                continue
            s.sent += 1
            if s.sent >= s.tokens:
                self._finish(s)
            else:
                if s.stream:
                    s.conn.transport.write(s.route.running[s.include_usage][(s.sent - 1) % _CYCLE])
                keep.append(s)
            emitted += 1
        self.itl_count += emitted
        self.streams = keep
        if keep:
            assert self.loop is not None
            now = self.loop.time()
            self._next_tick += self.tpot_s
            self._next_tick = max(self._next_tick, now)  # fell behind: tick now, not in a burst to catch up
            self._timer = self.loop.call_at(self._next_tick, self._tick)
        else:
            self._timer = None

    def _finish(self, s: _Stream) -> None:
        route = s.route
        if s.stream:
            s.conn.transport.write(route.final(s.tokens, s.include_usage, s.prompt_tokens))
        else:
            s.conn.transport.write(route.unary(s.tokens, s.prompt_tokens))
        self._done(s)

    def _done(self, s: _Stream) -> None:
        self.generation_tokens += s.tokens
        s.done = True
        s.conn.busy = False
        s.conn.next_request()

    # -- metrics ---------------------------------------------------------------------------------------

    def metrics_text(self) -> str:
        """The ``vllm:`` series the router scrapes (``scrape.METRIC_NAMES``), in Prometheus text format."""
        label = f'{{model_name={json.dumps(self.model)}}}'
        running = sum(1 for s in self.streams if not s.conn.closed)
        ttft_sum = self.requests * self.ttft_s
        lines = [
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{label} {running}",
            "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{label} {self.waiting}",
            "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{label} 0.0",
            "# TYPE vllm:prefix_cache_queries counter", f"vllm:prefix_cache_queries_total{label} {self.prompt_tokens}",
            "# TYPE vllm:prefix_cache_hits counter", f"vllm:prefix_cache_hits_total{label} 0",
            "# TYPE vllm:generation_tokens counter", f"vllm:generation_tokens_total{label} {self.generation_tokens}",
            "# TYPE vllm:time_to_first_token_seconds histogram",
            f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name={json.dumps(self.model)}}} {self.requests}',
            f"vllm:time_to_first_token_seconds_count{label} {self.requests}",
            f"vllm:time_to_first_token_seconds_sum{label} {ttft_sum}",
            "# TYPE vllm:inter_token_latency_seconds histogram",
            f'vllm:inter_token_latency_seconds_bucket{{le="+Inf",model_name={json.dumps(self.model)}}} {self.itl_count}',
            f"vllm:inter_token_latency_seconds_count{label} {self.itl_count}",
            f"vllm:inter_token_latency_seconds_sum{label} {self.itl_count * self.tpot_s}",
        ]
        return "\n".join(lines) + "\n"


class _Conn(asyncio.Protocol):
    """One client connection: httptools parses, requests are answered in order (keep-alive)."""

    def __init__(self, engine: BenchEngine) -> None:
        self.engine = engine
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.closed = False
        self.busy = False
        self.pending: deque[tuple[bytes, bytes, bytes]] = deque()
        self._url = b""
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(_error(400, "malformed HTTP request"))
            self.transport.close()
            self.closed = True

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.pending.append((self.parser.get_method(), self._url, b"".join(self._body)))
        if not self.busy:
            self.next_request()

    def next_request(self) -> None:
        while self.pending and not self.busy and not self.closed:
            method, url, body = self.pending.popleft()
            self.engine.handle(self, method, url, body)

    def send(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)


async def start(engine: BenchEngine, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    """Starts serving ``engine``; returns the server (its socket's port is the bound one)."""
    loop = asyncio.get_running_loop()
    engine.loop = loop
    return await loop.create_server(lambda: _Conn(engine), host, port, backlog=4096, reuse_address=True)


def serve(port: int = 0, model: str = DEFAULT_MODEL, tpot_s: float = DEFAULT_TPOT_S, ttft_s: float = 0.0,
          host: str = "127.0.0.1") -> None:
    """Runs an engine until killed; prints ``listening on http://HOST:PORT`` once bound."""
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass

    async def main() -> None:
        server = await start(BenchEngine(model, tpot_s, ttft_s), host, port)
        bound = server.sockets[0].getsockname()[1]
        print(f"listening on http://{host}:{bound}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def serve_args(port: int = 0, model: str = DEFAULT_MODEL, tpot_s: float = DEFAULT_TPOT_S,
               ttft_s: float = 0.0) -> list[str]:
    """The command line (after the interpreter) that runs an engine in a process of its own."""
    return ["-m", "greenserve.bench.router_engine", "serve", "--port", str(port), "--model", model,
            "--tpot-s", repr(tpot_s), "--ttft-s", repr(ttft_s)]


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m greenserve.bench.router_engine", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run an engine until killed")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--model", default=DEFAULT_MODEL, help="served model name")
    s.add_argument("--tpot-s", type=float, default=DEFAULT_TPOT_S, help="seconds between tokens (0: all at once)")
    s.add_argument("--ttft-s", type=float, default=0.0, help="seconds before the first token")
    args = p.parse_args(argv)
    if args.tpot_s < 0 or args.tpot_s != args.tpot_s:
        p.error("--tpot-s: must be >= 0")
    if args.ttft_s < 0 or args.ttft_s != args.ttft_s:
        p.error("--ttft-s: must be >= 0")
    if not 0 <= args.port <= 65535:
        p.error("--port: must be in [0, 65535]")
    serve(args.port, args.model, args.tpot_s, args.ttft_s, args.host)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
