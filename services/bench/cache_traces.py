"""Trace shapes of `greenserve bench cache-policy` besides a Mooncake JSONL file.

- `multi-turn`: GreenCache's multi-turn conversations (ShareGPT-like; `simulator.workloads.multi_turn_workload`):
  each turn's prompt is the whole history plus a new message, so the next turn reuses the previous prefix.
- `zipf-0.4`, `zipf-0.7`: GreenCache's document reading comprehension (TriviaQA-like; `zipf_document_workload`):
  a document plus a question, documents drawn with Zipf skew 0.4 (10 % of documents get ~25 % of prompts)
  and 0.7 (~50 %).
- `stale-hot`: adversarial for a frequency-weighted score such as LCS. Each epoch a small hot set is read
  many times in quick succession and then never again, then a working set is cycled; at a capacity that
  holds the working set but not both, LRU keeps the working set at once while LCS keeps the stale hot
  blocks (many hits) until their hits have decayed, and misses the working set meanwhile.
- `scan-loops` (LRU beats LCS): scans over fresh blocks, each scan read 6 times in a row (a loop) and then never
  again, loop sizes log-uniform from 8 to 6,000 blocks, 8-block requests. LRU keeps a loop that fits once it has
  read it; LCS keeps the blocks of earlier loops, whose several hits outweigh the new loop's, and misses.
- `zipf-scan` (LCS wins): 2,000 four-block documents read with Zipf skew 1.0, 30 % of requests a one-off scan
  of 16 new blocks. The scans flush LRU; LCS keeps the popular documents (their hits) through them.
- `phase-change`: `zipf-scan` (12,000 requests), then 20 loops of `scan-loops`, then `zipf-scan` again over the
  same documents: the better policy changes twice.

`azure_conversations` turns the Azure LLM inference trace 2023 (conversation service), which has no prefix
information, into a prefix trace by a stated reconstruction (its docstring).

All use 512-token blocks (`policies.BLOCK_TOKENS`); every generator is seeded, so a trace is the same on
every run.
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np

from greenserve.bench.cache_policies import BLOCK_TOKENS, Request
from greenserve.simulator import workloads

SHAPES = ("multi-turn", "zipf-0.4", "zipf-0.7", "stale-hot", "scan-loops", "zipf-scan", "phase-change")


def from_workload(w: workloads.Workload) -> list[Request]:
    """A simulator workload with prefix-block hashes as replay requests."""
    return [Request(float(t), int(p), tuple(int(b) for b in h))
            for t, p, h in zip(w.arrival_s, w.prompt_tokens, w.block_hashes)]


def multi_turn(n_conversations: int = 2000, *, seed: int = 1) -> list[Request]:
    """Conversations starting at 1 per second, 4 turns on average, 30 s think time, 8k context."""
    return from_workload(workloads.multi_turn_workload(n_conversations, 1.0, seed=seed, block_tokens=BLOCK_TOKENS))


def zipf_documents(alpha: float, n_requests: int = 8000, *, n_documents: int = 1000, seed: int = 1) -> list[Request]:
    """Document questions at 2 per second over `n_documents` documents with Zipf skew `alpha`."""
    return from_workload(workloads.zipf_document_workload(n_requests, 2.0, n_documents=n_documents, alpha=alpha,
                                                          seed=seed, block_tokens=BLOCK_TOKENS))


def stale_hot(epochs: int = 4, *, hot_blocks: int = 40, hot_rounds: int = 15, working_blocks: int = 120,
              working_cycles: int = 8, gap_s: float = 1.0) -> list[Request]:
    """Single-block requests `gap_s` apart: per epoch `hot_rounds` round-robin passes over `hot_blocks` new
    blocks, then `working_cycles` passes over `working_blocks` new blocks. Adversarial for LCS at a capacity
    between `working_blocks` and `hot_blocks + working_blocks` (e.g. 130 blocks, 2.7 % of the unique blocks
    with the defaults)."""
    out: list[Request] = []
    next_id = 0
    t = 0.0
    for _ in range(epochs):
        hot = range(next_id, next_id + hot_blocks)
        next_id += hot_blocks
        work = range(next_id, next_id + working_blocks)
        next_id += working_blocks
        for block in [b for _ in range(hot_rounds) for b in hot] + [b for _ in range(working_cycles) for b in work]:
            out.append(Request(t, BLOCK_TOKENS, (block,)))
            t += gap_s
    return out


def scan_loops(n_loops: int = 40, *, smallest: int = 8, largest: int = 6000, reads: int = 6, chunk: int = 8,
               seed: int = 2, gap_s: float = 0.5, t0_s: float = 0.0, first_id: int = 0) -> list[Request]:
    """`n_loops` scans of fresh blocks (sizes log-uniform in [smallest, largest]), each read `reads` times in a
    row in requests of `chunk` blocks, `gap_s` apart, then never again."""
    rng = np.random.default_rng(seed)
    out: list[Request] = []
    t, next_id = t0_s, first_id
    for _ in range(n_loops):
        size = int(np.exp(rng.uniform(np.log(smallest), np.log(largest))))
        loop = range(next_id, next_id + size)
        next_id += size
        for _ in range(reads):
            for i in range(0, size, chunk):
                blocks = tuple(loop[i:i + chunk])
                out.append(Request(t, BLOCK_TOKENS * len(blocks), blocks))
                t += gap_s
    return out


def zipf_scan(n_requests: int = 30000, *, n_documents: int = 2000, document_blocks: int = 4, alpha: float = 1.0,
              scan_share: float = 0.3, scan_blocks: int = 16, seed: int = 3, gap_s: float = 0.5, t0_s: float = 0.0,
              scan_first_id: int | None = None) -> list[Request]:
    """Documents of `document_blocks` blocks (ids 0 .. n_documents x document_blocks - 1) read with Zipf skew
    `alpha`, a `scan_share` of requests a one-off scan of `scan_blocks` new blocks (ids from `scan_first_id`)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_documents + 1) ** alpha
    weights /= weights.sum()
    popular = rng.permutation(n_documents)
    next_id = n_documents * document_blocks if scan_first_id is None else scan_first_id
    out: list[Request] = []
    t = t0_s
    while len(out) < n_requests:
        if rng.random() < scan_share:
            blocks = tuple(range(next_id, next_id + scan_blocks))
            next_id += scan_blocks
        else:
            d = int(popular[rng.choice(n_documents, p=weights)])
            blocks = tuple(range(d * document_blocks, (d + 1) * document_blocks))
        out.append(Request(t, BLOCK_TOKENS * len(blocks), blocks))
        t += gap_s
    return out


def phase_change(requests: int = 12000, loops: int = 20, *, n_documents: int = 2000, largest: int = 6000,
                 seed: int = 4) -> list[Request]:
    """`zipf_scan` (LCS's ground, `requests` requests), `scan_loops` (LRU's, `loops` loops), `zipf_scan` over the
    same documents again."""
    first = zipf_scan(requests, n_documents=n_documents, seed=seed)
    middle = scan_loops(loops, largest=largest, seed=seed, t0_s=first[-1].time_s + 1.0, first_id=1 << 40)
    again = zipf_scan(requests, n_documents=n_documents, seed=seed + 1, t0_s=middle[-1].time_s + 1.0,
                      scan_first_id=1 << 41)
    return first + middle + again


def azure_conversations(path: Path | None = None, *, max_gap_s: float = 600.0,
                        max_new_tokens: int = 1024) -> list[Request]:
    """The Azure LLM inference trace 2023 (conversation service) with reconstructed conversations.

    The trace has arrival times and prompt / output token counts but no prefix information. Assumption (not in
    the data): a request continues an earlier one when its prompt holds that request's prompt and answer plus at
    most `max_new_tokens` new tokens, within `max_gap_s`; among such, the one whose prompt + answer is longest
    (the tightest fit). It then shares that request's prompt's whole 512-token blocks; its other blocks are new
    (the answer's KV is not stored, as LMCache stores prompt chunks). A request that continues none starts a new
    conversation. On the shipped file 10,361 of 19,366 requests continue one, 3,498 of them sharing at least
    one block (the others continue a prompt shorter than a block). The reconstruction may chain
    unrelated requests of fitting sizes: read the figures as a second traffic shape of the token counts and
    arrivals of a real service, not as that service's prefix reuse.
    """
    w = workloads.load_azure_csv(path or workloads.trace_path("azure-conv"))
    ends: list[tuple[int, int]] = []  # (prompt + answer tokens, conversation), sorted
    convs: dict[int, tuple[float, int, tuple[int, ...]]] = {}  # conversation -> (time, prompt tokens, blocks)
    out: list[Request] = []
    next_id = 0
    for t, prompt, answer in zip(w.arrival_s, w.prompt_tokens, w.output_tokens):
        n = max(1, -(-prompt // BLOCK_TOKENS))
        j = bisect.bisect_right(ends, (prompt, 1 << 62)) - 1
        found = None
        while j >= 0 and prompt - ends[j][0] <= max_new_tokens:
            if t - convs[ends[j][1]][0] <= max_gap_s:
                found = j
                break
            j -= 1
        if found is not None:
            conv = ends.pop(found)[1]
            _, prev_prompt, prev_blocks = convs.pop(conv)
            keep = min(prev_prompt // BLOCK_TOKENS, n)
            blocks = prev_blocks[:keep] + tuple(range(next_id, next_id + n - keep))
            next_id += n - keep
        else:
            conv = len(out)
            blocks = tuple(range(next_id, next_id + n))
            next_id += n
        out.append(Request(float(t), int(prompt), blocks))
        convs[conv] = (float(t), int(prompt), blocks)
        bisect.insort(ends, (int(prompt) + int(answer), conv))
    return out


def shape(name: str) -> list[Request]:
    """The trace of one shape (SHAPES) with the bench's sizes."""
    if name == "multi-turn":
        return multi_turn()
    if name == "zipf-0.4":
        return zipf_documents(0.4)
    if name == "zipf-0.7":
        return zipf_documents(0.7)
    if name == "stale-hot":
        return stale_hot()
    if name == "scan-loops":
        return scan_loops()
    if name == "zipf-scan":
        return zipf_scan()
    if name == "phase-change":
        return phase_change()
    raise ValueError(f"unknown trace shape {name!r}; expected one of {SHAPES}")
