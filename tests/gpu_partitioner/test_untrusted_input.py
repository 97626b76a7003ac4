"""Input from outside that the gpu-partitioner must refuse cleanly and without unbounded work or memory (audit):
mig-parted YAML (ConvertMigPartedConfig) and ListLayouts' driver branch and profile lists."""

from __future__ import annotations

import pytest
from greenserve.gpu_partitioner import geometry, migparted
from greenserve.gpu_partitioner.migparted import MigPartedError

A100 = geometry.geometry("A100-40GB")


@pytest.mark.parametrize("text", ["[" * 50_000 + "]" * 50_000, "a: " + "{b: " * 5_000 + "1" + "}" * 5_000],
                         ids=["nested-lists", "nested-mappings"])
def test_deeply_nested_yaml_is_a_clean_refusal(text: str) -> None:
    """A few kB of nested brackets made PyYAML recurse past Python's limit: RecursionError, which
    ConvertMigPartedConfig answered with INTERNAL instead of INVALID_ARGUMENT naming the YAML."""
    with pytest.raises(MigPartedError) as exc:
        migparted.parse(text, A100)
    assert exc.value.path == "yaml"
