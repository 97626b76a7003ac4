"""`capacity.simulator_profile_name`: an engine on hardware the simulator has no profile of is predicted from the
closest stored profile of its model: the same GPU, family, maker's line, a single GPU, in that order, and a MIG
slice for a slice. Found by the demo: its A100-40GB 3g.20gb engines were predicted as ``llama3-8b@2xL40`` (the
model's first profile by name: two L40s' idle power for one slice)."""

from __future__ import annotations

import pytest

from greenserve.optimizer.capacity import simulator_profile_name


@pytest.mark.parametrize(("hardware", "expected"), [
    ("A100-80GB", ("llama3-8b@A100-80GB", True)),
    ("A100-40GB-MIG-3g.20gb", ("llama3-8b@A100-80GB-MIG-3g.40gb", False)),  # was llama3-8b@2xL40
    ("A100-80GB-MIG-2g.20gb", ("llama3-8b@A100-80GB-MIG-3g.40gb", False)),  # a slice of the same GPU
    ("A100-40GB", ("llama3-8b@A100-80GB", False)),  # the family's whole GPU, not its slice
    ("H200", ("llama3-8b@H100-80GB", False)),  # the maker's line, not the A100 first by name
    ("H200-MIG-1g.18gb", ("llama3-8b@H100-80GB-MIG-3g.40gb", False)),
    ("L4", ("llama3-8b@A100-80GB", False)),  # no single L GPU profile: a single GPU, never the 2xL40 pair
])
def test_the_closest_profile_of_the_model(hardware: str, expected: tuple[str, bool]) -> None:
    assert simulator_profile_name("llama3-8b", hardware) == expected
