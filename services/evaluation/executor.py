"""Where an evaluation's jobs run: in this process, over a local process pool, or on a Ray cluster.

``map_jobs(fn, items, ...)`` calls ``fn`` on every item and hands each result to ``on_done`` as it finishes (for
the progress bar), returning the results in the order of ``items``. A job may also report progress while it runs:
``tick(payload)`` inside ``fn`` reaches ``on_tick(payload)`` in the caller (a queue from the worker processes, read
by the caller between jobs' ends and every ``TICK_POLL_S``; a direct call in this process; Ray jobs report only
their end). With ``ray_address`` the same function runs as
Ray tasks: ``"local"`` starts a Ray instance on this machine (what the tests use), any other value is passed to
``ray.init(address=...)`` (``auto``, ``ray://head:10001``, ...). The cluster's workers must be able to import
greenserve (installed on every node, or through the cluster's ``runtime_env``). Ray is the optional extra
``greenserve[ray]``; without it ``RayUnavailable`` says how to install it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from greenserve.common.parent_death import exit_with_parent
from greenserve.simulator.engine_profile import MEASURED_PROFILES_ENV

T = TypeVar("T")
R = TypeVar("R")

_tick_to: Callable[[Any], None] | None = None  # where this process's tick() goes while map_jobs runs a job


def tick(payload: Any) -> None:
    """Reports ``payload`` to the ``on_tick`` of the map_jobs running this job (nothing outside one)."""
    if _tick_to is not None:
        _tick_to(payload)


def _worker_start(parent_pid: int, ticks: Any) -> None:
    global _tick_to
    exit_with_parent(parent_pid)
    _tick_to = ticks.put if ticks is not None else None


TICK_POLL_S = 0.2  # how often the caller looks for the worker processes' ticks while no job finishes


def _drain(ticks: Any, on_tick: Callable[[Any], None] | None) -> None:
    """Hands every tick already in the queue to ``on_tick``."""
    if ticks is None or on_tick is None:
        return
    while not ticks.empty():
        on_tick(ticks.get())


class RayUnavailable(RuntimeError):
    """--ray-address was given but Ray cannot be used (not installed, or the cluster cannot be reached)."""


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def map_jobs(fn: Callable[[T], R], items: Sequence[T], *, workers: int | None = None, ray_address: str | None = None,
             on_done: Callable[[R], None] | None = None, on_tick: Callable[[Any], None] | None = None) -> list[R]:
    global _tick_to
    if not items:
        return []
    if ray_address:
        return _map_ray(fn, items, ray_address, on_done)
    workers = workers or min(len(items), usable_cores())
    results: list[Any] = [None] * len(items)
    if workers <= 1:
        _tick_to = on_tick
        try:
            for i, item in enumerate(items):
                results[i] = fn(item)
                if on_done:
                    on_done(results[i])
        finally:
            _tick_to = None
        return results
    # Fresh interpreters, not forks: a fork of a process whose gRPC (or any other) threads hold a lock can crash or
    # hang in the child, and `demo` and embedding programs call this from such processes.
    context = multiprocessing.get_context("spawn")
    ticks: Any = context.SimpleQueue() if on_tick is not None else None
    try:
        with concurrent.futures.ProcessPoolExecutor(max_workers=min(workers, len(items)), initializer=_worker_start,
                                                    initargs=(os.getpid(), ticks), mp_context=context) as pool:
            futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
            pending = set(futures)
            while pending:
                done, pending = concurrent.futures.wait(pending, timeout=TICK_POLL_S,
                                                        return_when=concurrent.futures.FIRST_COMPLETED)
                # a job's ticks were written to the queue before its result was sent: they are taken first, so a
                # finished job's last ticks never arrive after its on_done
                _drain(ticks, on_tick)
                for future in done:
                    results[futures[future]] = future.result()
                    if on_done:
                        on_done(results[futures[future]])
    finally:
        if ticks is not None:
            ticks.close()
    return results


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Connects to Ray for the block (``None``: nothing; ``local``: a Ray instance on this machine) unless Ray is
    already initialised, and disconnects at the end if it connected."""
    if not address:
        yield
        return
    try:
        import ray
    except ImportError:
        raise RayUnavailable("Ray is not installed: pip install 'greenserve[ray]' (or 'ray'); without "
                             "--ray-address the local process pool runs the same jobs") from None
    if ray.is_initialized():
        yield
        return
    try:
        # the measured profiles of `evaluate --profile` reach the workers by the same variable as local processes
        # (a path each node must be able to read: the driver's own machine for a local instance)
        profiles = os.environ.get(MEASURED_PROFILES_ENV)
        runtime_env = {"env_vars": {MEASURED_PROFILES_ENV: profiles}} if profiles else None
        ray.init(address=None if address == "local" else address, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, runtime_env=runtime_env)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayUnavailable(f"cannot connect to the Ray cluster at {address!r}: {exc}") from None
    try:
        yield
    finally:
        ray.shutdown()


def _map_ray(fn: Callable[[T], R], items: Sequence[T], address: str, on_done: Callable[[R], None] | None) -> list[R]:
    with ray_session(address):
        import ray

        remote = ray.remote(fn)
        refs = {remote.remote(item): i for i, item in enumerate(items)}
        results: list[Any] = [None] * len(items)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            results[refs[done[0]]] = ray.get(done[0])
            if on_done:
                on_done(results[refs[done[0]]])
        return results
