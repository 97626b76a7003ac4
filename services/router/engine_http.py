"""The names the router's engine client had when it was one module, for the fronts and the dispatcher that still
import them from here (http_front.py, upstream.py, grpc_generate.py): the client is engine_pool.py (connections
and their pool), engine_response.py (one response: head, body framing, queue and sinks) and engine_wire.py
(limits, ``EngineHttpError``). New code imports from those; this module goes once those three do."""

from greenserve.router.engine_pool import EnginePool
from greenserve.router.engine_response import EngineResponse
from greenserve.router.engine_wire import EngineHttpError

__all__ = ["EngineHttpError", "EnginePool", "EngineResponse"]
