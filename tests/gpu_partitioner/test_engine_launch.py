"""Engine launchers: the exact `vllm serve` command and environment, the emulator's profile choice, the flags."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from greenserve.common.engine_launch import (
    EmulatorLauncher,
    EngineSpec,
    VllmLauncher,
    closest_profile,
    make_launcher,
    mig_hardware,
    parse_lmcache_servers,
    parse_port_range,
)
from greenserve.v1 import common_pb2

KNOWN = ["llama2-7b@A100-40GB", "llama3-8b@A100-80GB", "llama3-8b@A100-80GB-MIG-3g.40gb", "llama3-8b@H100-80GB",
         "llama3-8b@H100-80GB-MIG-3g.40gb", "llama3.2-1b@A100-40GB"]


def _spec(**overrides: object) -> EngineSpec:
    values: dict[str, object] = dict(
        engine_id="node-a-1234", pool="chat", served_model="meta-llama/Meta-Llama-3-8B-Instruct", variant="8b-fp8",
        model="neuralmagic/Meta-Llama-3-8B-Instruct-FP8", simulator_model="llama3-8b",
        vllm_args=("--quantization", "fp8"), gpu_uuid="GPU-1", mig_uuid="MIG-aaaa-bbbb",
        hardware="A100-80GB-MIG-3g.40gb", host="10.0.0.5", port=8101)
    values.update(overrides)
    return EngineSpec(**values)  # type: ignore[arg-type]


def test_vllm_command_serves_the_variant_under_the_pool_model_on_the_mig_device() -> None:
    cmd = VllmLauncher(gpu_memory_utilization=0.85, max_model_len=8192).command(_spec())
    assert cmd.argv == (
        "vllm", "serve", "neuralmagic/Meta-Llama-3-8B-Instruct-FP8", "--host", "10.0.0.5", "--port", "8101",
        "--served-model-name", "meta-llama/Meta-Llama-3-8B-Instruct", "--gpu-memory-utilization", "0.85",
        "--max-model-len", "8192", "--quantization", "fp8")
    assert cmd.env == {"CUDA_VISIBLE_DEVICES": "MIG-aaaa-bbbb"}
    assert cmd.health_path == "/health"


def test_vllm_command_without_a_device_inherits_cuda_visible_devices() -> None:
    """An empty CUDA_VISIBLE_DEVICES hides every GPU: an engine with no device named (the profiler's default) gets
    none in its environment, so it inherits the parent's; a whole GPU's UUID is passed like a MIG one."""
    assert "CUDA_VISIBLE_DEVICES" not in VllmLauncher().command(_spec(mig_uuid="", gpu_uuid="")).env
    assert VllmLauncher().command(_spec(mig_uuid="", gpu_uuid="GPU-1")).env == {"CUDA_VISIBLE_DEVICES": "GPU-1"}


def test_vllm_command_with_lmcache_uses_the_multiprocess_connector() -> None:
    cmd = VllmLauncher().command(_spec(lmcache_url="tcp://10.0.0.9:5555", vllm_args=()))
    assert "--max-model-len" not in cmd.argv  # 0: the model's own
    i = cmd.argv.index("--kv-transfer-config")
    assert json.loads(cmd.argv[i + 1]) == {
        "kv_connector": "LMCacheMPConnector",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"lmcache.mp.host": "tcp://10.0.0.9", "lmcache.mp.port": 5555}}
    assert cmd.argv[cmd.argv.index("--gpu-memory-utilization") + 1] == "0.9"


def test_emulator_command_and_profile_choice() -> None:
    launcher = EmulatorLauncher(time_scale=4.0, argv0=["greenserve-engine-sim"], known_profiles=KNOWN)
    cmd = launcher.command(_spec())
    assert cmd.argv == ("greenserve-engine-sim", "--host", "10.0.0.5", "--port", "8101", "--model",
                        "meta-llama/Meta-Llama-3-8B-Instruct", "--time-scale", "4", "--enable-sleep-mode", "--profile",
                        "llama3-8b@A100-80GB-MIG-3g.40gb")
    assert cmd.note == "" and cmd.env == {"CUDA_VISIBLE_DEVICES": "MIG-aaaa-bbbb"}
    # an A100-40GB 3g: no such profile; the same family's 3g is closest (same slice count)
    profile, note = closest_profile("llama3-8b", mig_hardware("A100-40GB", "3g.20gb"), KNOWN)
    assert profile == "llama3-8b@A100-80GB-MIG-3g.40gb" and "closest" in note
    # an H100 7g: the whole H100 beats an H100 3g and any A100
    assert closest_profile("llama3-8b", "H100-80GB-MIG-7g.80gb", KNOWN)[0] == "llama3-8b@H100-80GB"
    # a model the simulator does not know: the emulator's default profile, said in the note
    cmd = launcher.command(_spec(simulator_model="mistral-7b"))
    assert "--profile" not in cmd.argv and "mistral-7b" in cmd.note


def test_emulator_profiles_are_the_simulators() -> None:
    """The launcher's list is what `greenserve-engine-sim --list-profiles` prints."""
    listed = subprocess.run([sys.executable, "-m", "greenserve.simulator.emulator", "--list-profiles"],
                            capture_output=True, text=True, check=True, timeout=60).stdout.split()
    launcher = make_launcher("emulator")
    assert isinstance(launcher, EmulatorLauncher) and sorted(launcher.known_profiles) == sorted(listed)
    assert launcher.kind == common_pb2.ENGINE_KIND_SIMULATED
    assert make_launcher("none") is None


def test_flag_parsers_name_the_flag() -> None:
    assert parse_port_range("8100-8199") == (8100, 8199)
    assert parse_lmcache_servers("chat=tcp://10.0.0.5:5555, code=tcp://cache:5556") == {
        "chat": "tcp://10.0.0.5:5555", "code": "tcp://cache:5556"}
    for bad in ("8100", "9000-8000", "0-10", "1-70000"):
        with pytest.raises(ValueError, match="engine_port_range"):
            parse_port_range(bad)
    for bad in ("chat", "chat=http://x:1", "=tcp://x:1", "chat=tcp://x"):
        with pytest.raises(ValueError, match="engine_lmcache_servers"):
            parse_lmcache_servers(bad)


def test_bad_engine_flags_exit_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from greenserve.common.config import load_settings
    from greenserve.gpu_partitioner.service import GpuPartitionerSettings

    for flag in ("--engine-port-range=9-1", "--engine-launcher=docker", "--engine-lmcache-servers=chat"):
        with pytest.raises(SystemExit) as exited:
            load_settings(GpuPartitionerSettings, [flag], prog="greenserve-gpu-partitioner")
        assert exited.value.code == 2
        assert flag.split("=")[0] in capsys.readouterr().err
