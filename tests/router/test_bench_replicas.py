"""The replicas bench's trace handling and argument checks (the figures themselves: greenserve bench
router-replicas, docs/router.md)."""

from __future__ import annotations

import pytest
from greenserve.router import bench_replicas as br
from greenserve.router.prefix_index import chain_hashes, render_chat


def test_each_request_waits_for_the_latest_request_it_shares_the_longest_prefix_with() -> None:
    rows = [(0, 1, 2), (0, 5), (0, 1, 2, 3), (0, 1, 9), (0, 1, 2, 3, 4), (7,)]
    assert br.dependencies(rows) == [None, None, 0, 2, 2, None]


def test_a_requests_chat_keeps_its_conversation_key_across_turns() -> None:
    def key(blocks: tuple[int, ...]) -> int:
        msgs = br.chat(blocks, 8)
        return chain_hashes(render_chat((m["role"], m["content"]) for m in msgs)).affinity_key

    assert br.chat((0, 1, 2), 4)[0]["content"] == br.block_text(0, 4)
    assert key((0, 1, 2)) == key((0, 1, 3, 4, 5)) != key((0, 6, 2))


@pytest.mark.parametrize("flag", ["--requests", "--replicas", "--trials"])
def test_bad_values_are_refused(flag: str) -> None:
    args = br._parser("bench").parse_args([flag, "0"])
    with pytest.raises(SystemExit, match=flag):
        br.run(args)
