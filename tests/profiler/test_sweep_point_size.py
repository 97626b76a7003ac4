"""A sweep whose rates imply more requests per point than MAX_REQUESTS_PER_POINT is refused at StartSweep
(INVALID_ARGUMENT naming the rate), as an explicit requests_per_point above it already was.

Without requests_per_point a point measures rate x point_duration_s requests (and warms up with rate x warmup_s),
and nothing bounded that product: 1e300 req/s was accepted and failed in numpy, and a rate of 10^5 req/s over an
hour (3.6e8 requests) made the simulator build every request in memory. Found by an adversarial audit of
SweepSpec (failed before the fix: the sweep was accepted)."""

from __future__ import annotations

import grpc
import pytest

from greenserve.profiler import spec as spec_rules
from greenserve.v1 import profiler_pb2

from .conftest import sim_spec


@pytest.mark.parametrize(("rates", "duration_s", "warmup_s", "field"), [
    ([1.0, 10.0], 60.0, 0.0, "spec.request_rates_per_s[1]"),  # 600 measured requests at 10 req/s
    ([1.0], 60.0, 200.0, "spec.request_rates_per_s[0]"),  # 200 warm-up requests at 1 req/s
    ([1e300], 60.0, 0.0, "spec.request_rates_per_s[0]"),
])
async def test_rates_implying_too_many_requests_per_point_are_refused(profiler, monkeypatch, rates, duration_s,
                                                                      warmup_s, field) -> None:
    monkeypatch.setattr(spec_rules, "MAX_REQUESTS_PER_POINT", 100, raising=False)
    stub = await profiler(import_published=False)
    spec = sim_spec(rates=rates, point_duration_s=duration_s)
    spec.method.warmup_s = warmup_s
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert field in err.value.details()
    assert not (await stub.ListSweeps(profiler_pb2.ListSweepsRequest())).sweeps


async def test_an_explicit_request_count_bounds_the_point(profiler, monkeypatch) -> None:
    monkeypatch.setattr(spec_rules, "MAX_REQUESTS_PER_POINT", 100, raising=False)
    stub = await profiler(import_published=False)
    spec = sim_spec(rates=[1.0, 10.0], point_duration_s=60.0)
    spec.method.requests_per_point = 50  # the rate no longer sets the count
    spec.method.warmup_s = 1.0
    await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))
