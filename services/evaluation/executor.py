"""Where an evaluation's jobs run: in this process, over a local process pool, or on a Ray cluster.

``map_jobs(fn, items, ...)`` calls ``fn`` on every item and hands each result to ``on_done`` as it finishes (for
the progress bar), returning the results in the order of ``items``. With ``ray_address`` the same function runs as
Ray tasks: ``"local"`` starts a Ray instance on this machine (what the tests use), any other value is passed to
``ray.init(address=...)`` (``auto``, ``ray://head:10001``, ...). The cluster's workers must be able to import
greenserve (installed on every node, or through the cluster's ``runtime_env``). Ray is the optional extra
``greenserve[ray]``; without it ``RayUnavailable`` says how to install it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from greenserve.common.parent_death import exit_with_parent

T = TypeVar("T")
R = TypeVar("R")


class RayUnavailable(RuntimeError):
    """--ray-address was given but Ray cannot be used (not installed, or the cluster cannot be reached)."""


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def map_jobs(fn: Callable[[T], R], items: Sequence[T], *, workers: int | None = None, ray_address: str | None = None,
             on_done: Callable[[R], None] | None = None) -> list[R]:
    if not items:
        return []
    if ray_address:
        return _map_ray(fn, items, ray_address, on_done)
    workers = workers or min(len(items), usable_cores())
    results: list[Any] = [None] * len(items)
    if workers <= 1:
        for i, item in enumerate(items):
            results[i] = fn(item)
            if on_done:
                on_done(results[i])
        return results
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(workers, len(items)), initializer=exit_with_parent,
                                                initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
        for future in concurrent.futures.as_completed(futures):
            results[futures[future]] = future.result()
            if on_done:
                on_done(results[futures[future]])
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
        ray.init(address=None if address == "local" else address, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
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
