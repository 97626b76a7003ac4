"""A pool's recorded traffic as a replay trace for the simulator (Kareto scores cache tiers on it).

Built from the cache-manager's access history (GetAccessWindow, one window of one hour) and the forecaster's
load history of that hour (mean output tokens per request). ``build_trace`` turns the accesses into requests and
prefix blocks:

* **requests**: the router reports one request as a HIT (the deepest cached block: ``hit_tokens``) or a MISS,
  then a STORE of the prompt's deepest block (``tokens`` = the prompt's tokens), all with the request's time and
  conversation. A HIT or MISS starts a request; a STORE with the same time and ids joins it (else it is a
  request of its own, e.g. from a reporter that sends only stores).
* **prefix blocks** (``BLOCK_TOKENS`` tokens each; only whole blocks are reusable, as in the simulator's
  workloads): an entry key names the same prefix wherever it appears, so a request that hit key K starts with
  K's blocks (``hit_tokens`` of them) and the rest of its prompt is new blocks; a later request naming the
  same key shares them. In a conversation, a request whose prompt is longer than the conversation's previous
  prompt also starts with that prompt's blocks (chat turns resend the history: GreenCache's multi-turn model),
  so reuse that the cache in force missed is still in the trace. Document ids get no such assumption.
* **scaling** (``ReplayTrace.workload``): the planned hour's forecast rate per engine is reached by keeping a
  deterministic share of the conversations (whole conversations, so their think times and reuse stay), then,
  when the recorded traffic is slower than the forecast, by compressing time. Output lengths are drawn
  (log-normal, sigma 0.8, seeded) around the window's mean.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.simulator.workloads import Workload
from greenserve.v1 import cache_manager_pb2

BLOCK_TOKENS = 256
MIN_REQUESTS = 20  # a window with fewer requests is not used (the next fallback is tried)
MIN_KEPT = 30  # thinning keeps at least this many requests (then time is compressed instead)


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float  # from the window's start
    prompt_tokens: int
    blocks: tuple[int, ...]
    group: str  # the conversation (or document, or prefix family) that thinning keeps whole


@dataclass(frozen=True, eq=False)
class ReplayTrace:
    """One pool's recorded window, ready to replay (module doc). Hashed by its content digest (score caches)."""

    pool: str
    source: str  # "yesterday", "last_week" or "recent"
    label: str  # e.g. "same hour yesterday (2026-11-24 14:00-15:00 UTC)"
    requests: tuple[TraceRequest, ...]
    span_s: float  # seconds the requests cover (first to last arrival; at least 1)
    mean_output_tokens: float
    output_source: str  # where the mean came from
    reused_fraction: float  # prompt tokens in blocks an earlier request of the trace holds
    digest: str

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReplayTrace) and other.digest == self.digest

    @property
    def recorded_rate_per_s(self) -> float:
        return len(self.requests) / self.span_s

    def workload(self, rate_per_s: float, window_s: float, seed: int = 7) -> tuple[Workload, float, str]:
        """The trace at ``rate_per_s`` (module doc), cut at ``window_s``: (workload, the replayed window's
        length, s (shorter than ``window_s`` when the trace runs out), how it was scaled)."""
        if not (rate_per_s > 0 and math.isfinite(rate_per_s)):
            raise ValueError("rate_per_s: must be a finite number > 0")
        n = len(self.requests)
        keep = min(1.0, max(rate_per_s / self.recorded_rate_per_s, min(1.0, MIN_KEPT / max(n, 1))))
        if keep > 0.98:  # within 2 %: keep every request and let the time scale make up the difference
            keep = 1.0
        kept = [r for r in self.requests if keep >= 1.0 or _share(r.group) < keep]
        if len(kept) < 2:
            kept = list(self.requests)
        t0 = kept[0].arrival_s
        kept_span = max(kept[-1].arrival_s - t0, 1.0)
        factor = max((len(kept) / kept_span) / rate_per_s, 1e-6)  # < 1: the kept requests are slower: compress
        arrivals = [(r.arrival_s - t0) * factor for r in kept]
        length = min(window_s, kept_span * factor + 1.0)
        rows = [(a, r) for a, r in zip(arrivals, kept) if a < length]
        rng = np.random.default_rng(seed)
        mu = math.log(max(self.mean_output_tokens, 1.0)) - 0.32
        outputs = np.clip(np.rint(rng.lognormal(mu, 0.8, len(rows))), 1, 4096).astype(int).tolist()
        wl = Workload(f"{self.pool}-{self.source}", [a for a, _ in rows], [r.prompt_tokens for _, r in rows],
                      outputs, [r.blocks for _, r in rows], BLOCK_TOKENS)
        how = (f"{keep:.0%} of its conversations kept" if keep < 1.0 else "every request kept") + \
            (f", arrivals {1 / factor:.2g}x as fast" if abs(factor - 1.0) > 0.05 else "")
        return wl, length, how


def _share(group: str) -> float:
    """A stable number in [0, 1) per group (deterministic thinning)."""
    return zlib.crc32(group.encode()) / 2**32


def paired_requests(accesses: Iterable[cache_manager_pb2.AccessRecord], *,
                    routed_only: bool = False) -> list[tuple[float, str, str, int, str, int, str]]:
    """(time, conversation, document, prompt tokens, key, hit tokens, hit key) per request (module doc);
    ``routed_only``: a STORE with no HIT or MISS before it (not a request the router routed) is left out."""
    out: list[list] = []
    open_store = False
    for a in accesses:
        t = a.time.seconds + a.time.nanos * 1e-9
        if a.kind == cache_manager_pb2.ACCESS_KIND_STORE and out and open_store and out[-1][0] == t and \
                out[-1][1] == a.conversation_id and out[-1][2] == a.document_id:
            cur = out[-1]
            cur[3], cur[4] = max(cur[3], int(a.tokens)), a.entry_key
            open_store = False
            continue
        if a.kind == cache_manager_pb2.ACCESS_KIND_HIT:
            out.append([t, a.conversation_id, a.document_id, int(a.tokens), a.entry_key,
                        int(a.hit_tokens or a.tokens), a.entry_key])
            open_store = True
        elif a.kind == cache_manager_pb2.ACCESS_KIND_MISS:
            out.append([t, a.conversation_id, a.document_id, int(a.tokens), a.entry_key, 0, ""])
            open_store = True
        elif a.kind == cache_manager_pb2.ACCESS_KIND_STORE:
            if not routed_only:
                out.append([t, a.conversation_id, a.document_id, int(a.tokens), a.entry_key, 0, ""])
            open_store = False
    return [tuple(r) for r in out]


def build_trace(pool: str, source: str, label: str, window_start_s: float,
                accesses: Iterable[cache_manager_pb2.AccessRecord], *,
                mean_output_tokens: float, output_source: str) -> ReplayTrace | None:
    """The replay trace of one window's accesses (module doc); None when it holds fewer than MIN_REQUESTS
    requests."""
    reqs = sorted(paired_requests(accesses), key=lambda r: r[0])
    reqs = [r for r in reqs if r[3] > 0]
    if len(reqs) < MIN_REQUESTS:
        return None
    blocks_of: dict[str, tuple[int, ...]] = {}
    last_prompt: dict[str, tuple[int, ...]] = {}
    next_id = 1
    out: list[TraceRequest] = []
    reused = total = 0
    seen: set[int] = set()

    def extend(prefix: tuple[int, ...], n: int) -> tuple[int, ...]:
        nonlocal next_id
        if len(prefix) >= n:
            return prefix[:n]
        add = tuple(range(next_id, next_id + n - len(prefix)))
        next_id += len(add)
        return prefix + add

    for t, conv, doc, tokens, key, hit_tokens, hit_key in reqs:
        n = tokens // BLOCK_TOKENS
        prefix: tuple[int, ...] = ()
        if hit_key and hit_tokens > 0:
            k = min(hit_tokens, tokens) // BLOCK_TOKENS
            known = blocks_of.get(hit_key, ())
            if len(known) < k:
                known = extend(known, k)
                blocks_of[hit_key] = known
            prefix = known[:k]
        prev = last_prompt.get(conv) if conv else None
        if prev is not None and len(prefix) < len(prev) <= n:
            prefix = prev
        own = blocks_of.get(key)
        blocks = own[:n] if own is not None and len(own) >= n and own[:len(prefix)] == prefix else \
            extend(prefix, n)
        blocks_of[key] = blocks if len(blocks) >= len(blocks_of.get(key, ())) else blocks_of[key]
        if conv:
            last_prompt[conv] = blocks
        reused += sum(1 for b in blocks if b in seen) * BLOCK_TOKENS
        total += tokens
        seen.update(blocks)
        group = conv or doc or (f"b{blocks[0]}" if blocks else f"k{key}")
        out.append(TraceRequest(t - window_start_s, max(tokens, 1), blocks, group))
    span = max(out[-1].arrival_s - out[0].arrival_s, 1.0)
    h = hashlib.sha256()
    for r in out:
        h.update(f"{r.arrival_s:.6f},{r.prompt_tokens},{r.group},{','.join(map(str, r.blocks))};".encode())
    h.update(f"{mean_output_tokens:.3f}".encode())
    return ReplayTrace(pool, source, label, tuple(out), span, mean_output_tokens, output_source,
                       reused / max(total, 1), h.hexdigest())


def router_accesses(workload: Workload, pool: str, start_s: float) -> list[cache_manager_pb2.AccessRecord]:
    """The accesses the router would report for ``workload`` (its arrivals from ``start_s``) in front of an
    unbounded prefix cache: per request a HIT of the deepest block any earlier prompt held (or a MISS), then a
    STORE of its own deepest block, with the request's conversation. For benches and tests: a recorded window of a
    known shape. A request without block hashes is a prompt of its own (a MISS and a STORE of a fresh key)."""
    bt = workload.hash_block_tokens
    seen: set[tuple[int, ...]] = set()
    out: list[cache_manager_pb2.AccessRecord] = []
    sessions: Sequence[int | None] = workload.session_ids or [None] * len(workload)
    blocks_of = workload.block_hashes or [()] * len(workload)
    for i, (t, tokens, blocks, conv) in enumerate(zip(workload.arrival_s, workload.prompt_tokens, blocks_of,
                                                      sessions)):
        blocks = tuple(blocks)
        at = Timestamp()
        at.FromNanoseconds(round((start_s + t) * 1e9))
        cid = "" if conv is None else f"c{conv}"
        depth = max((j for j in range(1, len(blocks) + 1) if blocks[:j] in seen), default=0)
        key = f"{hash(blocks) & (2**63 - 1):016x}" if blocks else f"r{i:015x}"
        if depth:
            out.append(cache_manager_pb2.AccessRecord(
                entry_key=f"{hash(blocks[:depth]) & (2**63 - 1):016x}", kind=cache_manager_pb2.ACCESS_KIND_HIT,
                tokens=depth * bt, hit_tokens=depth * bt, conversation_id=cid, time=at))
        else:
            out.append(cache_manager_pb2.AccessRecord(entry_key=key, kind=cache_manager_pb2.ACCESS_KIND_MISS,
                                                      tokens=tokens, conversation_id=cid, time=at))
        out.append(cache_manager_pb2.AccessRecord(entry_key=key, kind=cache_manager_pb2.ACCESS_KIND_STORE,
                                                  tokens=tokens, conversation_id=cid, time=at))
        seen.update(blocks[:j] for j in range(1, len(blocks) + 1))
    return out
