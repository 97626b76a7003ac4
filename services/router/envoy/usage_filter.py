"""Reading what a receipt needs out of the response as Envoy streams it: the engine's ``usage`` object
(prompt, completion and cached prompt tokens) and the wall-clock time of the first token.

Two readers, chosen in Envoy's bootstrap (``usage_reader``): ``lua`` (the default), a Lua filter
(envoy.filters.http.lua) that does it in Envoy's own process and writes the figures to the request's dynamic
metadata under ``greenserve``, which the gRPC access log entry carries to the router (ledger.py), so no Python
runs per token; ``ext_proc``, Envoy's streamed response-body mode, every chunk sent to the picker and read by
``UsageScanner`` there (a gRPC round trip per chunk: measured dearer, docs/router.md). Envoy tells the picker
which reader it runs in the gRPC metadata of the picker's stream (``x-greenserve-usage-reader``); without
one (a gateway greenserve did not configure) the picker changes nothing and receipts count no completion
tokens.

The picker asks the engine for usage on every streamed request (``stream_options.include_usage``, as the
router's own HTTP front does); when the caller did not ask for it, the usage event is dropped from the stream
the caller sees (the Lua reader learns it from ``x-greenserve-strip-usage``, a request header the picker sets
and the filter removes). While dropping, a reader passes on whole SSE events only (an event split across two
reads goes out with the second; a response that is not an event stream passes on as it is).

Per chunk the Lua filter does one pattern search for ``"usage":{`` (and, until the first token, one for the
first token's text); only the chunk holding the usage object is parsed, and a chunk of whole events without it
goes on untouched (no copy into Envoy's buffer), also while dropping.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

METADATA_NAMESPACE = "greenserve"
"""The dynamic metadata namespace the filter writes (and the access log entry carries)."""
READER_METADATA_KEY = "x-greenserve-usage-reader"
"""gRPC metadata of Envoy's stream to the picker: the usage reader this Envoy runs (``lua`` or ``ext_proc``)."""
READERS = ("lua", "ext_proc", "none")
HELD_LIMIT_BYTES = 1 << 20
"""While dropping the usage event, a reader holds back an unfinished SSE event up to this size; past it the
response is not SSE after all and passes on as it is."""
STRIP_USAGE_HEADER = "x-greenserve-strip-usage"
"""Set by the picker on a streamed request whose caller did not ask for usage; removed before the engine."""

LUA_SOURCE = r"""
local find, match, sub, gmatch = string.find, string.match, string.sub, string.gmatch
local NS = "greenserve"
local STRIP = "x-greenserve-strip-usage"
local USAGE = '"usage":%s*{'
local HELD_LIMIT = @HELD_LIMIT_BYTES@  -- bytes of an unfinished event held back while dropping

function envoy_on_request(h)
  local headers = h:headers()
  if headers:get(STRIP) ~= nil then
    headers:remove(STRIP)
    h:streamInfo():dynamicMetadata():set(NS, "strip_usage", true)
  end
end

-- the index just past the last blank line that ends an SSE event (0: none)
local function last_event_end(s)
  local cut, p = 0, find(s, "\n\n", 1, true)
  while p do
    cut = p + 1
    p = find(s, "\n\n", p + 2, true)
  end
  return cut
end

-- the complete events of s without the final usage event (the one with no choices)
local function without_usage(s)
  if not find(s, USAGE) then
    return s
  end
  local out = {}
  for event in gmatch(s, "(.-\n\n)") do
    if not (find(event, USAGE) and find(event, '"choices":%s*%[%s*%]')) then
      out[#out + 1] = event
    end
  end
  return table.concat(out)
end

function envoy_on_response(h)
  if h:headers():get(":status") ~= "200" then
    return
  end
  local mine = h:streamInfo():dynamicMetadata():get(NS)
  local content_type = h:headers():get("content-type") or ""
  local strip = mine ~= nil and mine["strip_usage"] ~= nil and find(content_type, "text/event-stream", 1, true) ~= nil
  -- Envoy's wrappers do not outlive a yield (each read): the metadata is looked up afresh where it is written
  local first_us, tail, held = nil, "", ""
  for chunk in h:bodyChunks() do
    local n = chunk:length()
    if n > 0 then
      local bytes = chunk:getBytes(0, n)
      if first_us == nil and (find(bytes, '"content":%s*"[^"]') or find(bytes, '"text":%s*"[^"]')
                              or find(bytes, '"finish_reason":%s*"')) then
        first_us = h:timestampString(EnvoyTimestampResolution.MICROSECOND)
        h:streamInfo():dynamicMetadata():set(NS, "first_token_us", first_us)
      end
      local s = bytes
      if tail ~= "" then
        s = tail .. bytes
      end
      local at = find(s, USAGE)
      local found = at ~= nil
      -- the marker may be split across two reads; not after an event's end (the common read: whole events)
      tail = sub(s, -2) == "\n\n" and "" or sub(s, -24)
      while at do
        local object = match(s, '^"usage":%s*(%b{})', at)
        if object == nil then  -- the object goes on in the next read
          tail = sub(s, at)
          break
        end
        local completion = match(object, '"completion_tokens":%s*(%d+)')
        local prompt = match(object, '"prompt_tokens":%s*(%d+)')
        if completion ~= nil and prompt ~= nil then
          -- written at once: a caller that closes after [DONE] may reset the stream before its last chunk
          -- reaches this filter, and then no code after the loop runs (the access log is still written)
          local meta = h:streamInfo():dynamicMetadata()
          meta:set(NS, "completion_tokens", tonumber(completion))
          meta:set(NS, "prompt_tokens", tonumber(prompt))
          local cached = match(object, '"cached_tokens":%s*(%d+)')
          if cached ~= nil then
            meta:set(NS, "cached_tokens", tonumber(cached))
          end
        end
        at = find(s, USAGE, at + 1)
      end
      -- whole events, none of them the usage event: the read passes on as it is (no copy back)
      if strip and (found or held ~= "" or sub(bytes, -2) ~= "\n\n") then
        local whole = held .. bytes
        local cut = last_event_end(whole)
        local rest = sub(whole, cut + 1)
        if #rest > HELD_LIMIT then  -- no event ends: not SSE after all; pass it on and stop dropping
          strip, held = false, ""
          chunk:setBytes(whole)
        else
          held = rest
          chunk:setBytes(without_usage(sub(whole, 1, cut)))
        end
      end
    end
  end
end
"""

LUA_SOURCE = LUA_SOURCE.replace("@HELD_LIMIT_BYTES@", str(HELD_LIMIT_BYTES))


def lua_filter() -> dict[str, object]:
    """The http_filters entry of the usage filter (it goes after ext_proc, before the router)."""
    return {"name": "envoy.filters.http.lua", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        "default_source_code": {"inline_string": LUA_SOURCE}}}


_USAGE = re.compile(rb'"usage":\s*\{')
_FIRST_TOKEN = re.compile(rb'"(?:content|text)":\s*"[^"]|"finish_reason":\s*"')
_CHOICES_EMPTY = re.compile(rb'"choices":\s*\[\s*\]')
_DECODER = json.JSONDecoder()


class UsageScanner:
    """The Lua filter's reading, done in the picker for Envoy's streamed response-body mode (``ext_proc``)."""

    def __init__(self, strip: bool) -> None:
        self.strip = strip
        self.usage: dict[str, Any] | None = None
        self.first_token_wall_s: float | None = None
        self._tail = b""
        self._held = b""

    def feed(self, chunk: bytes) -> bytes | None:
        """Reads one chunk; returns the bytes to pass on instead of it (None: the chunk as it is)."""
        if self.first_token_wall_s is None and _FIRST_TOKEN.search(chunk):
            self.first_token_wall_s = time.time()
        data = self._tail + chunk
        self._tail = data[-24:]  # the marker may be split across two reads
        for found in _USAGE.finditer(data):
            start = found.end() - 1
            try:
                obj, _ = _DECODER.raw_decode(data[start:].decode("utf-8", "replace"))
            except ValueError:  # the object goes on in the next read
                self._tail = data[found.start():]
                break
            if isinstance(obj, dict) and isinstance(obj.get("completion_tokens"), int):
                self.usage = obj
        if not self.strip:
            return None
        whole = self._held + chunk
        cut = whole.rfind(b"\n\n") + 2 if b"\n\n" in whole else 0
        if len(whole) - cut > HELD_LIMIT_BYTES:  # no event ends: not SSE after all
            self.strip, self._held = False, b""
            return whole
        self._held = whole[cut:]
        events = whole[:cut].split(b"\n\n")[:-1] if cut else []
        return b"".join(e + b"\n\n" for e in events if not (_USAGE.search(e) and _CHOICES_EMPTY.search(e)))
