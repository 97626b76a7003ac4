"""Which serving modes a pool's engines can run, asked at planning time: the rule of the launcher matching each
engine kind (``EngineLauncher.mode_problem`` in engine_launch.py), so that the optimizer plans only what the
gpu-partitioner would accept (it refuses a plan with the same rule)."""

from __future__ import annotations

from collections.abc import Iterable

from greenserve.common.engine_launch import EmulatorLauncher, VllmLauncher
from greenserve.v1 import common_pb2


def kind_launcher(kind: int) -> VllmLauncher | EmulatorLauncher | None:
    """The launcher whose engines are of ``kind`` (``common_pb2.EngineKind``), built only to ask its
    ``mode_problem`` (nothing is looked up or run); None for ENGINE_KIND_UNSPECIFIED: no rule is known."""
    if kind == common_pb2.ENGINE_KIND_VLLM:
        return VllmLauncher()
    if kind == common_pb2.ENGINE_KIND_SIMULATED:
        return EmulatorLauncher(argv0=(), known_profiles=())
    return None


def engines_mode_problem(kinds: Iterable[int], target: common_pb2.ServingModeTarget, pool: common_pb2.Pool,
                         lmcache_url: str = "") -> str:
    """Why engines of ``kinds`` (a pool's, mixed or not) cannot all run the pool in ``target``'s mode: the first
    kind's ``mode_problem`` that refuses it, "" when every kind can; an unspecified kind adds no rule."""
    for kind in sorted(set(kinds)):
        launcher = kind_launcher(kind)
        problem = launcher.mode_problem(target, pool, lmcache_url) if launcher is not None else ""
        if problem:
            return problem
    return ""
