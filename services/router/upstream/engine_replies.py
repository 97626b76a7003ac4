"""What the router reads of an engine's replies outside the request path, capped: the monitor's ``/metrics``
scrapes and ``/health`` probes (monitor.py) and the ``/v1/models`` lookup of engines given without a model
(core.py).

An engine URL comes from RegisterEngine (any caller the admin API lets in) or ``--engines``, so its replies
are not trusted to be small. Read whole (aiohttp's ``text()``, ``json()``, ``read()``), an endless or huge body
grew the router's memory for as long as the probe timeout let it run (on a local link that is hundreds of MB
a second), for every such engine at every scrape. ``read_capped`` reads at most its cap (of the decoded
body: aiohttp decompresses a compressed body in bounded steps as it is read) and raises ``ReplyTooLarge``,
which the callers count as that engine's failed scrape or probe; the connection is closed, not reused. The
request path's reads have caps of their own (engine_wire.MAX_BODY_BYTES, disaggregated.PREFILL_MAX_BODY_BYTES).
"""

from __future__ import annotations

import aiohttp

MAX_METRICS_BYTES = 16 * 1024 * 1024
"""Cap of an engine's ``/metrics`` page. The emulator's page (vLLM V1's metric names, labels and buckets, one
engine rank; services/simulator/emulator) is 14 KB for 107 ``vllm:`` series. A large real page: 8 data-parallel
ranks of it (the ``engine`` label), 115 KB, plus ``vllm:lora_requests_info``, one series per set of running and
waiting LoRA adapters seen (vLLM never drops one), 5,000 sets of about 250 bytes: about 1.4 MB in all
(tests/router/test_engine_reply_caps.py builds it). 16 MiB leaves more than 10x; scrape.py parses only the lines
it needs, so a page near the cap still parses in well under a scrape interval."""

MAX_HEALTH_BYTES = 64 * 1024
"""Cap of an engine's ``/health`` answer, which is not used: vLLM and the emulator answer an empty body, SGLang a
few bytes."""

MAX_MODELS_BYTES = 8 * 1024 * 1024
"""Cap of an engine's ``/v1/models`` answer. The emulator's is 241 bytes for its one model; vLLM's model card adds
a permission object (about 300 bytes) and lists each LoRA adapter: 1,000 adapters, about 550 KB. 8 MiB leaves
more than 10x."""

READ_CHUNK_BYTES = 64 * 1024
"""Bytes asked of the body per read while it is read up to its cap."""


class ReplyTooLarge(ValueError):
    """An engine's reply is over its cap (a ValueError, as an unreadable reply: the scrape or probe failed)."""


async def read_capped(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The whole body of ``resp`` when it has at most ``max_bytes`` bytes; else ``ReplyTooLarge`` (a declared
    Content-Length over the cap before anything is read), with the connection closed."""
    length = resp.content_length
    if length is not None and length > max_bytes:
        resp.close()
        raise ReplyTooLarge(f"declares {length} bytes, over the cap of {max_bytes}")
    parts: list[bytes] = []
    total = 0
    content = resp.content
    while True:
        chunk = await content.read(READ_CHUNK_BYTES)
        if not chunk:
            return b"".join(parts)
        total += len(chunk)
        if total > max_bytes:
            resp.close()
            raise ReplyTooLarge(f"more than the cap of {max_bytes} bytes")
        parts.append(chunk)
