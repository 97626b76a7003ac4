"""Prefix-cache tiers of one simulated engine: GPU HBM (vLLM prefix cache), host DRAM (LMCache L1), disk (L2).

Blocks are the trace's prefix-block hashes. A prompt's cached prefix is its leading run of blocks held in
some tier; the lookup splits it monotonically by the fastest tier holding each block (HBM, then DRAM, then
disk). A prefilled prompt is written through to every tier that is on (HBM takes what the free KV pool holds).

Each LMCache tier evicts by its own policy (`TierSpec.policy`):

- ``LRU`` (LMCache's default): a prompt's write-through touches its blocks in prompt order.
- ``FIFO``: insertion order; a block already held is not moved.
- ``LCS``: GreenCache's Least Carbon Savings score through the cache-manager's `CacheIndex` (hit decay with
  tau estimated online, prefix chain: only leaves are evicted); a block the write-through finds held counts
  as a hit. All blocks are the same size here, so the score is the recency-weighted reuse of Eq. 7.

The disk tier can be **elastic** (Kareto Sec. 4): with `TierSpec.ttl_s` (and per-group TTLs, a group being
the prompt's first block, i.e. its prefix subtree) a block idle past its group's TTL is dropped, and the
capacity (0: unbounded) is only a ceiling; what the tier costs is then its *average* size, reported as
block-seconds (`Tier.block_seconds`), so reuse at the same average disk use can be compared with a
fixed-capacity tier. TTLs need the LRU policy (expiry is by idle time, kept in LRU order per group).

The disk tier's read bandwidth and latency come from its medium (`DISK_MEDIA`; default: the engine
profile's figures).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from greenserve.common.cache_index.index import CacheIndex

EVICTION_POLICIES = ("LRU", "FIFO", "LCS")

# Sequential read bandwidth (bytes/s) and access latency (s) per disk medium (datasheet figures).
DISK_MEDIA: dict[str, tuple[float, float]] = {
    "nvme": (6.9e9, 1e-4),  # Samsung PM9A3 U.2 PCIe Gen4: 6,900 MB/s (the default profile's disk)
    "sata-ssd": (5.6e8, 1e-4),  # Samsung 870 EVO SATA III: up to 560 MB/s
    "hdd": (2.7e8, 8e-3),  # Seagate Exos X18 7,200 rpm: 270 MB/s sustained, ~4.2 ms latency + seek
}


@dataclass(frozen=True)
class TierSpec:
    """One LMCache tier of an engine: capacity in tokens (0 = off, unless elastic), eviction policy, TTLs."""

    capacity_tokens: int = 0
    policy: str = "LRU"
    ttl_s: float = 0.0  # idle TTL of every block (0: none); > 0 makes the tier elastic
    group_ttls_s: Mapping[int, float] | None = None  # TTL per group (a prompt block, see group_depth); others: ttl_s
    group_depth: int = 0  # which block of a prompt names its group: 0 the first; 1 when all prompts share block 0

    def __post_init__(self) -> None:
        if self.capacity_tokens < 0:
            raise ValueError("capacity_tokens: must be >= 0")
        if self.policy not in EVICTION_POLICIES:
            raise ValueError(f"policy: must be one of {EVICTION_POLICIES}, got {self.policy!r}")
        ttls = list((self.group_ttls_s or {}).values()) + [self.ttl_s]
        if any(not (t >= 0) for t in ttls):
            raise ValueError("ttl_s: TTLs must be >= 0 s")
        if self.group_depth < 0:
            raise ValueError("group_depth: must be >= 0")
        if self.elastic and self.policy != "LRU":
            raise ValueError("policy: TTLs (an elastic tier) need the LRU policy")

    @property
    def elastic(self) -> bool:
        return self.ttl_s > 0 or bool(self.group_ttls_s)


class Tier:
    """Contents of one LMCache tier (`TierSpec`), with its time-integral of size (block-seconds)."""

    def __init__(self, spec: TierSpec, hash_tokens: int) -> None:
        self.spec = spec
        self.policy = spec.policy
        self.cap = spec.capacity_tokens // hash_tokens if spec.capacity_tokens else (1 << 62 if spec.elastic else 0)
        self.on = self.cap > 0
        self.hash_tokens = hash_tokens
        self.blocks: OrderedDict[int, int] = OrderedDict()  # block -> group; LRU / FIFO order, oldest first
        self.ttl_s = spec.ttl_s
        self.group_ttls = dict(spec.group_ttls_s or {})
        self.by_group: dict[int, OrderedDict[int, float]] = {}  # elastic: group -> block -> last access
        self._t: float | None = None  # time of the last size change (block-seconds)
        self.block_seconds = 0.0
        self.index: CacheIndex | None = None
        if self.policy == "LCS" and self.on:
            self.index = CacheIndex(initial_capacity=1024)
            self.slot_of: dict[int, int] = {}
            self.block_of: list[int] = []
            self.free: list[int] = []

    def __contains__(self, block: int) -> bool:
        return block in self.blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def _account(self, now: float) -> None:
        if self._t is not None and now > self._t:
            self.block_seconds += len(self.blocks) * (now - self._t)
        self._t = now if self._t is None else max(self._t, now)

    def expire(self, now: float) -> None:
        """Drop blocks idle past their group's TTL (elastic tiers)."""
        if not self.by_group:
            return
        self._account(now)
        for group, order in list(self.by_group.items()):
            ttl = self.group_ttls.get(group, self.ttl_s)
            if ttl <= 0:
                continue
            while order:
                block, t = next(iter(order.items()))
                if now - t <= ttl:
                    break
                order.popitem(last=False)
                self.blocks.pop(block, None)
                self.block_seconds -= now - (t + ttl)  # it left when its TTL ran out, not now
            if not order:
                del self.by_group[group]

    def put(self, hashes: tuple[int, ...], now: float) -> None:
        """Write-through of a prompt's blocks (touching those held), then evict down to the capacity."""
        if not self.on or not hashes:
            return
        self._account(now)
        if self.index is not None:
            self._put_lcs(hashes, now)
            return
        blocks = self.blocks
        group = hashes[min(self.spec.group_depth, len(hashes) - 1)]
        lru = self.policy == "LRU"
        for h in hashes:
            if h in blocks:
                if lru:
                    blocks.move_to_end(h)
            else:
                blocks[h] = group
        if self.spec.elastic:
            order = self.by_group.setdefault(group, OrderedDict())
            for h in hashes:
                g = blocks[h]
                o = order if g == group else self.by_group.setdefault(g, OrderedDict())
                o[h] = now
                o.move_to_end(h)
        excess = len(blocks) - self.cap
        for _ in range(max(0, excess)):
            block, g = blocks.popitem(last=False)
            if self.by_group:
                self.by_group.get(g, {}).pop(block, None)  # type: ignore[call-overload]

    def _put_lcs(self, hashes: tuple[int, ...], now: float) -> None:
        index, slot_of, blocks = self.index, self.slot_of, self.blocks
        assert index is not None
        ids = np.fromiter(hashes, dtype=np.int64)
        index.observe_accesses(ids, now)
        held = [slot_of[h] for h in hashes if h in slot_of]
        if held:
            index.hit_slots(np.asarray(held), hit_tokens=np.full(len(held), float(self.hash_tokens)), now_s=now)
        new = [h for h in dict.fromkeys(hashes) if h not in slot_of]
        excess = len(blocks) + len(new) - self.cap
        if excess > 0:
            victims = index.choose_victims(excess, now, exclude=np.asarray(held, dtype=np.int64))
            index.remove_slots(victims)
            for s in victims.tolist():
                b = self.block_of[s]
                del slot_of[b]
                blocks.pop(b, None)
                self.free.append(s)
        room = self.cap - len(blocks)
        new = new[:max(0, room)]
        if not new:
            return
        slots = []
        for h in new:
            s = self.free.pop() if self.free else len(self.block_of)
            if s == len(self.block_of):
                self.block_of.append(h)
            else:
                self.block_of[s] = h
            slot_of[h] = s
            blocks[h] = hashes[0]
            slots.append(s)
        index.ensure_capacity(len(self.block_of))
        prev = {h: (slot_of.get(hashes[i - 1], -1) if i else -1) for i, h in enumerate(hashes)}
        parents = np.asarray([prev[h] for h in new], dtype=np.int64)
        size = np.full(len(new), float(self.hash_tokens))
        index.store_slots(np.asarray(slots, dtype=np.int64), tokens=size, size_bytes=size, now_s=now, parents=parents)


def allocated_byte_seconds(tier: Tier, kv_bytes_per_token: float, end: float, duration_s: float) -> float:
    """What GreenCache Eq. 4 charges a tier for over the replay, as bytes x seconds: a fixed-capacity tier its
    whole capacity for `duration_s` (storage is allocated whether used or not), an elastic tier what it held
    (Kareto's Capacity x TTL cost)."""
    if not tier.on:
        return 0.0
    block_bytes = tier.hash_tokens * kv_bytes_per_token
    if tier.spec.elastic:
        tier._account(end)
        return tier.block_seconds * block_bytes
    return tier.cap * block_bytes * duration_s


def storage_embodied_g(byte_seconds: dict[str, float], params: object) -> dict[str, float]:
    """Embodied carbon of the allocated DRAM and disk tiers (GreenCache Eq. 4, DRAM by its footnote 1):
    S x T x C_e^Unit / LT, with S x T given as byte-seconds; `params` is a `carbon_params.CarbonParams`."""
    from greenserve.common.embodied_carbon import cache_embodied_g

    rates = {"dram": (params.dram_embodied_g_per_tb, params.dram_lifetime_s),  # type: ignore[attr-defined]
             "disk": (params.ssd_embodied_g_per_tb, params.ssd_lifetime_s)}  # type: ignore[attr-defined]
    return {tier: cache_embodied_g(duration_s=1.0, lifetime_s=rates[tier][1], ssd_embodied_g_per_tb=rates[tier][0],
                                      allocated_bytes=byte_seconds.get(tier, 0.0)) for tier in rates}


class PrefixTiers:
    """HBM / DRAM / disk contents of one engine (hot path: plain attributes)."""

    __slots__ = ("disk", "disk_cap", "dram", "dram_cap", "hash_tokens", "hbm")

    def __init__(self, hash_tokens: int, dram: TierSpec | int, disk: TierSpec | int) -> None:
        self.hbm: OrderedDict[int, None] = OrderedDict()  # LRU order: oldest first
        self.dram = Tier(dram if isinstance(dram, TierSpec) else TierSpec(dram), hash_tokens)
        self.disk = Tier(disk if isinstance(disk, TierSpec) else TierSpec(disk), hash_tokens)
        self.hash_tokens = hash_tokens
        self.dram_cap = self.dram.cap
        self.disk_cap = self.disk.cap

    def contents(self) -> dict[str, tuple[int, ...]]:
        """Blocks held per tier ("hbm", "dram", "disk"), oldest first (eviction order): what `preload` takes to
        start a later replay where this one ended (the evaluation carries it from hour to hour)."""
        return {"hbm": tuple(self.hbm), "dram": tuple(self.dram.blocks), "disk": tuple(self.disk.blocks)}

    def preload(self, contents: Mapping[str, Sequence[int]], hbm_free_blocks: int | None, now: float = 0.0) -> None:
        """Fill the tiers with `contents` (as `contents()` gives them), oldest first, block by block: what exceeds
        a tier's capacity is evicted by its policy, a tier that is off stays empty. A preloaded block is its own
        prefix group (elastic tiers) and has no parent (LCS)."""
        unknown = sorted(set(contents) - {"hbm", "dram", "disk"})
        if unknown:
            raise ValueError(f"contents: unknown tier {unknown[0]!r} (hbm, dram or disk)")
        if hbm_free_blocks is not None:
            self._put(self.hbm, tuple(contents.get("hbm", ())), max(0, hbm_free_blocks))
        for tier, name in ((self.dram, "dram"), (self.disk, "disk")):
            for block in contents.get(name, ()):
                tier.put((block,), now)

    def block_seconds(self, tier: str, end: float) -> float:
        """Time-integral of the `tier` ("dram" / "disk") size up to `end`."""
        t = self.dram if tier == "dram" else self.disk
        t._account(end)
        return t.block_seconds

    def cached_prefix_blocks(self, hashes: tuple[int, ...]) -> int:
        """Leading blocks present in HBM or DRAM (what a prefix-aware router can see)."""
        hbm, dram = self.hbm, self.dram.blocks
        n = 0
        for h in hashes:
            if h in hbm or h in dram:
                n += 1
            else:
                break
        return n

    def lookup(self, hashes: tuple[int, ...], now: float = 0.0) -> tuple[int, int, int]:
        """Leading blocks by fastest tier holding them, as a monotone split (HBM, then DRAM, then disk)."""
        self.disk.expire(now)
        hbm, dram, disk = self.hbm, self.dram.blocks, self.disk.blocks
        nh = nd = nk = 0
        tier = 0
        for h in hashes:
            if tier == 0 and h in hbm:
                nh += 1
                continue
            if tier <= 1 and (h in dram or h in hbm):
                tier = 1
                nd += 1
                continue
            if h in disk or h in dram or h in hbm:
                tier = 2
                nk += 1
                continue
            break
        if nh:  # LRU touch of the HBM hits
            touch = hbm.move_to_end
            for h in hashes[:nh]:
                touch(h)
        return nh, nd, nk

    def store(self, hashes: tuple[int, ...], hbm_free_blocks: int | None, now: float = 0.0) -> None:
        """Write-through of a prefilled prompt's blocks: HBM prefix cache (`hbm_free_blocks` of the free pool;
        None when prefix caching is off), LMCache L1 and L2."""
        if hbm_free_blocks is not None:
            self._put(self.hbm, hashes, max(0, hbm_free_blocks))
        self.dram.put(hashes, now)
        self.disk.expire(now)
        self.disk.put(hashes, now)

    @staticmethod
    def _put(cache: OrderedDict, hashes: tuple[int, ...], cap: int) -> None:
        touch = cache.move_to_end
        for h in hashes:
            if h in cache:
                touch(h)
            else:
                cache[h] = None
        excess = len(cache) - cap
        if excess > 0:
            pop = cache.popitem
            for _ in range(excess):
                pop(last=False)
