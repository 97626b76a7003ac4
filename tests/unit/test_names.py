"""greenserve.common.names: the one name pattern (issue 21, defect 16: a pool "nl\n" became a file)."""

from __future__ import annotations

import grpc
import pytest

from greenserve.common.errors import InvalidArgument
from greenserve.common.names import check_name, check_path_name, is_name


@pytest.mark.parametrize("name", ["p1", "pool-a", "a.b_c:d", "A" * 128, "0", "llama3.1-8b"])
def test_good_names(name: str) -> None:
    assert check_name("pool", name) == name and is_name(name)


@pytest.mark.parametrize("name", ["", "nl\n", "a\nb", "a/b", ".x", "..", "-x", ":x", "_x", "a b", "a\tb", "é",
                                  "A" * 129, "a\x00"])
def test_bad_names_name_the_field(name: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        check_name("server.pool", name)
    assert exc.value.field == "server.pool" and exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert not is_name(name)


def test_max_chars_and_long_values_are_shortened() -> None:
    assert is_name("a" * 64, max_chars=64) and not is_name("a" * 65, max_chars=64)
    with pytest.raises(InvalidArgument) as exc:
        check_name("id", "x" * 100_000 + "\n")
    assert len(str(exc.value)) < 300


@pytest.mark.parametrize("name", ["meta-llama/Meta-Llama-3-8B-Instruct", "llama/a", "a", "org/model:v1/part"])
def test_good_path_names(name: str) -> None:
    assert check_path_name("model", name) == name


@pytest.mark.parametrize("name", ["", "/a", "a/", "a//b", "a/../b", "a/.x", "a b/c", "a/b\n", "x" * 257])
def test_bad_path_names(name: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        check_path_name("model", name)
    assert exc.value.field == "model"
