"""The KV-cache index: entries, their prefix tree, LCS scores and the choice of eviction victims, with snapshots.

Shared domain code: the cache-manager keeps one index per pool of LMCache servers, and the simulator's cache tiers
(simulator/tiers.py) score and evict with the same index, so the replay and the service make the same choices.
``index.CacheIndex`` is the class; the other modules are its parts (keys, scores, eviction choice, snapshot).
"""
