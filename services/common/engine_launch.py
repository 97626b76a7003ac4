"""Engines on MIG instances: how the gpu-partitioner starts, watches and stops them.

Two launchers build the command of one engine behind one small interface (`EngineLauncher`):

* `VllmLauncher`: ``vllm serve <variant model> --host H --port P --served-model-name <pool model>`` with
  ``--gpu-memory-utilization``, optionally ``--max-model-len``, LMCache's multiprocess KV connector
  (``--kv-transfer-config`` with ``LMCacheMPConnector``) when the pool has an LMCache server, then the
  variant's own ``vllm_args`` (last, so a variant can override a default); environment
  ``CUDA_VISIBLE_DEVICES=<MIG device UUID>``. Health is vLLM's ``GET /health`` (200 when the engine runs).
  Serving modes (GreenLLM; the plan's ``ServingModeTarget`` with the pool's ``draft``): SpecDecode adds
  ``--speculative-config '{"method":"draft_model","model":<draft>,"num_speculative_tokens":k}'`` (vLLM's
  draft-model speculation: a vLLM recent enough to have it, see docs/gpu_partitioner.md). DPD is a pair of
  engines (``EngineSpec.pd_role``): the prefiller on the MIG instance and the decoder on a whole older GPU of the
  node, each with LMCache's in-process connector (``--kv-transfer-config`` with ``LMCacheConnectorV1``,
  ``kv_producer`` / ``kv_consumer``, the ``kv_connector_extra_config`` of LMCache's disaggregated-prefill example)
  and LMCache's PD settings as ``LMCACHE_*`` variables (``pd_settings``: NIXL channel, sender / receiver, the
  receiver's host and init/alloc ports, buffers), behind the router's proxy (``router/upstream/disaggregated.py``).
  A DPD engine without a role and DSD are refused (vLLM has no disaggregated speculative decoding: GreenLLM's
  is its own plug-in).
* `EmulatorLauncher`: ``greenserve-engine-sim --port P --model <served name> --profile <sim model>@<hardware>
  --time-scale X`` where the hardware is the MIG instance's (``A100-80GB-MIG-3g.40gb``); when the simulator
  has no profile of that name, the closest one of the same model (same GPU, then same GPU family, then the
  closest slice count) is used and the note says so. A serving mode adds ``--mode`` with the draft's profile
  (SpecDecode on the instance's hardware, DSD on the older GPU) or the decode GPU's (DPD), the acceptance rate,
  the speculative tokens and the link: the emulated engine runs all four modes from the performance model. A DPD
  pair runs as two emulated engines (``--mode dpd --pd-role prefill`` on the instance's profile, ``--pd-role
  decode`` on the older GPU's, with the link), as vLLM's pair does.

`EngineSupervisor` owns the processes: each engine is a child in its own session (process group), stopped
with SIGTERM to the group and SIGKILL after a grace period; `stop_all` runs when the service stops, so a
stopped gpu-partitioner leaves no engine behind. An engine that exited on its own is seen by `exited()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

from greenserve.common.parent_death import dies_with_parent
from greenserve.v1 import common_pb2

log = logging.getLogger("greenserve.gpu_partitioner.engines")

EMULATOR_SCRIPT = "greenserve-engine-sim"
VLLM_HEALTH_PATH = "/health"
LMCACHE_MP_CONNECTOR = "LMCacheMPConnector"
LMCACHE_MP_MODULE = "lmcache.integration.vllm.lmcache_mp_connector"
LMCACHE_V1_CONNECTOR = "LMCacheConnectorV1"  # in-process connector; its PD mode transfers KV prefiller -> decoder


@dataclass(frozen=True)
class EngineSpec:
    """What to run on one MIG instance (everything a launcher needs, nothing about the process)."""

    engine_id: str
    pool: str
    served_model: str  # the pool's model: what clients send and the router matches
    variant: str  # variant name ("" for the pool's default)
    model: str  # what `vllm serve` loads (the variant's model, else the pool's)
    simulator_model: str  # the variant's performance-model name ("" when none)
    vllm_args: tuple[str, ...]
    gpu_uuid: str
    mig_uuid: str
    hardware: str  # "A100-80GB-MIG-3g.40gb"
    host: str
    port: int
    lmcache_url: str = ""  # "tcp://host:port" of the pool's LMCache server (multiprocess mode), "" for none
    idle_power_w: float = 0.0
    busy_power_w: float = 0.0
    # serving mode (common_pb2.ServingMode; 0 and STANDALONE: standalone) and what it needs
    serving_mode: int = 0
    draft_model: str = ""  # the pool's draft (what vLLM's speculative config loads)
    draft_simulator_model: str = ""
    num_speculative_tokens: int = 3
    acceptance_fraction: float = 0.0  # accepted / proposed (the emulator paces by it)
    old_hardware: str = ""  # the older GPU of DPD / DSD ("T4")
    link_bandwidth_bytes_per_s: float = 0.0
    # DPD as a pair of engines: "prefill" (on the MIG instance) or "decode" (on the whole older GPU ``gpu_uuid``,
    # ``mig_uuid`` empty); the receiver's host and NIXL init/alloc ports (LMCache PD), the same in both specs
    pd_role: str = ""
    pd_peer_host: str = ""
    pd_init_port: int = 0
    pd_alloc_port: int = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def mode(self) -> str:
        return mode_name(self.serving_mode)

    @property
    def device(self) -> str:
        """What ``CUDA_VISIBLE_DEVICES`` names: the MIG device, else the whole GPU (a DPD decoder)."""
        return self.mig_uuid or self.gpu_uuid

    @property
    def role(self) -> tuple[str, str, str]:
        """(pool, variant, mode): an engine is replaced when its role on the instance changes."""
        return self.pool, self.variant, self.mode


MODE_NAMES: dict[int, str] = {
    common_pb2.SERVING_MODE_UNSPECIFIED: "standalone", common_pb2.SERVING_MODE_STANDALONE: "standalone",
    common_pb2.SERVING_MODE_SPEC_DECODE: "spec_decode", common_pb2.SERVING_MODE_DISAGGREGATED: "dpd",
    common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE: "dsd"}


def decoder_id(prefill_engine_id: str) -> str:
    """The supervisor's id of a DPD pair's decoder (the router knows the pair by the prefiller's id only)."""
    return f"{prefill_engine_id}/decode"


def mode_name(serving_mode: int) -> str:
    """The emulator's name of a ``common_pb2.ServingMode`` ("standalone", "spec_decode", "dpd", "dsd")."""
    return MODE_NAMES.get(serving_mode, "standalone")


@dataclass(frozen=True)
class LaunchCommand:
    """argv, the environment variables added to the service's, and the health path."""

    argv: tuple[str, ...]
    env: dict[str, str]
    health_path: str
    note: str = ""  # e.g. the emulator profile fallback


class EngineLauncher(Protocol):
    """Builds the command of one engine."""

    name: str  # "vllm" or "emulator"
    kind: common_pb2.EngineKind

    def command(self, spec: EngineSpec) -> LaunchCommand:
        """The command that runs `spec` (ValueError when it cannot be run)."""

    def mode_problem(self, target: common_pb2.ServingModeTarget, pool: common_pb2.Pool, lmcache_url: str = "") -> str:
        """Why this launcher's engines cannot run the pool in ``target``'s mode ("" when they can), the pool's
        LMCache server being ``lmcache_url`` ("" for none): checked before an engine is stopped for the mode
        change, so a mode they cannot run leaves the running ones be."""


def mig_hardware(gpu_model: str, mig_profile: str) -> str:
    """Hardware name of a MIG instance as profiles name it: "A100-80GB" + "3g.40gb" -> "A100-80GB-MIG-3g.40gb"."""
    return f"{gpu_model}-MIG-{mig_profile}"


def parse_lmcache_servers(text: str) -> dict[str, str]:
    """"chat=tcp://10.0.0.5:5555,code=tcp://10.0.0.6:5555" -> {pool: url}; ValueError naming the bad entry."""
    out: dict[str, str] = {}
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        pool, sep, url = item.partition("=")
        if not sep or not pool.strip() or not re.fullmatch(r"tcp://[^:/\s]+:\d{1,5}", url.strip()):
            raise ValueError(f"engine_lmcache_servers: {item!r} is not POOL=tcp://HOST:PORT")
        out[pool.strip()] = url.strip()
    return out


def parse_port_range(text: str) -> tuple[int, int]:
    """"8100-8199" -> (8100, 8199); ValueError when it is not LOW-HIGH within 1..65535."""
    match = re.fullmatch(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*", text)
    if not match:
        raise ValueError(f"engine_port_range: expected LOW-HIGH, got {text!r}")
    low, high = int(match.group(1)), int(match.group(2))
    if not 1 <= low <= high <= 65535:
        raise ValueError(f"engine_port_range: need 1 <= LOW <= HIGH <= 65535, got {text!r}")
    return low, high


class VllmLauncher:
    """``vllm serve`` on one MIG instance (flags per vLLM's engine and frontend arguments)."""

    name = "vllm"
    kind = common_pb2.ENGINE_KIND_VLLM

    def __init__(self, *, executable: str = "vllm", gpu_memory_utilization: float = 0.9,
                 max_model_len: int = 0) -> None:
        self.executable = executable
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len

    def mode_problem(self, target: common_pb2.ServingModeTarget, pool: common_pb2.Pool, lmcache_url: str = "") -> str:
        mode = target.serving_mode
        if mode == common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE:
            return "vLLM has no disaggregated speculative decoding (GreenLLM's DSD is its own plug-in)"
        if mode == common_pb2.SERVING_MODE_SPEC_DECODE and not (pool.HasField("draft") and pool.draft.model):
            return "vLLM's speculative decoding needs the pool's draft model (fleet.pools[].draft.model)"
        if mode == common_pb2.SERVING_MODE_DISAGGREGATED and lmcache_url:
            return ("the pool has an LMCache server (--engine-lmcache-servers) and vLLM takes one KV connector per "
                    "engine: DPD's KV transfer cannot run beside it")
        return ""

    def command(self, spec: EngineSpec) -> LaunchCommand:
        if not spec.model:
            raise ValueError(f"engine {spec.engine_id}: no model to serve (pool {spec.pool!r})")
        argv = [self.executable, "serve", spec.model, "--host", spec.host, "--port", str(spec.port),
                "--served-model-name", spec.served_model,
                "--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}"]
        if self.max_model_len > 0:
            argv += ["--max-model-len", str(self.max_model_len)]
        if spec.mode == "dpd" and spec.pd_role:
            return self._pd_command(spec, argv)
        if spec.mode in ("dpd", "dsd"):
            raise ValueError(
                f"engine {spec.engine_id}: mode {spec.mode} needs an engine on the older GPU "
                f"({spec.old_hardware or '?'})"
                + (" and the router's proxy: the gpu-partitioner starts it as a prefill/decode pair "
                   "(EngineSpec.pd_role), not as one engine" if spec.mode == "dpd" else
                   ": vLLM has no disaggregated speculative decoding (GreenLLM's DSD is its own plug-in)"))
        if spec.mode == "spec_decode":
            if not spec.draft_model:
                raise ValueError(f"engine {spec.engine_id}: mode spec_decode needs the pool's draft model "
                                 f"(fleet.pools[].draft.model)")
            argv += ["--speculative-config", json.dumps({
                "method": "draft_model", "model": spec.draft_model,
                "num_speculative_tokens": spec.num_speculative_tokens}, separators=(",", ":"))]
        if spec.lmcache_url:
            host, _, port = spec.lmcache_url.rpartition(":")
            argv += ["--kv-transfer-config", json.dumps({
                "kv_connector": LMCACHE_MP_CONNECTOR,
                "kv_connector_module_path": LMCACHE_MP_MODULE,
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"lmcache.mp.host": host, "lmcache.mp.port": int(port)},
            }, separators=(",", ":"))]
        argv += list(spec.vllm_args)
        # an empty CUDA_VISIBLE_DEVICES hides every GPU from CUDA (vLLM then finds none): with no device named
        # (the profiler's default) the engine inherits this process's variable instead
        env = {"CUDA_VISIBLE_DEVICES": spec.device} if spec.device else {}
        return LaunchCommand(argv=tuple(argv), env=env, health_path=VLLM_HEALTH_PATH)

    def _pd_command(self, spec: EngineSpec, argv: list[str]) -> LaunchCommand:
        """One engine of a DPD pair: LMCache's in-process connector in its role, its PD settings in the
        environment (LMCache reads ``LMCACHE_<KEY>`` as the config file's ``<key>``)."""
        if spec.pd_role not in ("prefill", "decode"):
            raise ValueError(f"engine {spec.engine_id}: pd_role must be prefill or decode, got {spec.pd_role!r}")
        if not spec.device:
            raise ValueError(f"engine {spec.engine_id}: the {spec.pd_role} engine of a DPD pair names no GPU")
        if spec.lmcache_url:  # one KV connector per engine: the pair's transfer replaces the shared cache
            raise ValueError(f"engine {spec.engine_id}: pool {spec.pool!r} has an LMCache server "
                             "(--engine-lmcache-servers) and mode dpd: vLLM takes one KV connector per engine")
        prefill = spec.pd_role == "prefill"
        extra: dict[str, object] = {"discard_partial_chunks": False,
                                    "lmcache_rpc_port": f"{'producer' if prefill else 'consumer'}-{spec.engine_id}"}
        if not prefill:
            extra["skip_last_n_tokens"] = 1
        argv += ["--kv-transfer-config", json.dumps({
            "kv_connector": LMCACHE_V1_CONNECTOR, "kv_role": "kv_producer" if prefill else "kv_consumer",
            "kv_connector_extra_config": extra}, separators=(",", ":"))]
        argv += list(spec.vllm_args)
        return LaunchCommand(argv=tuple(argv), env={"CUDA_VISIBLE_DEVICES": spec.device, **pd_settings(spec)},
                             health_path=VLLM_HEALTH_PATH)


PD_BUFFER_BYTES = {"prefill": 1 << 30, "decode": 2 << 30}  # LMCache's 1P1D example: 1 GiB sender, 2 GiB receiver


def pd_settings(spec: EngineSpec) -> dict[str, str]:
    """LMCache's PD configuration of one engine of a DPD pair (LMCache's disaggregated-prefill example, in-process
    mode: ``enable_pd``, ``transfer_channel`` nixl, ``pd_role`` sender / receiver, the receiver's
    ``pd_peer_host`` / ``pd_peer_init_port`` / ``pd_peer_alloc_port``, ``pd_buffer_size`` / ``pd_buffer_device``,
    no local CPU cache; the sender skips the ZMQ notification of LMCache's own proxy, ``pd_skip_proxy_notification``,
    since the router waits for the HTTP answer) as environment variables; ``PYTHONHASHSEED`` 0 in both, as LMCache requires for matching
    KV keys across processes. ``pd_backend_mode`` is ``sync`` in both: LMCache 0.5.6's default, ``async``
    (``storage_backend/pd_backend_async.py``), asserts ``pd_proxy_host`` / ``pd_proxy_port`` on the sender and has no
    ``pd_skip_proxy_notification``, so the prefiller would fail at start; only the sync backend (``pd_backend.py``)
    honours the skip, and the receiver runs the same backend as its sender."""
    if not (spec.pd_peer_host and spec.pd_init_port and spec.pd_alloc_port):
        raise ValueError(f"engine {spec.engine_id}: a DPD pair needs the decoder's host and NIXL init/alloc ports")
    env = {"PYTHONHASHSEED": "0", "LMCACHE_LOCAL_CPU": "False", "LMCACHE_MAX_LOCAL_CPU_SIZE": "0",
           "LMCACHE_ENABLE_PD": "True", "LMCACHE_TRANSFER_CHANNEL": "nixl", "LMCACHE_PD_BACKEND_MODE": "sync",
           "LMCACHE_PD_ROLE": "sender" if spec.pd_role == "prefill" else "receiver",
           "LMCACHE_PD_BUFFER_SIZE": str(PD_BUFFER_BYTES[spec.pd_role]), "LMCACHE_PD_BUFFER_DEVICE": "cuda"}
    if spec.pd_role == "decode":
        env.update({"LMCACHE_PD_PEER_HOST": spec.pd_peer_host, "LMCACHE_PD_PEER_INIT_PORT": str(spec.pd_init_port),
                    "LMCACHE_PD_PEER_ALLOC_PORT": str(spec.pd_alloc_port)})
    else:  # the router's HTTP answer is the "KV sent" signal: no ZMQ message to a proxy (LMCache's setting for
        env["LMCACHE_PD_SKIP_PROXY_NOTIFICATION"] = "True"  # orchestrators that run the PD flow over HTTP)
    return env


def pd_kv_transfer_params(spec: EngineSpec) -> str:
    """What the router adds to each prefill request of the pair (``Engine.prefill_kv_transfer_params``): LMCache's
    ``disagg_spec`` naming the decoder's host and NIXL ports (the router adds ``req_id``)."""
    return json.dumps({"disagg_spec": {"receiver_host": spec.pd_peer_host, "receiver_init_port": [spec.pd_init_port],
                                       "receiver_alloc_port": [spec.pd_alloc_port]}}, separators=(",", ":"))


def _hardware_parts(hardware: str) -> tuple[str, int]:
    """"A100-80GB-MIG-3g.40gb" -> ("A100-80GB", 3); "H100-80GB" -> ("H100-80GB", 7); "4xL40" -> ("4xL40", 7)."""
    base, sep, mig = hardware.partition("-MIG-")
    if not sep:
        return hardware, 7
    match = re.match(r"(\d+)g\.", mig)
    return base, int(match.group(1)) if match else 7


def closest_profile(simulator_model: str, hardware: str, known: Sequence[str]) -> tuple[str | None, str]:
    """The simulator profile for `simulator_model` on `hardware`, or the closest known one, with a note.

    Closest: same model, then the same GPU (A100-80GB), then the same family (A100), then the nearest number
    of compute slices (a whole GPU counts 7). None when the simulator knows no profile of the model."""
    wanted = f"{simulator_model}@{hardware}"
    if wanted in known:
        return wanted, ""
    same_model = [k for k in known if k.partition("@")[0] == simulator_model]
    if not simulator_model or not same_model:
        what = f"no simulator profile for model {simulator_model!r}" if simulator_model else \
            "the variant names no simulator model"
        return None, f"{what}; the emulator's default profile is used"
    base, slices = _hardware_parts(hardware)
    family = base.split("-")[0]

    def score(name: str) -> tuple[int, int, int, str]:
        cand_base, cand_slices = _hardware_parts(name.partition("@")[2])
        return (0 if cand_base == base else 1, 0 if cand_base.split("-")[0] == family else 1,
                abs(cand_slices - slices), name)

    best = min(same_model, key=score)
    return best, f"no simulator profile {wanted!r}; using the closest known one, {best!r}"


def _emulator_argv0() -> list[str]:
    """The emulator's console script beside this interpreter, else on PATH, else ``python -m``."""
    beside = Path(sys.executable).parent / EMULATOR_SCRIPT
    if beside.exists():
        return [str(beside)]
    found = shutil.which(EMULATOR_SCRIPT)
    return [found] if found else [sys.executable, "-m", "greenserve.simulator.emulator"]


class EmulatorLauncher:
    """``greenserve-engine-sim`` with the variant's performance profile on the instance's hardware."""

    name = "emulator"
    kind = common_pb2.ENGINE_KIND_SIMULATED

    def __init__(self, *, time_scale: float = 1.0, argv0: Sequence[str] | None = None,
                 known_profiles: Sequence[str] | None = None) -> None:
        self.time_scale = time_scale
        self.argv0 = list(argv0) if argv0 is not None else _emulator_argv0()
        if known_profiles is None:
            from greenserve.simulator.engine_profile import list_profiles

            known_profiles = list_profiles()
        self.known_profiles = list(known_profiles)

    def mode_problem(self, target: common_pb2.ServingModeTarget, pool: common_pb2.Pool, lmcache_url: str = "") -> str:
        mode = target.serving_mode
        speculative = (common_pb2.SERVING_MODE_SPEC_DECODE, common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE)
        if mode in speculative and not (pool.HasField("draft") and pool.draft.simulator_model):
            return ("the emulator's speculative modes need the draft's simulator model "
                    "(fleet.pools[].draft.simulator_model)")
        if mode == common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE and not target.old_hardware:
            return "DSD names no older GPU for the draft (old_hardware)"
        return ""

    def command(self, spec: EngineSpec) -> LaunchCommand:
        profile, note = closest_profile(spec.simulator_model, spec.hardware, self.known_profiles)
        # sleep mode on, so that the router can put the engine to sleep when the plan says (engine_runs; vLLM engines
        # get it from the variant's vllm_args: --enable-sleep-mode, CUDA only)
        argv = [*self.argv0, "--host", spec.host, "--port", str(spec.port), "--model", spec.served_model,
                "--time-scale", f"{self.time_scale:g}", "--enable-sleep-mode"]
        if profile is not None:
            argv += ["--profile", profile]
        notes = [note] if note else []
        if spec.mode == "dpd" and spec.pd_role:
            if spec.pd_role not in ("prefill", "decode"):
                raise ValueError(f"engine {spec.engine_id}: pd_role must be prefill or decode, got {spec.pd_role!r}")
            argv += ["--mode", "dpd", "--pd-role", spec.pd_role]
            if spec.link_bandwidth_bytes_per_s > 0:
                argv += ["--link-bandwidth-bytes-per-s", f"{spec.link_bandwidth_bytes_per_s:g}"]
        elif spec.mode != "standalone":
            argv += self._mode_args(spec, notes)
        return LaunchCommand(argv=tuple(argv), env={"CUDA_VISIBLE_DEVICES": spec.device},
                             health_path=VLLM_HEALTH_PATH, note="; ".join(notes))

    def _mode_args(self, spec: EngineSpec, notes: list[str]) -> list[str]:
        """``--mode`` and the profiles it needs: the draft on this instance (spec_decode) or on the older GPU (dsd),
        the target on the older GPU (dpd)."""
        if spec.mode in ("dpd", "dsd") and not spec.old_hardware:
            raise ValueError(f"engine {spec.engine_id}: mode {spec.mode} names no older GPU (old_hardware)")
        if spec.mode in ("spec_decode", "dsd"):
            model, hardware, flag = spec.draft_simulator_model, \
                spec.hardware if spec.mode == "spec_decode" else spec.old_hardware, "--draft-profile"
            if not model:
                raise ValueError(f"engine {spec.engine_id}: mode {spec.mode} needs the draft's simulator model "
                                 f"(fleet.pools[].draft.simulator_model)")
        else:
            model, hardware, flag = spec.simulator_model, spec.old_hardware, "--decode-profile"
        profile, note = closest_profile(model, hardware, self.known_profiles)
        if profile is None:
            raise ValueError(f"engine {spec.engine_id}: mode {spec.mode}: {note}")
        if note:
            notes.append(note)
        args = ["--mode", spec.mode, flag, profile, "--num-speculative-tokens", str(spec.num_speculative_tokens)]
        if spec.acceptance_fraction > 0:
            args += ["--spec-acceptance", f"{spec.acceptance_fraction:g}"]
        if spec.link_bandwidth_bytes_per_s > 0:
            args += ["--link-bandwidth-bytes-per-s", f"{spec.link_bandwidth_bytes_per_s:g}"]
        return args


@dataclass
class EngineProcess:
    """One running engine: its spec, command and child process."""

    spec: EngineSpec
    command: LaunchCommand
    process: asyncio.subprocess.Process
    log_path: Path | None
    kind: common_pb2.EngineKind
    reported_exit: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode


class EngineStartError(RuntimeError):
    """An engine did not become healthy (exited, or its health check timed out)."""


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class EngineSupervisor:
    """Starts, health-checks and stops the engine processes of this gpu-partitioner."""

    launcher: EngineLauncher
    host: str = "127.0.0.1"
    port_range: tuple[int, int] = (8100, 8199)
    log_dir: Path | None = None
    stop_grace_s: float = 10.0
    engines: dict[str, EngineProcess] = field(default_factory=dict)  # by engine id

    def by_mig_uuid(self) -> dict[str, EngineProcess]:
        """Engines on MIG instances (a DPD pair by its prefiller; its decoder is ``decoder_of``)."""
        return {e.spec.mig_uuid: e for e in self.engines.values() if e.spec.mig_uuid}

    def decoder_of(self, engine_id: str) -> EngineProcess | None:
        """The decoder of the DPD pair whose prefiller is ``engine_id`` (None when it has none)."""
        return self.engines.get(decoder_id(engine_id))

    def next_port(self, also_taken: Sequence[int] = ()) -> int:
        """The lowest port of the range that no engine of ours uses and that can be bound now."""
        taken = {p for e in self.engines.values() for p in (e.spec.port, e.spec.pd_init_port, e.spec.pd_alloc_port)}
        taken |= set(also_taken)
        low, high = self.port_range
        for port in range(low, high + 1):
            if port not in taken and _port_free(self.host, port):
                return port
        raise EngineStartError(f"no free port in {low}-{high} on {self.host}")

    def exited(self) -> list[EngineProcess]:
        """Engines whose process ended without being stopped by us (each returned once)."""
        out = []
        for engine in self.engines.values():
            if engine.returncode is not None and not engine.reported_exit:
                engine.reported_exit = True
                out.append(engine)
        return out

    async def start(self, spec: EngineSpec) -> EngineProcess:
        """Spawns the engine in its own process group (not waited for: see `wait_healthy`). Its own session keeps
        the supervisor's signals from it, so it is asked for SIGTERM when the supervisor dies (PR_SET_PDEATHSIG):
        else it outlives a supervisor killed with kill -9. Call from the event loop's thread (``parent_death``)."""
        command = self.launcher.command(spec)
        if command.note:
            log.warning("engine %s: %s", spec.engine_id, command.note)
        log_path = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.log_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', spec.engine_id)}.log"
        env = {**os.environ, **command.env}
        argv = dies_with_parent(command.argv, signal.SIGTERM, env)
        if log_path is not None:
            with open(log_path, "ab") as log_file:
                process = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=asyncio.subprocess.STDOUT,
                    env=env, start_new_session=True)
        else:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                env=env, start_new_session=True)
        engine = EngineProcess(spec, command, process, log_path, self.launcher.kind)
        self.engines[spec.engine_id] = engine
        log.info("engine %s started (pid %d): %s", spec.engine_id, process.pid, " ".join(command.argv))
        return engine

    async def wait_healthy(self, engine: EngineProcess, timeout_s: float) -> None:
        """Polls the health URL until 200; EngineStartError when the process exits or the time is up."""
        url = engine.spec.url + engine.command.health_path
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                if engine.returncode is not None:
                    engine.reported_exit = True
                    where = f" (log {engine.log_path.name})" if engine.log_path else ""
                    raise EngineStartError(f"engine {engine.spec.engine_id} exited with code {engine.returncode} "
                                           f"during start-up{where}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        return
                if loop.time() > deadline:
                    raise EngineStartError(f"engine {engine.spec.engine_id} not healthy at {url} after {timeout_s:g} s")
                await asyncio.sleep(0.1)

    async def stop(self, engine_id: str) -> None:
        """SIGTERM to the engine's process group, SIGKILL after the grace period; forgets the engine."""
        engine = self.engines.pop(engine_id, None)
        if engine is None:
            return
        await self._terminate(engine)

    async def _terminate(self, engine: EngineProcess) -> None:
        pid = engine.pid
        if engine.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(engine.process.wait(), timeout=self.stop_grace_s)
            except TimeoutError:
                log.warning("engine %s ignored SIGTERM for %g s; killing it", engine.spec.engine_id, self.stop_grace_s)
        # the group may hold grandchildren (vLLM workers) even when the leader is gone
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        if engine.returncode is None:
            await engine.process.wait()
        log.info("engine %s stopped (exit %s)", engine.spec.engine_id, engine.returncode)

    async def stop_all(self) -> None:
        """Stops every engine (the service is stopping)."""
        engines = list(self.engines.values())
        self.engines.clear()
        await asyncio.gather(*(self._terminate(e) for e in engines), return_exceptions=True)


def make_launcher(name: str, *, time_scale: float = 1.0, gpu_memory_utilization: float = 0.9,
                  max_model_len: int = 0, vllm_executable: str = "vllm") -> EngineLauncher | None:
    """The launcher named by --engine-launcher ("none": no engines are started)."""
    if name == "vllm":
        return VllmLauncher(executable=vllm_executable, gpu_memory_utilization=gpu_memory_utilization,
                            max_model_len=max_model_len)
    if name == "emulator":
        return EmulatorLauncher(time_scale=time_scale)
    if name == "none":
        return None
    raise ValueError(f"engine_launcher: must be vllm, emulator or none, got {name!r}")
