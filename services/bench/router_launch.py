"""Process starting for ``greenserve bench router`` (bench.py) and the benches built on it (bench_engine,
bench_replicas, bench_workers): every process a bench starts goes through ``bench_popen`` (pinned to CPUs,
niced by ``NICE``, killed with the bench); and the processes under test: the emulated or no-op engines,
the router, vllm-router, and which CPUs each runs on (``cpu_plan``)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from greenserve.common.parent_death import dies_with_parent

REPO = Path(__file__).resolve().parents[2]
VLLM_ROUTER_VERSION = "0.1.17"


def log(msg: str) -> None:
    print(f"[bench router] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


NICE = 0  # niceness given to every process the bench starts (--nice; 0 = inherit)


_LAUNCH = """
import os, sys
cpus, nice = sys.argv[1], int(sys.argv[2])
if cpus:
    os.sched_setaffinity(0, map(int, cpus.split(",")))
if nice:
    os.nice(nice)
    try:  # Linux autogroup: nice only ranks a process inside its session's group, so it gets a group of its own
        os.setsid()
        with open("/proc/self/autogroup", "w") as fh:
            fh.write(str(nice))
    except OSError:
        pass  # no autogroup (or no right to a negative group nice): the process nice still applies
os.execvp(sys.argv[3], sys.argv[3:])
"""


def pinned(cmd: list[str], cpus: list[int] | None) -> list[str]:
    """``cmd`` started through a tiny launcher that pins itself to ``cpus``, applies ``--nice`` and
    execs ``cmd``: every thread the program starts later inherits both (a Rust router starts its
    threads at once, so pinning its pid after the start would miss them). With ``--nice`` the process
    also gets a session, hence a scheduler autogroup, of its own with that nice: where the kernel groups
    by session (``sched_autogroup_enabled``, the development VM), a process nice ranks a process only
    inside its group, and the router's group, its load all on one CPU, lost that CPU to other sessions'
    jobs (the HTTP front's hidden TTFT; docs/router.md)."""
    if not cpus and not NICE:
        return cmd
    return [sys.executable, "-c", _LAUNCH, ",".join(map(str, cpus or [])), str(NICE), *cmd]


def bench_popen(cmd: list[str], cpus: list[int] | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
    """Starts a process of a bench (engine, router, load generator), pinned and niced by ``pinned``, that
    dies with the bench: the kernel sends it SIGTERM when the bench process dies, however it dies
    (``kill -9`` included), so a stopped bench leaves no engine or router behind (a router stops its
    own workers on SIGTERM). Start it from the bench's main thread (``parent_death``)."""
    return subprocess.Popen(dies_with_parent(pinned(cmd, cpus), signal.SIGTERM, kwargs.get("env")), **kwargs)


def exit_on_sigterm() -> None:
    """SIGTERM ends a bench like Ctrl-C: its ``finally`` blocks stop the processes it started and remove its
    files (without this the default action killed it on the spot; ``bench_popen``'s children then got
    only their parent-death signal)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


# ------------------------------------------------------------------------------------------------------
# processes under test
# ------------------------------------------------------------------------------------------------------


def env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GREENSERVE_")}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    return env


class Procs:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def add(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def start_engine(procs: Procs, args: argparse.Namespace, cpus: list[int] | None) -> str:
    cmd = [sys.executable, "-m", "greenserve.simulator.emulator", "--port", "0", "--time-scale", str(args.time_scale),
           "--max-num-seqs", str(args.max_num_seqs)]
    if args.model:
        cmd += ["--model", args.model]
    if args.engine == "noop":  # bench_engine.py: a token per --noop-tpot-s, the router the bottleneck
        from greenserve.bench.router_engine import DEFAULT_MODEL, serve_args

        cmd = [sys.executable, *serve_args(model=args.model or DEFAULT_MODEL, tpot_s=args.noop_tpot_s)]
    return spawn_engine(procs, cmd, cpus, "engine emulator")


def spawn_engine(procs: Procs, cmd: list[str], cpus: list[int] | None, what: str) -> str:
    """Starts an engine that prints "... listening on URL" as its first line; its URL."""
    proc = procs.add(bench_popen(cmd, cpus, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env()))
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if "listening on" not in line:
        raise RuntimeError(f"{what} did not start: {line!r}")
    return line.strip().rsplit(" ", 1)[-1]


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except Exception as exc:  # noqa: BLE001
            last = str(exc)
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s:g}s ({last})")


_PROFILED_ROUTER = (
    "import cProfile, sys; from greenserve.router.__main__ import main; prof = cProfile.Profile(); "
    "prof.enable(); rc = main(sys.argv[2:]); prof.disable(); prof.dump_stats(sys.argv[1]); raise SystemExit(rc)"
)


def start_router(procs: Procs, engines: list[str], data_dir: str, cpus: list[int] | None,
                  profile: str | None = None, workers: int = 1, extra: list[str] | None = None
                  ) -> tuple[str, str, subprocess.Popen[bytes]]:
    """The router in a process of its own (``workers`` > 1: a supervisor and its workers, bench_workers.py);
    with ``profile``, under cProfile (stats written at exit)."""
    grpc_port, http_port = free_port(), free_port()
    entry = ["-c", _PROFILED_ROUTER, profile] if profile else ["-m", "greenserve.router"]
    cmd = [sys.executable, *entry, "--host", "127.0.0.1", "--port", str(grpc_port),
           "--http-port", str(http_port), "--engines", ",".join(engines), "--data-dir", data_dir,
           "--no-watch-plans", "--no-feeds", "--log-level", "WARNING", "--max-in-flight", "100000",
           "--workers", str(workers), *(extra or [])]
    log_file = open(Path(data_dir) / "router.log", "wb")  # closed with the process
    proc = procs.add(bench_popen(cmd, cpus, stdout=log_file, stderr=subprocess.STDOUT, env=env()))
    url = f"http://127.0.0.1:{http_port}"
    wait_http(url + "/health", 60, proc)
    return url, f"127.0.0.1:{grpc_port}", proc


def vllm_router_bin(install: bool) -> tuple[Path | None, str]:
    venv = REPO / ".venv-vllm-router"
    exe = venv / "bin" / "vllm-router"
    if exe.exists():
        return exe, ""
    if not install:
        return None, "not installed and --no-install-peer given"
    log(f"installing vllm-router=={VLLM_ROUTER_VERSION} into {venv.name} ...")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"vllm-router=={VLLM_ROUTER_VERSION}"],
                       check=True, capture_output=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        shutil.rmtree(venv, ignore_errors=True)
        return None, f"pip install vllm-router=={VLLM_ROUTER_VERSION} failed: {str(exc)[:200]} {detail[-300:]!r}"
    return (exe, "") if exe.exists() else (None, "vllm-router installed but its executable is missing")


def start_vllm_router(procs: Procs, exe: Path, engines: list[str], data_dir: str,
                       cpus: list[int] | None) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    cmd = [str(exe), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *engines,
           "--policy", "round_robin", "--log-level", "warning", "--disable-retries"]
    log_file = open(Path(data_dir) / "vllm-router.log", "wb")
    proc = procs.add(bench_popen(cmd, cpus, stdout=log_file, stderr=subprocess.STDOUT, env=env()))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", 60, proc)
    return url, proc


def cpu_plan(pin: bool) -> dict[str, Any]:
    """Which CPUs each part runs on. Pinned: the router (and, in its turn, vllm-router) alone on the
    last CPU; engines and load generator on the others, the same in direct and routed runs, so that the
    system under test neither steals from nor is slowed by the engines it is compared with."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return {"enabled": False, "reason": "--no-pin" if not pin else "fewer than 2 CPUs", "cpus": cpus}
    return {"enabled": True, "router": cpus[-1:], "vllm_router": cpus[-1:], "engines": cpus[:-1],
            "loadgen": cpus[:-1]}
