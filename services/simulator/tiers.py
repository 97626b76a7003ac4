"""Prefix-cache tiers of one simulated engine: GPU HBM (vLLM prefix cache), host DRAM (LMCache L1), disk (L2).

Blocks are the trace's prefix-block hashes. A prompt's cached prefix is its leading run of blocks held in
some tier; the lookup splits it monotonically by the fastest tier holding each block (HBM, then DRAM, then
disk). A prefilled prompt is written through to every tier that is on (HBM takes what the free KV pool holds).
All tiers evict LRU (LMCache's default, vLLM's free-block order).
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixTiers:
    """HBM / DRAM / disk contents of one engine (hot path: plain attributes)."""

    __slots__ = ("disk", "disk_cap", "dram", "dram_cap", "hash_tokens", "hbm")

    def __init__(self, hash_tokens: int, dram_capacity_tokens: int, disk_capacity_tokens: int) -> None:
        self.hbm: OrderedDict[int, None] = OrderedDict()  # LRU order: oldest first
        self.dram: OrderedDict[int, None] = OrderedDict()
        self.disk: OrderedDict[int, None] = OrderedDict()
        self.hash_tokens = hash_tokens
        self.dram_cap = dram_capacity_tokens // hash_tokens
        self.disk_cap = disk_capacity_tokens // hash_tokens

    def cached_prefix_blocks(self, hashes: tuple[int, ...]) -> int:
        """Leading blocks present in HBM or DRAM (what a prefix-aware router can see)."""
        hbm, dram = self.hbm, self.dram
        n = 0
        for h in hashes:
            if h in hbm or h in dram:
                n += 1
            else:
                break
        return n

    def lookup(self, hashes: tuple[int, ...]) -> tuple[int, int, int]:
        """Leading blocks by fastest tier holding them, as a monotone split (HBM, then DRAM, then disk)."""
        hbm, dram, disk = self.hbm, self.dram, self.disk
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

    def store(self, hashes: tuple[int, ...], hbm_free_blocks: int | None) -> None:
        """Write-through of a prefilled prompt's blocks: HBM prefix cache (`hbm_free_blocks` of the free pool;
        None when prefix caching is off), LMCache L1 and L2."""
        if hbm_free_blocks is not None:
            self._put(self.hbm, hashes, max(0, hbm_free_blocks))
        if self.dram_cap:
            self._put(self.dram, hashes, self.dram_cap)
        if self.disk_cap:
            self._put(self.disk, hashes, self.disk_cap)

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
