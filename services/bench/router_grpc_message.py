"""What one streamed gRPC message costs the server, per way of sending it.

``python -m greenserve.bench.router_grpc_message`` starts a bare gRPC server in a child process for each
variant, streams ``--streams`` concurrent ``Generate`` calls of ``--messages`` messages each to a client
in this process (``--gap-s`` between two messages of a stream, as tokens arrive), and reports the
server process's CPU time (``/proc/PID/stat``) per message. Variants:

- ``aio_write``: grpc.aio, a coroutine handler calling ``context.write(GenerateResponse(...))`` (the
  router's way);
- ``aio_yield``: grpc.aio, an async-generator handler yielding the messages;
- ``aio_bytes``: grpc.aio, ``context.write`` of wire bytes the handler builds itself
  (``generate_response_bytes``), through a generic handler with no response serializer;
- ``aio_bytes_nocomp``: as ``aio_bytes`` with compression explicitly off for the call;
- ``sync_yield``: the sync server (thread pool), a generator handler yielding the messages.

``--interceptor`` serves the aio variants through the services' own ``ServerInterceptor`` (auth, an
OpenTelemetry span and metrics, the log line, error mapping); ``--messages 1`` then gives its cost per call.

The figure is CPU per message of the server alone (the client runs in another process); it is what the
router pays per message on top of reading the engine's tokens. One JSON line per variant, then a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from concurrent import futures

import grpc
from greenserve.common.cli_parser import Parser
from greenserve.common.parent_death import dies_with_parent
from greenserve.v1 import router_pb2

SERVICE = "greenserve.v1.RouterService"
METHOD = f"/{SERVICE}/Generate"
VARIANTS = ("aio_write", "aio_yield", "aio_bytes", "aio_bytes_nocomp", "sync_yield")
_TEXT = " token"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len_field(tag: int, data: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(data)) + data


def generate_response_bytes(request_id: str = "", text_delta: str = "", finish_reason: str = "",
                            receipt: bytes = b"", engine_id: str = "", token_count: int = 0) -> bytes:
    """The protobuf wire bytes of a ``GenerateResponse`` (fields 1-6; empty fields left out, as the
    protobuf runtime does for proto3 scalars), ``receipt`` being the serialised CarbonReceipt."""
    parts = []
    if request_id:
        parts.append(_len_field(0x0A, request_id.encode()))
    if text_delta:
        parts.append(_len_field(0x12, text_delta.encode()))
    if finish_reason:
        parts.append(_len_field(0x1A, finish_reason.encode()))
    if receipt:
        parts.append(_len_field(0x22, receipt))
    if engine_id:
        parts.append(_len_field(0x2A, engine_id.encode()))
    if token_count:
        parts.append(b"\x30" + _varint(token_count))
    return b"".join(parts)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- server (child process) -----------------------------------------------------------------------------


def _serve_aio(variant: str, port: int, messages: int, gap_s: float, interceptor: bool = False) -> None:
    import uvloop

    Response = router_pb2.GenerateResponse

    async def write_handler(request: router_pb2.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        write = context.write
        for _i in range(messages):
            if gap_s:
                await asyncio.sleep(gap_s)
            await write(Response(request_id="r", text_delta=_TEXT, token_count=1))

    async def yield_handler(request: router_pb2.GenerateRequest,
                            context: grpc.aio.ServicerContext) -> AsyncIterator[router_pb2.GenerateResponse]:
        for _i in range(messages):
            if gap_s:
                await asyncio.sleep(gap_s)
            yield Response(request_id="r", text_delta=_TEXT, token_count=1)

    async def bytes_handler(request: router_pb2.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        if variant == "aio_bytes_nocomp":
            context.set_compression(grpc.Compression.NoCompression)
        write = context.write
        for _i in range(messages):
            if gap_s:
                await asyncio.sleep(gap_s)
            await write(generate_response_bytes(request_id="r", text_delta=_TEXT, token_count=1))

    if variant == "aio_write":
        h = grpc.unary_stream_rpc_method_handler(write_handler, request_deserializer=router_pb2.GenerateRequest.FromString,
                                                 response_serializer=Response.SerializeToString)
    elif variant == "aio_yield":
        h = grpc.unary_stream_rpc_method_handler(yield_handler, request_deserializer=router_pb2.GenerateRequest.FromString,
                                                 response_serializer=Response.SerializeToString)
    else:
        h = grpc.unary_stream_rpc_method_handler(bytes_handler, request_deserializer=router_pb2.GenerateRequest.FromString,
                                                 response_serializer=None)

    async def main() -> None:
        interceptors = []
        if interceptor:  # the services' own layer (auth, span, metrics, log line, error mapping)
            from greenserve.common.server import ServerInterceptor
            from greenserve.common.telemetry import setup_telemetry

            interceptors.append(ServerInterceptor("bench", setup_telemetry("bench", install_global=False), None))
        server = grpc.aio.server(interceptors=interceptors)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Generate": h}),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    uvloop.install()
    asyncio.run(main())


def _serve_sync(port: int, messages: int, gap_s: float, threads: int) -> None:
    Response = router_pb2.GenerateResponse

    def handler(request: router_pb2.GenerateRequest,
                context: grpc.ServicerContext) -> Iterator[router_pb2.GenerateResponse]:
        for _i in range(messages):
            if gap_s:
                time.sleep(gap_s)
            yield Response(request_id="r", text_delta=_TEXT, token_count=1)

    h = grpc.unary_stream_rpc_method_handler(handler, request_deserializer=router_pb2.GenerateRequest.FromString,
                                             response_serializer=Response.SerializeToString)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Generate": h}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


# -- client (this process) ------------------------------------------------------------------------------


async def _load(port: int, streams: int) -> tuple[int, str]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_stream(METHOD, request_serializer=router_pb2.GenerateRequest.SerializeToString,
                                    response_deserializer=router_pb2.GenerateResponse.FromString)

        async def one() -> tuple[int, str]:
            n, text = 0, []
            async for msg in call(router_pb2.GenerateRequest()):
                n += 1
                text.append(msg.text_delta)
            return n, "".join(text)

        results = await asyncio.gather(*(one() for _ in range(streams)))
    return sum(n for n, _ in results), results[0][1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_variant(variant: str, streams: int, messages: int, gap_s: float, cpu: int | None,
                interceptor: bool = False) -> dict:
    port = _free_port()
    cmd = [sys.executable, "-m", "greenserve.bench.router_grpc_message", "--serve", variant, "--port", str(port),
           "--messages", str(messages), "--gap-s", str(gap_s), "--streams", str(streams),
           *(["--interceptor"] if interceptor else [])]
    proc = subprocess.Popen(dies_with_parent(cmd, signal.SIGTERM), stdout=subprocess.PIPE, text=True)
    try:
        if cpu is not None:
            os.sched_setaffinity(proc.pid, {cpu})
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        asyncio.run(_load(port, 4))  # warm-up: channel, handler code paths
        before, t0 = _cpu_s(proc.pid), time.monotonic()
        received, text = asyncio.run(_load(port, streams))
        cpu_s, wall_s = _cpu_s(proc.pid) - before, time.monotonic() - t0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    if received != streams * messages or text != _TEXT * messages:
        raise SystemExit(f"{variant}: received {received} messages, expected {streams * messages}")
    return {"variant": variant, "interceptor": interceptor, "streams": streams, "messages_per_stream": messages, "gap_s": gap_s,
            "server_cpu_s": round(cpu_s, 3), "wall_s": round(wall_s, 2),
            "server_cpu_us_per_message": round(cpu_s / received * 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m greenserve.bench.router_grpc_message", description=__doc__.split("\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ", ".join(VARIANTS))
    p.add_argument("--streams", type=int, default=64, help="concurrent streams")
    p.add_argument("--messages", type=int, default=200, help="messages per stream")
    p.add_argument("--gap-s", type=float, default=0.005, help="pause between two messages of a stream")
    p.add_argument("--rounds", type=int, default=1, help="runs of every variant, interleaved")
    p.add_argument("--server-cpu", type=int, default=None, help="pin the server to this CPU")
    p.add_argument("--interceptor", action="store_true",
                   help="aio variants: serve through greenserve.common.server's ServerInterceptor, as the services do")
    p.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        if args.serve == "sync_yield":
            _serve_sync(args.port, args.messages, args.gap_s, threads=args.streams + 8)
        else:
            _serve_aio(args.serve, args.port, args.messages, args.gap_s, args.interceptor)
        return 0
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        print(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})", file=sys.stderr)
        return 2
    rows = []
    for _ in range(args.rounds):
        for v in variants:
            row = run_variant(v, args.streams, args.messages, args.gap_s, args.server_cpu, args.interceptor)
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {v: sorted(r["server_cpu_us_per_message"] for r in rows if r["variant"] == v) for v in variants}
    print(json.dumps({"server_cpu_us_per_message": summary, "load_average": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
