"""`greenserve profile ...` against a real profiler process: import, list, show, sweep, plot; bad input exits 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests.conftest import free_port



@pytest.fixture(scope="module")
def profiler_addr(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("cli")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "greenserve.profiler", "--port", str(port), "--db-url",
                             f"sqlite:///{work / 'p.db'}", "--no-import-published", "--no-log-json"],
                            stdout=open(work / "log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OTEL_SDK_DISABLED": "true"})
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]):
    """The CLI's main() in this process (no interpreter start per call), its exit status and output."""
    from greenserve_client.commands import profile

    def call(addr: str, *args: str) -> Result:
        capsys.readouterr()
        try:
            code = profile.main([*args, "--profiler-addr", addr, "--timeout-s", "30"])
        except SystemExit as exc:  # argparse errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return call


def test_import_list_show(run, profiler_addr: str, tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('[[profiles]]\ncitation = "our lab, run 7"\n'
                    'config = { model = "llama3-8b", hardware = "2xL40", workload = "sharegpt" }\n'
                    'slo = { ttft_s = 0.2, tpot_s = 0.08, attainment_fraction = 0.9 }\n'
                    'points = [{ request_rate_per_s = 1.0, ttft_p50_s = 0.05, slo_attainment_fraction = 0.97, '
                    'tpot_mean_s = 0.03, mean_batch_size = 1.5 },\n'
                    '          { request_rate_per_s = 2.0, ttft_p50_s = 0.09, slo_attainment_fraction = 0.93, '
                    'tpot_mean_s = 0.032, mean_batch_size = 3.2 }]\n')
    out = run(profiler_addr, "import", str(path), "--source", "measured", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {"stored": ["llama3-8b@2xL40|workload=sharegpt@1"]}
    listed = run(profiler_addr, "list", "--source", "measured", "--json")
    profiles = json.loads(listed.stdout.splitlines()[-1])["profiles"]
    assert [p["config_key"] for p in profiles] == ["llama3-8b@2xL40|workload=sharegpt"]
    shown = run(profiler_addr, "show", "llama3-8b@2xL40|workload=sharegpt")
    assert shown.returncode == 0 and "our lab, run 7" in shown.stdout and "0.93" in shown.stdout
    calibrated = run(profiler_addr, "calibrate", "llama3-8b@2xL40|workload=sharegpt", "--json")
    assert calibrated.returncode == 0, calibrated.stderr
    version = json.loads(calibrated.stdout.splitlines()[-1])
    assert version["name"] == "llama3-8b@2xL40+cal1" and version["calibrated_from"].endswith("@1")
    missing = run(profiler_addr, "show", "nope@nothing")
    assert missing.returncode == 2 and "NOT_FOUND" in missing.stderr


def test_sweep_then_plot(run, profiler_addr: str, tmp_path: Path) -> None:
    out = run(profiler_addr, "sweep", "--model", "llama3-8b", "--hardware", "H100-80GB", "--cache-dram-gib", "0,2",
              "--rates", "1,4,16", "--workload", "sharegpt", "--ttft-slo-s", "0.2", "--tpot-slo-s", "0.08",
              "--duration-s", "30", "--json")
    assert out.returncode == 0, out.stderr
    sweep = json.loads(out.stdout.splitlines()[-1])
    assert sweep["state"] == "SWEEP_STATE_SUCCEEDED" and len(sweep["profile_ids"]) == 2
    assert "measured" in out.stderr  # the progress line
    png = tmp_path / "p.png"
    keys = [pid.rsplit("@", 1)[0] for pid in sweep["profile_ids"]]
    plotted = run(profiler_addr, "plot", *keys, "--out", str(png))
    assert plotted.returncode == 0, plotted.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("args", "needle"), [
    (["--rates", "1,x"], "--rates"),
    (["--rates", "2,-1"], "spec.request_rates_per_s[1]"),
    (["--rates", "1", "--workload", "nope"], "spec.workload"),
    (["--rates", "1", "--cache-dram-gib", "-4"], "--cache-dram-gib"),
])
def test_bad_sweep_input_exits_2_naming_it(run, profiler_addr: str, args: list[str], needle: str) -> None:
    base = ["sweep", "--model", "llama3-8b", "--hardware", "H100-80GB", "--workload", "poisson",
            "--ttft-slo-s", "1", "--tpot-slo-s", "0.1"]
    out = run(profiler_addr, *base, *args)
    assert out.returncode == 2 and needle in out.stderr, out.stderr


@pytest.mark.parametrize("action", ["show", "calibrate"])
@pytest.mark.parametrize("version", ["-1", "4294967296", "x"])
def test_bad_profile_version_exits_2_naming_it(run, profiler_addr: str, action: str, version: str) -> None:
    # versions are uint32 on the wire: one past it used to end in a ValueError traceback
    out = run(profiler_addr, action, "some-key", f"--version={version}")
    assert out.returncode == 2 and "--version" in out.stderr, out.stderr
