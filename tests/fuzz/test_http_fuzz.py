"""Fuzz every HTTP route of the router's OpenAI-compatible front and of the engine emulator (issue 21).

Routes are read from each aiohttp application's router, so a new route is fuzzed without editing this file.
Each route gets GREENSERVE_FUZZ_N cases: OpenAI-shaped JSON bodies with adversarial values, random and deeply
nested JSON, invalid JSON (truncated, NaN/Infinity literals, invalid UTF-8), random bytes, wrong content types
and encodings, huge and many headers, odd query strings and the wrong method. No reply may be a 5xx, and both
servers must still answer /health afterwards.
"""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest
from greenserve.router.front.service import RouterSettings, build
from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator

from tests.fuzz.conftest import fuzz_cases, fuzz_seed

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
TIMEOUT_S = 20.0
TOKEN = "fuzz-token"  # the router front requires it; STRANGER_SHARE of the cases come without it
STRANGER_SHARE = 0.05
STRANGER_HEADERS = [None, "Bearer wrong", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"]
MAX_BODY_BYTES = 64 * 1024  # the router's --http-max-body-bytes here, so "oversized" cases stay cheap
JSON_VALUES: list[Any] = [None, True, False, 0, -1, 1, 2**31, 2**63, 10**30, -(10**30), 1e308, -1e308, 0.5, "",
                          "x" * 100_000, "a\x00b", "\n", "🙂", [], {}, [1, 2], {"a": {"b": None}}, "NaN", "-1"]


def template(path: str, rng: random.Random) -> dict[str, Any]:
    """A well-formed OpenAI-style body for the route (small, so replies come quickly)."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": rng.randint(1, 4), "stream": rng.random() < 0.5}
    if "chat" in path:
        body["messages"] = [{"role": "user", "content": "hi " * rng.randint(1, 20)}]
    else:
        body["prompt"] = "hello " * rng.randint(1, 20)
    for key in ("temperature", "top_p", "seed", "n", "stop", "user", "stream_options", "logprobs", "ignore_eos"):
        if rng.random() < 0.1:
            body[key] = rng.choice(JSON_VALUES[:14])
    return body


def mutate(value: Any, rng: random.Random, depth: int = 0) -> Any:
    """One adversarial change somewhere in a JSON value."""
    if isinstance(value, dict) and value and depth < 4 and rng.random() < 0.8:
        key = rng.choice(list(value))
        out = dict(value)
        roll = rng.random()
        if roll < 0.15:
            del out[key]
        elif roll < 0.3:
            out[rng.choice(["extra", "", "\x00", "model ", "x" * 300])] = rng.choice(JSON_VALUES)
        else:
            out[key] = mutate(value[key], rng, depth + 1)
        return out
    if isinstance(value, list) and value and depth < 4 and rng.random() < 0.7:
        out = list(value)
        i = rng.randrange(len(out))
        out[i] = mutate(out[i], rng, depth + 1)
        if rng.random() < 0.1:
            out = out * 500
        return out
    return rng.choice(JSON_VALUES)


def random_json(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 4 or roll < 0.4:
        return rng.choice(JSON_VALUES[:-6])
    if roll < 0.7:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["model", "messages", "prompt", "stream", "crash", "k", ""]): random_json(rng, depth + 1)
            for _ in range(rng.randint(0, 4))}


def http_case(path: str, method: str, rng: random.Random) -> tuple[str, str, dict[str, str], bytes, str]:
    """(kind, method, headers, body, url suffix) of one case."""
    headers = {"content-type": "application/json"}
    kind = rng.choice(["template", "template", "mutated", "mutated", "random_json", "deep_json", "bad_json",
                       "random_bytes", "content_type", "huge_header", "many_headers", "wrong_method", "query",
                       "bad_encoding", "empty", "oversized"])
    body: bytes = json.dumps(template(path, rng)).encode()
    suffix = ""
    if kind == "mutated":
        body = json.dumps(mutate(template(path, rng), rng)).encode()
    elif kind == "random_json":
        body = json.dumps(random_json(rng)).encode()
    elif kind == "deep_json":
        depth = rng.choice([200, 2_000, 50_000])
        body = (("[" * depth + "]" * depth) if rng.random() < 0.5 else ('{"a":' * depth + "1" + "}" * depth)).encode()
    elif kind == "bad_json":
        body = rng.choice([body[: rng.randint(1, max(1, len(body) - 1))], b'{"model": NaN, "max_tokens": Infinity}',
                           b'{"model": "\xff\xfe"}', b"{'single': 'quotes'}", b'{"a":1,"a":2}', b"\x00" * 8,
                           b'{"max_tokens": 1e999}', b'"just a string"', b"[]", b"null", b"1" * 5000])
    elif kind == "random_bytes":
        body = rng.randbytes(rng.randint(1, 512))
    elif kind == "content_type":
        headers["content-type"] = rng.choice(["text/plain", "multipart/form-data", "multipart/form-data; boundary=x",
                                              "application/x-www-form-urlencoded", "application/json; charset=latin-9",
                                              "", "*/*", "application/json\r\nx: y".replace("\r\n", " ")])
    elif kind == "huge_header":
        headers["x-junk"] = "a" * rng.choice([9_000, 70_000])
    elif kind == "many_headers":
        headers.update({f"x-h{i}": "v" * 50 for i in range(rng.choice([120, 300]))})
    elif kind == "wrong_method":
        method = rng.choice(["PUT", "DELETE", "PATCH", "GET" if method == "POST" else "POST", "OPTIONS"])
    elif kind == "query":
        suffix = "?" + rng.choice(["a=1", "stream=true&model=x", "%ff%fe=1", "x=" + "y" * 5000, "&&&=", "a=%00"])
    elif kind == "bad_encoding":
        headers["content-encoding"] = rng.choice(["gzip", "deflate", "br", "zstd", "identity, gzip"])
        body = rng.randbytes(64)
    elif kind == "empty":
        body = b""
    elif kind == "oversized":
        body = json.dumps({**template(path, rng), "prompt": "x" * (MAX_BODY_BYTES + 1000)}).encode()
    return kind, method, headers, body, suffix


def routes(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every fixed route of an aiohttp application (HEAD twins of GET left out)."""
    out = []
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path")
        if path and route.method != "HEAD":
            out.append((route.method, path))
    return sorted(set(out))


async def fuzz_routes(base_url: str, app: Any, label: str, after_case: Any = None, token: str | None = None,
                      open_paths: frozenset[str] = frozenset()) -> list[str]:
    """Fuzz every route; with `token`, most cases carry it and STRANGER_SHARE of them carry none or a wrong
    one (those must be refused with a 4xx on every path but `open_paths`)."""
    failures: list[str] = []
    seed = fuzz_seed()
    async with httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT_S) as client:
        for method, path in routes(app):
            rng = random.Random(f"{seed}:{label}:{method} {path}")
            counts: dict[int, int] = {}
            for index in range(fuzz_cases()):
                kind, verb, headers, body, suffix = http_case(path, method, rng)
                stranger = token is not None and rng.random() < STRANGER_SHARE
                if token is not None:
                    header = rng.choice(STRANGER_HEADERS) if stranger else f"Bearer {token}"
                    if header is not None:
                        headers["authorization"] = header
                where = (f"{label} {method} {path} case {index} ({kind}{', no valid token' if stranger else ''}), "
                         f"GREENSERVE_FUZZ_SEED={seed}")
                try:
                    reply = await client.request(verb, path + suffix, headers=headers, content=body)
                except httpx.HTTPError as exc:
                    # The server may close a connection it refuses (e.g. oversized head): a clean refusal; a
                    # read timeout is not.
                    if isinstance(exc, httpx.TimeoutException):
                        failures.append(f"{where}: no reply in {TIMEOUT_S} s ({type(exc).__name__})")
                    counts[-1] = counts.get(-1, 0) + 1
                else:
                    counts[reply.status_code] = counts.get(reply.status_code, 0) + 1
                    if reply.status_code >= 500:
                        failures.append(f"{where}: {reply.status_code} {reply.text[:200]!r}")
                    elif stranger and path not in open_paths and reply.status_code < 400:
                        failures.append(f"{where}: a request without a valid token got {reply.status_code}")
                if after_case is not None:
                    after_case(path)
                if len(failures) >= 8:
                    return failures
            print(f"{label} {method} {path}: {dict(sorted(counts.items()))}")
        health = await client.get("/health")
        if health.status_code != 200:
            failures.append(f"{label}: /health answers {health.status_code} after the fuzz")
    return failures


@pytest.fixture
async def emulator():
    emu = EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, time_scale=200.0))
    await emu.start()
    yield emu
    emu.set_faults(crash=False, hang=False, error_rate=0.0)
    await emu.stop()


async def test_fuzz_engine_emulator_routes(emulator: EngineEmulator) -> None:
    assert emulator._runner is not None

    def reset_faults(path: str) -> None:
        if path.startswith("/admin/"):  # the fault-injection route may legitimately switch faults on
            emulator.set_faults(crash=False, hang=False, error_rate=0.0)

    failures = await fuzz_routes(emulator.url, emulator._runner.app, "emulator", reset_faults)
    assert not failures, "\n".join(failures)


async def test_fuzz_router_http_front_routes(emulator: EngineEmulator, start_inprocess) -> None:
    values = {"http_port": 0, "watch_plans": False, "feeds": False, "scrape_interval_s": 0.1,
              "health_interval_s": 0.2, "probe_timeout_s": 0.5, "engines": emulator.url, "log_level": "WARNING",
              "auth_token": TOKEN, "http_max_body_bytes": MAX_BODY_BYTES}
    running = await start_inprocess(RouterSettings, build, **values)
    front = running.server.registrations[0].servicer.http
    assert front is not None
    failures = await fuzz_routes(f"http://127.0.0.1:{front.port}", front.app, "router", token=TOKEN,
                                 open_paths=frozenset({"/health"}))
    assert not failures, "\n".join(failures)
