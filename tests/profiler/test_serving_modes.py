"""Serving-mode configurations (GreenLLM SpecDecode, DPD, DSD): simulator sweeps through the optimizer's mode path,
refused mode configs naming the field, stable keys and the CLI's mode flags."""

from __future__ import annotations

import argparse

import grpc
import pytest

from greenserve.common.errors import error_detail_from_rpc_error
from greenserve.profiler import mode_config
from greenserve.profiler.keys import config_key
from greenserve.profiler.method import resolve
from greenserve.profiler.sim_backend import simulate_point
from greenserve.simulator import mode_units
from greenserve.simulator.engine_profile import load_profile
from greenserve.v1 import common_pb2, profiler_pb2
from greenserve_client.commands import profile as profile_cli

from .conftest import SLO, config, sim_spec, wait_state

DRAFT = common_pb2.SpeculativeDraft(simulator_model="llama3.2-1b", acceptance_fraction=0.7)
SPEC = common_pb2.SERVING_MODE_SPEC_DECODE
DPD = common_pb2.SERVING_MODE_DISAGGREGATED
A100_40 = {"model": "llama2-7b", "hardware": "A100-40GB"}  # the draft's profile llama3.2-1b@A100-40GB is stored
DSD = common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE
DONE = {profiler_pb2.SWEEP_STATE_SUCCEEDED, profiler_pb2.SWEEP_STATE_FAILED, profiler_pb2.SWEEP_STATE_CANCELLED}


async def test_sweep_over_standalone_and_spec_decode_lowers_tpot_at_low_load(profiler) -> None:
    stub = await profiler(import_published=False)
    standalone = config(serving_mode=common_pb2.SERVING_MODE_STANDALONE)
    spec_decode = config(serving_mode=SPEC, draft=DRAFT)
    spec = sim_spec(rates=(1.0, 4.0, 64.0), configs=[standalone, spec_decode], workload="poisson")
    sweep = (await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))).sweep
    final = await wait_state(stub, sweep.id, DONE)
    assert final.state == profiler_pb2.SWEEP_STATE_SUCCEEDED, final.notes
    profiles = {}
    for pid in final.profile_ids:
        key, version = pid.rsplit("@", 1)
        profiles[key] = (await stub.GetProfile(profiler_pb2.GetProfileRequest(config_key=key,
                                                                              version=int(version)))).profile
    base_key = "llama3-8b@H100-80GB|mode=standalone|workload=poisson"
    sd_key = "llama3-8b@H100-80GB|mode=spec_decode|draft=llama3.2-1b|acceptance=0.7|spec_tokens=3|workload=poisson"
    assert set(profiles) == {base_key, sd_key}
    base, sd = profiles[base_key], profiles[sd_key]
    assert sd.config.draft.acceptance_fraction == pytest.approx(0.7)
    # 1 + k r = 3.1 tokens per speculative round: the draft's cost is well below the 2.1 saved target steps
    assert sd.points[0].tpot_p50_s < 0.8 * base.points[0].tpot_p50_s
    for profile in (base, sd):
        low = profile.points[0]
        assert low.slo_attainment_fraction >= SLO.attainment_fraction
        assert low.power_source == "simulator_model" and low.power_w > 0 and low.carbon_per_output_token_g > 0
        # the ladder stop rule holds for modes too: 64 req/s overloads one GPU
        assert [p.request_rate_per_s for p in profile.points][-1] == 64.0
        assert profile.points[-1].below_slo_target and profile.ladder_note.startswith("stopped")


def test_mode_point_is_the_shared_mode_unit() -> None:
    # the profiler replays the unit greenserve.simulator.mode_units builds (the serving-modes solver's path):
    # DPD's older GPU draws power too, so the pair's mean power exceeds the standalone GPU's at low load
    slo_spec = sim_spec(rates=(1.0,), workload="poisson")
    standalone = config(model="llama2-7b", hardware="A100-40GB")
    dpd = config(model="llama2-7b", hardware="A100-40GB", serving_mode=DPD, old_hardware="A100-40GB",
                 link_bandwidth_bytes_per_s=2e9)
    unit = mode_config.unit(dpd, "llama2-7b@A100-40GB", load_profile("llama2-7b@A100-40GB"))
    assert [e.role for e in unit.fleet.engines] == ["prefill", "decode"]
    assert unit.fleet.kv_link_bandwidth_bytes_per_s == 2e9 and unit.engine_gpus == (("new",), ("old",))
    method = resolve(slo_spec)
    p_alone = simulate_point(standalone, 1.0, slo_spec, method)
    p_dpd = simulate_point(dpd, 1.0, slo_spec, method)
    idle_old_w = float(mode_units.gpu_table()["A100-40GB"]["idle_w"])
    assert p_dpd.power_w > p_alone.power_w + 0.5 * idle_old_w


def _mode_spec(backend=profiler_pb2.SWEEP_BACKEND_SIMULATOR, **kw):
    return sim_spec(configs=[config(**kw)], backend=backend,
                    engine_url="http://127.0.0.1:9" if backend == profiler_pb2.SWEEP_BACKEND_ENGINE else "")


def _draft(**kw) -> common_pb2.SpeculativeDraft:
    d = common_pb2.SpeculativeDraft()
    d.CopyFrom(DRAFT)
    for name, value in kw.items():
        setattr(d, name, value)
    return d


@pytest.mark.parametrize(("spec", "code", "field"), [
    (_mode_spec(serving_mode=SPEC), grpc.StatusCode.INVALID_ARGUMENT, "spec.configs[0].draft"),
    (_mode_spec(serving_mode=SPEC, draft=_draft(acceptance_fraction=0.0)), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.configs[0].draft.acceptance_fraction"),
    (_mode_spec(serving_mode=SPEC, draft=_draft(acceptance_fraction=1.5)), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.configs[0].draft.acceptance_fraction"),
    (_mode_spec(serving_mode=SPEC, draft=_draft(acceptance_fraction=float("nan"))), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.configs[0].draft.acceptance_fraction"),
    (_mode_spec(serving_mode=SPEC, draft=_draft(simulator_model="gpt-17")), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.configs[0].draft.simulator_model"),
    (_mode_spec(serving_mode=SPEC, draft=_draft(num_speculative_tokens=99)), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.configs[0].draft.num_speculative_tokens"),
    (_mode_spec(serving_mode=DPD, link_bandwidth_bytes_per_s=2e9), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.configs[0].old_hardware"),
    (_mode_spec(serving_mode=DPD, old_hardware="A100-40GB"), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.configs[0].link_bandwidth_bytes_per_s"),
    (_mode_spec(serving_mode=DPD, old_hardware="Z80", link_bandwidth_bytes_per_s=2e9),
     grpc.StatusCode.INVALID_ARGUMENT, "spec.configs[0].old_hardware"),
    (_mode_spec(serving_mode=DSD, draft=DRAFT, old_hardware="T4"), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.configs[0].link_bandwidth_bytes_per_s"),
    (_mode_spec(serving_mode=DSD, old_hardware="T4", link_bandwidth_bytes_per_s=2e9),
     grpc.StatusCode.INVALID_ARGUMENT, "spec.configs[0].draft"),
    (_mode_spec(serving_mode=DSD, draft=DRAFT, old_hardware="T4", link_bandwidth_bytes_per_s=-1.0),
     grpc.StatusCode.INVALID_ARGUMENT, "spec.configs[0].link_bandwidth_bytes_per_s"),
    (_mode_spec(serving_mode=common_pb2.SERVING_MODE_STANDALONE, draft=DRAFT), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.configs[0].draft"),
    (_mode_spec(serving_mode=SPEC, draft=DRAFT, backend=profiler_pb2.SWEEP_BACKEND_ENGINE),
     grpc.StatusCode.FAILED_PRECONDITION, "spec.configs[0].serving_mode"),
])
async def test_bad_mode_config_names_the_field_and_stores_nothing(profiler, spec, code, field) -> None:
    stub = await profiler(import_published=False)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))
    assert err.value.code() == code, err.value.details()
    assert error_detail_from_rpc_error(err.value).field == field, err.value.details()
    assert len((await stub.ListSweeps(profiler_pb2.ListSweepsRequest())).sweeps) == 0
    assert len((await stub.ListProfiles(profiler_pb2.ListProfilesRequest())).profiles) == 0


def test_keys_of_configs_without_mode_fields_are_unchanged() -> None:
    assert config_key(config(serving_mode=common_pb2.SERVING_MODE_STANDALONE, cache_dram_bytes=4 << 30,
                             workload="sharegpt")) == "llama3-8b@H100-80GB|dram=4294967296|mode=standalone|workload=sharegpt"
    dsd = config(serving_mode=DSD, draft=_draft(acceptance_fraction=0.457, num_speculative_tokens=4),
                 old_hardware="T4", link_bandwidth_bytes_per_s=2.5e9)
    assert config_key(dsd) == ("llama3-8b@H100-80GB|mode=disaggregated_spec_decode|draft=llama3.2-1b|"
                               "acceptance=0.457|spec_tokens=4|old=T4|link=2500000000")


def _cli_spec(*flags: str) -> profiler_pb2.SweepSpec:
    ns = profile_cli._parser().parse_args(["sweep", "--model", "llama3-8b", "--hardware", "H100-80GB", "--rates", "1",
                                          "--workload", "poisson", "--ttft-slo-s", "1", "--tpot-slo-s", "0.1", *flags])
    return profile_cli._build_spec(ns)


def test_cli_sweep_builds_mode_configs_from_flags() -> None:
    spec = _cli_spec("--modes", "standalone,spec_decode,dpd,dsd", "--draft-model", "llama3.2-1b",
                     "--draft-acceptance", "0.457", "--old-hardware", "A100-40GB",
                     "--link-bandwidth-bytes-per-s", "2e9", "--cache-dram-gib", "0,4")
    assert len(spec.configs) == 8
    alone, sd, dpd, dsd = spec.configs[:4]
    assert alone.serving_mode == common_pb2.SERVING_MODE_STANDALONE and not alone.HasField("draft")
    assert (sd.serving_mode, sd.draft.simulator_model, sd.old_hardware) == (SPEC, "llama3.2-1b", "")
    assert (dpd.serving_mode, dpd.HasField("draft"), dpd.old_hardware) == (DPD, False, "A100-40GB")
    assert dsd.serving_mode == DSD and dsd.draft.acceptance_fraction == pytest.approx(0.457)
    assert dsd.link_bandwidth_bytes_per_s == 2e9 and spec.configs[4].cache_dram_bytes == 4 << 30
    assert len(_cli_spec().configs) == 1 and _cli_spec().configs[0].serving_mode == 0
    with pytest.raises(argparse.ArgumentTypeError, match="--modes"):
        _cli_spec("--modes", "turbo")


def test_cli_unknown_mode_exits_2(capsys) -> None:
    code = profile_cli.main(["sweep", "--model", "llama3-8b", "--hardware", "H100-80GB", "--rates", "1",
                             "--workload", "poisson", "--ttft-slo-s", "1", "--tpot-slo-s", "0.1", "--modes", "turbo"])
    assert code == 2 and "--modes" in capsys.readouterr().err


async def test_engine_backend_starts_the_emulator_in_each_mode(profiler) -> None:
    """Without an engine URL the profiler starts an emulated engine per configuration, in its serving mode."""
    stub = await profiler(import_published=False, engine_launcher="emulator", nvml_power="off")
    spec = profiler_pb2.SweepSpec(
        backend=profiler_pb2.SWEEP_BACKEND_ENGINE, engine_modelled_s_per_wall_s=5.0, workload="sharegpt",
        request_rates_per_s=[2.0], point_duration_s=5.0, seed=2,
        slo=common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9),
        configs=[config(**A100_40, serving_mode=common_pb2.SERVING_MODE_STANDALONE),
                 config(**A100_40, serving_mode=SPEC, draft=DRAFT)],
        method=common_pb2.ProfileMethod(warmup_s=1.0))
    sweep = (await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))).sweep
    final = await wait_state(stub, sweep.id, DONE, timeout_s=120)
    assert final.state == profiler_pb2.SWEEP_STATE_SUCCEEDED, final.error
    profiles = {}
    for pid in final.profile_ids:
        key, _ = pid.rsplit("@", 1)
        profiles[key] = (await stub.GetProfile(profiler_pb2.GetProfileRequest(config_key=key))).profile
    base = profiles["llama2-7b@A100-40GB|mode=standalone|workload=sharegpt"]
    sd = profiles["llama2-7b@A100-40GB|mode=spec_decode|draft=llama3.2-1b|acceptance=0.7|spec_tokens=3|"
                  "workload=sharegpt"]
    assert "--mode " not in base.note
    assert "--mode spec_decode --draft-profile llama3.2-1b@A100-40GB" in sd.note
    assert "--spec-acceptance 0.7" in sd.note
    assert base.points[0].failed_requests == 0 and sd.points[0].failed_requests == 0
    assert sd.points[0].tpot_mean_s < 0.8 * base.points[0].tpot_mean_s


async def test_engine_backend_refuses_a_mode_its_launcher_cannot_start(profiler) -> None:
    stub = await profiler(import_published=False, engine_launcher="vllm", nvml_power="off")
    spec = _mode_spec(backend=profiler_pb2.SWEEP_BACKEND_ENGINE, serving_mode=DPD, old_hardware="A100-40GB",
                      link_bandwidth_bytes_per_s=2e9)
    spec.engine_url = ""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value.details()
    assert error_detail_from_rpc_error(err.value).field == "spec.configs[0].serving_mode"
    assert len((await stub.ListSweeps(profiler_pb2.ListSweepsRequest())).sweeps) == 0


async def test_vllm_launcher_needs_the_drafts_model(profiler) -> None:
    stub = await profiler(import_published=False, engine_launcher="vllm", nvml_power="off")
    spec = _mode_spec(backend=profiler_pb2.SWEEP_BACKEND_ENGINE, serving_mode=SPEC, draft=DRAFT)
    spec.engine_url = ""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert error_detail_from_rpc_error(err.value).field == "spec.configs[0].draft.model"
    spec.configs[0].draft.model = "meta-llama/Llama-3.2-1B"  # then the vLLM command is written (not run here)
    spec.request_rates_per_s[:] = [1.0]
    from greenserve.profiler.engine_backend import EngineBackend
    from greenserve.profiler.service import ProfilerSettings

    backend = EngineBackend(ProfilerSettings(engine_launcher="vllm", log_json=False))
    argv = backend._launcher(spec).command(backend._engine_spec(spec, spec.configs[0], 8000)).argv
    assert "--speculative-config" in argv and "meta-llama/Llama-3.2-1B" in argv[argv.index("--speculative-config") + 1]
