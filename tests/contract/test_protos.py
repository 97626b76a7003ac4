"""The contract: generated stubs are fresh, buf lint is clean, and the API follows its own conventions."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from packaging.requirements import Requirement
from packaging.version import Version

from greenserve.v1 import (
    cache_manager_pb2,
    common_pb2,
    forecaster_pb2,
    gpu_partitioner_pb2,
    optimizer_pb2,
    profiler_pb2,
    router_pb2,
)

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ROOT / "protos"
MODULES = [common_pb2, forecaster_pb2, profiler_pb2, optimizer_pb2, cache_manager_pb2, gpu_partitioner_pb2, router_pb2]


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    fresh = tmp_path / "greenserve" / "v1"
    checked_in = ROOT / "services" / "v1"
    fresh_files = {p.name: p.read_bytes() for p in fresh.iterdir()}
    current_files = {p.name: p.read_bytes() for p in checked_in.iterdir() if p.is_file()}
    assert set(fresh_files) == set(current_files), "stub files differ: run python scripts/gen_protos.py"
    stale = [name for name, data in fresh_files.items() if current_files[name] != data]
    assert not stale, f"stale generated code {stale}: run python scripts/gen_protos.py"


def _stamped_versions(pattern: str, glob: str) -> set[Version]:
    found = {Version(m.group(1)) for path in (ROOT / "services" / "v1").glob(glob)
             if (m := re.search(pattern, path.read_text(), re.MULTILINE))}
    assert found, f"no version stamp in services/v1/{glob}"
    return found


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]
    return {r.name: r for r in reqs}


def _lower_bound(req: Requirement) -> Version:
    bounds = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
    assert bounds, f"{req} has no lower bound"
    return max(bounds)


def test_stub_versions_agree_with_the_pins() -> None:
    """The stubs stamp the grpcio-tools and protobuf versions that made them and refuse older runtimes at import.

    So the generator is pinned to the version in the stubs (a new grpcio-tools release must not make them stale),
    and the runtime floors are at least those versions (an install at the floor must import them).
    """
    reqs = _requirements()
    (grpc_stamp,) = _stamped_versions(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'", "*_pb2_grpc.py")
    (protobuf_stamp,) = _stamped_versions(r"^# Protobuf Python Version: ([0-9.]+)", "*_pb2.py")
    tools = reqs["grpcio-tools"]
    assert [(s.operator, Version(s.version)) for s in tools.specifier] == [("==", grpc_stamp)], (
        f"pin grpcio-tools=={grpc_stamp} in the dev extra (the version the stubs were generated with), not {tools}")
    assert _lower_bound(reqs["grpcio"]) >= grpc_stamp, f"the stubs need grpcio>={grpc_stamp}"
    assert _lower_bound(reqs["protobuf"]) >= protobuf_stamp, f"the stubs need protobuf>={protobuf_stamp}"
    assert reqs["protobuf"].specifier.contains(str(protobuf_stamp))
    assert not reqs["protobuf"].specifier.contains(f"{protobuf_stamp.major + 1}.0"), (
        "protobuf's runtime refuses stubs from another major version: cap protobuf below the next major")


def _buf() -> list[str]:
    local = PROTOS / "node_modules" / ".bin" / "buf"
    if local.exists():
        return [str(local)]
    if shutil.which("buf"):
        return ["buf"]
    pytest.skip("buf not installed: run `npm ci --prefix protos` (the README's test command does)")


def test_buf_lint_is_clean() -> None:
    result = subprocess.run([*_buf(), "lint"], cwd=PROTOS, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_format_is_clean() -> None:
    result = subprocess.run([*_buf(), "format", "--diff", "--exit-code"], cwd=PROTOS, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_service_has_its_own_file_and_request_response_pairs() -> None:
    services = {name: module for module in MODULES for name in module.DESCRIPTOR.services_by_name}
    assert set(services) == {
        "ForecasterService", "ProfilerService", "OptimizerService", "CacheManagerService", "GpuPartitionerService",
        "RouterService",
    }
    for name, module in services.items():
        for method in module.DESCRIPTOR.services_by_name[name].methods:
            assert method.input_type.name == f"{method.name}Request"
            assert method.output_type.name == f"{method.name}Response"


def test_streaming_shapes_of_the_api() -> None:
    def method(module, service, name):
        return module.DESCRIPTOR.services_by_name[service].methods_by_name[name]

    generate = method(router_pb2, "RouterService", "Generate")
    assert generate.server_streaming and not generate.client_streaming
    assert method(optimizer_pb2, "OptimizerService", "WatchPlans").server_streaming
    assert method(profiler_pb2, "ProfilerService", "WatchSweep").server_streaming
    assert method(forecaster_pb2, "ForecasterService", "StreamLoad").client_streaming


def test_plan_and_forecast_carry_versions_windows_and_intervals() -> None:
    plan = common_pb2.Plan.DESCRIPTOR.fields_by_name
    assert {"version", "valid_from", "valid_until", "intervals", "expected_carbon", "explanation"} <= set(plan)
    point = common_pb2.ForecastPoint.DESCRIPTOR.fields_by_name
    assert {"mean", "lower", "upper"} <= set(point)


def test_numeric_fields_name_their_unit() -> None:
    """Every float/double field ends in a unit suffix (or is a dimensionless fraction/weight/score)."""
    suffixes = ("_s", "_g", "_kwh", "_w", "_j", "_bytes", "_per_s", "_g_per_kwh", "_g_per_tb", "_fraction", "_percent")
    # Ratios and values whose unit is given by their series; sampling knobs of the OpenAI API.
    dimensionless = {"weight", "pue", "mean", "lower", "upper", "value", "lcs_score", "mean_batch_size", "temperature",
                     "top_p"}
    offenders = []
    for module in MODULES:
        file_proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(file_proto)

        def walk(messages, prefix="", file_proto=file_proto):
            for msg in messages:
                for field in msg.field:
                    if field.type in (field.TYPE_DOUBLE, field.TYPE_FLOAT):
                        if not field.name.endswith(suffixes) and field.name not in dimensionless:
                            offenders.append(f"{file_proto.name}:{prefix}{msg.name}.{field.name}")
                walk(msg.nested_type, f"{prefix}{msg.name}.")

        walk(file_proto.message_type)
    assert not offenders, f"double fields without a unit in their name: {offenders}"
