"""Start, health-check and stop real vLLM OpenAI servers (vLLM's CPU build) on the tiny local model.

The interpreter is the one of vLLM's own virtualenv: ``$GREENSERVE_VLLM_VENV`` or ``<repo>/.venv-vllm``, made by
``scripts/install-vllm.sh``, whose stamp file says the install finished (``unavailable_reason`` names what is
missing). The model is made on first use by ``tiny_model.py`` run with that interpreter.

One engine is ``python -m vllm.entrypoints.openai.api_server`` with the flags of ``serve_args``: float32 (the CPU
build's fastest dtype for a model this small), ``--enforce-eager`` (no torch.compile: seconds instead of minutes),
prefix caching on, a 2048-token context, and ``VLLM_CPU_KVCACHE_SPACE=1`` (1 GiB of KV cache; the CPU build's default
is 4 GiB per engine).

Start-up time: what dominates an engine's start is not the model (loaded in 0.02 s, KV cache and warm-up in 1-3 s)
but three Python interpreters importing torch and vLLM one after the other: the API server, the EngineCore it spawns,
and the worker process the CPU build's multiprocess executor spawns (vLLM's own log stamps: 16 s, 20 s and 24 s of a
75 s start at load average 10). The worker runs inside EngineCore instead (``--distributed-executor-backend=uni``,
which the CPU build honours only with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``): one interpreter fewer, 31-37 s instead of
67-77 s at the same load, and no loss of throughput for this model (652 vs 404 output tokens/s at 20 concurrent
requests, same load). In that mode vLLM does not bind its OpenMP threads (``VLLM_CPU_OMP_THREADS_BIND`` is read by the
multiprocess executor only), so an engine's cores (``cpu_bind``) are set as the process's CPU affinity, which
EngineCore and its threads inherit. vLLM writes its compile and model caches under ``VLLM_CACHE_ROOT`` and
``TORCHINDUCTOR_CACHE_DIR``: both go into the caller's scratch folder, never the user's home.

Process tree: the API server starts EngineCore as a child process (and the CPU build a resource tracker), so an
engine is started in a session of its own and stopped by signalling its whole process group: SIGTERM, then after
the grace period SIGKILL to whatever of the group is left. If the caller itself dies, PR_SET_PDEATHSIG sends the
API server SIGTERM (``greenserve.common.parent_death``), and vLLM's EngineCore exits when its parent does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from greenserve.common.parent_death import dies_with_parent
from greenserve.vllm_cpu import tiny_model

# <repo>/services/vllm_cpu/engines.py -> <repo>
REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_ENV = "GREENSERVE_VLLM_VENV"
STAMP = ".greenserve-vllm-installed"  # written by scripts/install-vllm.sh once vllm imports
SERVED_MODEL_NAME = "tiny-llama"
MAX_MODEL_LEN = 2048
KV_CACHE_SPACE_GIB = 1
#: how long an engine may take to answer /health (26-35 s alone on 2 cores; two starting together share them)
START_TIMEOUT_S = 300.0
STOP_GRACE_S = 20.0
TINY_MODEL_SCRIPT = Path(tiny_model.__file__).resolve()


def venv() -> Path:
    """vLLM's virtualenv: $GREENSERVE_VLLM_VENV, else <repo>/.venv-vllm."""
    return Path(os.environ.get(VENV_ENV) or REPO_ROOT / ".venv-vllm")


def python() -> Path:
    return venv() / "bin" / "python"


LMCACHE_VENV_ENV = "GREENSERVE_VLLM_LMCACHE_VENV"
LMCACHE_STAMP = ".greenserve-vllm-lmcache-installed"  # written by scripts/install-vllm.sh --with-lmcache


def lmcache_venv() -> Path:
    """The same vLLM plus LMCache 0.5.6 (LMCache's in-process KV connector, LMCacheConnectorV1):
    $GREENSERVE_VLLM_LMCACHE_VENV, else <repo>/.venv-vllm-lmcache."""
    return Path(os.environ.get(LMCACHE_VENV_ENV) or REPO_ROOT / ".venv-vllm-lmcache")


def lmcache_unavailable_reason() -> str | None:
    """Why no engine with LMCache's in-process connector can start here (None when one can)."""
    where = lmcache_venv()
    if not (where / "bin" / "vllm").exists() or not (where / LMCACHE_STAMP).exists():
        return (f"no vLLM + LMCache virtualenv at {where} (bash scripts/install-vllm.sh --with-lmcache makes it; "
                f"{LMCACHE_VENV_ENV} moves it)")
    return None


def unavailable_reason() -> str | None:
    """Why real vLLM engines cannot start here (None when they can)."""
    where = venv()
    if not (where / "bin" / "python").exists():
        return f"no vLLM virtualenv at {where} (bash scripts/install-vllm.sh makes it; {VENV_ENV} moves it)"
    if not (where / STAMP).exists():
        return f"the vLLM virtualenv at {where} has no install stamp: scripts/install-vllm.sh did not finish"
    return None


def ensure_model(model_dir: Path, seed: int = tiny_model.DEFAULT_SEED, timeout_s: float = 300.0) -> Path:
    """The tiny model in ``model_dir``, made first if it is not there (RuntimeError with the maker's reason)."""
    if tiny_model.is_made(model_dir, seed):
        return model_dir
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    done = subprocess.run([str(python()), str(TINY_MODEL_SCRIPT), f"--out={model_dir}", f"--seed={seed}"],
                          capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    if done.returncode != 0 or not tiny_model.is_made(model_dir, seed):
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"making the tiny model in {model_dir} failed: {last}")
    return model_dir


def engine_env(scratch: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of an engine: offline, no usage reports, caches under ``scratch``."""
    scratch.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if base is None else base)
    env.update({
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_SPACE_GIB),
        # with --distributed-executor-backend=uni: the worker inside EngineCore, one interpreter fewer to start
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(scratch / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
        "HF_HOME": str(scratch / "hf"),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    })
    # greenserve's own virtualenv must not leak into vLLM's interpreter
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return env


def serve_args(model_dir: Path, *, host: str = "127.0.0.1", port: int, served_model_name: str = SERVED_MODEL_NAME,
               aliases: Sequence[str] = (), max_model_len: int = MAX_MODEL_LEN) -> list[str]:
    """The OpenAI server's flags for the tiny model on CPU (without the interpreter). ``aliases``: more names the
    engine answers to (vLLM's ``--served-model-name`` takes several; the first is the one it reports in responses,
    ``/v1/models`` and its metrics' ``model_name``), e.g. the model name a fleet's requests carry.
    ``--enable-prompt-tokens-details``: usage then has ``prompt_tokens_details.cached_tokens``, the prefix-cache
    hits of the request, which the router's carbon receipt reads (without it vLLM sends null)."""
    names = [served_model_name, *(a for a in aliases if a != served_model_name)]
    return ["-m", "vllm.entrypoints.openai.api_server", f"--model={model_dir}", "--served-model-name", *names,
            f"--host={host}", f"--port={port}", "--dtype=float32", "--enforce-eager", "--enable-prefix-caching",
            f"--max-model-len={max_model_len}", "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
            "--distributed-executor-backend=uni"]


def cpu_binds(count: int) -> list[str | None]:
    """The cores of each of ``count`` engines on this machine (``start``'s ``cpu_bind``): None (all of them) for a
    single engine; else this process's CPUs dealt out round-robin, so that the engines do not compete for the same
    core (two engines on 2 cores: core 0 and core 1). More engines than CPUs share them."""
    if count <= 1:
        return [None] * count
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if count >= len(cpus):
        return [str(cpus[i % len(cpus)]) for i in range(count)]
    return [",".join(str(c) for c in cpus[i::count]) for i in range(count)]


def cpu_set(spec: str) -> set[int]:
    """The CPUs of a ``cpu_binds`` entry (``"0,2"``; ranges ``"0-3"`` too)."""
    cpus: set[int] = set()
    for part in filter(None, spec.split(",")):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


@dataclass
class VllmEngine:
    """One running vLLM OpenAI server (the leader of its own process group)."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)
    healthy_after_s: float | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Seconds from start until /health answered 200; RuntimeError if it exits, TimeoutError if too slow."""
        deadline = self.started_at + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"vLLM exited with code {self.process.returncode} during start-up; last log "
                                       f"lines ({self.log_path}):\n{tail(self.log_path)}")
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        self.healthy_after_s = time.monotonic() - self.started_at
                        return self.healthy_after_s
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"vLLM at {self.url} not healthy after {timeout_s:.0f} s; last log lines "
                                       f"({self.log_path}):\n{tail(self.log_path)}")
                time.sleep(0.25)

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        return stop_group(self.process, grace_s)


def start(model_dir: Path, *, port: int, log_path: Path, scratch: Path, host: str = "127.0.0.1",
          served_model_name: str = SERVED_MODEL_NAME, aliases: Sequence[str] = (), extra_args: Sequence[str] = (),
          env: Mapping[str, str] | None = None, cpu_bind: str | None = None,
          death_signal: int = signal.SIGTERM) -> VllmEngine:
    """Starts one engine (not waited for: ``VllmEngine.wait_healthy``). ``extra_args`` follow the standard flags
    (a later flag wins in vLLM's parser); ``cpu_bind``: the cores of its worker (``cpu_binds``). Raises
    RuntimeError when vLLM is not installed."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    cmd = [str(python()), *serve_args(model_dir, host=host, port=port, served_model_name=served_model_name,
                                      aliases=aliases), *extra_args]
    full_env = engine_env(scratch, env)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        # own session: the engine and EngineCore form one process group that stop_group signals as a whole
        proc = subprocess.Popen(dies_with_parent(cmd, death_signal, full_env), stdout=log_file,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env=full_env)
    if cpu_bind is not None:  # before EngineCore is spawned (after the imports, seconds later): it inherits them
        os.sched_setaffinity(proc.pid, cpu_set(cpu_bind))
    probe = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return VllmEngine(f"http://{probe}:{port}", proc, log_path)


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (zombies left out: a member killed after its parent died waits for
    whoever adopted it to reap it, and it holds nothing). Reads /proc (Linux); elsewhere asks the kernel whether
    the group has any process, zombies included."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except ProcessLookupError:
            return []
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            members.append(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is still running."""
    return bool(group_members(pgid))


def stop_group(process: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> int | None:
    """SIGTERM to the process group led by ``process``, SIGKILL to the group after ``grace_s``, and SIGKILL to any
    member left once the leader has exited (EngineCore outliving its API server). Returns the leader's exit code."""
    pgid = process.pid
    if process.poll() is None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        code = process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        code = process.wait()
    # the rest of the group (EngineCore) follows its leader within the grace period, or is killed
    for sig in (None, signal.SIGKILL):
        if sig is not None and group_alive(pgid):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
        deadline = time.monotonic() + grace_s
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
    return code


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


if __name__ == "__main__":  # python -m greenserve.vllm_cpu.engines: say whether engines can start here
    why = unavailable_reason()
    print(why or f"vLLM ready: {python()}")
    sys.exit(1 if why else 0)
