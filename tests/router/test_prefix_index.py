"""Prefix index: chained hashes, per-engine matches, LRU eviction, and the memory cap on the Mooncake trace."""

from __future__ import annotations

import json
import tracemalloc

from greenserve.router.routing.prefix_index import PrefixIndex, chain_hashes, render_chat
from greenserve.simulator.workloads import trace_path

MOONCAKE = trace_path("mooncake")


def test_chain_hashes_are_prefix_chained_and_stable() -> None:
    a = chain_hashes("x" * 1000 + "tail A", 100)
    b = chain_hashes("x" * 1000 + "tail B", 100)
    assert len(a) == 10 and a == b  # the differing tail is a partial block: not hashed
    c = chain_hashes("y" + "x" * 999, 100)
    assert all(x != y for x, y in zip(a, c))  # one early change changes every later hash
    assert chain_hashes("abc" * 100, 64) == chain_hashes("abc" * 100, 64)


def test_render_chat_includes_every_message_and_role() -> None:
    one = render_chat([("system", "S"), ("user", "hello")])
    two = render_chat([("system", "S"), ("user", "other")])
    assert one != two and "hello" in one and "S" in one
    assert render_chat([("user", "x")]) != render_chat([("assistant", "x")])


def test_match_reports_leading_blocks_per_engine() -> None:
    idx = PrefixIndex(max_bytes=1 << 20)
    idx.insert("a", [1, 2, 3, 4])
    idx.insert("b", [1, 2, 9])
    idx.insert("c", [7])
    assert idx.match([1, 2, 3, 4, 5]) == {"a": 4, "b": 2}
    assert idx.match([1, 2, 9]) == {"a": 2, "b": 3}
    assert idx.match([5, 6]) == {}
    assert idx.match([]) == {}
    idx.remove_engine("a")
    assert idx.match([1, 2, 3]) == {"b": 2}


def test_lru_evicts_oldest_and_cap_is_global() -> None:
    idx = PrefixIndex(max_bytes=100 * 320)  # 100 entries in all
    idx.add_engine("a")
    idx.add_engine("b")  # 50 each
    idx.insert("a", list(range(40)))
    idx.insert("a", list(range(100, 130)))  # 70 > 50: the oldest 20 go
    assert idx.engine_entries("a") == 50
    assert idx.match(list(range(40))) == {}  # block 0 evicted: no leading match
    assert idx.match(list(range(100, 130)))["a"] == 30
    for e in "cdefgh":  # more engines shrink every share: the total stays bounded
        idx.add_engine(e)
        idx.insert(e, list(range(1000 * ord(e), 1000 * ord(e) + 50)))
    assert idx.entries() <= idx.max_entries
    assert idx.estimated_bytes() <= idx.max_bytes


def test_memory_stays_under_cap_on_mooncake_trace() -> None:
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    cap = 2 * 1024 * 1024
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    idx = PrefixIndex(max_bytes=cap)
    engines = [f"e{i}" for i in range(8)]
    peak_entries = 0
    hits = 0
    for i, row in enumerate(rows):
        # 64-bit hashes like the router's own (the trace's ids are small ints, which cost less)
        hashes = [(h * 0x9E3779B97F4A7C15 + 1) & ((1 << 64) - 1) for h in row["hash_ids"]]
        m = idx.match(hashes)
        engine = max(m, key=m.get) if m and i % 3 else engines[i % 8]
        hits += m.get(engine, 0)
        idx.insert(engine, hashes)
        peak_entries = max(peak_entries, idx.entries())
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert used <= cap, f"index uses {used} bytes > cap {cap}"
    assert peak_entries <= idx.max_entries
    assert idx.evictions > 0 and hits > 0  # the cap was binding and the index still found reuse


def test_chain_hashes_are_the_blake2b_of_each_whole_prefix() -> None:
    """Hash i is blake2b (8 bytes, little-endian) of the seed and the prompt's UTF-8 bytes up to the end of
    block i, for every full block and no partial one, up to max_blocks: what other replicas and processes
    compute for the same prompt, whatever the loop that computes it."""
    import hashlib

    from greenserve.router.routing.prefix_index import _SEED

    text = "ein Präfix, 前缀 and a prefix; " * 90  # multi-byte characters straddle block edges
    data = text.encode("utf-8")
    for block_chars, max_blocks in ((256, 4096), (64, 4096), (100, 7)):
        got = chain_hashes(text, block_chars, max_blocks)
        n = min(len(data) // block_chars, max_blocks)
        want = [int.from_bytes(hashlib.blake2b(_SEED + data[: (i + 1) * block_chars], digest_size=8).digest(),
                               "little") for i in range(n)]
        assert list(got) == want and n > 0
