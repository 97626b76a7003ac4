"""KV block pool with automatic prefix caching, after vLLM V1's ``KVCacheManager``/``BlockPool``.

The pool has a fixed number of KV blocks (from the performance model's memory budget). A prompt's
full blocks are identified by *chained* block hashes: block i's hash covers its own token ids and
the hash of block i-1, so equal hashes mean equal prefixes. Blocks are in one of three states:

* held: referenced by at least one running request (counted in ``kv_cache_usage_perc``);
* cached and evictable: no request holds them, but their hash still maps to their content, so a
  later prompt with the same prefix reuses them (LRU order; the least recently freed goes first);
* free: hold nothing.

New blocks come from the free ones first, then by evicting the least recently used cached block,
which is how vLLM's free-block queue behaves. Blocks holding generated tokens are not hashed here
(vLLM hashes them too; the emulator only reuses prompt prefixes, which is what routers exploit).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

#: parent hash of the first block of every prompt.
ROOT_HASH = 0x5EED_0F_B10C


def block_hashes(token_ids: Sequence[int], block_size_tokens: int) -> list[int]:
    """Chained hashes of the *full* blocks of ``token_ids`` (a trailing partial block has none).

    Uses Python's ``hash`` of an int tuple, which is deterministic across processes (only str/bytes
    hashing is salted by PYTHONHASHSEED), and fast.
    """
    hashes: list[int] = []
    parent = ROOT_HASH
    full = len(token_ids) - len(token_ids) % block_size_tokens
    for start in range(0, full, block_size_tokens):
        parent = hash((parent, tuple(token_ids[start : start + block_size_tokens])))
        hashes.append(parent)
    return hashes


def blocks_for_tokens(num_tokens: int, block_size_tokens: int) -> int:
    """Number of KV blocks needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // block_size_tokens)


class BlockPool:
    """Fixed-size pool of KV blocks with an LRU prefix cache of hashed prompt blocks."""

    def __init__(self, num_blocks: int, block_size_tokens: int) -> None:
        if num_blocks <= 0 or block_size_tokens <= 0:
            raise ValueError("num_blocks and block_size_tokens must be positive")
        self.num_blocks = num_blocks
        self.block_size_tokens = block_size_tokens
        self._free_blocks = num_blocks
        #: hash -> number of requests holding that cached block (0 = evictable)
        self._refs: dict[int, int] = {}
        #: hashes of cached blocks nobody holds, least recently used first
        self._evictable: OrderedDict[int, None] = OrderedDict()
        #: number of cached blocks evicted so far (for tests and debugging)
        self.evictions = 0

    # -- queries ----------------------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        """Blocks held by requests (the numerator of vLLM's ``kv_cache_usage_perc``)."""
        return self.num_blocks - self._free_blocks - len(self._evictable)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests, 0..1."""
        return self.used_blocks / self.num_blocks

    @property
    def cached_blocks(self) -> int:
        """Blocks whose content is addressable by hash (held or evictable)."""
        return len(self._refs)

    def cached_prefix_blocks(self, hashes: Sequence[int], max_blocks: int) -> int:
        """How many leading blocks of ``hashes`` (at most ``max_blocks``) are in the cache."""
        refs = self._refs
        n = 0
        for h in hashes[:max_blocks]:
            if h not in refs:
                break
            n += 1
        return n

    def can_allocate(self, hit_hashes: Sequence[int], new_blocks: int) -> bool:
        """Whether holding ``hit_hashes`` plus ``new_blocks`` fresh blocks fits right now."""
        evictable = self._evictable
        reclaimable = self._free_blocks + len(evictable)
        # hit blocks that are evictable now stop being reclaimable once we hold them
        reclaimable -= sum(1 for h in hit_hashes if h in evictable)
        return new_blocks <= reclaimable

    def free_block_count(self) -> int:
        """Blocks that a new allocation could take (free + evictable)."""
        return self._free_blocks + len(self._evictable)

    # -- mutations --------------------------------------------------------------------------
    def hold_cached(self, hit_hashes: Sequence[int]) -> None:
        """Take a reference on cached blocks (a prefix hit); they stop being evictable."""
        refs, evictable = self._refs, self._evictable
        for h in hit_hashes:
            n = refs[h]
            if n == 0:
                del evictable[h]
            refs[h] = n + 1

    def take_new(self, count: int) -> None:
        """Take ``count`` fresh blocks: free ones first, then evict least recently used cached ones."""
        if count <= 0:
            return
        if count > self._free_blocks + len(self._evictable):
            raise RuntimeError("KV block pool exhausted (caller must check can_allocate)")
        from_free = min(count, self._free_blocks)
        self._free_blocks -= from_free
        evictable, refs = self._evictable, self._refs
        for _ in range(count - from_free):
            h, _ = evictable.popitem(last=False)
            del refs[h]
            self.evictions += 1

    def publish(self, block_hash: int) -> bool:
        """Turn one fresh block that a request just filled with a full prompt block into a cached one.

        Returns True when the block became cached (the request now holds it by hash). Returns False
        when another request published the same hash first: then the request holds that block by
        hash instead and its own fresh block goes back to the free pool (vLLM deduplicates likewise).
        """
        refs = self._refs
        n = refs.get(block_hash)
        if n is None:
            refs[block_hash] = 1
            return True
        if n == 0:
            del self._evictable[block_hash]
        refs[block_hash] = n + 1
        self._free_blocks += 1
        return False

    def release(self, held_hashes: Sequence[int], fresh_blocks: int) -> None:
        """Drop a request's blocks: hashed ones become evictable (tail first), fresh ones free."""
        refs, evictable = self._refs, self._evictable
        # the tail of a prompt is the least likely to be shared, so it is queued for eviction first
        for h in reversed(held_hashes):
            n = refs[h] - 1
            refs[h] = n
            if n == 0:
                evictable[h] = None
        self._free_blocks += fresh_blocks

    def reset(self) -> None:
        """Forget every cached block (engine restart). Only valid when no request holds blocks."""
        self._free_blocks = self.num_blocks
        self._refs.clear()
        self._evictable.clear()
