"""``greenserve-router --workers N``: N worker processes behind the same ports, under one supervisor.

Each worker is the router as one process runs it (``python -m greenserve.router --workers 1``): its own
RouterCore on the same database (engine registrations, health verdicts and the plan are shared through
it), the gRPC server and the HTTP front bound to the same two ports with SO_REUSEPORT, so that the kernel
spreads new connections over the workers. Linux only (SO_REUSEPORT balancing, PR_SET_PDEATHSIG).

The supervisor (this module's :class:`Supervisor`, the process started by the user) does no request work:

* it claims the ports first: a probe socket per port (SO_REUSEPORT, bound, never listening) keeps the
  port reserved for the workers for as long as it lives, port 0 becomes a concrete port, and an abstract
  Unix socket named after the port makes a second supervisor on the same port fail at start (the
  single-process router keeps SO_REUSEPORT off, so it cannot share a port with either);
* it migrates the database once, before the workers open it;
* it starts the workers, waits until each reports serving (a byte on a pipe), restarts a worker that
  dies (after 0.25 s, doubling up to 30 s; a worker that served 60 s starts the count afresh; after 8
  deaths in a row of one worker the supervisor stops everything and exits 1);
* a worker killed outright (SIGKILL, OOM) loses the connections it had accepted, and the kernel resets
  those still queued on its socket unless ``net.ipv4.tcp_migrate_req=1`` (Linux >= 5.14, per network
  namespace) hands them to the other workers; the supervisor warns at start when it is 0;
* SIGTERM / SIGINT are forwarded to every worker (each drains like a single router); workers still
  running after ``--shutdown-grace-s`` + 5 s are killed. A worker asks the kernel for SIGTERM when the
  supervisor dies (PR_SET_PDEATHSIG), so even ``kill -9`` of the supervisor leaves no worker serving.

``/metrics`` on any worker reports the router as a whole: prometheus_client's multiprocess mode, one
directory of per-process files (``<data-dir>/router-metrics-<grpc port>``); counters and histograms are
summed over every worker that ever ran (a dead worker's counts stay; the request path counts in plain
Python and each worker writes its counts to its file when it publishes, every second, and at stop:
folded_metrics.py, so another worker's counts lag by up to a second and a worker killed outright loses
at most its last second of them), gauges by their
``multiprocess_mode`` (levels over live workers). The gauges that read a live value when scraped
(in flight, connections, ...) are written to the files every second and by the answering worker at the
scrape. Each worker also publishes its requests in flight per engine, so that ``Drain`` through any worker
counts every worker's (:meth:`Worker.drain_wait`). Responses of the HTTP front carry
``x-greenserve-worker-pid``. Each worker's OTel metrics and traces
carry ``service.instance.id`` = ``<host>-<supervisor pid>-worker-<index>``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from greenserve.common.parent_death import set_parent_death_signal
from greenserve.common.tasks import cancel_and_wait

if TYPE_CHECKING:
    from greenserve.common.config import ServiceSettings
    from greenserve.router.core import RouterCore
    from greenserve.router.front.http_front import HttpFront

log = logging.getLogger("greenserve.router.workers")

WORKER_ENV = "GREENSERVE_ROUTER_WORKER"
"""Set by the supervisor in each worker's environment: ``<index>:<supervisor pid>:<ready pipe fd>``."""
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
OTEL_RESOURCE_ENV = "OTEL_RESOURCE_ATTRIBUTES"
MAX_DEFAULT_WORKERS = 8
WORKER_HEADER = "x-greenserve-worker-pid"
RESTART_BASE_S = 0.25
RESTART_MAX_S = 30.0
STABLE_AFTER_S = 60.0
MAX_FAILURES = 8
READY_WITHIN_S = 120.0
KILL_AFTER_GRACE_S = 5.0
GAUGE_PUBLISH_S = 1.0
MIGRATE_REQ_SYSCTL = "/proc/sys/net/ipv4/tcp_migrate_req"


def supported() -> bool:
    """Whether several workers can share a port here (Linux: SO_REUSEPORT balances connections)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """CPUs the cgroup's quota allows (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), rounded up; None: no
    quota. A container limited to 2 CPUs on a 64-CPU node sees 64 in its affinity mask."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return max(1, math.ceil(quota_us / period_us)) if quota_us > 0 and period_us > 0 else None


def default_workers() -> int:
    """One worker per CPU this process may run on (its affinity mask, capped by a cgroup CPU quota), at most
    MAX_DEFAULT_WORKERS; 1 where unsupported."""
    if not supported():
        return 1
    cpus = len(os.sched_getaffinity(0))
    return max(1, min(MAX_DEFAULT_WORKERS, cpus, cgroup_cpu_limit() or cpus))


# -- inside a worker ---------------------------------------------------------------------------------


ENGINE_IN_FLIGHT = "greenserve_router_engine_in_flight"
DRAIN_SETTLE_MARGIN_S = 0.5


@dataclass
class Worker:
    """This process as a worker of a supervisor (parsed from WORKER_ENV)."""

    index: int
    supervisor_pid: int
    ready_fd: int
    _publish: Callable[[], None] | None = None

    def report_serving(self, _server: Any = None) -> None:
        """Tells the supervisor this worker serves (one byte on its pipe)."""
        try:
            os.write(self.ready_fd, b"1")
            os.close(self.ready_fd)
        except OSError:
            pass

    def start(self, core: RouterCore, on_stop: list[Callable[[], Any]]) -> None:
        """Publishes this worker's live gauges and its requests in flight per engine to the multiprocess files
        every second (the whole router's /metrics and Drain read them); the task stops with ``on_stop``."""
        if not os.environ.get(MULTIPROC_ENV):
            return
        from prometheus_client import Gauge

        per_engine = Gauge(ENGINE_IN_FLIGHT, "requests in flight per engine", ["engine"], registry=core.prom,
                           multiprocess_mode="livesum")
        seen: set[str] = set()

        def publish() -> None:
            engines = core.registry.engines
            for engine_id in seen - set(engines):
                per_engine.labels(engine_id).set(0)
            for engine_id, engine in engines.items():
                per_engine.labels(engine_id).set(engine.in_flight)
                seen.add(engine_id)
            publish_live_gauges(core.prom)

        self._publish = publish
        task = asyncio.get_running_loop().create_task(_publish_every(publish, GAUGE_PUBLISH_S), name="worker-gauges")

        async def stop() -> None:
            await cancel_and_wait(task)

        on_stop.append(stop)

    def attach(self, core: RouterCore, front: HttpFront) -> None:
        """Makes ``front`` (not yet started) a worker's: /metrics of the whole router, the worker header."""
        path = os.environ.get(MULTIPROC_ENV)
        if path and self._publish is not None:
            front.metrics_registry = whole_router_registry(self._publish, path)
        pid = str(os.getpid())

        async def add_header(request: Any, response: Any) -> None:
            response.headers[WORKER_HEADER] = pid

        front.app.on_response_prepare.append(add_header)

    async def drain_wait(self, core: RouterCore, ids: list[str], wait: bool, deadline: float
                         ) -> tuple[list[str], list[str]]:
        """(idle, busy) of ``ids`` over every worker, this one's count fresh and the others' as published.
        With ``wait``, until all are idle or ``deadline`` (time.monotonic()), and never before the others
        had time to learn of the drain (the shared state's poll) and to publish after it."""
        path = os.environ.get(MULTIPROC_ENV)
        if not path or self._publish is None:
            busy = [i for i in ids if (e := core.registry.get(i)) is not None and e.in_flight > 0]
            return [i for i in ids if i not in busy], busy
        settle_until = time.monotonic() + float(getattr(core.config, "state_poll_interval_s", 1.0)) \
            + GAUGE_PUBLISH_S + DRAIN_SETTLE_MARGIN_S
        while True:
            self._publish()
            counts = await asyncio.to_thread(_engine_in_flight, path)
            busy = [i for i in ids if counts.get(i, 0.0) > 0]
            now = time.monotonic()
            if not wait or now >= deadline or (not busy and now >= settle_until):
                return [i for i in ids if i not in busy], busy
            await asyncio.sleep(min(0.1, max(0.0, deadline - now)))


def _engine_in_flight(path: str) -> dict[str, float]:
    """Requests in flight per engine summed over the live workers (their multiprocess files)."""
    from prometheus_client.multiprocess import MultiProcessCollector

    out: dict[str, float] = {}
    for family in MultiProcessCollector(None, path).collect():
        if family.name == ENGINE_IN_FLIGHT:
            for sample in family.samples:
                out[sample.labels["engine"]] = out.get(sample.labels["engine"], 0.0) + sample.value
    return out


_current: list[Worker | None] = []


def current_worker() -> Worker | None:
    """This process's Worker when a supervisor started it, else None (the same object on every call)."""
    if not _current:
        value = os.environ.get(WORKER_ENV)
        if value:
            index, supervisor_pid, ready_fd = (int(x) for x in value.split(":"))
            _current.append(Worker(index, supervisor_pid, ready_fd))
        else:
            _current.append(None)
    return _current[0]


def publish_live_gauges(registry: Any) -> None:
    """Writes the current value of every gauge of ``registry`` to this process's multiprocess file (gauges
    that read a live value through ``set_function`` are not written otherwise)."""
    collectors = registry._names_to_collectors  # prometheus_client has no public lookup by name
    for family in registry.collect():
        if family.type != "gauge":
            continue
        gauge = collectors.get(family.name)
        if gauge is None:
            continue
        for sample in family.samples:
            (gauge.labels(**sample.labels) if sample.labels else gauge).set(sample.value)


async def _publish_every(publish: Callable[[], None], interval_s: float) -> None:
    while True:
        try:
            publish()
        except Exception:
            log.exception("publishing the worker's gauges failed")
        await asyncio.sleep(interval_s)


class _WholeRouter:
    """Collector of the whole router: this worker's live gauges written first, then every worker's files."""

    def __init__(self, publish: Callable[[], None], path: str) -> None:
        from prometheus_client.multiprocess import MultiProcessCollector

        self._publish = publish
        self._all = MultiProcessCollector(None, path)

    def collect(self) -> Iterable[Any]:
        self._publish()
        return self._all.collect()


def whole_router_registry(publish: Callable[[], None], path: str) -> Any:
    """A registry whose scrape is the sum over the workers sharing the multiprocess directory ``path``."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_WholeRouter(publish, path))
    return registry


# -- the supervisor ------------------------------------------------------------------------------------


def _port_lock_name(port: int) -> str:
    return f"\0greenserve-router-port-{port}"


class PortClaim:
    """A port held for the workers: a bound probe socket (SO_REUSEPORT, never listening) and the lock."""

    def __init__(self, what: str, host: str, port: int) -> None:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        self.probe = socket.socket(family, socket.SOCK_STREAM)
        # SO_REUSEADDR as every listener has (grpc, asyncio): connections of an earlier server on this port
        # left in TIME_WAIT must not block it; a live listener still does (the workers' own share it by
        # SO_REUSEPORT).
        self.probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            self.probe.bind(address)
        except OSError as exc:
            self.probe.close()
            raise OSError(f"cannot bind {what} {host}:{port}: {exc}") from exc
        self.port: int = self.probe.getsockname()[1]
        self.lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.lock.bind(_port_lock_name(self.port))
        except OSError:
            self.close()
            raise OSError(f"cannot bind {what} {host}:{self.port}: another greenserve-router supervisor "
                          "serves it") from None

    def close(self) -> None:
        self.probe.close()
        self.lock.close()


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    ready_r: int | None = None
    ready: bool = False
    started_at: float = 0.0
    failures: int = 0
    start_at: float | None = None  # when a dead worker is due to be restarted


class Supervisor:
    """Starts ``workers`` routers on shared ports and keeps them running (see the module docstring)."""

    def __init__(self, settings: ServiceSettings, argv: list[str], workers: int) -> None:
        self.settings = settings
        self.argv = list(argv)
        self.slots = [_Slot(i) for i in range(workers)]
        self.claims: list[PortClaim] = []
        self.grpc_port = 0
        self.http_port = -1
        self.metrics_dir: Path | None = None
        self.stop_signal: int | None = None
        self.exit_code = 0

    # -- start ---------------------------------------------------------------------------------------

    def _claim(self) -> None:
        s: Any = self.settings
        grpc_claim = PortClaim("gRPC", s.host, s.bind_port)
        self.claims.append(grpc_claim)
        self.grpc_port = grpc_claim.port
        if s.http_port >= 0:
            http_claim = PortClaim("HTTP front", s.http_host or s.host, s.http_port)
            self.claims.append(http_claim)
            self.http_port = http_claim.port

    def _prepare(self) -> None:
        from greenserve.common.persistence import Database

        # migrations once, before N workers open the database at the same instant
        Database.open(self.settings.database_url, self.settings.service_name).close()
        self.metrics_dir = Path(self.settings.data_dir) / f"router-metrics-{self.grpc_port}"
        shutil.rmtree(self.metrics_dir, ignore_errors=True)  # files of a previous run (the port lock is ours)
        self.metrics_dir.mkdir(parents=True)
        try:
            migrate = Path(MIGRATE_REQ_SYSCTL).read_text().strip()
        except OSError:  # kernel before 5.14
            migrate = ""
        if migrate == "0":
            log.warning("net.ipv4.tcp_migrate_req is 0: connections the kernel queued on a worker that dies are "
                        "reset instead of handed to the other workers (docs/router.md)")

    def _spawn(self, slot: _Slot) -> None:
        ready_r, ready_w = os.pipe()
        env = {**os.environ, WORKER_ENV: f"{slot.index}:{os.getpid()}:{ready_w}",
               MULTIPROC_ENV: str(self.metrics_dir)}
        # OTel: each worker is an instance of its own (the same one after a restart: its counters reset)
        instance = f"service.instance.id={socket.gethostname()}-{os.getpid()}-worker-{slot.index}"
        env[OTEL_RESOURCE_ENV] = ",".join(filter(None, [os.environ.get(OTEL_RESOURCE_ENV, ""), instance]))
        cmd = [sys.executable, "-m", "greenserve.router", *self.argv, "--workers", "1",
               "--port", str(self.grpc_port), "--http-port", str(self.http_port)]
        try:
            slot.proc = subprocess.Popen(cmd, env=env, pass_fds=(ready_w,), stdin=subprocess.DEVNULL)
        finally:
            os.close(ready_w)
        slot.ready_r, slot.ready, slot.started_at, slot.start_at = ready_r, False, time.monotonic(), None

    # -- run -----------------------------------------------------------------------------------------

    def run(self) -> int:
        from greenserve.common.db_errors import PersistenceError
        from sqlalchemy.exc import SQLAlchemyError

        try:
            self._claim()
            self._prepare()
        except (OSError, ValueError, PersistenceError, SQLAlchemyError) as exc:  # a port, the data dir, the DB
            for claim in self.claims:
                claim.close()
            print(f"greenserve-router: error: {exc}", file=sys.stderr)
            return 1
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
        old_wakeup = signal.set_wakeup_fd(wake_w)

        def on_stop(signum: int, _frame: Any) -> None:
            if self.stop_signal is None:
                self.stop_signal = signum

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop through the wakeup fd
        try:
            for slot in self.slots:
                self._spawn(slot)
            if self._await_ready(wake_r):
                log.info("serving", extra={"workers": [s.proc.pid for s in self.slots if s.proc],
                                           "port": self.grpc_port, "http_port": self.http_port})
                self._loop(wake_r)
        finally:
            self._stop_all()
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_r)
            os.close(wake_w)
            for claim in self.claims:
                claim.close()
            if self.metrics_dir is not None:
                shutil.rmtree(self.metrics_dir, ignore_errors=True)
        return self.exit_code

    def _wait(self, wake_r: int, timeout_s: float) -> None:
        watched = [wake_r] + [s.ready_r for s in self.slots if s.ready_r is not None]
        try:
            readable, _, _ = select.select(watched, [], [], max(0.0, timeout_s))
        except InterruptedError:
            return
        for fd in readable:
            if fd == wake_r:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                continue
            slot = next(s for s in self.slots if s.ready_r == fd)
            data = os.read(fd, 1)
            os.close(fd)
            slot.ready_r = None
            if data:
                slot.ready = True
                if slot.failures:
                    log.info("worker restarted", extra={"worker": slot.index, "pid": slot.proc.pid if slot.proc else None})

    def _await_ready(self, wake_r: int) -> bool:
        """Waits until every worker serves; False (exit code set) when one exits first or a signal came."""
        deadline = time.monotonic() + READY_WITHIN_S
        while not all(s.ready for s in self.slots):
            if self.stop_signal is not None:
                return False
            for slot in self.slots:
                if slot.proc is not None and slot.proc.poll() is not None and not slot.ready:
                    code = slot.proc.returncode
                    log.error("worker exited before serving", extra={"worker": slot.index, "exit_code": code})
                    self.exit_code = code if code and code > 0 else 1
                    return False
            if time.monotonic() > deadline:
                log.error("workers not serving in time", extra={"within_s": READY_WITHIN_S})
                self.exit_code = 1
                return False
            self._wait(wake_r, 0.5)
        return True

    def _loop(self, wake_r: int) -> None:
        from prometheus_client import multiprocess

        while self.stop_signal is None:
            now = time.monotonic()
            for slot in self.slots:
                proc = slot.proc
                if proc is not None and proc.poll() is not None:
                    if slot.ready_r is not None:
                        os.close(slot.ready_r)
                        slot.ready_r = None
                    multiprocess.mark_process_dead(proc.pid, str(self.metrics_dir))
                    if now - slot.started_at >= STABLE_AFTER_S:
                        slot.failures = 0
                    slot.failures += 1
                    slot.proc = None
                    if slot.failures > MAX_FAILURES:
                        log.error("worker keeps dying; stopping the router",
                                  extra={"worker": slot.index, "deaths": slot.failures, "exit_code": proc.returncode})
                        self.exit_code = 1
                        return
                    delay = min(RESTART_MAX_S, RESTART_BASE_S * 2 ** (slot.failures - 1))
                    slot.start_at = now + delay
                    log.warning("worker died; restarting it", extra={
                        "worker": slot.index, "pid": proc.pid, "exit_code": proc.returncode, "restart_in_s": delay})
                if slot.proc is None and slot.start_at is not None and now >= slot.start_at:
                    self._spawn(slot)
            due = [s.start_at for s in self.slots if s.proc is None and s.start_at is not None]
            self._wait(wake_r, min([1.0] + [d - time.monotonic() for d in due]))

    def _stop_all(self) -> None:
        from prometheus_client import multiprocess

        sig = signal.SIGINT if self.stop_signal == signal.SIGINT else signal.SIGTERM
        live = [s.proc for s in self.slots if s.proc is not None and s.proc.poll() is None]
        for proc in live:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
        deadline = (time.monotonic() + self.settings.shutdown_delay_s + self.settings.shutdown_grace_s
                    + KILL_AFTER_GRACE_S)
        for proc in live:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker did not stop in time; killing it", extra={"pid": proc.pid})
                proc.kill()
                proc.wait()
        for slot in self.slots:
            if slot.ready_r is not None:
                os.close(slot.ready_r)
                slot.ready_r = None
            if slot.proc is not None and self.metrics_dir is not None:
                multiprocess.mark_process_dead(slot.proc.pid, str(self.metrics_dir))
        if self.stop_signal is not None:
            log.info("stopped", extra={"signal": signal.Signals(self.stop_signal).name})


# -- entry point ---------------------------------------------------------------------------------------


def run_router(settings_cls: type[ServiceSettings], build: Callable[..., Any], argv: list[str] | None = None) -> int:
    """greenserve-router: one process (``--workers 1``), a worker (started by a supervisor) or a supervisor."""
    from greenserve.common.app import run_service
    from greenserve.common.config import load_settings
    from greenserve.common.telemetry import setup_logging

    args = sys.argv[1:] if argv is None else list(argv)
    worker = current_worker()
    if worker is not None:
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != worker.supervisor_pid:  # the supervisor died before the line above
            return 1
        return run_service(settings_cls, build, args, reuse_port=True, on_serving=worker.report_serving)
    prog = "greenserve-router"
    settings = load_settings(settings_cls, args, prog=prog)
    workers = getattr(settings, "workers", None) or default_workers()
    if workers == 1:
        return run_service(settings_cls, build, args)
    if not supported():
        print(f"{prog}: error: --workers {workers} needs Linux (SO_REUSEPORT, PR_SET_PDEATHSIG); use --workers 1",
              file=sys.stderr)
        return 2
    setup_logging(settings.log_level, settings.log_json)
    return Supervisor(settings, args, workers).run()
