"""One conformance suite, two engines: what greenserve relies on of a vLLM engine, checked against real vLLM (CPU
build, tiny random-weight model) and against the emulator (greenserve-engine-sim) with the same requests.

Covered: the OpenAI endpoints (/v1/models, /v1/completions, /v1/chat/completions, streaming and not, through the
official client and on the wire), SSE framing and the final usage chunk of ``stream_options.include_usage``, the
error bodies of bad requests, /health, every ``vllm:`` metric family and label that the router
(router/routing/scrape.py) and the profiler (profiler/engine_metrics.py) read, the counters moving by what a request did,
and prefix-cache hits on a repeated prompt longer than vLLM's 128-token block.

The weights are random, so nothing here looks at the text: only at structure, token counts (``ignore_eos`` with
``max_tokens``, ``min_tokens``) and metrics. Where the two engines differ on purpose, docs/simulator.md
("Emulator and real vLLM") says how and why; the tests pin the shared part.
"""

from __future__ import annotations

import json
import uuid

import httpx
import openai
import pytest
from greenserve.profiler import engine_metrics
from greenserve.router.routing import scrape
from greenserve.simulator.emulator.metrics import EngineMetrics
from prometheus_client.parser import text_string_to_metric_families

from tests.real_engine.conftest import Engine

pytestmark = pytest.mark.timeout(600)

ERROR_KEYS = {"message", "type", "param", "code"}
# names the product reads that only some engines export: the emulator's modelled power and LMCache's in-process
# metrics (a real vLLM without a connector exports neither; docs/profiler.md)
NOT_VLLM = ("greenserve:", "lmcache:")


def client(engine: Engine) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.url + "/v1", api_key="none", max_retries=0, timeout=120)


def sse_events(engine: Engine, path: str, body: dict) -> list[str]:
    """The raw ``data:`` payloads of one streamed request, checking the framing: every event is one ``data: ``
    line followed by a blank line, and nothing follows ``[DONE]``."""
    with httpx.stream("POST", engine.url + path, json=body, timeout=120) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        raw = "".join(reply.iter_text())
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    events = raw.split("\n\n")
    assert events[-1] == ""
    payloads = []
    for event in events[:-1]:
        assert event.startswith("data: ") and "\n" not in event, event[:200]
        payloads.append(event[len("data: "):])
    assert payloads[-1] == "[DONE]" and "[DONE]" not in payloads[:-1]
    return payloads[:-1]


def metric_samples(engine: Engine) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Family name -> [(labels, value)] of every ``vllm:`` sample on the engine's page."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(engine.metrics_text()):
        if family.name.startswith("vllm:"):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def test_health_and_models(engine: Engine) -> None:
    assert httpx.get(engine.url + "/health", timeout=10).status_code == 200
    models = httpx.get(engine.url + "/v1/models", timeout=10).json()
    assert models["object"] == "list"
    first = models["data"][0]
    assert first["id"] == engine.model and first["object"] == "model" and isinstance(first["owned_by"], str)
    assert [m.id for m in client(engine).models.list().data][0] == engine.model


def test_completion_counts_tokens_and_ends_by_length(engine: Engine) -> None:
    reply = client(engine).completions.create(model=engine.model, prompt="The grid is clean tonight", max_tokens=9,
                                              extra_body={"ignore_eos": True})
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-") and reply.model == engine.model
    assert len(reply.choices) == 1 and isinstance(reply.choices[0].text, str)
    assert reply.choices[0].finish_reason == "length"
    usage = reply.usage
    assert usage is not None and usage.completion_tokens == 9 and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_chat_min_tokens_and_max_tokens_bound_the_answer(engine: Engine) -> None:
    reply = client(engine).chat.completions.create(model=engine.model, max_tokens=12,
                                                   messages=[{"role": "system", "content": "Be brief."},
                                                             {"role": "user", "content": "hi"}],
                                                   extra_body={"min_tokens": 5})
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    message = reply.choices[0].message
    assert message.role == "assistant" and isinstance(message.content, str)
    assert reply.usage is not None and 5 <= reply.usage.completion_tokens <= 12
    assert reply.choices[0].finish_reason in ("stop", "length")
    if reply.choices[0].finish_reason == "length":
        assert reply.usage.completion_tokens == 12


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_stream_framing_and_the_final_usage_chunk(engine: Engine, chat: bool) -> None:
    n = 8
    body: dict = {"model": engine.model, "max_tokens": n, "ignore_eos": True, "stream": True,
                  "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": "Tell me about the wind."}]
    else:
        body["prompt"] = "Tell me about the wind."
    chunks = [json.loads(p) for p in sse_events(engine, "/v1/chat/completions" if chat else "/v1/completions", body)]
    kind = "chat.completion.chunk" if chat else "text_completion"
    assert all(c["object"] == kind for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and all(c["model"] == engine.model for c in chunks)
    *content, last = chunks
    # the usage chunk comes last, alone: no choices, the whole request's counts
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == n
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + n
    assert all(c.get("usage") is None for c in content)
    finishes = [c["choices"][0].get("finish_reason") for c in content]
    assert finishes[-1] == "length" and not any(finishes[:-1])
    if chat:
        assert content[0]["choices"][0]["delta"]["role"] == "assistant"
        pieces = [c["choices"][0]["delta"].get("content") or "" for c in content]
    else:
        pieces = [c["choices"][0]["text"] for c in content]
    assert all(isinstance(p, str) for p in pieces)
    # one chunk per token at most (a detokenizer may hold back a partial character, never add a chunk)
    assert 1 <= len(content) <= n + 1


def test_official_client_streams_with_usage(engine: Engine) -> None:
    stream = client(engine).chat.completions.create(model=engine.model, max_tokens=6, stream=True,
                                                    stream_options={"include_usage": True},
                                                    messages=[{"role": "user", "content": "hi"}],
                                                    extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6 and chunks[-1].choices == []
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"


M = "MODEL"  # replaced by the engine's model name
# (path, body, status, param): bad requests that both engines refuse the same way. `param` None: the engines name
# it differently or not at all (docs/simulator.md); the body's shape and status are still pinned.
BAD_REQUESTS = [
    ("/v1/completions", {"model": M}, 400, "prompt"),
    ("/v1/completions", {"model": M, "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": "no-such-model", "prompt": "x"}, 404, "model"),
    ("/v1/completions", {"model": M, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": M, "prompt": "x", "max_tokens": 100000}, 400, "max_tokens"),
    ("/v1/completions", {"model": M, "prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/completions", {"model": M, "prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"model": M, "prompt": "x", "stop": [""]}, 400, None),
    ("/v1/completions", {"model": M, "prompt": "x", "max_tokens": 3, "min_tokens": 5}, 400, None),
    ("/v1/chat/completions", {"model": M}, 400, None),
    ("/v1/chat/completions", {"model": M, "messages": []}, 400, None),
    ("/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1},
     400, None),
    ("/v1/chat/completions", {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_REQUESTS,
                         ids=[f"{p.split('/')[-1]}-{s}-{prm or 'unnamed'}-{i}" for i, (p, _, s, prm)
                              in enumerate(BAD_REQUESTS)])
def test_bad_requests_get_vllms_error_body(engine: Engine, path: str, body: dict, status: int,
                                           param: str | None) -> None:
    body = {k: (engine.model if v == M else v) for k, v in body.items()}
    reply = httpx.post(engine.url + path, json=body, timeout=60)
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    error = reply.json()["error"]
    assert set(error) == ERROR_KEYS, error
    assert error["code"] == status and isinstance(error["message"], str) and error["message"]
    assert error["type"] == ("NotFoundError" if status == 404 else error["type"]) and isinstance(error["type"], str)
    if param is not None:
        assert error["param"] == param, error


def test_malformed_json_is_a_400_with_an_error_body(engine: Engine) -> None:
    reply = httpx.post(engine.url + "/v1/completions", content=b"{not json", timeout=30,
                       headers={"content-type": "application/json"})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert set(error) == ERROR_KEYS and error["code"] == 400 and str(error["param"]).startswith("body")


def test_official_client_raises_the_typed_errors(engine: Engine) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client(engine).completions.create(model=engine.model, prompt="x", max_tokens=0)
    assert "max_tokens" in str(bad.value)
    with pytest.raises(openai.NotFoundError):
        client(engine).chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])


def _readers_first_names() -> set[str]:
    """The newest name of every quantity the router and the profiler read (sample names, as scraped)."""
    names = {names[0] for names in scrape.METRIC_NAMES.values()}
    names |= {names[0] for names in (*engine_metrics.COUNTERS.values(), *engine_metrics.GAUGES.values())}
    names |= {f"{names[0]}{suffix}" for names in engine_metrics.HISTOGRAMS.values() for suffix in ("_sum", "_count")}
    return {n for n in names if not n.startswith(NOT_VLLM)}


def test_every_metric_the_router_and_profiler_read_is_exported_with_vllms_labels(engine: Engine) -> None:
    client(engine).completions.create(model=engine.model, prompt="warm up", max_tokens=2)
    samples = metric_samples(engine)
    missing = sorted(_readers_first_names() - set(samples))
    assert not missing, f"{engine.kind} lacks {missing}"
    for name in _readers_first_names():
        for labels, _value in samples[name]:
            assert labels.get("model_name") == engine.model and labels.get("engine") == "0", (name, labels)
    reasons = {labels["finished_reason"] for labels, _ in samples["vllm:request_success_total"]}
    assert reasons >= {"stop", "length", "abort", "error", "repetition"}, reasons
    # both readers get a value for every quantity from this page
    router_view = scrape.parse_metrics(engine.metrics_text())
    assert all(getattr(router_view, f) is not None for f in router_view.__dataclass_fields__), router_view
    snap = engine_metrics.parse(engine.metrics_text())
    for quantity in ("prefix_queries_tokens", "prefix_hits_tokens", "external_queries_tokens", "external_hits_tokens",
                     "generation_tokens", "prompt_tokens"):
        assert snap.pick(engine_metrics.COUNTERS[quantity]) is not None, quantity
    assert snap.gauge("running") is not None


@pytest.mark.parametrize("engine", ["vllm"], indirect=True)
def test_the_emulators_vllm_families_exist_on_real_vllm_with_the_same_type(engine: Engine) -> None:
    real = {f.name: f.type for f in text_string_to_metric_families(engine.metrics_text())}
    emulated = {f.name: f.type for f in text_string_to_metric_families(
        __import__("prometheus_client").generate_latest(EngineMetrics("m").registry()).decode())
        if f.name.startswith("vllm:")}
    assert emulated
    differ = {name: (kind, real.get(name)) for name, kind in emulated.items() if real.get(name) != kind}
    assert not differ, differ


def test_counters_move_by_what_a_request_did(engine: Engine) -> None:
    before = engine_metrics.parse(engine.metrics_text())
    reply = client(engine).completions.create(model=engine.model, prompt=f"count me {uuid.uuid4().hex}",
                                              max_tokens=11, extra_body={"ignore_eos": True})
    after = engine_metrics.parse(engine.metrics_text())
    assert reply.usage is not None

    def delta(name: str) -> float:
        return after.values[name] - before.values.get(name, 0.0)

    assert delta("vllm:generation_tokens_total") == 11
    assert delta("vllm:prompt_tokens_total") == reply.usage.prompt_tokens
    assert delta("vllm:prefix_cache_queries_total") == reply.usage.prompt_tokens
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                      "vllm:request_time_per_output_token_seconds"):
        assert delta(f"{histogram}_count") == 1, histogram
        assert delta(f"{histogram}_sum") > 0, histogram
    window = engine_metrics.window(before, after)
    assert window.ttft_mean_s is not None and window.tpot_mean_s is not None and window.e2e_mean_s is not None
    assert 0 < window.ttft_mean_s <= window.e2e_mean_s


def test_a_repeated_long_prompt_hits_the_prefix_cache(engine: Engine) -> None:
    # > 2 blocks of 128 tokens on either tokenizer; a fresh nonce first, so nothing earlier shares the prefix
    prompt = f"{uuid.uuid4().hex} " + " ".join(f"word{i} of the long shared document," for i in range(120))
    c = client(engine)
    first_before = scrape.parse_metrics(engine.metrics_text())
    first = c.completions.create(model=engine.model, prompt=prompt, max_tokens=2)
    between = scrape.parse_metrics(engine.metrics_text())
    second = c.completions.create(model=engine.model, prompt=prompt, max_tokens=2)
    after = scrape.parse_metrics(engine.metrics_text())
    assert first.usage is not None and second.usage is not None
    tokens = first.usage.prompt_tokens
    assert tokens > 256, tokens
    assert between.prefix_queries_tokens - first_before.prefix_queries_tokens == tokens
    assert between.prefix_hits_tokens - first_before.prefix_hits_tokens == 0
    hits = after.prefix_hits_tokens - between.prefix_hits_tokens
    assert after.prefix_queries_tokens - between.prefix_queries_tokens == tokens
    # whole blocks of the prompt, at least one, never the last token (it is always recomputed)
    assert 128 <= hits < tokens, (hits, tokens)
    details = second.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens == hits
