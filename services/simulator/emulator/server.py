"""HTTP front of the emulated engine: vLLM's OpenAI-compatible API on aiohttp.

Routes (what clients, routers and scrapers use of ``vllm serve``): ``POST /v1/completions``,
``POST /v1/chat/completions`` (JSON or SSE streaming ending with ``data: [DONE]``), ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (Prometheus text, vLLM metric names), ``GET /version``,
``POST /tokenize``, and the emulator's own ``GET|POST /admin/faults``. With ``enable_sleep_mode`` (vLLM's
``--enable-sleep-mode``) also ``POST /sleep?level=1|2&mode=abort|wait|keep``, ``POST /wake_up`` and
``GET /is_sleeping`` (``{"is_sleeping": bool}``), with vLLM's semantics (sleep_mode.py); without it they are 404, as
in vLLM.

Output: every request generates ``max_tokens`` deterministic filler tokens (a real model would stop
at its end-of-sequence token; the emulator cannot know when, so ``finish_reason`` is ``"length"``)
unless a stop string from ``stop`` appears in the filler text or the pseudo-EOS option
(``eos_probability``) ends it early (``"stop"``). A chat request without ``max_tokens`` gets
``default_chat_max_tokens`` (256) instead of vLLM's "until the context is full".

``usage.prompt_tokens_details.cached_tokens`` is always present (vLLM needs
``--enable-prompt-tokens-details`` for it): the prompt tokens served from the prefix cache.

Hot path: a streaming handler sleeps until the engine step that produced its tokens ends, then
writes all its new SSE events in one ``write`` built from per-request string templates and
precomputed JSON token literals (no ``json.dumps`` per token).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from typing import Any

from aiohttp import web
from greenserve.simulator.emulator.config import EmulatorConfig
from greenserve.simulator.emulator.engine import EmulatedEngine, EngineRequest
from greenserve.simulator.emulator.faults import (
    FaultSpecError,
    FaultState,
    apply_fault_update,
    validate_fault_update,
)
from greenserve.simulator.emulator.metrics import EngineMetrics
from greenserve.simulator.emulator.modes import make_timer
from greenserve.simulator.emulator.pacing import (
    load_perf_model,
    resolve_shape,
)
from greenserve.simulator.emulator.protocol import (
    ApiError,
    GenerationRequest,
    bad,
    parse_generation,
)
from greenserve.simulator.emulator import sleep_mode
from greenserve.simulator.emulator.tokenizer import (
    FILLER_CYCLE,
    FILLER_TOKENS_JSON,
    filler_offset,
    filler_text,
    tokenize,
)
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("greenserve.simulator.emulator")

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_DONE = "data: [DONE]\n\n"
#: largest request body accepted (bytes); long prompts of a few hundred thousand characters fit
MAX_BODY_BYTES = 32 * 1024 * 1024


def _error_response(err: ApiError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


class EngineEmulator:
    """One emulated vLLM engine: engine loop + HTTP server, startable inside any asyncio program."""

    def __init__(self, config: EmulatorConfig | None = None) -> None:
        self.config = config = config or EmulatorConfig()
        config.validate()
        profile, perf_model, profile_name = load_perf_model(config.profile)
        self.profile = profile
        self.shape = resolve_shape(
            profile,
            perf_model,
            profile_name,
            config.model,
            config.max_model_len,
            config.num_gpu_blocks,
            config.max_num_batched_tokens,
        )
        self.model = self.shape.served_model_name
        self.metrics = EngineMetrics(self.model)
        self._registry = self.metrics.registry()
        self.faults = FaultState()
        apply_fault_update(
            self.faults,
            {
                "hang": config.hang,
                "slow_factor": config.slow_factor,
                "error_rate": config.error_rate,
                "seed": config.fault_seed,
                "fail_after_tokens": config.fail_after_tokens,
            },
        )
        mode = config.serving_mode
        timer = make_timer(perf_model, mode)
        self.engine = EmulatedEngine(
            self.shape,
            timer,
            self.metrics,
            self.faults,
            time_scale=config.time_scale,
            max_num_seqs=config.max_num_seqs,
            # moving the weights: the engine's peak draw (the planner's wake-up charge), beside any second GPU's idle
            transfer_power_w=float(perf_model.power_w(1.0)) + timer.idle_power_w - float(perf_model.power_w(0.0)),
        )
        self.port: int | None = None
        self.url: str | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._created = int(time.time())
        self._id_prefix = f"{random.getrandbits(32):08x}"
        self._next_id = 0
        self._unhung: asyncio.Event | None = None
        self._pending: asyncio.Task[None] | None = None
        self._crash_timer: asyncio.TimerHandle | None = None
        #: set when the engine crashed (the CLI exits on it)
        self.crashed: asyncio.Event | None = None

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the port (``config.port``; 0 = a free one), start the engine loop; sets ``port``/``url``."""
        self._unhung = asyncio.Event()
        if not self.faults.hang:
            self._unhung.set()
        self.crashed = asyncio.Event()
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._dead_while_crashed])
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/version", self._version)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/admin/faults", self._get_faults)
        app.router.add_post("/admin/faults", self._post_faults)
        if self.config.enable_sleep_mode:
            app.router.add_post("/sleep", self._sleep)
            app.router.add_post("/wake_up", self._wake_up)
            app.router.add_get("/is_sleeping", self._is_sleeping)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        await self._listen(self.config.port)
        self.engine.start()
        if self.faults.hang:
            self.engine.set_hang(True)
        if self.config.crash_after_s is not None:
            self._crash_timer = asyncio.get_running_loop().call_later(
                self.config.crash_after_s, lambda: self.set_faults(crash=True)
            )

    async def _listen(self, port: int) -> None:
        assert self._runner is not None
        site = web.TCPSite(self._runner, self.config.host, port)
        await site.start()
        self._site = site
        bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        self.port = int(bound[1])
        host = self.config.host
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        self.url = f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    async def stop(self) -> None:
        """Stop serving: drop requests, close connections and the port."""
        if self._crash_timer is not None:
            self._crash_timer.cancel()
        if self._pending is not None:
            await asyncio.gather(self._pending, return_exceptions=True)
        await self.engine.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._site = None

    # -- faults -----------------------------------------------------------------------------
    def set_faults(
        self,
        crash: bool | None = None,
        hang: bool | None = None,
        slow_factor: float | None = None,
        error_rate: float | None = None,
        seed: int | None = None,
        fail_after_tokens: int | None = None,
    ) -> None:
        """Change fault injection now (None leaves a setting as it is); see ``faults.py``.

        ``crash=True`` cuts every connection and closes the port at once; ``crash=False`` after a
        crash re-opens the same port with a fresh engine (empty prefix cache); ``await
        wait_listening()`` waits until that is done.
        """
        given = {
            k: v
            for k, v in {
                "crash": crash,
                "hang": hang,
                "slow_factor": slow_factor,
                "error_rate": error_rate,
                "seed": seed,
                "fail_after_tokens": fail_after_tokens,
            }.items()
            if v is not None
        }
        self._apply_faults(validate_fault_update(given))

    async def wait_listening(self) -> None:
        """Wait until a restart requested by ``set_faults(crash=False)`` has re-opened the port."""
        if self._pending is not None:
            await self._pending

    def _apply_faults(self, update: dict[str, Any]) -> None:
        was_crashed = self.faults.crash
        apply_fault_update(self.faults, update)
        if "hang" in update:
            self.engine.set_hang(self.faults.hang)
            assert self._unhung is not None
            if self.faults.hang:
                self._unhung.clear()
            else:
                self._unhung.set()
        if self.faults.crash and not was_crashed:
            self._crash()
        elif was_crashed and not self.faults.crash:
            self._pending = asyncio.get_running_loop().create_task(self._restart())

    def _crash(self) -> None:
        """Die abruptly: drop all requests, reset every connection, stop listening."""
        log.warning("greenserve-engine-sim: injected crash")
        self.engine.abort_all("engine crashed")
        site, self._site = self._site, None
        if site is not None and site._server is not None:
            site._server.close()  # stop accepting now; the runner forgets the site below
            self._runner._unreg_site(site)  # type: ignore[union-attr]
        self._abort_connections()
        assert self.crashed is not None
        self.crashed.set()

    @web.middleware
    async def _dead_while_crashed(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """A crashed engine answers nothing. The crash aborts the open connections, but one the server accepted as
        it ran (its ``connection_made`` still queued) escapes that; a client's keep-alive pool would then get 200
        from /health on it for as long as it reuses it, and a router would never eject the engine."""
        if self.faults.crash:
            if request.transport is not None:
                request.transport.abort()  # the client sees the connection reset; the answer below is never sent
            return web.Response(status=503)
        return await handler(request)

    def _abort_connections(self) -> None:
        if self._runner is None or self._runner.server is None:
            return
        for handler in self._runner.server.connections:
            transport = handler.transport
            if transport is not None:
                transport.abort()

    async def _restart(self) -> None:
        assert self.port is not None and self.crashed is not None
        await self._listen(self.port)
        self.crashed.clear()

    # -- simple routes -------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        assert self._unhung is not None
        await self._unhung.wait()  # a hung engine never answers its health check
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": self._created,
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": self.shape.max_model_len_tokens,
            "permission": [],
        }
        return web.json_response({"object": "list", "data": [card]})

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "greenserve-engine-sim (vLLM OpenAI API emulation)"})

    async def _tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._json(request)
            if not isinstance(body, dict):
                raise bad("body", "must be a JSON object")
            if "messages" in body:
                gen = parse_generation(
                    {**body, "max_tokens": 1, "stream": False},
                    chat=True,
                    served_model=self.model,
                    max_model_len=2**62,
                    default_chat_max_tokens=1,
                )
                ids = gen.prompt_token_ids
            else:
                prompt = body.get("prompt")
                if not isinstance(prompt, str):
                    raise bad("prompt", "must be a string")
                if body.get("model") not in (None, self.model):
                    raise ApiError(404, f"The model `{body.get('model')}` does not exist.", "model")
                ids = tokenize(prompt)
        except ApiError as err:
            return _error_response(err)
        return web.json_response({"count": len(ids), "max_model_len": self.shape.max_model_len_tokens, "tokens": ids})

    # -- sleep mode (sleep_mode.py) -------------------------------------------------------------
    async def _sleep(self, request: web.Request) -> web.Response:
        level_text = request.query.get("level", "1")
        mode = request.query.get("mode", "abort")
        try:
            level = int(level_text)
        except ValueError:
            return _error_response(bad("level", f"must be an integer, got {level_text!r}"))
        if level not in sleep_mode.SLEEP_LEVELS:
            return _error_response(bad("level", f"must be 1 or 2, got {level}"))
        if mode not in sleep_mode.SLEEP_MODES:
            return _error_response(bad("mode", f"must be one of {', '.join(sleep_mode.SLEEP_MODES)}, got {mode!r}"))
        duration = self.config.sleep_s if self.config.sleep_s is not None else sleep_mode.sleep_s(self.profile, level)
        await self.engine.sleep(level, mode, duration)
        return web.Response(status=200)

    async def _wake_up(self, request: web.Request) -> web.Response:
        if request.query.getall("tags", []):
            return _error_response(bad("tags", "the emulator wakes the weights and the KV cache together"))
        duration = self.config.wake_up_s if self.config.wake_up_s is not None else sleep_mode.wake_up_s(self.profile)
        await self.engine.wake_up(duration)
        return web.Response(status=200)

    async def _is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": await self.engine.is_sleeping()})

    async def _get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults.as_dict())

    async def _post_faults(self, request: web.Request) -> web.Response:
        try:
            body = await self._json(request)
            update = validate_fault_update(body)
        except ApiError as err:
            return _error_response(err)
        except FaultSpecError as err:
            return _error_response(bad(err.field, err.message))
        crash_now = update.get("crash") is True and not self.faults.crash
        if crash_now:
            # answer first, then die: the caller learns the fault was applied
            resp = web.json_response({**self.faults.as_dict(), **update})
            await resp.prepare(request)
            await resp.write_eof()
            self._apply_faults(update)
            return resp
        self._apply_faults(update)
        return web.json_response(self.faults.as_dict())

    @staticmethod
    async def _json(request: web.Request) -> Any:
        try:
            raw = await request.read()
        except web.RequestPayloadError as exc:  # e.g. a Content-Encoding the body does not decode with
            raise bad("body", f"unreadable body: {exc}") from None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad("body", f"invalid JSON: {exc}") from None
        except RecursionError:
            raise bad("body", "invalid JSON: nested too deeply") from None

    # -- generation ----------------------------------------------------------------------------
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body = await self._json(request)
            gen = parse_generation(
                body,
                chat=chat,
                served_model=self.model,
                max_model_len=self.shape.max_model_len_tokens,
                default_chat_max_tokens=self.config.default_chat_max_tokens,
            )
        except ApiError as err:
            return _error_response(err)
        if self.config.serving_mode.pd_role == "prefill":  # a DPD prefiller answers its one token (modes.py)
            gen.max_tokens = 1
        if self.faults.draw_error():
            return _error_response(ApiError(500, "injected fault: the engine failed this request (error_rate)"))
        self._next_id += 1
        request_id = request.headers.get("X-Request-Id") or f"{self._id_prefix}{self._next_id:08x}"
        ereq = EngineRequest(
            request_id=request_id,
            prompt_token_ids=gen.prompt_token_ids,
            max_tokens=gen.max_tokens,
            min_tokens=gen.min_tokens,
            ignore_eos=gen.ignore_eos,
            stop=gen.stop,
            eos_probability=self.config.eos_probability,
            eos_seed=self.faults.seed,
        )
        fail_after = self.faults.fail_after_tokens
        self.engine.add_request(ereq)
        try:
            if gen.stream:
                return await self._stream(request, gen, ereq, fail_after)
            return await self._unary(request, gen, ereq, fail_after)
        finally:
            if not ereq.finished:  # client gone, handler cancelled, or a stream fault
                self.engine.abort(ereq)

    def _die_mid_request(self, request: web.Request, ereq: EngineRequest, reason: str) -> None:
        self.engine.abort(ereq, reason)
        if request.transport is not None:
            request.transport.abort()

    def _usage(self, ereq: EngineRequest) -> dict[str, Any]:
        completion = ereq.num_output_tokens
        return {
            "prompt_tokens": ereq.prompt_tokens,
            "total_tokens": ereq.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": ereq.num_cached_tokens},
        }

    def _final_text(self, ereq: EngineRequest) -> str:
        text = filler_text(0, ereq.num_output_tokens)
        if ereq.text_limit_chars is not None:
            text = text[: ereq.text_limit_chars]
        return text

    async def _unary(
        self, request: web.Request, gen: GenerationRequest, ereq: EngineRequest, fail_after: int
    ) -> web.StreamResponse:
        while not ereq.finished:
            if fail_after and ereq.num_output_tokens >= fail_after:
                self._die_mid_request(request, ereq, "fail_after_tokens fault")
                return web.Response(status=500)  # never reaches the client: the connection is gone
            await ereq.wait_update()
        if ereq.error is not None:
            if self.faults.crash or (fail_after and ereq.num_output_tokens >= fail_after):
                if request.transport is not None:
                    request.transport.abort()
                return web.Response(status=500)
            return _error_response(ApiError(500, f"request aborted: {ereq.error}"))
        text = self._final_text(ereq)
        if gen.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": ereq.finish_reason,
                "stop_reason": ereq.stop_reason,
            }
            obj, prefix = "chat.completion", "chatcmpl-"
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": ereq.finish_reason,
                "stop_reason": ereq.stop_reason,
                "prompt_logprobs": None,
            }
            obj, prefix = "text_completion", "cmpl-"
        body = {
            "id": prefix + ereq.request_id,
            "object": obj,
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": self._usage(ereq),
        }
        return web.json_response(body, headers={"X-Request-Id": ereq.request_id})

    async def _stream(
        self, request: web.Request, gen: GenerationRequest, ereq: EngineRequest, fail_after: int
    ) -> web.StreamResponse:
        created = int(time.time())
        model_json = json.dumps(self.model)
        if gen.chat:
            rid = "chatcmpl-" + ereq.request_id
            common = f'"id":{json.dumps(rid)},"object":"chat.completion.chunk","created":{created},"model":{model_json}'
            head = 'data: {' + common + ',"choices":[{"index":0,"delta":{"content":'
            mid = '},"logprobs":null,"finish_reason":'
        else:
            rid = "cmpl-" + ereq.request_id
            common = f'"id":{json.dumps(rid)},"object":"text_completion","created":{created},"model":{model_json}'
            head = 'data: {' + common + ',"choices":[{"index":0,"text":'
            mid = ',"logprobs":null,"finish_reason":'
        usage_null = ',"usage":null' if gen.include_usage else ""
        tail_running = mid + 'null,"stop_reason":null}]' + usage_null + "}\n\n"
        continuous = gen.continuous_usage_stats

        resp = web.StreamResponse(headers={**_SSE_HEADERS, "X-Request-Id": ereq.request_id})
        await resp.prepare(request)
        if gen.chat:
            await resp.write(
                ('data: {' + common + ',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                 '"logprobs":null,"finish_reason":null}]' + usage_null + "}\n\n").encode()
            )
        text_mode = bool(ereq.stop)
        longest_stop = max((len(s) for s in ereq.stop), default=0)
        pending_text, seen_tokens, sent_chars = "", 0, 0
        sent = 0
        limit = fail_after if fail_after and fail_after < ereq.max_tokens else 0
        while True:
            k = ereq.num_output_tokens
            if ereq.error is not None:
                if self.faults.crash or (limit and k >= limit):
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                break  # aborted for another reason: end the stream without [DONE]
            cut = bool(limit) and k >= limit
            if cut:
                k = limit
            finished = ereq.finished and not cut
            if k > sent or finished:
                parts: list[str] = []
                tail_final = None
                if finished:
                    tail_final = (
                        mid + json.dumps(ereq.finish_reason) + ',"stop_reason":' + json.dumps(ereq.stop_reason) + "}]"
                        + usage_null + "}\n\n"
                    )
                if text_mode:
                    pending_text += filler_text(seen_tokens, k - seen_tokens)
                    seen_tokens = k
                    if ereq.text_limit_chars is not None:
                        upto = ereq.text_limit_chars
                    elif finished:
                        upto = filler_offset(k)
                    else:
                        upto = filler_offset(k) - (longest_stop - 1)
                    n = max(0, upto - sent_chars)
                    if n or tail_final:
                        piece, pending_text = pending_text[:n], pending_text[n:]
                        sent_chars += n
                        parts.append(head + json.dumps(piece) + (tail_final or tail_running))
                elif continuous:  # vLLM's continuous_usage_stats: usage in every chunk (rarely used)
                    p_tokens = ereq.prompt_tokens
                    for i in range(sent, k):
                        last = finished and i == k - 1
                        reason = json.dumps(ereq.finish_reason) if last else "null"
                        stop_reason = json.dumps(ereq.stop_reason) if last else "null"
                        usage = {"prompt_tokens": p_tokens, "total_tokens": p_tokens + i + 1, "completion_tokens": i + 1}
                        parts.append(
                            head + FILLER_TOKENS_JSON[i % FILLER_CYCLE] + mid + reason + ',"stop_reason":'
                            + stop_reason + '}],"usage":' + json.dumps(usage) + "}\n\n"
                        )
                else:
                    stop_at = k - 1 if finished else k
                    for i in range(sent, stop_at):
                        parts.append(head + FILLER_TOKENS_JSON[i % FILLER_CYCLE] + tail_running)
                    if finished:
                        token = FILLER_TOKENS_JSON[(k - 1) % FILLER_CYCLE] if k > sent else '""'
                        parts.append(head + token + tail_final)  # type: ignore[operator]
                sent = k
                if finished:
                    if gen.include_usage:
                        parts.append(
                            "data: "
                            + json.dumps(
                                {
                                    "id": rid,
                                    "object": "chat.completion.chunk" if gen.chat else "text_completion",
                                    "created": created,
                                    "model": self.model,
                                    "choices": [],
                                    "usage": self._usage(ereq),
                                }
                            )
                            + "\n\n"
                        )
                    parts.append(_DONE)
                if parts:
                    await resp.write("".join(parts).encode())
                if finished:
                    break
                if cut:
                    self._die_mid_request(request, ereq, "fail_after_tokens fault")
                    return resp
            await ereq.wait_update()
        try:
            await resp.write_eof()
        except ConnectionError:
            pass
        return resp


__all__ = ["EmulatorConfig", "EngineEmulator"]
