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

All use 512-token blocks (`policies.BLOCK_TOKENS`); every generator is seeded, so a trace is the same on
every run.
"""

from __future__ import annotations

from greenserve.cache_manager.policies import BLOCK_TOKENS, Request
from greenserve.simulator import workloads

SHAPES = ("multi-turn", "zipf-0.4", "zipf-0.7", "stale-hot")


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
    raise ValueError(f"unknown trace shape {name!r}; expected one of {SHAPES}")
