"""Calibration: a measured profile fits the simulator's model; the fitted model is a version a sweep can use."""

from __future__ import annotations

import grpc
import pytest

from greenserve.common.errors import error_detail_from_rpc_error
from greenserve.profiler.method import resolve
from greenserve.profiler.sim_backend import simulate_point
from greenserve.simulator.engine_profile import load_profile
from greenserve.v1 import common_pb2, profiler_pb2

from .conftest import config, sim_spec, wait_state

SLO = common_pb2.Slo(ttft_s=0.2, tpot_s=0.08, attainment_fraction=0.9)
RATES = (1.0, 4.0, 8.0)


def _measured_elsewhere() -> common_pb2.Profile:
    """A 'measured' ShareGPT profile of an engine slower than the data file says (decode at 45 % of the HBM
    bandwidth instead of 70 %, prefill at 30 % MFU instead of 44 %), produced by the simulator itself."""
    slower = load_profile("llama3-8b@H100-80GB").with_overrides(decode_mbu=0.45, prefill_mfu=0.30)
    spec = sim_spec(rates=RATES, workload="sharegpt", slo=SLO, seed=4)
    method = resolve(spec)
    profile = common_pb2.Profile(config=config(workload="sharegpt"), slo=SLO,
                                 source=common_pb2.PROFILE_SOURCE_MEASURED, note="engine in the lab")
    profile.points.extend(simulate_point(spec.configs[0], r, spec, method, slower) for r in RATES)
    return profile


async def test_calibrate_then_sweep_with_the_model_version(profiler) -> None:
    stub = await profiler(import_published=False)
    measured = (await stub.PutProfile(profiler_pb2.PutProfileRequest(profile=_measured_elsewhere()))).profile
    version = (await stub.Calibrate(profiler_pb2.CalibrateRequest(config_key=measured.config_key))).model_version
    assert version.name == "llama3-8b@H100-80GB+cal1" and version.base_profile == "llama3-8b@H100-80GB"
    assert version.calibrated_from == f"{measured.config_key}@1"
    assert abs(version.parameters["decode_mbu"] - 0.45) < abs(0.7 - 0.45)  # moved towards the truth
    tpot = [c for c in version.checks if c.quantity == "tpot_mean_s"]
    assert tpot and all(abs(c.calibrated_model_s - c.measured_s) < abs(c.default_model_s - c.measured_s) for c in tpot)
    listed = (await stub.ListModelVersions(profiler_pb2.ListModelVersionsRequest())).model_versions
    assert [v.name for v in listed] == [version.name]

    def mean_tpot_error(points) -> float:
        return sum(abs(p.tpot_mean_s / m.tpot_mean_s - 1) for p, m in zip(points, measured.points)) / len(points)

    results = {}
    for name in ("", version.name):
        spec = sim_spec(rates=RATES, workload="sharegpt", slo=SLO, seed=4, model_version=name)
        spec.method.stop_rule = common_pb2.LADDER_STOP_RULE_FULL_LADDER
        sweep = (await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))).sweep
        done = await wait_state(stub, sweep.id, {profiler_pb2.SWEEP_STATE_SUCCEEDED, profiler_pb2.SWEEP_STATE_FAILED})
        assert done.state == profiler_pb2.SWEEP_STATE_SUCCEEDED, done.error
        key, v = done.profile_ids[0].rsplit("@", 1)
        results[name] = (await stub.GetProfile(profiler_pb2.GetProfileRequest(config_key=key, version=int(v)))).profile
    calibrated = results[version.name]
    assert calibrated.model_version == version.name and version.name in calibrated.note
    assert mean_tpot_error(calibrated.points) < mean_tpot_error(results[""].points)


async def test_calibration_refusals(profiler) -> None:
    stub = await profiler(import_published=False)
    simulated = _measured_elsewhere()
    simulated.source = common_pb2.PROFILE_SOURCE_SIMULATED
    stored = (await stub.PutProfile(profiler_pb2.PutProfileRequest(profile=simulated))).profile
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Calibrate(profiler_pb2.CalibrateRequest(config_key=stored.config_key))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "MEASURED" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=sim_spec(model_version="llama3-8b@H100-80GB+cal9")))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_detail_from_rpc_error(err.value).field == "spec.model_version"
    assert len((await stub.ListSweeps(profiler_pb2.ListSweepsRequest())).sweeps) == 0
