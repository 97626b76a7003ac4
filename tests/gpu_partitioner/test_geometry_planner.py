"""Geometry tables, the maximal-layout enumeration and the planner's properties (hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from greenserve.common import mig_geometry as geometry
from greenserve.gpu_partitioner import layout_diff
from greenserve.common.mig_geometry import GpuGeometry, LayoutError, Placement
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CLASSIC = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]


def _brute_force_maximal(cands: list[tuple[int, int, int]], r510: bool) -> set[frozenset[tuple[int, int, int]]]:
    """Independent check: all subsets of (compute, start, size) placements, geometry's rules 1-5."""
    valid = []
    for n in range(1, 8):
        for combo in itertools.combinations(cands, n):
            masks = [((1 << size) - 1) << start for _, start, size in combo]
            if sum((m).bit_count() for m in masks) != sum(masks).bit_count():
                continue  # overlap
            if sum(c for c, _, _ in combo) > 7:
                continue
            computes = [c for c, _, _ in combo]
            if computes.count(1) > 7 or computes.count(2) > 3 or computes.count(3) > 2 or computes.count(4) > 1:
                continue
            if not r510 and 4 in computes and 3 in computes:
                continue
            valid.append(frozenset(combo))
    valid_set = set(valid)
    return {v for v in valid_set if not any(v | {c} in valid_set for c in cands if c not in v)}


def test_a100_classic_profiles_give_nvidia_19_layouts_and_18_before_r510() -> None:
    geo = geometry.geometry("A100-40GB")
    layouts = geo.maximal_layouts(CLASSIC)
    assert len(layouts) == 19
    assert len(geo.maximal_layouts(CLASSIC, driver=470)) == 18
    cands = [(geo.profile(p.profile).compute_slices, p.start, p.size) for p in geo.candidates(CLASSIC)]
    as_tuples = {frozenset((geo.profile(p.profile).compute_slices, p.start, p.size) for p in layout) for layout in layouts}
    assert as_tuples == _brute_force_maximal(cands, r510=True)
    # CLOVER Fig. 1 numbering named in its text: 1 = full GPU, 3 = [4g, 2g, 1g], 10 = {1g, 1g, 2g, 3g}, 19 = 7 x 1g
    def mix(layout: tuple[Placement, ...]) -> list[int]:
        return sorted(geo.profile(p.profile).compute_slices for p in layout)
    assert mix(layouts[0]) == [7]
    assert mix(layouts[2]) == [1, 2, 4]
    assert mix(layouts[9]) == [1, 1, 2, 3]
    assert mix(layouts[18]) == [1] * 7
    assert all(geo.is_maximal(layout, CLASSIC) for layout in layouts)


@pytest.mark.parametrize("model", geometry.MODEL_NAMES)
def test_every_model_has_the_reference_profile_table(model: str) -> None:
    geo = geometry.geometry(model)
    by_id = {p.profile_id: p for p in geo.profiles}
    assert sorted(by_id) == [0, 5, 9, 14, 15, 19, 20]
    assert (by_id[9].compute_slices, by_id[9].memory_slices, by_id[9].starts) == (3, 4, (0, 4))
    assert (by_id[15].compute_slices, by_id[15].memory_slices, by_id[15].starts) == (1, 2, (0, 2, 4, 6))
    assert by_id[20].media_extensions and by_id[20].max_instances == 1
    assert by_id[20].nvml_value == 7 and by_id[15].nvml_value == 9 and by_id[0].nvml_value == 4
    # 78 maximal layouts with the 2-memory-slice 1g (enumerated from the user guide's placements), same on every
    # model
    no_me = [p.name for p in geo.profiles if not p.media_extensions]
    assert len(geo.maximal_layouts(no_me)) == 78
    assert by_id[9].kubernetes_resource == f"nvidia.com/mig-{by_id[9].name}"
    assert by_id[20].kubernetes_resource.endswith(".me")


def test_validation_names_the_offending_placement() -> None:
    geo = geometry.geometry("A100-80GB")
    with pytest.raises(LayoutError) as exc:
        geo.validate([Placement(0, 4, "4g.40gb"), Placement(4, 4, "3g.40gb"), Placement(3, 1, "1g.10gb")])
    assert exc.value.index == 2 and exc.value.reason == geometry.REASON_RESOURCES
    with pytest.raises(LayoutError) as exc:
        geo.validate([Placement(0, 1, "9g.1gb")])
    assert exc.value.reason == geometry.REASON_INVALID
    with pytest.raises(LayoutError, match="R510"):
        geo.validate([Placement(0, 4, "4g.40gb"), Placement(4, 4, "3g.40gb")], driver=470)
    with pytest.raises(LayoutError, match=r"\+me"):
        geo.validate([Placement(0, 1, "1g.10gb+me"), Placement(1, 1, "1g.10gb")])


def test_model_identification() -> None:
    assert geometry.identify_model(pci_device_id=0x20B010DE) == "A100-40GB"
    assert geometry.identify_model(name="NVIDIA H100 80GB HBM3") == "H100-80GB"
    assert geometry.identify_model(name="NVIDIA A100-SXM4-80GB") == "A100-80GB"
    assert geometry.identify_model(name="NVIDIA H200") == "H200-141GB"
    assert geometry.identify_model(name="Tesla T4") is None


def test_parse_layout_forms() -> None:
    geo = geometry.geometry("A100-40GB")
    assert geometry.parse_layout(geo, "3g.20gb@4,1g.5gb") == ([Placement(4, 4, "3g.20gb")], ["1g.5gb"])
    assert geometry.parse_layout(geo, '[{"profile": "2g.10gb", "start": 2, "size": 2}]') == ([Placement(2, 2, "2g.10gb")], [])
    assert geometry.parse_layout(geo, "empty") == ([], [])
    with pytest.raises(LayoutError):
        geometry.parse_layout(geo, "3g.20gb@x")


# --------------------------------------------------------------------------------------------------
# Planner properties
# --------------------------------------------------------------------------------------------------


@st.composite
def valid_layout(draw: st.DrawFn, geo: GpuGeometry) -> list[Placement]:
    """A random valid layout: random candidates added while they fit."""
    cands = geo.candidates()
    order = draw(st.permutations(cands))
    limit = draw(st.integers(min_value=0, max_value=len(cands)))
    layout: list[Placement] = []
    for cand in order[:limit]:
        if geo.check_add_reason(layout, cand) is None:
            layout.append(cand)
    return layout


MODELS = st.sampled_from(geometry.MODEL_NAMES).map(geometry.geometry)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_plan_is_legal_at_every_step_reaches_target_and_keeps_shared_instances(data: st.DataObject) -> None:
    geo = data.draw(MODELS)
    current = data.draw(valid_layout(geo))
    target = data.draw(valid_layout(geo))
    result = layout_diff.plan(geo, current, target)
    layout = list(current)
    destroyed: set[Placement] = set()
    for step in result.steps:
        layout = layout_diff.apply_step(geo, layout, step)  # raises if the step is illegal here
        assert geo.is_valid(layout)
        if step.kind == layout_diff.DESTROY:
            destroyed.add(step.placement)  # type: ignore[arg-type]
    assert sorted(layout) == sorted(target)
    shared = set(current) & set(target)
    assert set(result.kept) == shared and not (shared & destroyed)
    assert len(result.steps) == len(set(current) ^ set(target))  # minimal: nothing touched twice


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_unplaced_targets_keep_as_many_instances_as_any_placement_would(data: st.DataObject) -> None:
    geo = data.draw(MODELS)
    current = data.draw(valid_layout(geo))
    wanted = data.draw(valid_layout(geo))
    names = [p.profile for p in wanted]
    resolved = layout_diff.resolve_target(geo, [], names, current)
    assert geo.is_valid(resolved) and sorted(p.profile for p in resolved) == sorted(names)
    # no placement of the same profiles keeps more: compare with the random placement we drew
    assert len(set(resolved) & set(current)) >= len(set(wanted) & set(current))


def test_plan_with_mig_off_enables_first() -> None:
    geo = geometry.geometry("H100-80GB")
    result = layout_diff.plan(geo, [], [Placement(0, 8, "7g.80gb")], mig_enabled=False)
    assert [s.kind for s in result.steps] == [layout_diff.ENABLE_MIG, layout_diff.CREATE]
