"""Cache index: LCS scores (GreenCache Eq. 7-9), eviction choice, TTL expiry and snapshots."""

from __future__ import annotations

import numpy as np
import pytest

from greenserve.cache_manager.index import CacheIndex


def test_score_follows_eq7_entry_form() -> None:
    index = CacheIndex()
    index.store("a", tokens=100, size_bytes=1000, now_s=0.0)
    index.hit("a", hit_tokens=100, now_s=10.0)
    # tokens x (hits + 1) / (size x age since last access)
    assert index.scores(30.0)[index.slot("a")] == pytest.approx(100 * 2 / (1000 * 20.0))


def test_accumulated_token_term_and_stored_age() -> None:
    index = CacheIndex(token_term="accumulated", age_basis="stored")
    index.store("a", tokens=100, size_bytes=1000, now_s=0.0)
    index.hit("a", hit_tokens=80, now_s=10.0)
    assert index.scores(40.0)[index.slot("a")] == pytest.approx(2 * (80 + 100) / (1000 * 40.0))


def test_turn_variant_prefers_deeper_turns() -> None:
    index = CacheIndex()
    index.store("t1", tokens=100, size_bytes=1000, now_s=0.0, turn=1)
    index.store("t5", tokens=100, size_bytes=1000, now_s=0.0, turn=5)
    sc = index.scores(10.0)
    assert sc[index.slot("t5")] == pytest.approx(5 * sc[index.slot("t1")])


def test_document_variant_shares_hits_across_entries_of_a_document() -> None:
    index = CacheIndex()
    index.store("d1", tokens=100, size_bytes=1000, now_s=0.0, document_id="doc")
    index.store("d2", tokens=100, size_bytes=1000, now_s=0.0, document_id="doc")
    index.store("x", tokens=100, size_bytes=1000, now_s=0.0)
    index.hit("d1", hit_tokens=100, now_s=0.0, document_id="doc")
    sc = index.scores(10.0)
    # d2 was never hit itself but its document was: it outranks the unrelated entry x.
    assert sc[index.slot("d2")] > sc[index.slot("x")]


def test_choose_victims_lowest_first_and_excludes() -> None:
    index = CacheIndex()
    for i, hits in enumerate([5, 0, 3, 1]):
        index.store(f"k{i}", tokens=10, size_bytes=10, now_s=0.0)
        for _ in range(hits):
            index.hit(f"k{i}", hit_tokens=10, now_s=0.0)
    victims = [index.key_of(int(s)) for s in index.choose_victims(2, 5.0)]
    assert victims == ["k1", "k3"]
    ex = np.array([index.slot("k1")])
    assert [index.key_of(int(s)) for s in index.choose_victims(1, 5.0, exclude=ex)] == ["k3"]


def test_removed_slots_are_reused_and_never_chosen() -> None:
    index = CacheIndex()
    index.store("a", tokens=1, size_bytes=5, now_s=0)
    index.store("b", tokens=1, size_bytes=7, now_s=0)
    index.remove("a")
    assert len(index) == 1 and index.bytes_in_use == 7
    assert [index.key_of(int(s)) for s in index.choose_victims(5, 1.0)] == ["b"]
    index.store("c", tokens=1, size_bytes=1, now_s=0)
    assert index.slot("c") == 0


def test_sampled_choice_returns_live_entries() -> None:
    index = CacheIndex(max_scan_entries=64)
    for i in range(1000):
        index.store(str(i), tokens=1, size_bytes=1, now_s=float(i))
    victims = index.choose_victims(3, 2000.0)
    assert len(victims) == 3 and all(index.live[victims])


def test_expired_by_group_ttl() -> None:
    index = CacheIndex()
    index.store("g0", tokens=1, size_bytes=1, now_s=0, group=0)
    index.store("g1", tokens=1, size_bytes=1, now_s=0, group=1)
    index.store("none", tokens=1, size_bytes=1, now_s=0)
    got = {index.key_of(int(s)) for s in index.expired(10.0, np.array([5.0, 50.0]), 1.0)}
    assert got == {"g0", "none"}


def test_snapshot_roundtrip(tmp_path) -> None:
    index = CacheIndex()
    index.store("a", tokens=3, size_bytes=30, now_s=1.0, turn=2)
    index.store("b", tokens=4, size_bytes=40, now_s=1.0, document_id="doc")
    index.store("c", tokens=5, size_bytes=50, now_s=1.0)
    index.hit("b", hit_tokens=4, now_s=2.0, document_id="doc")
    index.remove("c")
    path = tmp_path / "p.npz"
    index.save(path)
    back = CacheIndex.load(path)
    assert len(back) == 2 and back.bytes_in_use == 70 and "c" not in back
    np.testing.assert_allclose(back.scores(9.0)[:2], index.scores(9.0)[:2])
    back.store("d", tokens=1, size_bytes=1, now_s=3.0)
    assert back.slot("d") == 2  # the freed slot of "c" is reused


def test_bad_options_rejected() -> None:
    with pytest.raises(ValueError):
        CacheIndex(age_basis="never")
    with pytest.raises(ValueError):
        CacheIndex(token_term="x")
