"""Regression tests of the defects the fuzz harness found (each gave INTERNAL or a 5xx before its fix)."""

from __future__ import annotations

import grpc
import pytest
from greenserve.common.errors import InvalidArgument
from greenserve.profiler import spec as profiler_spec
from greenserve.router.front.service import RouterSettings, build
from greenserve.v1 import common_pb2, profiler_pb2, router_pb2, router_pb2_grpc

from tests.profiler.conftest import sim_spec

BAD_URLS = ["http://[::1", "http://h:99999", "http://h:port/"]  # urllib raises ValueError on each


@pytest.mark.parametrize("url", BAD_URLS)
async def test_router_register_engine_with_an_unparsable_url_is_invalid_argument(start_inprocess, url) -> None:
    running = await start_inprocess(RouterSettings, build, http_port=-1, watch_plans=False, feeds=False)
    async with grpc.aio.insecure_channel(running.address) as channel:
        engine = common_pb2.Engine(id="e1", url=url, pool="default", model="m")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await router_pb2_grpc.RouterServiceStub(channel).RegisterEngine(
                router_pb2.RegisterEngineRequest(engine=engine), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert "engine.url" in err.value.details()


@pytest.mark.parametrize("url", BAD_URLS)
def test_profiler_engine_sweep_with_an_unparsable_url_is_invalid_argument(url) -> None:
    spec = sim_spec(backend=profiler_pb2.SWEEP_BACKEND_ENGINE, engine_url=url)
    with pytest.raises(InvalidArgument) as err:
        profiler_spec.validate(spec)
    assert err.value.field == "spec.engine_url"


@pytest.mark.parametrize("value", [float("inf"), -float("inf"), float("nan")])
def test_fleet_file_with_an_infinite_enum_is_refused_naming_the_key(value: float) -> None:
    """Issue 36, the file fuzz: ``model: .inf`` for a GPU (an enum) raised OverflowError out of protobuf's parser."""
    from greenserve_client.commands.fleet import FleetFileError, parse_fleet

    with pytest.raises(FleetFileError) as err:
        parse_fleet({"gpus": [{"uuid": "GPU-1", "model": value}]})
    assert err.value.path == "gpus[0].model"


@pytest.mark.parametrize("value", [".inf", ".nan", "-.inf"])
def test_scenario_with_an_infinite_number_is_refused_naming_the_key(tmp_path, value: str) -> None:
    """Issue 36, the file fuzz: ``peak_requests_per_s: .inf`` was taken (only `< 0` was refused) and reached the
    evaluation as an infinite load."""
    from greenserve.evaluation.scenario import ScenarioError, load

    path = tmp_path / "s.yaml"
    path.write_text(f"pools:\n  - name: chat\n    hardware: A100-80GB\n    engines: 2\n    peak_requests_per_s: {value}\n")
    with pytest.raises(ScenarioError) as err:
        load(path)
    assert "pools[0].peak_requests_per_s: must be a finite number >= 0" in str(err.value)
