"""Profiles over gRPC: versions per configuration key, filters, validation that stores nothing, published import."""

from __future__ import annotations

import grpc
import pytest

from greenserve.common.errors import error_detail_from_rpc_error
from greenserve.profiler.keys import config_key
from greenserve.profiler.published import builtin_profiles, load_file
from greenserve.v1 import common_pb2, profiler_pb2

from .conftest import SLO, config


def measured(rates=(1.0, 2.0), **cfg) -> common_pb2.Profile:
    profile = common_pb2.Profile(config=config(**cfg), slo=SLO, source=common_pb2.PROFILE_SOURCE_MEASURED,
                                 note="engine http://10.0.0.7:8000")
    for r in rates:
        profile.points.add(request_rate_per_s=r, ttft_p50_s=0.1 * r, slo_attainment_fraction=0.95, requests=100)
    return profile


async def test_versions_per_key_and_latest(profiler) -> None:
    stub = await profiler(import_published=False)
    first = (await stub.PutProfile(profiler_pb2.PutProfileRequest(profile=measured()))).profile
    second = (await stub.PutProfile(profiler_pb2.PutProfileRequest(profile=measured((1.0, 2.0, 3.0))))).profile
    other = (await stub.PutProfile(profiler_pb2.PutProfileRequest(profile=measured(cache_dram_bytes=1 << 30)))).profile
    assert (first.version, second.version, other.version) == (1, 2, 1)
    assert first.config_key == second.config_key == "llama3-8b@H100-80GB"
    assert other.config_key == "llama3-8b@H100-80GB|dram=1073741824"
    latest = (await stub.GetProfile(profiler_pb2.GetProfileRequest(config_key=first.config_key))).profile
    assert latest.version == 2 and len(latest.points) == 3
    v1 = (await stub.GetProfile(profiler_pb2.GetProfileRequest(config_key=first.config_key, version=1))).profile
    assert len(v1.points) == 2 and v1.note == "engine http://10.0.0.7:8000"
    everything = (await stub.ListProfiles(profiler_pb2.ListProfilesRequest())).profiles
    assert len(everything) == 3
    latest_only = (await stub.ListProfiles(profiler_pb2.ListProfilesRequest(latest_only=True))).profiles
    assert sorted((p.config_key, p.version) for p in latest_only) == [(first.config_key, 2), (other.config_key, 1)]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetProfile(profiler_pb2.GetProfileRequest(config_key=first.config_key, version=3))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda p: p.ClearField("config"), "profile.config"),
    (lambda p: setattr(p.config, "model", ""), "profile.config.model"),
    (lambda p: setattr(p, "source", common_pb2.PROFILE_SOURCE_UNSPECIFIED), "profile.source"),
    (lambda p: setattr(p.points[1], "ttft_p50_s", float("nan")), "profile.points[1].ttft_p50_s"),
    (lambda p: setattr(p.points[0], "power_w", -3.0), "profile.points[0].power_w"),
    (lambda p: setattr(p.points[1], "request_rate_per_s", 0.5), "profile.points[1].request_rate_per_s"),
    (lambda p: setattr(p.points[0], "slo_attainment_fraction", 1.5), "profile.points[0].slo_attainment_fraction"),
    (lambda p: (setattr(p, "source", common_pb2.PROFILE_SOURCE_PUBLISHED), setattr(p, "note", "")), "profile.note"),
    (lambda p: p.ClearField("points"), "profile.points"),
    # found by an adversarial audit: the skipped rates and the method's numbers were stored unchecked (NaN, inf)
    (lambda p: p.skipped_rates_per_s.extend([4.0, float("nan")]), "profile.skipped_rates_per_s[1]"),
    (lambda p: setattr(p.method, "warmup_s", float("inf")), "profile.method.warmup_s"),
    (lambda p: setattr(p.method, "request_timeout_s", -1.0), "profile.method.request_timeout_s"),
    (lambda p: setattr(p.method, "stop_rule", 99), "profile.method.stop_rule"),
])
async def test_bad_profile_is_refused_and_nothing_stored(profiler, mutate, field) -> None:
    stub = await profiler(import_published=False)
    profile = measured()
    mutate(profile)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.PutProfile(profiler_pb2.PutProfileRequest(profile=profile))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_detail_from_rpc_error(err.value).field == field
    assert len((await stub.ListProfiles(profiler_pb2.ListProfilesRequest())).profiles) == 0


async def test_published_tables_are_imported_once_with_citations(profiler, tmp_path) -> None:
    stub = await profiler(data_dir=tmp_path / "p")
    published = (await stub.ListProfiles(profiler_pb2.ListProfilesRequest(
        source=common_pb2.PROFILE_SOURCE_PUBLISHED))).profiles
    assert len(published) == len(builtin_profiles()) == 22
    sharegpt = (await stub.GetProfile(profiler_pb2.GetProfileRequest(
        config_key="llama2-7b@A100-40GB|mode=standalone|workload=sharegpt"))).profile
    assert (sharegpt.slo.ttft_s, sharegpt.slo.tpot_s, sharegpt.slo.attainment_fraction) == (0.2, 0.08, 0.9)
    assert "GreenLLM" in sharegpt.note and "Table II" in sharegpt.note
    facts = {f.name: f.value for f in sharegpt.facts}
    assert (facts["p50_prompt_tokens"], facts["p50_output_tokens"]) == (160, 140)
    a100 = (await stub.GetProfile(profiler_pb2.GetProfileRequest(config_key="any@A100-40GB"))).profile
    assert {f.name: f.value for f in a100.facts}["embodied_carbon_kg"] == 26.34
    lcs16 = (await stub.ListProfiles(profiler_pb2.ListProfilesRequest(workload="triviaqa-a0.7"))).profiles
    largest = max(lcs16, key=lambda p: p.config.cache_disk_bytes)
    assert largest.config.cache_disk_bytes == 16 * 10**12
    assert {f.name: f.value for f in largest.facts}["cache_hit_fraction_lcs"] == 0.52
    # a second start on the same database imports nothing more
    again = await profiler(data_dir=tmp_path / "p")
    assert len((await again.ListProfiles(profiler_pb2.ListProfilesRequest())).profiles) == 22


def test_import_file_names_the_bad_entry(tmp_path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[[profiles]]\ncitation = "x"\nconfig = { model = "m", hardware = "h" }\nfacts = { a_w = "high" }\n')
    with pytest.raises(ValueError, match=r"profiles\[0\]\.facts\.a_w"):
        load_file(path)
    path.write_text('[[profiles]]\nconfig = { model = "m", hardware = "h" }\n')
    with pytest.raises(ValueError, match=r"profiles\[0\]\.citation"):
        load_file(path)


def test_config_key_is_stable_and_complete() -> None:
    cfg = common_pb2.ProfileConfig(model="llama3-70b", model_variant="int8", hardware="4xL40", mig_profile="",
                                   cache_dram_bytes=5, cache_disk_bytes=7,
                                   serving_mode=common_pb2.SERVING_MODE_SPEC_DECODE, workload="sharegpt")
    assert config_key(cfg) == "llama3-70b:int8@4xL40|dram=5|disk=7|mode=spec_decode|workload=sharegpt"
