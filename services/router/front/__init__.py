"""The callers' side of the router: the OpenAI-compatible HTTP front and its SSE forwarding, the gRPC servicer
and its Generate stream, and the limits every request passes first."""
