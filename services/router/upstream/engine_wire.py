"""The HTTP/1.1 wire as the router's engine client reads it: the limits of an engine's answer, the error every
failed exchange raises (``EngineHttpError``), the engine's rejection of a request (``UpstreamClientError``) and
``whole_chunks``, the raw fast path's test that one read holds whole chunks of a chunked body (engine_response.py
decodes the body, engine_pool.py offers the raw bytes).
"""

from __future__ import annotations

import re

MAX_HEAD_BYTES = 64 * 1024
"""Bytes a response head (status line and headers) may take."""

MAX_CHUNK_LINE_BYTES = 4096
"""Bytes a chunk-size line (size and extensions) may take."""

MAX_TRAILER_BYTES = 16 * 1024
"""Bytes the trailer section of a chunked body may take."""

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Default cap of a whole-body ``read`` (a non-streamed completion is far smaller)."""

_SIZE_LINE = re.compile(rb"([0-9a-fA-F]{1,15})\r\n")
_CRLF = b"\r\n"


class EngineHttpError(Exception):
    """An exchange with an engine failed: connect error or timeout, a malformed or cut response, a body over its
    cap. Before the first token the dispatcher retries on another engine."""


class UpstreamClientError(Exception):
    """The engine rejected the request itself (4xx other than 429): passed back to the caller as is (the
    dispatcher raises it for the decoder's answer, disaggregated.py for the prefiller's)."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(f"engine answered {status}")
        self.status = status
        self.body = body
        self.content_type = content_type


def whole_chunks(data: bytes) -> int:
    """The number of chunks when ``data`` is exactly one or more whole chunks of a chunked body (plain hex
    sizes, no extensions, none of size 0), else 0."""
    n = 0
    i = 0
    end = len(data)
    match = _SIZE_LINE.match
    while i < end:
        m = match(data, i)
        if m is None:
            return 0
        size = int(m.group(1), 16)
        if not size:
            return 0
        i = m.end() + size + 2
        if i > end or data[i - 2 : i] != _CRLF:
            return 0
        n += 1
    return n
