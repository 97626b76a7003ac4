"""Cache index: LCS scores (GreenCache Eq. 7-9), eviction choice, TTL expiry and snapshots."""

from __future__ import annotations

import numpy as np
import pytest

from greenserve.common.cache_index.index import CacheIndex


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


def _brute_victims(index: CacheIndex, count: int, now: float, exclude: set[int]) -> list[tuple[float, int]]:
    """Scores of the victims of evicting one by one, rescoring everything (leaves only, truncation reset)."""
    n = index._n
    live = {s for s in range(n) if index.key_hash[s] != 0}
    children = {s: 0 for s in live}
    for s in live:
        p = int(index.parent[s])
        if p in live:
            children[p] += 1
    reset: set[int] = set()
    out = []
    for _ in range(count):
        best = None
        for s in live:
            if children[s] or s in exclude:
                continue
            if s in reset and index.truncation_reset:
                num = max(int(index.turn[s]), 1) * float(index.tokens[s])
            else:
                num = float(index._numerator(np.array([s]))[0])
            age = max(now - float(index.last_access_s[s]), 1e-3)
            if index.tau_s != np.inf and int(index.turn[s]) == 0:  # hit part decays with Age
                base = float(index.tokens[s])
                num = base + (num - base) * float(np.exp(-age / index.tau_s))
            sc = num / max(float(index.size_bytes[s]), 1.0) / age
            if best is None or sc < best[0]:
                best = (sc, s)
        if best is None:
            break
        out.append(best)
        live.discard(best[1])
        p = int(index.parent[best[1]])
        if p in live:
            children[p] -= 1
            if children[p] == 0:
                reset.add(p)
    return out


@pytest.mark.parametrize(("hit_decay", "reset"), [("none", True), (20.0, False), (20.0, True)])
@pytest.mark.parametrize("seed", range(6))
def test_incremental_choice_is_exact(seed: int, hit_decay: str | float, reset: bool) -> None:
    """The pool + dirty + bound choice equals one-by-one eviction with a full rescoring, over random
    stores (with prefix chains), hits, touches and evictions as time moves on (with and without hit
    decay and truncation reset)."""
    rng = np.random.default_rng(seed)
    index = CacheIndex(initial_capacity=16, hit_decay=hit_decay, truncation_reset=reset)
    cap = 300
    index.ensure_capacity(cap)
    chains: list[list[int]] = []
    free = list(range(cap))
    now = 0.0
    for _step in range(400):
        now += float(rng.exponential(1.0))
        if free and rng.random() < 0.6:
            base = chains[int(rng.integers(len(chains)))] if chains and rng.random() < 0.5 else []
            base = [s for s in base if index.key_hash[s] != 0]
            length = int(rng.integers(1, 5))
            new = [free.pop() for _ in range(min(length, len(free)))]
            parents = [base[-1] if base else -1] + new[:-1]
            index.store_slots(np.array(new), tokens=rng.integers(1, 513, len(new)), size_bytes=np.full(len(new), 512.0),
                              now_s=now, parents=np.array(parents))
            chains.append(base + new)
        live = np.flatnonzero(index.key_hash[:cap] != 0)
        if len(live) and rng.random() < 0.5:
            hit = np.unique(rng.choice(live, size=min(3, len(live)), replace=False))
            index.hit_slots(hit, hit_tokens=np.full(len(hit), 100.0), now_s=now)
        if len(live) > 20 and rng.random() < 0.5:
            exclude = rng.choice(live, size=3, replace=False)
            count = int(rng.integers(1, 6))
            expected = _brute_victims(index, count, now, {int(x) for x in exclude})
            got = index.choose_victims(count, now, exclude=exclude)
            assert got.tolist() == [s for _, s in expected]
            index.remove_slots(got)
            free.extend(int(v) for v in got)
    assert index.refreshes < 200  # most choices came from the pool, not a full pass


def test_incremental_choice_matches_full_pass_scores() -> None:
    """Same victims (by score) from the pool path as from a fresh index state's full pass."""
    rng = np.random.default_rng(1)
    index = CacheIndex()
    n = 2000
    index.ensure_capacity(n)
    index.store_slots(np.arange(n), tokens=rng.integers(1, 513, n), size_bytes=np.full(n, 512.0), now_s=0.0)
    index.last_access_s[:n] = rng.uniform(0, 1000, n)
    index.hits[:n] = rng.poisson(2, n)
    index._refresh_values(np.arange(n))
    now = 1000.0
    for _ in range(30):
        now += 0.7
        expected = _brute_victims(index, 4, now, set())
        got = index.choose_victims(4, now)
        assert np.allclose(index.scores(now, got), [sc for sc, _ in expected])
        index.remove_slots(got)
        new = np.flatnonzero(index.key_hash[:n] == 0)[:4]
        index.store_slots(new, tokens=np.full(4, 256), size_bytes=np.full(4, 512.0), now_s=now)
    assert index.refreshes <= 10  # the pool served most choices


def test_prefix_chain_evicts_leaves_first_and_truncation_resets_hits() -> None:
    index = CacheIndex(truncation_reset=True)
    index.store("a", tokens=512, size_bytes=512, now_s=0.0)
    index.store("b", tokens=512, size_bytes=512, now_s=0.0, parent_key="a")
    index.store("c", tokens=512, size_bytes=512, now_s=1.0)
    for _ in range(5):
        index.hit("a", hit_tokens=512, now_s=0.0)
    # b is the lowest leaf; a (6 accesses) is protected while b is cached, then scored as truncated.
    order = [index.key_of(int(s)) for s in index.choose_victims(3, 10.0)]
    assert order == ["b", "a", "c"]
    index.remove("b")
    assert int(index.hits[index.slot("a")]) == 0  # truncated: hits restart
    no_reset = CacheIndex(truncation_reset=False)
    no_reset.store("a", tokens=512, size_bytes=512, now_s=0.0)
    no_reset.store("b", tokens=512, size_bytes=512, now_s=0.0, parent_key="a")
    no_reset.store("c", tokens=512, size_bytes=512, now_s=1.0)
    for _ in range(5):
        no_reset.hit("a", hit_tokens=512, now_s=0.0)
    assert [no_reset.key_of(int(s)) for s in no_reset.choose_victims(3, 10.0)] == ["b", "c", "a"]


def test_keys_round_trip_compactly_and_table_grows(tmp_path) -> None:
    index = CacheIndex(initial_capacity=16)
    lm = [f"{i:064x}@meta-llama/Llama-3.1-8B@16777472@tenant-{i % 3}" for i in range(500)]
    odd = ["not-hex@x", "ABCD", "a" * 70, "", "0f@m@1@s@2"]
    for i, k in enumerate(lm + odd):
        index.store(k, tokens=1, size_bytes=1, now_s=float(i))
    for k in lm[::2]:
        assert index.remove(k)
    assert len(index) == 250 + len(odd)
    for k in lm[1::2] + odd:
        assert index.key_of(index.slot(k)) == k
    assert all(k not in index for k in lm[::2])
    assert index.array_bytes_per_slot() <= 120
    index.save(tmp_path / "p.npz")
    back = CacheIndex.load(tmp_path / "p.npz")
    for k in lm[1::2] + odd:
        assert back.key_of(back.slot(k)) == k
    assert "0" * 64 + "@meta-llama/Llama-3.1-8B@16777472@tenant-0" not in back


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


def test_hit_decay_weights_hits_by_idle_time() -> None:
    index = CacheIndex(hit_decay=100.0)
    index.store("a", tokens=100, size_bytes=1000, now_s=0.0)
    index.hit("a", hit_tokens=100, now_s=10.0)
    index.hit("a", hit_tokens=100, now_s=10.0)
    # (tokens + hits x tokens x exp(-Age / tau)) / (size x Age)
    assert index.scores(60.0)[index.slot("a")] == pytest.approx((100 + 2 * 100 * np.exp(-0.5)) / (1000 * 50.0))


def test_online_tau_is_a_high_quantile_of_sampled_regaps() -> None:
    index = CacheIndex(hit_decay="online")
    assert index.estimated_tau_s() == np.inf
    ids = np.arange(20000)
    index.observe_accesses(ids, 0.0)
    index.observe_accesses(ids[:10000], 100.0)  # gap 100 s for half the keys
    index.observe_accesses(ids[10000:], 1000.0)  # gap 1000 s for the other half
    tau = index.estimated_tau_s()
    assert 1000.0 <= tau <= 1000.0 * 2 ** 0.25  # the 90 % quantile bin: the 1000 s gaps


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_choice_is_exact_with_hit_decay(seed: int) -> None:
    rng = np.random.default_rng(seed)
    index = CacheIndex(hit_decay=30.0)
    n = 3000
    index.ensure_capacity(n)
    live = 0
    for step in range(60):
        now = float(step * 5)
        new = np.arange(live, min(live + 50, n))
        index.store_slots(new, tokens=rng.integers(1, 512, len(new)).astype(float),
                          size_bytes=np.full(len(new), 512.0), now_s=now - rng.uniform(0, 100, len(new)).min())
        live += len(new)
        alive = np.flatnonzero(index.key_hash[:n] != 0)
        hit = rng.choice(alive, size=min(40, len(alive)), replace=False)
        index.hit_slots(hit, hit_tokens=np.full(len(hit), 512.0), now_s=now)
        victims = index.choose_victims(20, now + 1.0)
        sc_all = index.scores(now + 1.0)
        # The first victim is the global minimum of every live leaf's score (no chain here).
        assert sc_all[victims[0]] == pytest.approx(float(np.min(sc_all[index.key_hash[:n] != 0])))
        # Victims come in non-decreasing score order.
        assert np.all(np.diff(sc_all[victims]) >= -1e-12)
        index.remove_slots(victims)
