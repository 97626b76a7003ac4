"""An engine sweep against an engine_url whose GET /v1/models answers JSON that is not an object is refused as
FAILED_PRECONDITION naming spec.engine_url, like any other unusable answer.

prepare() read reply.json().get("data"): a top-level JSON array, string or number raised AttributeError, which no
handler caught, so StartSweep answered INTERNAL. Found by an adversarial audit of the
profiler's engine probe (failed before the fix)."""

from __future__ import annotations

import grpc
import pytest
from aiohttp import web

from greenserve.v1 import common_pb2, profiler_pb2

from .conftest import config


@pytest.mark.parametrize("body", ["[]", "\"models\"", "42", "null", "{\"data\": null}"])
async def test_models_reply_that_is_not_an_object_is_failed_precondition(profiler, body: str) -> None:
    async def models(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        stub = await profiler(import_published=False)
        spec = profiler_pb2.SweepSpec(
            backend=profiler_pb2.SWEEP_BACKEND_ENGINE, engine_url=f"http://127.0.0.1:{port}", workload="sharegpt",
            request_rates_per_s=[1.0], point_duration_s=5.0, configs=[config()],
            slo=common_pb2.Slo(ttft_s=0.2, tpot_s=0.08, attainment_fraction=0.9))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec), timeout=30)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value.details()
        assert "spec.engine_url" in err.value.details()
        assert not (await stub.ListSweeps(profiler_pb2.ListSweepsRequest())).sweeps
    finally:
        await runner.cleanup()
