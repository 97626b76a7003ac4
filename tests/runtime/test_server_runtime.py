"""The shared server runtime, exercised through a real service (the optimizer) over real gRPC channels:
health, reflection, auth, TLS/mTLS, error mapping with rich details, UNIMPLEMENTED, telemetry, deadlines,
message-size limits and graceful shutdown."""

from __future__ import annotations

import math
import time

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status
from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import TracerProvider

from greenserve.common import deadline as deadline_mod
from greenserve.common import server as server_mod
from greenserve.common.client import ChannelConfig, create_channel, idempotent_methods
from greenserve.common.errors import error_detail_from_rpc_error
from greenserve.common.server import registration
from greenserve.optimizer.service import OptimizerSettings, build, estimate_carbon
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc

OPTIMIZER = "greenserve.v1.OptimizerService"


def estimate(energy_kwh: float = 1.0, ci: float = 100.0, duration_s: float = 3600.0) -> optimizer_pb2.EstimateCarbonRequest:
    return optimizer_pb2.EstimateCarbonRequest(energy_kwh=energy_kwh, ci_g_per_kwh=ci, duration_s=duration_s)


async def estimate_status(config: ChannelConfig) -> grpc.StatusCode:
    """Status of one EstimateCarbon call over a channel built from `config`."""
    channel = create_channel(config)
    try:
        await optimizer_pb2_grpc.OptimizerServiceStub(channel).EstimateCarbon(estimate(), timeout=5)
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    finally:
        await channel.close()


async def test_health_and_reflection_list_the_service(start_inprocess) -> None:
    svc = await start_inprocess(OptimizerSettings, build)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", OPTIMIZER):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await health.Check(health_pb2.HealthCheckRequest(service="greenserve.v1.NoSuchService"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND

        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        reply = await call.read()
        names = {s.name for s in reply.list_services_response.service}
        assert {OPTIMIZER, "grpc.health.v1.Health"} <= names
        call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=OPTIMIZER)]))
        reply = await call.read()
        assert reply.file_descriptor_response.file_descriptor_proto, "reflection must serve the descriptors grpcurl needs"


async def test_estimate_carbon_and_invalid_argument_names_the_field(start_inprocess) -> None:
    svc = await start_inprocess(OptimizerSettings, build)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
        reply = await stub.EstimateCarbon(estimate())
        assert math.isclose(reply.carbon.operational_g, 100.0)
        assert reply.carbon.embodied_compute_g > 0
        assert math.isclose(reply.carbon.total_g, reply.carbon.operational_g + reply.carbon.embodied_compute_g)

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.EstimateCarbon(estimate(energy_kwh=-1.0))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "energy_kwh" in err.value.details()
        detail = error_detail_from_rpc_error(err.value)
        assert detail is not None and detail.field == "energy_kwh"
        assert detail.reason == common_pb2.ERROR_REASON_INVALID_FIELD and detail.service == "optimizer"
        status = rpc_status.from_call(err.value)
        bad = [d for d in status.details if d.Is(error_details_pb2.BadRequest.DESCRIPTOR)]
        assert len(bad) == 1

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.EstimateCarbon(estimate(ci=float("nan")))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ci_g_per_kwh" in err.value.details()

        bad_component = optimizer_pb2.EstimateCarbonRequest(
            energy_kwh=1, ci_g_per_kwh=1, duration_s=1,
            carbon_params=common_pb2.CarbonParams(
                components=[common_pb2.EmbodiedComponent(kind=common_pb2.COMPONENT_KIND_GPU, name="H100", count=1)]
            ),
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.EstimateCarbon(bad_component)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "carbon_params.components[0].embodied_g" in err.value.details()


async def test_unimplemented_rpcs_say_so(start_inprocess) -> None:
    # The generated base servicer: every RPC a service does not implement answers UNIMPLEMENTED with its name.
    svc = await start_inprocess(OptimizerSettings, lambda ctx: [registration(
        optimizer_pb2, optimizer_pb2_grpc, "OptimizerService", optimizer_pb2_grpc.OptimizerServiceServicer())])
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetPlan(optimizer_pb2.GetPlanRequest())
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "OptimizerService/GetPlan" in err.value.details()
        call = stub.WatchPlans(optimizer_pb2.WatchPlansRequest())
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_bearer_token_required_when_auth_on(start_inprocess) -> None:
    svc = await start_inprocess(OptimizerSettings, build, auth_token="s3cret-token")

    def call(token: str | None):
        return estimate_status(ChannelConfig(address=svc.address, token=token))

    assert await call(None) == grpc.StatusCode.UNAUTHENTICATED
    assert await call("wrong") == grpc.StatusCode.UNAUTHENTICATED
    assert await call("s3cret-token") == grpc.StatusCode.OK
    # Health stays open for probes; reflection and every greenserve RPC need the token.
    async with grpc.aio.insecure_channel(svc.address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=OPTIMIZER))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        call_ = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call_.read()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_tls_with_test_ca(start_inprocess, tls_files) -> None:
    svc = await start_inprocess(OptimizerSettings, build, tls_cert=tls_files.server_cert, tls_key=tls_files.server_key)

    port = svc.address.split(":")[1]
    address = f"localhost:{port}"
    assert await estimate_status(ChannelConfig(address=address, tls_ca=tls_files.ca_cert)) == grpc.StatusCode.OK
    assert await estimate_status(ChannelConfig(address=address, tls_ca=tls_files.other_ca_cert)) == grpc.StatusCode.UNAVAILABLE
    assert await estimate_status(ChannelConfig(address=address)) == grpc.StatusCode.UNAVAILABLE  # plaintext refused


async def test_mutual_tls_requires_a_client_certificate(start_inprocess, tls_files) -> None:
    svc = await start_inprocess(
        OptimizerSettings, build,
        tls_cert=tls_files.server_cert, tls_key=tls_files.server_key, tls_client_ca=tls_files.ca_cert,
    )
    port = svc.address.split(":")[1]

    def call(**kwargs):
        return estimate_status(ChannelConfig(address=f"localhost:{port}", tls_ca=tls_files.ca_cert, **kwargs))

    assert await call() == grpc.StatusCode.UNAVAILABLE
    assert await call(tls_cert=tls_files.client_cert, tls_key=tls_files.client_key) == grpc.StatusCode.OK


async def test_tls_settings_must_be_complete() -> None:
    settings = OptimizerSettings.model_validate({"tls_cert": "a.pem"})
    with pytest.raises(ValueError, match="tls_cert and tls_key"):
        server_mod.server_credentials(settings)


async def test_spans_and_metrics_per_rpc_with_propagated_trace(start_inprocess) -> None:
    svc = await start_inprocess(OptimizerSettings, build)
    provider = TracerProvider()
    tracer = provider.get_tracer("test")
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
        with tracer.start_as_current_span("gateway") as parent:
            carrier: dict[str, str] = {}
            inject(carrier, context=trace.set_span_in_context(parent))
            await stub.EstimateCarbon(estimate(), metadata=tuple(carrier.items()))
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.EstimateCarbon(estimate(energy_kwh=-1))
    spans = [s for s in svc.spans.get_finished_spans() if s.name == f"{OPTIMIZER}/EstimateCarbon"]
    assert len(spans) == 2
    ok, failed = spans
    assert ok.parent is not None and ok.context.trace_id == parent.get_span_context().trace_id
    assert ok.attributes["rpc.grpc.status_code"] == 0
    assert failed.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    data = svc.metrics.get_metrics_data()
    points = [
        p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        if m.name == "greenserve.rpc.server.requests" for p in m.data.data_points
    ]
    by_code = {p.attributes["rpc.grpc.status_code"]: p.value for p in points if p.attributes["rpc.method"].endswith("EstimateCarbon")}
    assert by_code == {"OK": 1, "INVALID_ARGUMENT": 1}


async def test_deadline_is_visible_to_handlers_and_bounds_outbound_calls(start_inprocess) -> None:
    seen: dict[str, float | None] = {}

    class Probe(optimizer_pb2_grpc.OptimizerServiceServicer):
        def __init__(self, ctx) -> None:
            self.ctx = ctx

        async def EstimateCarbon(self, request, context):  # gRPC method name
            return estimate_carbon(request)

        async def GetFleet(self, request, context):  # gRPC method name
            seen["remaining_s"] = deadline_mod.remaining_s()
            # An outbound call made from here gets at most the remaining time, even if it asks for more.
            outbound = create_channel(ChannelConfig(address=seen_address["addr"], default_timeout_s=60))
            try:
                stub = optimizer_pb2_grpc.OptimizerServiceStub(outbound)
                await stub.EstimateCarbon(estimate(), timeout=120)
            finally:
                await outbound.close()
            return optimizer_pb2.GetFleetResponse()

    seen_address: dict[str, str] = {}
    svc = await start_inprocess(
        OptimizerSettings, lambda ctx: [registration(optimizer_pb2, optimizer_pb2_grpc, "OptimizerService", Probe(ctx))]
    )
    seen_address["addr"] = svc.address
    async with grpc.aio.insecure_channel(svc.address) as channel:
        await optimizer_pb2_grpc.OptimizerServiceStub(channel).GetFleet(optimizer_pb2.GetFleetRequest(), timeout=3.0)
    # Bounded by the caller's 3 s (plus clock skew between client and server), not by any default.
    assert seen["remaining_s"] is not None and 0 < seen["remaining_s"] <= 3.5
    inner = [s for s in svc.spans.get_finished_spans() if s.name.endswith("/EstimateCarbon")]
    assert inner, "the outbound call reached the server"


def test_client_timeout_is_capped_by_propagated_deadline() -> None:
    from greenserve.common.client import _Metadata

    meta = _Metadata(token="t", default_timeout_s=30.0)
    details = grpc.aio.ClientCallDetails("/x/y", None, None, None, None)
    assert meta._details(details, 30.0).timeout == 30.0
    token = deadline_mod.current_deadline.set(time.monotonic() + 2.0)
    try:
        capped = meta._details(details, 30.0)
        assert 0 < capped.timeout <= 2.0
        assert ("authorization", "Bearer t") in list(capped.metadata)
    finally:
        deadline_mod.current_deadline.reset(token)


def test_retry_policy_covers_only_idempotent_methods() -> None:
    names = {(m["service"], m["method"]) for m in idempotent_methods()}
    assert (OPTIMIZER, "GetPlan") in names and (OPTIMIZER, "EstimateCarbon") in names
    assert ("greenserve.v1.RouterService", "ListEngines") in names
    assert (OPTIMIZER, "ComputePlan") not in names
    assert ("greenserve.v1.RouterService", "Generate") not in names
    assert ("greenserve.v1.ForecasterService", "IngestPoints") not in names


async def test_messages_over_the_limit_are_rejected(start_inprocess) -> None:
    svc = await start_inprocess(OptimizerSettings, build, max_message_bytes=4096)
    big = optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[common_pb2.Pool(name="x" * 10_000)]))
    async with grpc.aio.insecure_channel(svc.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await optimizer_pb2_grpc.OptimizerServiceStub(channel).SetFleet(big)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_graceful_stop_reports_not_serving_and_refuses_new_calls(start_inprocess) -> None:
    svc = await start_inprocess(OptimizerSettings, build)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
        await stub.EstimateCarbon(estimate())
        await svc.server.stop(0.5)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.EstimateCarbon(estimate(), timeout=2)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_client_retries_idempotent_calls_only(start_inprocess) -> None:
    attempts = {"GetPlan": 0, "ComputePlan": 0}

    class Flaky(optimizer_pb2_grpc.OptimizerServiceServicer):
        def __init__(self, ctx) -> None:
            self.ctx = ctx

        async def GetPlan(self, request, context):  # gRPC method name
            attempts["GetPlan"] += 1
            if attempts["GetPlan"] < 3:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
            return optimizer_pb2.GetPlanResponse()

        async def ComputePlan(self, request, context):
            attempts["ComputePlan"] += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")

    svc = await start_inprocess(
        OptimizerSettings, lambda ctx: [registration(optimizer_pb2, optimizer_pb2_grpc, "OptimizerService", Flaky(ctx))]
    )
    channel = create_channel(ChannelConfig(address=svc.address, default_timeout_s=10))
    try:
        stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
        await stub.GetPlan(optimizer_pb2.GetPlanRequest())
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ComputePlan(optimizer_pb2.ComputePlanRequest())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await channel.close()
    assert attempts == {"GetPlan": 3, "ComputePlan": 1}
