"""The way to the engines: the dispatcher (retries before the first token, SSE scanning), the keep-alive HTTP/1.1
client and its responses, capped reads off the request path, and disaggregated prefill/decode pairs."""
