"""Envoy's Lua filter (envoy.filters.http.lua) that reads what a receipt needs out of the response as Envoy
streams it, in Envoy's own process: the engine's ``usage`` object (prompt, completion and cached prompt
tokens) and the wall-clock time of the first token. It writes them to the request's dynamic metadata under
``greenserve``; the gRPC access log entry carries that metadata to the router (ledger.py), so no Python runs
per token.

The picker asks the engine for usage on every streamed request (``stream_options.include_usage``, as the
router's own HTTP front does); when the caller did not ask for it, the picker marks the request with
``x-greenserve-strip-usage`` and the filter drops the usage event from the stream the caller sees. In that
mode the filter passes on whole SSE events only (an event split across two reads goes out with the second).

Per chunk the filter does one pattern search for ``"usage":{`` (and, until the first token, one for the
first token's text); only the chunk holding the usage object is parsed.
"""

from __future__ import annotations

METADATA_NAMESPACE = "greenserve"
"""The dynamic metadata namespace the filter writes (and the access log entry carries)."""
STRIP_USAGE_HEADER = "x-greenserve-strip-usage"
"""Set by the picker on a streamed request whose caller did not ask for usage; removed before the engine."""

LUA_SOURCE = r"""
local find, match, sub, gmatch = string.find, string.match, string.sub, string.gmatch
local NS = "greenserve"
local STRIP = "x-greenserve-strip-usage"
local USAGE = '"usage":%s*{'

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
  local strip = mine ~= nil and mine["strip_usage"] ~= nil
  local first_us, tail, held = nil, "", ""
  local prompt, completion, cached
  for chunk in h:bodyChunks() do
    local n = chunk:length()
    if n > 0 then
      local bytes = chunk:getBytes(0, n)
      if first_us == nil and (find(bytes, '"content":%s*"[^"]') or find(bytes, '"text":%s*"[^"]')
                              or find(bytes, '"finish_reason":%s*"')) then
        first_us = h:timestampString(EnvoyTimestampResolution.MICROSECOND)
      end
      local s = tail .. bytes
      local at = find(s, USAGE)
      tail = sub(s, -24)  -- the marker may be split across two reads
      while at do
        local object = match(s, '^"usage":%s*(%b{})', at)
        if object == nil then  -- the object goes on in the next read
          tail = sub(s, at)
          break
        end
        completion = match(object, '"completion_tokens":%s*(%d+)')
        prompt = match(object, '"prompt_tokens":%s*(%d+)')
        cached = match(object, '"cached_tokens":%s*(%d+)')
        at = find(s, USAGE, at + 1)
      end
      if strip then
        local whole = held .. bytes
        local cut = last_event_end(whole)
        held = sub(whole, cut + 1)
        chunk:setBytes(without_usage(sub(whole, 1, cut)))
      end
    end
  end
  -- Envoy's wrappers do not outlive a yield: the metadata is looked up again after the last chunk
  local meta = h:streamInfo():dynamicMetadata()
  if first_us ~= nil then
    meta:set(NS, "first_token_us", first_us)
  end
  if completion ~= nil and prompt ~= nil then
    meta:set(NS, "completion_tokens", tonumber(completion))
    meta:set(NS, "prompt_tokens", tonumber(prompt))
    if cached ~= nil then
      meta:set(NS, "cached_tokens", tonumber(cached))
    end
  end
end
"""


def lua_filter() -> dict[str, object]:
    """The http_filters entry of the usage filter (it goes after ext_proc, before the router)."""
    return {"name": "envoy.filters.http.lua", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        "default_source_code": {"inline_string": LUA_SOURCE}}}
