"""Minimal destroy/create plan from the current MIG layout of a GPU to a target layout.

A GI cannot move: keeping an instance running means the target has a GI of the same profile at the same
placement. The plan therefore keeps the intersection of the two layouts, destroys the rest of the current
layout and creates the rest of the target. That is the minimum number of steps (every current GI that
the target lacks must be destroyed, every target GI that is not there must be created).

Order: all destroys, then all creates. Every intermediate layout is then a subset of the current layout
(during destroys) or of the target (during creates); both are valid and every rule of
`geometry.GpuGeometry` is closed under subsets, so every step is legal when it runs. Creates use explicit
placements (``nvmlDeviceCreateGpuInstanceWithPlacement``), so their order cannot change where a GI lands.

Target GIs given without a placement (`unplaced`) are placed here, choosing the placement that keeps the
most current GIs running and, among those, NVIDIA's packing preference (3g at slice 4, small GIs low).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from greenserve.common.mig_geometry import (
    CURRENT_DRIVER,
    GpuGeometry,
    LayoutError,
    Placement,
)

DESTROY = "destroy"
CREATE = "create"
ENABLE_MIG = "enable_mig"
DISABLE_MIG = "disable_mig"
STEP_KINDS = (DESTROY, CREATE, ENABLE_MIG, DISABLE_MIG)


@dataclass(frozen=True)
class Step:
    """One action on a GPU: destroy/create a GI (with its full-size compute instance) or switch MIG mode."""

    kind: str
    placement: Placement | None = None

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "placement": None if self.placement is None else self.placement.to_json()}

    @staticmethod
    def from_json(value: dict[str, object]) -> Step:
        placement = value.get("placement")
        return Step(kind=str(value["kind"]), placement=None if placement is None else Placement.from_json(placement))  # type: ignore[arg-type]

    def __str__(self) -> str:
        return self.kind if self.placement is None else f"{self.kind} {self.placement}"


@dataclass(frozen=True)
class LayoutPlan:
    """Steps in order and the GIs that stay untouched."""

    steps: tuple[Step, ...]
    kept: tuple[Placement, ...]
    target: tuple[Placement, ...]


def resolve_target(
    geo: GpuGeometry,
    placed: Sequence[Placement],
    unplaced: Sequence[str],
    current: Sequence[Placement] = (),
    *,
    driver: int = CURRENT_DRIVER,
) -> list[Placement]:
    """Place the `unplaced` profiles around the `placed` GIs; LayoutError when they cannot all fit.

    Among all valid completions, picks the one keeping most GIs of `current` (same profile and placement),
    then the packing preference. The search is exhaustive (at most 7 GIs on 8 slices: tiny).
    """
    geo.validate(placed, driver=driver)
    for name in unplaced:
        if not geo.has_profile(name):
            raise LayoutError(f"{geo.model} has no MIG profile {name!r}")
    if not unplaced:
        return list(placed)
    current_set = set(current)
    # Largest first prunes the search; identical profiles take increasing starts (no duplicate solutions).
    todo = sorted(unplaced, key=lambda n: (-geo.profile(n).memory_slices, -geo.profile(n).compute_slices, n))
    best: tuple[tuple[int, tuple[int, ...]], list[Placement]] | None = None

    def preference(p: Placement) -> int:
        prof = geo.profile(p.profile)
        # 3g prefers slice 4 (leaves 0-3 for 2g/1g and uses all compute); everything else packs low.
        return -p.start if prof.compute_slices == 3 else p.start

    def search(i: int, layout: list[Placement], min_start: int) -> None:
        nonlocal best
        if i == len(todo):
            extra = layout[len(placed):]
            score = (-sum(1 for p in layout if p in current_set), tuple(sorted(preference(p) for p in extra)))
            if best is None or score < best[0]:
                best = (score, list(layout))
            return
        name = todo[i]
        prof = geo.profile(name)
        for start in prof.starts:
            if start < min_start:
                continue
            cand = Placement(start=start, size=prof.memory_slices, profile=name)
            if geo.check_add_reason(layout, cand, driver=driver) is None:
                layout.append(cand)
                nxt = todo[i + 1] if i + 1 < len(todo) else None
                search(i + 1, layout, start + 1 if nxt == name else 0)
                layout.pop()

    search(0, list(placed), 0)
    if best is None:
        what = ", ".join(unplaced)
        raise LayoutError(f"{what} do not fit on {geo.model} next to {', '.join(map(str, placed)) or 'nothing'}",
                          reason="insufficient_resources")
    return best[1]


def plan(
    geo: GpuGeometry,
    current: Sequence[Placement],
    target: Sequence[Placement],
    *,
    mig_enabled: bool = True,
    target_mig_enabled: bool = True,
    driver: int = CURRENT_DRIVER,
) -> LayoutPlan:
    """Minimal steps from `current` to `target` (both must be valid; LayoutError otherwise)."""
    geo.validate(current, driver=driver)
    geo.validate(target, driver=driver)
    if len(set(target)) != len(target):
        raise LayoutError("target lists the same GI twice")
    if not mig_enabled and current:
        raise LayoutError("a GPU with MIG disabled cannot have GPU instances")
    if not target_mig_enabled and target:
        raise LayoutError("a target with MIG disabled cannot have GPU instances")
    target_set = set(target)
    current_set = set(current)
    kept = tuple(sorted(p for p in current if p in target_set))
    steps: list[Step] = []
    if not mig_enabled and target_mig_enabled:
        steps.append(Step(ENABLE_MIG))
    # Destroy from the highest slice down, create large GIs first: any order is legal (see module doc),
    # this one reads like what an operator would type.
    steps.extend(Step(DESTROY, p) for p in sorted((p for p in current if p not in target_set), reverse=True))
    steps.extend(
        Step(CREATE, p)
        for p in sorted((p for p in target if p not in current_set), key=lambda p: (-p.size, p.start))
    )
    if mig_enabled and not target_mig_enabled:
        steps.append(Step(DISABLE_MIG))
    return LayoutPlan(steps=tuple(steps), kept=kept, target=tuple(sorted(target)))


def apply_step(geo: GpuGeometry, layout: Sequence[Placement], step: Step, *, driver: int = CURRENT_DRIVER) -> list[Placement]:
    """The layout after `step`; LayoutError when the step is not legal on `layout` (used by tests and dry runs)."""
    if step.kind == DESTROY:
        if step.placement not in layout:
            raise LayoutError(f"destroy {step.placement}: no such GI")
        return [p for p in layout if p != step.placement]
    if step.kind == CREATE:
        assert step.placement is not None
        problem = geo.check_add_reason(layout, step.placement, driver=driver)
        if problem is not None:
            raise LayoutError(f"create {step.placement}: {problem[1]}", reason=problem[0])
        return [*layout, step.placement]
    if step.kind in (ENABLE_MIG, DISABLE_MIG):
        if layout:
            raise LayoutError(f"{step.kind} with GPU instances present")
        return list(layout)
    raise LayoutError(f"unknown step kind {step.kind!r}")
