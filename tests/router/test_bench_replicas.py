"""The replicas bench's trace handling and argument checks (the figures themselves: greenserve bench
router-replicas, docs/router.md)."""

from __future__ import annotations

import pytest
from greenserve.bench import router_replicas as br
from greenserve.router.routing.prefix_index import chain_hashes, render_chat


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


def test_the_phase_starts_its_emulated_engines() -> None:
    """The phase's engines start through bench_launch.start_engine (it failed with AttributeError 'engine' once the
    bench learned --engine noop, so --replicas-phase and bench router-replicas crashed before any figure)."""
    import urllib.request

    from greenserve.bench import router_launch as rb
    from greenserve.bench.router_replicas import engine_args

    procs = rb.Procs()
    try:
        url = rb.start_engine(procs, engine_args(time_scale=20.0), None)
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            assert b"vllm:prefix_cache_queries" in resp.read()  # the emulator: the hit rate is read from these
    finally:
        procs.stop()
